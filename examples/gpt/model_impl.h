/* gpt/model_impl: the GPT's internals shared by model.c and a test-side backward pass
 * (tests/examples/gpt_manual_backward.c, the hand-written reference the tape is measured
 * against). Private: not installed, not for train_gpt.c or pipe.c (they use model.h). */
#ifndef GPT_MODEL_IMPL_H
#define GPT_MODEL_IMPL_H

#include <stdint.h>

#include <dtensor/dtensor.h>

#include "model.h"

#define MAX_LAYERS 16
#define EPS        1e-5f

/* Per-layer parameter slots: weights (decayed) and layer norms (not decayed); the Llama
 * variant's: q, k, v, o, gate, up, down and its two RMS norm gains. */
enum { W_Q, W_K, W_V, W_O, W_FC, W_FC2, W_PER_LAYER };
enum { N_LN1G, N_LN1B, N_LN2G, N_LN2B, N_PER_LAYER };
enum { LW_Q, LW_K, LW_V, LW_O, LW_GATE, LW_UP, LW_DOWN, LW_PER_LAYER };
enum { LN_ATTN, LN_MLP, LN_PER_LAYER };
#define MAX_PER_LAYER 16

/* Every tensor of one pass, destroyed together at the end. */
#define TAPE_MAX 1024
typedef struct tape {
    dt_tensor *t[TAPE_MAX];
    int n;
} tape;

typedef struct unit_hook_arg {
    const gpt *m;
    dt_tape *tape;
} unit_hook_arg;

/* The activations of one block kept for the backward pass. */
typedef struct acts {
    dt_tensor *x, *a, *q, *k, *v, *y, *x1, *b, *h, *g;
} acts;

/* One forward pass: what it made (owned by tp) and what a backward pass reads. */
typedef struct pass {
    tape tp;
    dt_tape *tape;                     /* the recording autograd tape (NULL: nothing records) */
    dt_tensor *pf[4 * MAX_LAYERS + 8]; /* f32 views of the layer norms and embeddings */
    dt_tensor *pos;                    /* position ids [rows, T] */
    acts blk[MAX_LAYERS];
    dt_tensor *xl, *f, *logits;
    unit_hook_arg ha;    /* the segments' hook argument (lives as long as the pass) */
    int head_open;       /* the head's segment is still open (closed after the loss) */
    const dt_tensor *in; /* pipeline stage without the embeddings: its input activation */
} pass;

/* A backward pass run instead of the tape's (gpt__set_backward_hook): called by gpt_grads_each
 * after a forward pass `p` over ids that recorded nothing, with y its targets and dloss the
 * seed; puts each parameter's gradient (f32, owned by the caller's array) into g[slot] and
 * tells fn (may be NULL) of it at once. A refusal sets its message with gpt__set_error. */
typedef dt_status (*gpt__backward_fn)(gpt *m, pass *p, const dt_tensor *ids, const dt_tensor *y,
                                      float dloss, dt_tensor **g, gpt_grad_fn fn, void *arg);

struct gpt {
    dt_mesh *mesh;
    gpt_config cfg;
    dt_dtype dtype;
    int nparams, ndecay;
    dt_tensor **param;
    char **names;
    /* Stage 3 (gpt_attach): the parameters' owner; the groups are slot ranges, per unit
     * (0 embeddings, 1 + l block l, L + 1 the head) a weight group and a norm group. */
    dt_zero *zero;
    int ngroups;
    int64_t count;
    dt_layout *l_act, *l_ids, *l_col, *l_row, *l_vocab, *l_rep1, *l_rep2, *l_rep3;
    dt_layout *l_gath; /* sequence parallel: the column-parallel matmuls' input, sequence whole */
    int checkpoint_blocks;      /* gpt_set_backward */
    gpt__backward_fn backward;  /* NULL: the tape's (gpt__set_backward_hook) */
    int nemb, wpl, npl, nfinal; /* slots: embeddings, weights and norms per layer, final norm */
    uint64_t peak_saved;        /* the most bytes a tape held for backward (gpt_peak_saved) */
    int64_t recomputed;         /* calls the last backward re-ran (gpt_recomputed) */
    float dropout;              /* gpt_set_dropout: residual and attention dropout */
    uint64_t drop_seed, drop_pass;
    int drop_on;    /* a training pass (tape_grads) runs */
    int u_lo, u_hi; /* pipeline stage: the units [u_lo, u_hi) (gpt_set_units) */
};

/* Models created after this call make their gradients with fn instead of the tape (NULL: the
 * tape again). For test programs only (tests/examples/train_gpt_manual.c). */
void gpt__set_backward_hook(gpt__backward_fn fn);

/* Sets the message gpt_last_error returns (printf style). */
void gpt__set_error(const char *fmt, ...);

/* Slot numbers. */
static inline int p_wte(void)
{
    return 0;
}
static inline int p_wpe(void)
{
    return 1;
}
static inline int p_w(const gpt *m, int l, int w)
{
    return m->nemb + m->wpl * l + w;
}
static inline int p_wlm(const gpt *m)
{
    return m->nemb + m->wpl * (int)m->cfg.layers;
}
static inline int p_n(const gpt *m, int l, int w)
{
    return m->ndecay + m->npl * l + w;
}
static inline int p_lnf(const gpt *m, int beta)
{
    return m->ndecay + m->npl * (int)m->cfg.layers + beta;
}

/* t (may be NULL) into the pass's tensors, destroyed by tape_free; returns t. */
static inline dt_tensor *keep(tape *tp, dt_tensor *t)
{
    if (t && tp->n < TAPE_MAX)
        tp->t[tp->n++] = t;
    return t;
}

static inline void tape_free(tape *tp)
{
    for (int i = 0; i < tp->n; i++)
        dt_tensor_destroy(tp->t[i]);
    tp->n = 0;
}

/* `st = call`, and on success its output `var` kept in tape tp. */
#define K(tp, call, var) ((st = (call)) == DT_OK ? (keep((tp), (var)), DT_OK) : st)

/* Parameter `slot`: the model's own, or (stage 3) the optimizer's gathered one (NULL, with
 * the optimizer's message, when its unit is not gathered). Borrowed. */
dt_tensor *gpt__param_of(const gpt *m, int slot);
/* Parameter slot as f32 (layer norms and embeddings run in f32; matmuls read bf16/f16
 * weights directly): the parameter itself, or a cast kept in the pass. */
dt_status gpt__f32_param(const gpt *m, pass *p, int slot, dt_tensor **out);
/* Stage 3: unit u's parameters gathered (u >= 0), unit `next`'s (>= 0) prefetched; and
 * unit u's released. Nothing in stages 0-2. Collective. */
dt_status gpt__unit_in(const gpt *m, int u, int next);
dt_status gpt__unit_out(const gpt *m, int u);

#endif
