/* ops/def_elem_rand: the random constructors and arange (no inputs: the caller's layout is
 * the output's) and the mse loss: definitions, public wrappers, mse's backward.
 * Attributes of the constructors: i[0] = rank, i[1 + d] = dims, i[9] = dtype, i[10] = seed,
 * i[11] = stream; f[0], f[1] = (lo, hi) for uniform, (mean, std) for normal, p for bernoulli.
 * mse has none. Every other slot zero. */
#include <math.h>
#include <string.h>

#include "ops/def_elem.h"
#include "runtime/error.h"

enum { A_RANK = 0, A_DIM = 1, A_DTYPE = 9, A_SEED = 10, A_STREAM = 11 };

/* "->abc": every output factor new (the caller's layout shards it). */
static dt_status ctor_rule(const dt_op_sig *sig, char *buf, size_t len)
{
    int r = (int)sig->attrs->i[A_RANK];
    if (r < 0 || r > DT_MAX_RANK || len < (size_t)r + 3)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "random: rank %d", r);
    size_t k = 0;
    buf[k++] = '-';
    buf[k++] = '>';
    for (int d = 0; d < r; d++)
        buf[k++] = dt__op_letter(d);
    buf[k] = '\0';
    return DT_OK;
}

static dt_status ctor_infer(const dt_op_sig *sig, dt_op_shape *out)
{
    const char *name = sig->user ? (const char *)sig->user : "random";
    int r = (int)sig->attrs->i[A_RANK];
    dt_dtype t = (dt_dtype)sig->attrs->i[A_DTYPE];
    if (sig->nin != 0)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "%s: takes no inputs, got %d", name,
                         sig->nin);
    if (r < 0 || r > DT_MAX_RANK)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "%s: rank %d outside 0..%d", name, r,
                         DT_MAX_RANK);
    int is_arange = strcmp(name, "arange") == 0;
    int ok = dt__elem_is_float(t) || (is_arange && (t == DT_DTYPE_I32 || t == DT_DTYPE_I64)) ||
             (strcmp(name, "random_bernoulli") == 0 && t == DT_DTYPE_U8);
    if (!ok)
        return dt__error(DT_ERR_SHAPE, "%s: dtype %s not supported", name, dt_dtype_name(t));
    out->dtype = t;
    out->rank = r;
    for (int d = 0; d < r; d++) {
        out->dim[d] = sig->attrs->i[A_DIM + d];
        if (out->dim[d] < 0)
            return dt__error(DT_ERR_INVALID_ARGUMENT, "%s: dim %d is %lld", name, d,
                             (long long)out->dim[d]);
    }
    return DT_OK;
}

#define RAND_DEF(N, OP, DOC)                                                                \
    static dt_status k_##N(const dt_op_kernel_args *a)                                      \
    {                                                                                       \
        return dt__k_random(a, OP);                                                         \
    }                                                                                       \
    const dt_op_def dt__def_##N = {.name = #N, .nin = 0, .rule_fn = ctor_rule,               \
                                   .user = (void *)#N,                                      \
                                   .infer = ctor_infer, .cpu = k_##N,                       \
                                   .reduce = DT_REDUCE_SUM, .doc = DOC, .family = "random"};

RAND_DEF(random_uniform, DT__RAND_UNIFORM, "uniform in [lo, hi) by Philox of the global index")
RAND_DEF(random_normal, DT__RAND_NORMAL, "normal(mean, std) by Box-Muller on Philox")
RAND_DEF(random_bernoulli, DT__RAND_BERNOULLI, "1 with probability p, else 0, by Philox")
RAND_DEF(arange, DT__RAND_ARANGE, "0, 1, ..., n-1")

/* The constructors' attributes, then the generic path with no inputs and the caller's
 * layout (dt_op_call shards the output's own factors: each device draws its block). */
static dt_status ctor_run(const char *name, const dt_op_def *def, const dt_layout *layout,
                          const int64_t *shape, dt_dtype dtype, double f0, double f1,
                          uint64_t seed, uint64_t stream, dt_tensor **out)
{
    if (!layout || !out)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "%s: NULL %s", name,
                         !layout ? "layout" : "output pointer");
    int r = dt_layout_rank(layout);
    if (r > 0 && !shape)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "%s: NULL shape", name);
    if (dt_layout_num_partial(layout) > 0)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "%s: the layout must not be partial", name);
    dt_op_attrs at = DT_OP_ATTRS_INIT;
    at.i[A_RANK] = r;
    for (int d = 0; d < r; d++)
        at.i[A_DIM + d] = shape[d];
    at.i[A_DTYPE] = (int64_t)dtype;
    at.i[A_SEED] = (int64_t)seed;
    at.i[A_STREAM] = (int64_t)stream;
    at.f[0] = f0;
    at.f[1] = f1;
    /* The generic path: no inputs, the layout given; each device draws its own block. */
    return dt__op_run(def, NULL, 0, &at, layout, out);
}

dt_status dt_random_uniform(const dt_layout *layout, const int64_t *shape, dt_dtype dtype,
                            double lo, double hi, uint64_t seed, uint64_t stream,
                            dt_tensor **out)
{
    if (!(lo <= hi) || !isfinite(lo) || !isfinite(hi))
        return dt__error(DT_ERR_INVALID_ARGUMENT, "random_uniform: bad range [%g, %g)", lo, hi);
    return ctor_run("random_uniform", &dt__def_random_uniform, layout, shape, dtype, lo, hi,
                    seed, stream, out);
}

dt_status dt_random_normal(const dt_layout *layout, const int64_t *shape, dt_dtype dtype,
                           double mean, double std, uint64_t seed, uint64_t stream,
                           dt_tensor **out)
{
    if (!(std >= 0.0) || !isfinite(std) || !isfinite(mean))
        return dt__error(DT_ERR_INVALID_ARGUMENT, "random_normal: bad mean %g or std %g", mean,
                         std);
    return ctor_run("random_normal", &dt__def_random_normal, layout, shape, dtype, mean, std,
                    seed, stream, out);
}

dt_status dt_random_bernoulli(const dt_layout *layout, const int64_t *shape, dt_dtype dtype,
                              double p, uint64_t seed, uint64_t stream, dt_tensor **out)
{
    if (!(p >= 0.0 && p <= 1.0))
        return dt__error(DT_ERR_INVALID_ARGUMENT, "random_bernoulli: p %g outside [0, 1]", p);
    return ctor_run("random_bernoulli", &dt__def_random_bernoulli, layout, shape, dtype, p,
                    0.0, seed, stream, out);
}

dt_status dt_arange(const dt_layout *layout, int64_t n, dt_dtype dtype, dt_tensor **out)
{
    if (layout && dt_layout_rank(layout) != 1)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "arange: the layout must have rank 1, not %d",
                         dt_layout_rank(layout));
    if (n < 0)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "arange: n is %lld", (long long)n);
    return ctor_run("arange", &dt__def_arange, layout, &n, dtype, 0.0, 0.0, 0, 0, out);
}

/* ---- mse ------------------------------------------------------------------------------- */

/* "abc,abc->": every factor contracting; a sharded one leaves the output sum-partial (each
 * block's sum of squares over the global count). */
static dt_status mse_rule(const dt_op_sig *sig, char *buf, size_t len)
{
    int r = sig->in[0].rank;
    if (len < (size_t)(2 * r + 4))
        return dt__error(DT_ERR_INVALID_ARGUMENT, "mse: no room for the rule");
    size_t k = 0;
    for (int o = 0; o < 2; o++) {
        for (int d = 0; d < r; d++)
            buf[k++] = dt__op_letter(d);
        buf[k++] = o ? '-' : ',';
    }
    buf[k++] = '>';
    buf[k] = '\0';
    return DT_OK;
}

static dt_status mse_infer(const dt_op_sig *sig, dt_op_shape *out)
{
    const dt_op_shape *p = &sig->in[0], *t = &sig->in[1];
    int same = p->rank == t->rank && p->dtype == t->dtype && dt__elem_is_float(p->dtype);
    for (int d = 0; same && d < p->rank; d++)
        same = p->dim[d] == t->dim[d];
    if (!same) {
        char b0[96], b1[96];
        return dt__error(DT_ERR_SHAPE, "mse: pred %s and target %s must have one shape and "
                         "dtype (f32 or f64)", dt__elem_shape_str(p, b0, sizeof b0),
                         dt__elem_shape_str(t, b1, sizeof b1));
    }
    memset(out, 0, sizeof *out);
    out->dtype = p->dtype;
    return DT_OK;
}

/* dpred = 2 (pred - target) dy / N, dtarget = -dpred. */
static dt_status mse_bw(const dt_op_grad *g)
{
    double n = (double)dt_tensor_numel(g->in[0]);
    dt_tensor *r = NULL, *u = NULL, *dy = NULL;
    dt_status st = DT_OK;
    /* the tape seeds a rank-0 root with an f32 tensor whatever the loss's dtype */
    if (dt_tensor_dtype(g->dy) != dt_tensor_dtype(g->in[0]))
        st = dt_cast(g->dy, dt_tensor_dtype(g->in[0]), &dy);
    else
        dy = dt_tensor_retain(g->dy);
    if (st == DT_OK)
        st = dt__op_run2(&dt__def_sub, g->in[0], g->in[1], NULL, &r);
    if (st == DT_OK)
        st = dt__op_run2(&dt__def_mul, r, dy, NULL, &u);
    for (int k = 0; k < 2 && st == DT_OK; k++)
        if (g->needs[k])
            st = dt__mul_scalar(u, (k ? -2.0 : 2.0) / n, &g->dx[k]);
    dt_tensor_destroy(r);
    dt_tensor_destroy(u);
    dt_tensor_destroy(dy);
    return st;
}

static dt_status mse_sample(uint64_t seed, int max_dim, dt_op_sig *sig, dt_op_attrs *attrs)
{
    sig->nin = 2;
    dt__elem_sample_shape(&seed, max_dim, seed % 3 == 2 ? DT_DTYPE_F32 : DT_DTYPE_F64, &sig->in[0]);
    sig->in[1] = sig->in[0];
    (void)attrs;
    return DT_OK;
}

const dt_op_def dt__def_mse = {
    .name = "mse", .nin = 2, .rule_fn = mse_rule, .infer = mse_infer, .cpu = dt__k_mse,
    .backward = mse_bw, .reduce = DT_REDUCE_SUM,
    .doc = "mean of (pred - target)^2 (rank 0; sharded inputs give a partial sum)",
    .family = "loss", .sample = mse_sample};

dt_status dt_mse(const dt_tensor *pred, const dt_tensor *target, dt_tensor **out)
{
    return dt__op_run2(&dt__def_mse, pred, target, NULL, out);
}
