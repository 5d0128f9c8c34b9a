/* train/history: per-step records; their checkpoint form, CSV and plot. */
#include "history.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "le.h"
#include "plot.h"

/* step (i64), five doubles, skipped (i64): 7 little-endian 8-byte words. */
#define REC_BYTES 56

int history_add(history *h, const hist_rec *rec)
{
    if (h->n == h->cap) {
        int64_t ncap = h->cap ? 2 * h->cap : 256;
        hist_rec *r = realloc(h->r, (size_t)ncap * sizeof *r);
        if (!r)
            return -1;
        h->r = r;
        h->cap = ncap;
    }
    h->r[h->n++] = *rec;
    return 0;
}

void history_truncate(history *h, int64_t step)
{
    while (h->n > 0 && h->r[h->n - 1].step > step)
        h->n--;
}

void history_free(history *h)
{
    free(h->r);
    h->r = NULL;
    h->n = h->cap = 0;
}

size_t history_bytes(const history *h)
{
    return (size_t)h->n * REC_BYTES;
}

static uint64_t dbits(double d)
{
    uint64_t u;
    memcpy(&u, &d, 8);
    return u;
}

static double bitsd(uint64_t u)
{
    double d;
    memcpy(&d, &u, 8);
    return d;
}

void history_serialize(const history *h, uint8_t *out)
{
    for (int64_t i = 0; i < h->n; i++, out += REC_BYTES) {
        const hist_rec *r = &h->r[i];
        le_put_u64(out, (uint64_t)r->step);
        le_put_u64(out + 8, dbits(r->loss));
        le_put_u64(out + 16, dbits(r->eval_loss));
        le_put_u64(out + 24, dbits(r->eval_acc));
        le_put_u64(out + 32, dbits(r->samples_per_s));
        le_put_u64(out + 40, dbits(r->loss_scale));
        le_put_u64(out + 48, (uint64_t)r->skipped);
    }
}

int history_deserialize(history *h, const void *data, size_t nbytes)
{
    if (nbytes % REC_BYTES)
        return -1;
    const uint8_t *p = data;
    h->n = 0;
    for (size_t i = 0; i < nbytes / REC_BYTES; i++, p += REC_BYTES) {
        hist_rec r = {(int64_t)le_get_u64(p),    bitsd(le_get_u64(p + 8)),
                      bitsd(le_get_u64(p + 16)), bitsd(le_get_u64(p + 24)),
                      bitsd(le_get_u64(p + 32)), bitsd(le_get_u64(p + 40)),
                      (int)le_get_u64(p + 48)};
        if (history_add(h, &r) != 0)
            return -1;
    }
    return 0;
}

int history_write_rows(const history *h, const char *path, const char *header,
                       history_row_fn row, char *err, size_t errlen)
{
    FILE *f = fopen(path, "w");
    if (!f) {
        snprintf(err, errlen, "%s: cannot create: %s", path, strerror(errno));
        return -1;
    }
    fprintf(f, "%s\n", header);
    for (int64_t i = 0; i < h->n; i++)
        row(f, &h->r[i]);
    if (ferror(f) | (fclose(f) != 0)) {
        snprintf(err, errlen, "%s: write failed: %s", path, strerror(errno));
        return -1;
    }
    return 0;
}

/* train_mlp's row: the held-out loss and accuracy where evaluated. */
static void mlp_row(FILE *f, const hist_rec *r)
{
    fprintf(f, "%lld,%.6g,", (long long)r->step, r->loss);
    if (isnan(r->eval_acc))
        fprintf(f, ",,");
    else
        fprintf(f, "%.6g,%.6g,", r->eval_loss, r->eval_acc);
    fprintf(f, "%.1f,%g,%d\n", r->samples_per_s, r->loss_scale, r->skipped);
}

int history_write_csv(const history *h, const char *path, char *err, size_t errlen)
{
    return history_write_rows(
        h, path, "step,train_loss,heldout_loss,heldout_accuracy,samples_per_s,loss_scale,skipped",
        mlp_row, err, errlen);
}

/* A record with a held-out loss (train_gpt) or accuracy (train_mlp, which has both). */
static int evaluated(const hist_rec *r)
{
    return !isnan(r->eval_loss) || !isnan(r->eval_acc);
}

int history_series(const history *h, hist_series *s, const char *path, char *err,
                   size_t errlen)
{
    int64_t n = h->n;
    memset(s, 0, sizeof *s);
    double *buf = malloc((size_t)(n ? n : 1) * 5 * sizeof *buf);
    if (!buf) {
        snprintf(err, errlen, "%s: out of memory", path);
        return -1;
    }
    s->xs = buf;
    s->loss = buf + n;
    s->ex = buf + 2 * n;
    s->el = buf + 3 * n;
    s->ea = buf + 4 * n;
    s->n = n;
    for (int64_t i = 0; i < n; i++) {
        const hist_rec *r = &h->r[i];
        s->xs[i] = (double)r->step;
        s->loss[i] = r->loss;
        if (isfinite(r->loss) && r->loss > s->train_max)
            s->train_max = r->loss;
        if (!evaluated(r))
            continue;
        s->ex[s->ne] = (double)r->step;
        s->el[s->ne] = r->eval_loss;
        s->ea[s->ne++] = r->eval_acc;
        if (isfinite(r->eval_loss) && r->eval_loss > s->eval_max)
            s->eval_max = r->eval_loss;
    }
    return 0;
}

void history_series_free(hist_series *s)
{
    free(s->xs);
    memset(s, 0, sizeof *s);
}

int history_write_plot(const history *h, int64_t total_steps, double target_acc,
                       const char *subtitle, const char *path, char *err, size_t errlen)
{
    hist_series sr;
    if (history_series(h, &sr, path, err, errlen) != 0)
        return -1;
    int64_t n = sr.n, ne = sr.ne;
    double *xs = sr.xs, *loss = sr.loss, *ex = sr.ex, *el = sr.el, *ea = sr.ea;
    double lmax = sr.train_max > sr.eval_max ? sr.train_max : sr.eval_max, amin = 1;
    for (int64_t i = 0; i < ne; i++)
        if (ea[i] < amin)
            amin = ea[i];
    /* Accuracy axis from a round tenth below the worst value, so the end of the curve shows. */
    double afloor = floor(amin * 10.0) / 10.0;
    if (afloor > 0.8)
        afloor = 0.8;
    plot_series s_loss[2] = {
        {"training batch", (int)n, xs, loss, {70, 130, 200}, 0},
        {"held-out", (int)ne, ex, el, {230, 120, 20}, 1},
    };
    plot_series s_acc[1] = {{"held-out", (int)ne, ex, ea, {30, 150, 60}, 1}};
    char target_label[32];
    snprintf(target_label, sizeof target_label, "target %.0f%%", 100 * target_acc);
    double xmax = (double)(total_steps > 0 ? total_steps : 1);
    plot_panel panels[2] = {
        {"loss", subtitle, "step", 0, xmax, 0, plot_nice_ceil(lmax), 0, NAN, NULL, 2, s_loss},
        {"held-out accuracy", subtitle, "step", 0, xmax, afloor, 1.0, 1, target_acc, target_label,
         1, s_acc},
    };
    int rc = plot_write_png(path, 900, 340, 2, panels, err, errlen);
    history_series_free(&sr);
    return rc;
}
