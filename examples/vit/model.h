/* vit/model: a small vision transformer on 8x8 images written with the public ops only
 * (ops_general.h, ops.h), laid out so that every mesh of at most 2 x 2 devices computes the
 * same bits (docs/vit.md, "Why the bits agree").
 *
 * The batch is held as [S, b] (S = VIT_SHARDS shards of b rows) and the heads and MLP columns
 * as [M, ...] (M = VIT_GROUPS groups). S is sharded over the mesh dim `batch`, M over `model`.
 * Every parameter enters the model through dt_expand to a leading S dim, and every
 * group-parallel input through dt_expand to an M dim, so that every einsum has S (and M) as
 * batch letters: a device's GEMMs have the same sizes on every mesh, no einsum ever contracts
 * a sharded letter, and every sum across devices is the sum of two terms (expand's backward,
 * dt_sum over M), which IEEE addition gives exactly whatever the order. */
#ifndef VIT_MODEL_H
#define VIT_MODEL_H

#include <stdint.h>

#include <dtensor/dtensor.h>

#define VIT_SHARDS     2 /* S: shards of the batch (the leading dim of every activation) */
#define VIT_GROUPS     2 /* M: head / MLP column groups (one head per group) */
#define VIT_SIDE       8 /* images are VIT_SIDE x VIT_SIDE */
#define VIT_CLASSES    10
#define VIT_MAX_LAYERS 4
#define VIT_MAX_PARAMS (4 + 9 * VIT_MAX_LAYERS) /* vit_num_params is at most this */

typedef struct vit_config {
    int64_t patch;  /* patch side: 2 (16 tokens of 4 pixels) or 4 (4 tokens of 16) */
    int64_t dim;    /* token width D, divisible by VIT_GROUPS */
    int64_t mlp;    /* MLP hidden width, divisible by VIT_GROUPS */
    int64_t layers; /* transformer blocks, 1..VIT_MAX_LAYERS */
    uint64_t seed;  /* dt_random_normal's seed for the initial weights */
} vit_config;

typedef struct vit vit;

/* The model on `mesh` (dims `batch` and optionally `model`): parameters drawn by
 * dt_random_normal (the same global values on every mesh), sharded over `model` along their
 * group dim, replicated otherwise. Local. */
dt_status vit_create(const dt_mesh *mesh, const vit_config *cfg, vit **out);
void vit_destroy(vit *m);

/* The parameters (borrowed; updated in place by the optimizer) and their names. */
int vit_num_params(const vit *m);
dt_tensor *const *vit_params(const vit *m);
const char *const *vit_param_names(const vit *m);

/* The layouts of a batch: images [S, b, 8, 8] f32 and labels [S, b] i32, S over `batch`. */
const dt_layout *vit_image_layout(const vit *m);
const dt_layout *vit_label_layout(const vit *m);

/* Logits [S, b, classes] of images [S, b, 8, 8]. Recorded when a tape records. Collective. */
dt_status vit_forward(const vit *m, const dt_tensor *images, dt_tensor **logits_out);

/* The mean cross-entropy of logits [S, b, classes] against labels [S, b] (labels < 0 are
 * ignored), a rank-0 tensor whose bits do not depend on the mesh. Recorded when a tape
 * records. Collective. */
dt_status vit_loss(const vit *m, const dt_tensor *logits, const dt_tensor *labels,
                   dt_tensor **loss_out);

/* One training pass: the mean cross-entropy of the batch (labels < 0 ignored) into *loss_out
 * and every parameter's gradient (owned, partial over `batch`) into grads_out[0..n-1].
 * Collective. */
dt_status vit_grads(vit *m, const dt_tensor *images, const dt_tensor *labels, double *loss_out,
                    dt_tensor **grads_out);

/* The last error's text: the model's own, else dt_last_error(). */
const char *vit_last_error(void);

#endif
