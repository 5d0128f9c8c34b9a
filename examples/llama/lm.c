/* llama/lm: an HF decoder (GPT-2 or the Llama family) loaded onto a mesh box by box: its
 * parameters, their layouts and slots, the activation layouts (lm.h; the cached forward pass
 * is lm_forward.c's). */
#include "lm.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lm_impl.h"

static char own_error[256];

void lm__set_error(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(own_error, sizeof own_error, fmt, ap);
    va_end(ap);
}

const char *lm_last_error(void)
{
    return own_error[0] ? own_error : dt_last_error();
}

const dt_hf_config *lm_config(const lm *m)
{
    return &m->cfg;
}
int lm_num_params(const lm *m)
{
    return m->n;
}
dt_tensor *const *lm_params(const lm *m)
{
    return m->p;
}
const char *const *lm_param_names(const lm *m)
{
    return (const char *const *)m->names;
}

uint64_t lm_weight_bytes(const lm *m)
{
    uint64_t b = 0;
    for (int i = 0; i < m->n; i++)
        b += (uint64_t)dt_tensor_numel(m->p[i]) * 4u;
    return b;
}

void lm_destroy(lm *m)
{
    if (!m)
        return;
    lm__release(m);
    for (int i = 0; i < m->n; i++) {
        if (m->p && !m->zero)
            dt_tensor_destroy(m->p[i]);
        if (m->names)
            free(m->names[i]);
    }
    free(m->p);
    free(m->names);
    free(m->ly);
    free(m->opt);
    dt_mesh_destroy(m->mesh);
    free(m);
}

/* The specs of parameter `name` (rank 1 or 2) on this model's mesh. */
static void param_specs(const lm *m, const char *name, int rank, const char **s)
{
    const char *u = DT_UNSHARDED, *tp = m->tp;

    const char *leaf = name;
    s[0] = s[1] = u;
    if (!strcmp(name, "embed") || !strcmp(name, "head") || !strcmp(name, "wte")) {
        s[0] = tp; /* vocabulary rows */
        return;
    }
    if (!strncmp(name, "h.", 2) || !strncmp(name, "layers.", 7)) {
        /* "h.{l}.q.w" / "layers.{l}.q.w": the part after the layer number. */
        const char *p = strchr(name, '.');
        p = p ? strchr(p + 1, '.') : NULL;
        leaf = p ? p + 1 : name;
    }
    int is_w = rank == 2;
    if (!strncmp(leaf, "q.", 2)) {
        if (m->q_sharded)
            s[is_w] = tp;
    } else if (!strncmp(leaf, "k.", 2) || !strncmp(leaf, "v.", 2)) {
        if (m->kv_sharded)
            s[is_w] = tp;
    } else if (!strcmp(leaf, "o.w")) {
        if (m->q_sharded)
            s[0] = tp;
    } else if (!strcmp(leaf, "fc.w") || !strcmp(leaf, "fc.b") || !strcmp(leaf, "gate.w") ||
               !strcmp(leaf, "up.w")) {
        if (m->f_sharded)
            s[is_w] = tp;
    } else if (!strcmp(leaf, "proj.w") || !strcmp(leaf, "down.w")) {
        if (m->f_sharded)
            s[0] = tp;
    }
}

/* Points the named slots at parameter i. */
void lm__bind(lm *m, int i)
{
    const char *name = m->names[i];
    dt_tensor *t = m->p[i];
    if (!strcmp(name, "embed") || !strcmp(name, "wte")) {
        m->embed = t;
        if (!m->head)
            m->head = t;
        return;
    }
    if (!strcmp(name, "head")) {
        m->head = t;
        return;
    }
    if (!strcmp(name, "wpe")) {
        m->pos = t;
        return;
    }
    if (!strcmp(name, "norm") || !strcmp(name, "lnf.g")) {
        m->nfg = t;
        return;
    }
    if (!strcmp(name, "lnf.b")) {
        m->nfb = t;
        return;
    }
    long l = -1;
    const char *leaf = NULL;
    if (!strncmp(name, "h.", 2))
        l = strtol(name + 2, (char **)&leaf, 10);
    else if (!strncmp(name, "layers.", 7))
        l = strtol(name + 7, (char **)&leaf, 10);
    if (l < 0 || l >= m->cfg.layers || !leaf || *leaf != '.')
        return;
    leaf++;
    layer *y = &m->ly[l];
    static const struct {
        const char *name;
        size_t at;
    } slots[] = {
        {"ln1.g", offsetof(layer, n1g)},     {"ln1.b", offsetof(layer, n1b)},
        {"attn_norm", offsetof(layer, n1g)}, {"q.w", offsetof(layer, qw)},
        {"q.b", offsetof(layer, qb)},        {"k.w", offsetof(layer, kw)},
        {"k.b", offsetof(layer, kb)},        {"v.w", offsetof(layer, vw)},
        {"v.b", offsetof(layer, vb)},        {"o.w", offsetof(layer, ow)},
        {"o.b", offsetof(layer, ob)},        {"ln2.g", offsetof(layer, n2g)},
        {"ln2.b", offsetof(layer, n2b)},     {"mlp_norm", offsetof(layer, n2g)},
        {"fc.w", offsetof(layer, w1)},       {"fc.b", offsetof(layer, b1)},
        {"gate.w", offsetof(layer, w1)},     {"up.w", offsetof(layer, w3)},
        {"proj.w", offsetof(layer, w2)},     {"proj.b", offsetof(layer, b2)},
        {"down.w", offsetof(layer, w2)},
    };
    for (size_t k = 0; k < sizeof slots / sizeof slots[0]; k++)
        if (!strcmp(leaf, slots[k].name))
            *(dt_tensor **)((char *)y + slots[k].at) = t;
}

void lm__rebind(lm *m)
{
    memset(m->ly, 0, (size_t)m->cfg.layers * sizeof *m->ly);
    m->embed = m->head = m->pos = m->nfg = m->nfb = NULL;
    for (int i = 0; i < m->n; i++)
        lm__bind(m, i);
}

dt_status lm__build(lm *m, const dt_foreign_map_entry *map, int count)
{
    const dt_hf_config *c = &m->cfg;
    const dt_mesh *mesh = m->mesh;
    dt_status st = DT_OK;
    int md = dt_mesh_dim_index(mesh, "model");
    int64_t M = md >= 0 ? dt_mesh_dim_size(mesh, md) : 1;
    m->tp = md >= 0 ? "model" : DT_UNSHARDED;
    m->q_sharded = c->heads % M == 0;
    m->kv_sharded = m->q_sharded && c->kv_heads % M == 0;
    m->f_sharded = c->intermediate % M == 0;
    m->p = calloc((size_t)count, sizeof *m->p);
    m->names = calloc((size_t)count, sizeof *m->names);
    m->ly = calloc((size_t)c->layers, sizeof *m->ly);
    if (!m->p || !m->names || !m->ly)
        st = DT_ERR_NO_MEMORY;
    for (int i = 0; st == DT_OK && i < count; i++) {
        const char *s[2];
        dt_layout *l = NULL;
        param_specs(m, map[i].name, map[i].rank, s);
        m->names[i] = strdup(map[i].name);
        m->n = i + 1;
        if (!m->names[i])
            st = DT_ERR_NO_MEMORY;
        if (st == DT_OK)
            st = dt_layout_create(mesh, map[i].rank, s, &l);
        if (st == DT_OK)
            st = dt_tensor_zeros(l, DT_DTYPE_F32, map[i].shape, &m->p[i]);
        dt_layout_destroy(l);
    }
    for (int i = 0; st == DT_OK && i < m->n; i++)
        lm__bind(m, i);
    return st;
}

void lm__rope_opts(const lm *m, dt_rope_opts *out)
{
    const dt_hf_config *c = &m->cfg;
    dt_rope_opts o = DT_ROPE_OPTS_INIT;
    o.theta = c->rope_theta;
    o.llama3 = c->rope_llama3;
    if (c->rope_llama3) {
        o.factor = c->rope_factor;
        o.low_freq_factor = c->rope_low_freq_factor;
        o.high_freq_factor = c->rope_high_freq_factor;
        o.original_max = c->rope_original_max;
    }
    *out = o;
}

dt_status lm_load(const dt_mesh *mesh, const char *dir, lm **out)
{
    own_error[0] = '\0';
    lm *m = calloc(1, sizeof *m);
    if (!m)
        return DT_ERR_NO_MEMORY;
    m->mesh = dt_mesh_retain(mesh);
    dt_foreign *src = NULL;
    dt_foreign_map_entry *map = NULL;
    int count = 0;
    dt_status st = dt_hf_config_read(dir, &m->cfg);
    if (st == DT_OK)
        st = dt_foreign_open(dir, &src);
    const dt_hf_config *c = &m->cfg;
    if (st == DT_OK && c->layers > MAX_LAYERS) {
        lm__set_error("%s: %lld layers (at most %d)", dir, (long long)c->layers, MAX_LAYERS);
        st = DT_ERR_UNSUPPORTED;
    }
    if (st == DT_OK && c->arch == DT_HF_GPT2) {
        dt_foreign_gpt2_config g;
        st = dt_foreign_gpt2_map(src, 0, &map, &count, &g);
        if (st == DT_OK && (g.n_layer != c->layers || g.n_embd != c->hidden)) {
            lm__set_error("%s: config.json and the weights disagree on n_layer or n_embd", dir);
            st = DT_ERR_SHAPE;
        }
    } else if (st == DT_OK) {
        st = dt_foreign_llama_map(src, c, &map, &count);
    }
    dt_foreign_view *views = NULL;
    if (st == DT_OK)
        st = lm__build(m, map, count);
    if (st == DT_OK && !(views = calloc((size_t)count, sizeof *views)))
        st = DT_ERR_NO_MEMORY;
    for (int i = 0; st == DT_OK && i < count; i++)
        views[i] = map[i].view;
    if (st == DT_OK)
        st = dt_foreign_restore(src, count, views, m->p);
    free(views);
    dt_foreign_map_free(map, count);
    dt_foreign_close(src);
    if (st != DT_OK) {
        lm_destroy(m);
        return st;
    }
    *out = m;
    return DT_OK;
}

void lm__layouts_free(lm_layouts *l)
{
    dt_layout *ls[] = {l->act, l->ids, l->q, l->kv, l->rep3, l->sp};
    for (size_t i = 0; i < sizeof ls / sizeof ls[0]; i++)
        dt_layout_destroy(ls[i]);
    memset(l, 0, sizeof *l);
}

dt_status lm__layouts(const lm *m, int64_t rows, lm_layouts *out)
{
    int bd = dt_mesh_dim_index(m->mesh, "batch");
    const char *b = bd >= 0 && rows % dt_mesh_dim_size(m->mesh, bd) == 0 ? "batch" : DT_UNSHARDED;
    const char *u = DT_UNSHARDED;
    const char *s_act[3] = {b, u, u};
    const char *s_q[3] = {b, u, m->q_sharded ? m->tp : u};
    const char *s_kv[3] = {b, u, m->kv_sharded ? m->tp : u};
    lm_layouts l;
    memset(&l, 0, sizeof l);
    dt_status st;
    if ((st = dt_layout_create(m->mesh, 3, s_act, &l.act)) != DT_OK ||
        (st = dt_layout_create(m->mesh, 2, s_act, &l.ids)) != DT_OK ||
        (st = dt_layout_create(m->mesh, 3, s_q, &l.q)) != DT_OK ||
        (st = dt_layout_create(m->mesh, 3, s_kv, &l.kv)) != DT_OK ||
        (st = dt_layout_replicated(m->mesh, 3, &l.rep3)) != DT_OK ||
        (m->seqpar && strcmp(m->tp, "model") == 0 &&
         (st = dt_layout_create(m->mesh, 3, (const char *[]){b, "model", u}, &l.sp)) != DT_OK)) {
        lm__layouts_free(&l);
        return st;
    }
    *out = l;
    return DT_OK;
}

dt_status lm_set_param(lm *m, int i, const dt_tensor *t)
{
    dt_tensor *f = NULL, *r = NULL;
    dt_status st = DT_OK;
    if (i < 0 || i >= m->n || dt_tensor_rank(t) != dt_tensor_rank(m->p[i]) ||
        memcmp(dt_tensor_shape(t), dt_tensor_shape(m->p[i]),
               (size_t)dt_tensor_rank(t) * sizeof(int64_t)) != 0) {
        lm__set_error("lm_set_param: parameter %d: another shape", i);
        return DT_ERR_SHAPE;
    }
    if (dt_tensor_dtype(t) != DT_DTYPE_F32)
        st = dt_cast(t, DT_DTYPE_F32, &f);
    if (st == DT_OK)
        st = dt_relayout(f ? f : t, dt_tensor_layout(m->p[i]), &r);
    dt_tensor_destroy(f);
    if (st != DT_OK)
        return st;
    dt_tensor_destroy(m->p[i]);
    m->p[i] = r;
    lm__rebind(m);
    return DT_OK;
}

/* A zeroed tensor whose local components are written from their boxes of the host array
 * (dt_tensor_local_write: any device kind, no communication). */
dt_status lm__from_host(const dt_layout *layout, dt_dtype dtype, const int64_t *shape,
                        const void *global, dt_tensor **out)
{
    dt_tensor *t = NULL;
    int rank = dt_layout_rank(layout);
    size_t es = dt_dtype_size(dtype);
    dt_status st = dt_tensor_zeros(layout, dtype, shape, &t);
    for (int i = 0; st == DT_OK && i < dt_tensor_num_local(t); i++) {
        const DLTensor *c = dt_tensor_local(t, i);
        const int64_t *off = dt_tensor_local_offset(t, i);
        int64_t n = 1;
        for (int d = 0; d < rank; d++)
            n *= c->shape[d];
        unsigned char *box = malloc((size_t)(n ? n : 1) * es);
        if (!box) {
            st = DT_ERR_NO_MEMORY;
            break;
        }
        /* Row by row of the last dim: the global index of each row's first element. */
        int64_t last = rank ? c->shape[rank - 1] : 1, rows = last ? n / last : 0;
        for (int64_t r = 0; r < rows; r++) {
            int64_t rem = r, g = 0, stride = 1;
            for (int d = rank - 1; d >= 0; d--) {
                int64_t idx = d == rank - 1 ? off[d] : off[d] + rem % c->shape[d];
                if (d != rank - 1)
                    rem /= c->shape[d];
                g += idx * stride;
                stride *= shape[d];
            }
            memcpy(box + (size_t)(r * last) * es, (const unsigned char *)global + (size_t)g * es,
                   (size_t)last * es);
        }
        st = dt_tensor_local_write(t, i, box, (size_t)n * es);
        free(box);
    }
    if (st != DT_OK) {
        dt_tensor_destroy(t);
        return st;
    }
    *out = t;
    return DT_OK;
}
