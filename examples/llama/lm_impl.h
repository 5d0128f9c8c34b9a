/* llama/lm_impl: the model's internals shared by lm.c (loading, the cached forward pass) and
 * lm_train.c (the training pass on the tape). Private to examples/llama. */
#ifndef LLAMA_LM_IMPL_H
#define LLAMA_LM_IMPL_H

#include "lm.h"

#define MAX_LAYERS 256

/* One block's parameters (NULL: absent). GPT-2: w1/b1 = fc, w2/b2 = proj; Llama: w1 gate,
 * w3 up, w2 down. */
typedef struct layer {
    dt_tensor *n1g, *n1b, *qw, *qb, *kw, *kb, *vw, *vb, *ow, *ob, *n2g, *n2b;
    dt_tensor *w1, *b1, *w3, *w2, *b2;
} layer;

struct lm {
    dt_mesh *mesh;
    dt_hf_config cfg;
    int n; /* parameters */
    dt_tensor **p;
    char **names;
    layer *ly;
    dt_tensor *embed, *pos, *nfg, *nfb, *head; /* head: the tied embedding or lm_head */
    int q_sharded, kv_sharded, f_sharded;      /* over `model` */
    const char *tp;                            /* "model" or unsharded */
    int *opt;      /* lm_attach: the model's parameter at optimizer position k */
    int groups[2]; /* lm_attach: the decayed and the other parameters' groups */
    dt_zero *zero; /* stage 3 (lm_attach): the optimizer holds the parameters */
    int gathered;  /* stage 3: lm__gather'ed (p[] borrowed from the optimizer) */
    int seqpar;    /* lm_set_sequence_parallel: the training pass's activations */
};

/* Sets the message lm_last_error returns (printf style). */
void lm__set_error(const char *fmt, ...);

/* The activation layouts for `rows` sequences: [rows, n, C], ids [rows, n], q [rows, n, H*D]
 * (heads sharded on model when it divides them), k/v [rows, n, KV*D], replicated 3-D; rows
 * sharded on batch when it divides them. */
typedef struct lm_layouts {
    dt_layout *act, *ids, *q, *kv, *rep3;
    dt_layout *sp; /* sequence parallel: [rows, n, C], n sharded on model (else NULL) */
} lm_layouts;
dt_status lm__layouts(const lm *m, int64_t rows, lm_layouts *out);
void lm__layouts_free(lm_layouts *l);

/* m's parameters (m->mesh and m->cfg set) as zeroed tensors of map's names and shapes in their
 * layouts, bound to the layer slots. Collective (no communication). */
dt_status lm__build(lm *m, const dt_foreign_map_entry *map, int count);

/* Stage 3: every parameter gathered whole (p[] borrowed from the optimizer, the slots bound)
 * for a pass, and released after it. Nothing in stages 0-2. Collective. */
dt_status lm__gather(lm *m);
dt_status lm__release(lm *m);

/* The config's rotary embeddings as dt_rope_half's options (Llama). */
void lm__rope_opts(const lm *m, dt_rope_opts *out);

/* Points the layer and model slots named by parameter i at it; lm__rebind: every slot
 * cleared, then bound to p[] again. */
void lm__bind(lm *m, int i);
void lm__rebind(lm *m);

/* A tensor of `layout` holding the global host array `global` (no communication). */
dt_status lm__from_host(const dt_layout *layout, dt_dtype dtype, const int64_t *shape,
                        const void *global, dt_tensor **out);

struct lm_cache {
    const lm *m;
    int64_t rows, cap, len;
    lm_layouts l;
    dt_tensor **k, **v; /* per layer [rows, cap, KV * D] */
};

#endif
