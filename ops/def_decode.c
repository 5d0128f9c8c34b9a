/* ops/def_decode: the ops incremental decoding needs (docs/generate.md): rotary embeddings in
 * the rotate-half form with theta and llama3 frequency scaling (rope_half, its own gradient
 * by the inverse rotation), and causal attention of new queries against a key/value cache
 * (attention_cached); their definitions, public functions and validator samples. Kernels:
 * ops/k_decode.c. Attribute slots:
 *   rope_half: i[0] pos_offset, i[1] inverse, i[2] llama3, i[3] original_max;
 *              f[0] theta, f[1] factor, f[2] low_freq_factor, f[3] high_freq_factor.
 *   attention_cached: i[0] pos_offset. */
#include <string.h>

#include "ops/def_decode.h"
#include "ops/def_reduce.h"
#include "runtime/error.h"

static int same_dims(const dt_op_shape *a, int da, const dt_op_shape *b, int db)
{
    return a->dim[da] == b->dim[db];
}

/* ---- rope_half --------------------------------------------------------------------------- */

static dt_status rope_half_infer(const dt_op_sig *sig, dt_op_shape *out)
{
    const dt_op_shape *x = &sig->in[0];
    const dt_op_attrs *a = sig->attrs;
    char s[96];
    if (!dt__rd_float(x->dtype))
        return dt__error(DT_ERR_SHAPE, "rope_half: x %s is %s, not f32 or f64",
                         dt__rd_shape_str(x, s, sizeof s), dt_dtype_name(x->dtype));
    if (x->rank < 3 || x->dim[x->rank - 1] % 2 != 0)
        return dt__error(DT_ERR_SHAPE,
                         "rope_half: x %s is not [..., T, heads, head_dim] with head_dim even",
                         dt__rd_shape_str(x, s, sizeof s));
    if (a->i[0] < 0 || !(a->f[0] > 0.0))
        return dt__error(DT_ERR_INVALID_ARGUMENT,
                         "rope_half: pos_offset %lld < 0 or theta %g not positive",
                         (long long)a->i[0], a->f[0]);
    if (a->i[2] && !(a->f[1] > 0.0 && a->f[2] > 0.0 && a->f[3] > a->f[2] && a->i[3] > 0))
        return dt__error(DT_ERR_INVALID_ARGUMENT,
                         "rope_half: llama3 scaling needs factor > 0, 0 < low_freq_factor < "
                         "high_freq_factor and original_max > 0 (got %g, %g, %g, %lld)",
                         a->f[1], a->f[2], a->f[3], (long long)a->i[3]);
    *out = *x;
    return DT_OK;
}

static dt_status rope_half_backward(const dt_op_grad *g)
{
    return dt__rd_grad_flipped(g, &dt__def_rope_half);
}

static dt_status rope_half_sample(uint64_t seed, int max_dim, dt_op_sig *sig, dt_op_attrs *attrs)
{
    uint64_t s = seed;
    int rank = (int)dt__rd_randint(&s, 3, 4);
    sig->nin = 1;
    sig->in[0].dtype = DT_DTYPE_F64;
    sig->in[0].rank = rank;
    for (int d = 0; d < rank - 1; d++)
        sig->in[0].dim[d] = dt__rd_randint(&s, 1, max_dim);
    sig->in[0].dim[rank - 1] = 2 * dt__rd_randint(&s, 1, max_dim > 3 ? max_dim / 2 + 1 : 2);
    attrs->i[0] = dt__rd_randint(&s, 0, 40);
    attrs->i[1] = 0;
    attrs->i[2] = dt__rd_randint(&s, 0, 1);
    attrs->f[0] = dt__rd_randint(&s, 0, 1) ? 10000.0 : 500000.0;
    if (attrs->i[2]) { /* small original_max: every band of the scaling is reached */
        attrs->i[3] = 64;
        attrs->f[1] = 8.0;
        attrs->f[2] = 1.0;
        attrs->f[3] = 4.0;
    }
    return DT_OK;
}

const dt_op_def dt__def_rope_half = {
    .name = "rope_half",
    .nin = 1,
    .rule = "...thD->...thD",
    .infer = rope_half_infer,
    .cpu = dt__k_rope_half,
    .backward = rope_half_backward,
    .linearity = DT_OP_LINEAR_MULTI,
    .linear_in = 1,
    .doc = "rotary embeddings, rotate-half form, theta and llama3 scaling, global positions",
    .family = "transformer",
    .sample = rope_half_sample,
};

dt_status dt_rope_half(const dt_tensor *x, int64_t pos_offset, const dt_rope_opts *opts,
                       dt_tensor **out)
{
    if (!x || !out)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "dt_rope_half: NULL argument");
    dt_rope_opts o = DT_ROPE_OPTS_INIT;
    if (opts)
        o = *opts;
    dt_op_attrs at = DT_OP_ATTRS_INIT;
    at.i[0] = pos_offset;
    at.i[2] = o.llama3 != 0;
    at.i[3] = o.llama3 ? o.original_max : 0;
    at.f[0] = o.theta;
    if (o.llama3) {
        at.f[1] = o.factor;
        at.f[2] = o.low_freq_factor;
        at.f[3] = o.high_freq_factor;
    }
    return dt__op_run1(&dt__def_rope_half, x, &at, out);
}

/* ---- attention_cached -------------------------------------------------------------------- */

static dt_status cached_infer(const dt_op_sig *sig, dt_op_shape *out)
{
    const dt_op_shape *q = &sig->in[0], *k = &sig->in[1], *v = &sig->in[2];
    char s0[96], s1[96], s2[96];
    int64_t pos = sig->attrs->i[0];
    if (!dt__rd_float(q->dtype) || k->dtype != q->dtype || v->dtype != q->dtype || q->rank != 5 ||
        k->rank != 4 || v->rank != 4 || memcmp(k->dim, v->dim, 4 * sizeof k->dim[0]) != 0 ||
        !same_dims(q, 0, k, 0) || !same_dims(q, 2, k, 2) || !same_dims(q, 4, k, 3))
        return dt__error(DT_ERR_SHAPE,
                         "attention_cached: q %s (%s), k %s, v %s are not q [B, T, KV, G, D], "
                         "k and v [B, S, KV, D] of one float dtype",
                         dt__rd_shape_str(q, s0, sizeof s0), dt_dtype_name(q->dtype),
                         dt__rd_shape_str(k, s1, sizeof s1), dt__rd_shape_str(v, s2, sizeof s2));
    if (pos < 0 || pos + q->dim[1] > k->dim[1])
        return dt__error(DT_ERR_SHAPE,
                         "attention_cached: queries at positions %lld..%lld beyond the cache's "
                         "%lld positions",
                         (long long)pos, (long long)(pos + q->dim[1] - 1), (long long)k->dim[1]);
    *out = *q;
    return DT_OK;
}

static dt_status cached_sample(uint64_t seed, int max_dim, dt_op_sig *sig, dt_op_attrs *attrs)
{
    uint64_t s = seed;
    int64_t b = dt__rd_randint(&s, 1, 2), kv = dt__rd_randint(&s, 1, 3),
            g = dt__rd_randint(&s, 1, 3), d = dt__rd_randint(&s, 1, max_dim),
            t = dt__rd_randint(&s, 1, max_dim), pos = dt__rd_randint(&s, 0, max_dim - t),
            cap = dt__rd_randint(&s, pos + t, max_dim);
    sig->nin = 3;
    const int64_t qd[5] = {b, t, kv, g, d}, kd[4] = {b, cap, kv, d};
    for (int i = 0; i < 3; i++) {
        sig->in[i].dtype = DT_DTYPE_F64;
        sig->in[i].rank = i == 0 ? 5 : 4;
        memcpy(sig->in[i].dim, i == 0 ? qd : kd, (size_t)sig->in[i].rank * sizeof qd[0]);
    }
    attrs->i[0] = pos;
    return DT_OK;
}

const dt_op_def dt__def_attention_cached = {
    .name = "attention_cached",
    .nin = 3,
    .rule = "btkgD,bSkD,bSkD->btkgD",
    .infer = cached_infer,
    .cpu = dt__k_attention_cached,
    .doc = "causal attention of new queries (grouped per kv head) against a key/value cache",
    .family = "transformer",
    .sample = cached_sample,
};

dt_status dt_attention_cached(const dt_tensor *q, const dt_tensor *k_cache,
                              const dt_tensor *v_cache, int64_t pos_offset, dt_tensor **out)
{
    if (!q || !k_cache || !v_cache || !out)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "dt_attention_cached: NULL argument");
    dt_op_attrs at = DT_OP_ATTRS_INIT;
    at.i[0] = pos_offset;
    const dt_tensor *in[3] = {q, k_cache, v_cache};
    return dt__op_run(&dt__def_attention_cached, in, 3, &at, NULL, out);
}

const dt_op_def *const dt__defs_decode[] = {&dt__def_rope_half, &dt__def_attention_cached, NULL};
