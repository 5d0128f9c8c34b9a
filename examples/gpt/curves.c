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
    int64_t n = h->n, ne = 0;
    double *buf = malloc((size_t)(n ? n : 1) * 4 * sizeof *buf);
    if (!buf) {
        snprintf(err, errlen, "%s: out of memory", path);
        return -1;
    }
    double *xs = buf, *loss = buf + n, *ex = buf + 2 * n, *el = buf + 3 * n, lmax = target;
    for (int64_t i = 0; i < n; i++) {
        const hist_rec *r = &h->r[i];
        xs[i] = (double)r->step;
        loss[i] = r->loss;
        if (isfinite(r->loss) && r->loss > lmax)
            lmax = r->loss;
        if (!isnan(r->eval_loss)) {
            ex[ne] = (double)r->step;
            el[ne++] = r->eval_loss;
        }
    }
    plot_series s[2] = {
        {"training batch", (int)n, xs, loss, {70, 130, 200}, 0},
        {"held-out", (int)ne, ex, el, {230, 120, 20}, 1},
    };
    char label[48];
    snprintf(label, sizeof label, "target %.2f nats/char", target);
    plot_panel panel = {"loss (nats per character)", subtitle, "step", 0,
                        (double)(total_steps > 0 ? total_steps : 1), 1.5, plot_nice_ceil(lmax),
                        0, target, label, 2, s};
    int rc = plot_write_png(path, 900, 380, 1, &panel, err, errlen);
    free(buf);
    return rc;
}
