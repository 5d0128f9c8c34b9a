/* llama/lm_init: a Llama-family model from a config alone, initialised at random (normal(0,
 * 0.02), the residual projections o and down scaled by 1/sqrt(2 layers), norm gains 1,
 * biases 0): the same values on every mesh (lm.h). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lm_impl.h"

/* Our names and shapes of a Llama-family config, as dt_foreign_llama_map gives them. */
static dt_status entries(const dt_hf_config *c, dt_foreign_map_entry **out, int *count_out)
{
    int per = 9 + (c->attention_bias ? 3 : 0);
    int count = 2 + per * (int)c->layers + (c->tie_word_embeddings ? 0 : 1);
    dt_foreign_map_entry *e = calloc((size_t)count, sizeof *e);
    if (!e)
        return DT_ERR_NO_MEMORY;
    int64_t C = c->hidden, Q = c->heads * c->head_dim, K = c->kv_heads * c->head_dim;
    int64_t F = c->intermediate;
    int k = 0;
    char name[128];
#define ADD(nm, r, a, b)                                                                           \
    do {                                                                                           \
        e[k].name = strdup(nm);                                                                    \
        e[k].rank = (r);                                                                           \
        e[k].shape[0] = (a);                                                                       \
        e[k].shape[1] = (b);                                                                       \
        k++;                                                                                       \
    } while (0)
    ADD("embed", 2, c->vocab, C);
    for (int64_t l = 0; l < c->layers; l++) {
        const struct {
            const char *n;
            int r;
            int64_t a, b;
            int bias;
        } w[12] = {{"attn_norm", 1, C, 0, 0}, {"q.w", 2, C, Q, 0},  {"q.b", 1, Q, 0, 1},
                   {"k.w", 2, C, K, 0},       {"k.b", 1, K, 0, 1},  {"v.w", 2, C, K, 0},
                   {"v.b", 1, K, 0, 1},       {"o.w", 2, Q, C, 0},  {"mlp_norm", 1, C, 0, 0},
                   {"gate.w", 2, C, F, 0},    {"up.w", 2, C, F, 0}, {"down.w", 2, F, C, 0}};
        for (int j = 0; j < 12; j++) {
            if (w[j].bias && !c->attention_bias)
                continue;
            snprintf(name, sizeof name, "layers.%lld.%s", (long long)l, w[j].n);
            ADD(name, w[j].r, w[j].a, w[j].b);
        }
    }
    ADD("norm", 1, C, 0);
    if (!c->tie_word_embeddings)
        ADD("head", 2, c->vocab, C);
#undef ADD
    for (int i = 0; i < k; i++)
        if (!e[i].name) {
            dt_foreign_map_free(e, count);
            return DT_ERR_NO_MEMORY;
        }
    *out = e;
    *count_out = k;
    return DT_OK;
}

static uint64_t splitmix64(uint64_t *x)
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static double normal(uint64_t *s)
{
    double u1 = ((double)(splitmix64(s) >> 11) + 0.5) * (1.0 / 9007199254740992.0);
    double u2 = (double)(splitmix64(s) >> 11) * (1.0 / 9007199254740992.0);
    return sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2);
}

dt_status lm_create_random(const dt_mesh *mesh, const dt_hf_config *cfg, uint64_t seed, lm **out)
{
    lm__set_error("%s", "");
    if (cfg->arch != DT_HF_LLAMA || cfg->layers < 1 || cfg->layers > MAX_LAYERS) {
        lm__set_error("lm_create_random: a Llama-family config of 1..%d layers", MAX_LAYERS);
        return DT_ERR_INVALID_ARGUMENT;
    }
    lm *m = calloc(1, sizeof *m);
    if (!m)
        return DT_ERR_NO_MEMORY;
    m->mesh = dt_mesh_retain(mesh);
    m->cfg = *cfg;
    dt_foreign_map_entry *map = NULL;
    int count = 0;
    dt_status st = entries(cfg, &map, &count);
    if (st == DT_OK)
        st = lm__build(m, map, count);
    uint64_t s = seed;
    double resid = 0.02 / sqrt(2.0 * (double)cfg->layers);
    for (int i = 0; st == DT_OK && i < m->n; i++) {
        int64_t n = dt_tensor_numel(m->p[i]);
        float *h = malloc((size_t)n * sizeof *h);
        if (!h) {
            st = DT_ERR_NO_MEMORY;
            break;
        }
        const char *nm = m->names[i];
        int gain = strstr(nm, "norm") != NULL, bias = strstr(nm, ".b") != NULL;
        double std = strstr(nm, ".o.w") || strstr(nm, ".down.w") ? resid : 0.02;
        for (int64_t j = 0; j < n; j++)
            h[j] = gain ? 1.0f : bias ? 0.0f : (float)(std * normal(&s));
        dt_tensor *t = NULL;
        st =
            lm__from_host(dt_tensor_layout(m->p[i]), DT_DTYPE_F32, dt_tensor_shape(m->p[i]), h, &t);
        free(h);
        if (st == DT_OK) {
            dt_tensor_destroy(m->p[i]);
            m->p[i] = t;
        }
    }
    /* The slots point at the new tensors. */
    if (st == DT_OK)
        lm__rebind(m);
    dt_foreign_map_free(map, count);
    if (st != DT_OK) {
        lm_destroy(m);
        return st;
    }
    *out = m;
    return DT_OK;
}
