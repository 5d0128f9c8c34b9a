/* gpt/curves: CSV and PNG of a train_gpt run's history (see curves.h). */
#include "curves.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "../train/plot.h"

/* One record: the held-out loss where evaluated; samples_per_s holds tokens per second. */
static void gpt_row(FILE *f, const hist_rec *r)
{
    fprintf(f, "%lld,%.6f,", (long long)r->step, r->loss);
    if (!isnan(r->eval_loss))
        fprintf(f, "%.6f", r->eval_loss);
    fprintf(f, ",%.1f,%g,%d\n", r->samples_per_s, r->loss_scale, r->skipped);
}

int curves_write_csv(const history *h, const char *path, char *err, size_t errlen)
{
    return history_write_rows(h, path,
                              "step,train_loss,heldout_loss,tokens_per_s,loss_scale,skipped",
                              gpt_row, err, errlen);
}

int curves_write_plot(const history *h, int64_t total_steps, double target,
                      const char *subtitle, const char *path, char *err, size_t errlen)
{
    hist_series sr;
    if (history_series(h, &sr, path, err, errlen) != 0)
        return -1;
    /* The loss axis: up to the target or the largest training loss. */
    double lmax = sr.train_max > target ? sr.train_max : target;
    plot_series s[2] = {
        {"training batch", (int)sr.n, sr.xs, sr.loss, {70, 130, 200}, 0},
        {"held-out", (int)sr.ne, sr.ex, sr.el, {230, 120, 20}, 1},
    };
    char label[48];
    snprintf(label, sizeof label, "target %.2f nats/char", target);
    plot_panel panel = {"loss (nats per character)", subtitle, "step", 0,
                        (double)(total_steps > 0 ? total_steps : 1), 1.5, plot_nice_ceil(lmax),
                        0, target, label, 2, s};
    int rc = plot_write_png(path, 900, 380, 1, &panel, err, errlen);
    history_series_free(&sr);
    return rc;
}
