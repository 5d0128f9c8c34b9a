/* train/history: the per-step record of a training run (loss, held-out loss and accuracy,
 * throughput, loss scale): kept in memory, saved in checkpoints so a resumed run keeps its
 * whole curve, and written out as CSV and as a PNG plot. */
#ifndef TRAIN_HISTORY_H
#define TRAIN_HISTORY_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

typedef struct hist_rec {
    int64_t step;
    double loss;          /* training loss of this step's batch */
    double eval_loss;     /* held-out loss after this step; NaN when not evaluated */
    double eval_acc;      /* held-out accuracy (0..1); NaN when not evaluated */
    double samples_per_s; /* this step's throughput */
    double loss_scale;    /* the scale this step's gradients carried */
    int skipped;          /* 1: overflow, the optimizer skipped the update */
} hist_rec;

typedef struct history {
    hist_rec *r;
    int64_t n, cap;
} history;

/* Appends a record. Returns 0, or -1 when out of memory. */
int history_add(history *h, const hist_rec *rec);
/* Drops records with step > `step` (a resume from an earlier checkpoint). */
void history_truncate(history *h, int64_t step);
void history_free(history *h);

/* Serialised size and form (little-endian, fixed width per record) for a checkpoint value. */
size_t history_bytes(const history *h);
void history_serialize(const history *h, uint8_t *out);
/* Replaces h's records. Returns 0, or -1 (bad size, out of memory). */
int history_deserialize(history *h, const void *data, size_t nbytes);

/* Writes `header` and a line per record, row(f, record) writing each (with its newline).
 * Returns 0, or -1 with a message in err. */
typedef void (*history_row_fn)(FILE *f, const hist_rec *r);
int history_write_rows(const history *h, const char *path, const char *header,
                       history_row_fn row, char *err, size_t errlen);

/* Writes "step,train_loss,heldout_loss,heldout_accuracy,samples_per_s,loss_scale,skipped"
 * rows (empty fields when not evaluated). Returns 0, or -1 with a message in err. */
int history_write_csv(const history *h, const char *path, char *err, size_t errlen);

/* The records as plot series: every step's training loss (xs, loss: n points) and the
 * held-out loss and accuracy of the evaluated steps (ex, el, ea: ne points), with the largest
 * finite training loss (train_max) and held-out loss (eval_max), 0 when none. */
typedef struct hist_series {
    double *xs, *loss, *ex, *el, *ea;
    int64_t n, ne;
    double train_max, eval_max;
} hist_series;

/* Fills s from h (s owns its arrays: history_series_free). Returns 0, or -1 with
 * "<path>: out of memory" in err. */
int history_series(const history *h, hist_series *s, const char *path, char *err,
                   size_t errlen);
void history_series_free(hist_series *s);

/* Draws the loss curves (training and held-out) and the held-out accuracy, with a dashed
 * line at `target_acc`, over steps 0..total_steps, as a PNG. `subtitle` goes after the
 * titles. Returns 0, or -1 with a message in err. */
int history_write_plot(const history *h, int64_t total_steps, double target_acc,
                       const char *subtitle, const char *path, char *err, size_t errlen);

#endif
