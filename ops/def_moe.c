/* ops/def_moe: the mixture-of-experts op definitions (grouped_matmul and its weight gradient:
 * rules, shape inference, CPU kernels, backward, validator samples) and their public wrappers
 * (dtensor/moe.h). Attribute slot: i[0] = trans_w (grouped_matmul). */
#include <stdlib.h>
#include <string.h>

#include "dtensor/moe.h"
#include "mesh/mesh_group.h"
#include "ops/shape_impl.h"
#include "runtime/error.h"

static int is_float(dt_dtype t)
{
    return t == DT_DTYPE_F32 || t == DT_DTYPE_F64;
}

/* Checks x [P, R, K], w [P*G, K, N] (or [P*G, N, K] with trans), counts i64 [P, G]; writes
 * P, R, K, N, G. `what` names the op and the second operand (w or dy). */
static dt_status check3(const char *op, const dt_op_sig *sig, int wgrad, int trans, int64_t *P,
                        int64_t *R, int64_t *K, int64_t *N, int64_t *G)
{
    const dt_op_shape *x = &sig->in[0], *w = &sig->in[1], *c = &sig->in[2];
    if (x->rank != 3 || w->rank != 3 || c->rank != 2 || c->dtype != DT_DTYPE_I64 ||
        !is_float(x->dtype) || x->dtype != w->dtype)
        return dt__error(DT_ERR_SHAPE,
                         "%s: x [P, R, K] (f32/f64), %s of rank 3 and x's "
                         "dtype, counts i64 [P, G] wanted (ranks %d, %d, %d)",
                         op, wgrad ? "dy" : "w", x->rank, w->rank, c->rank);
    *P = x->dim[0];
    *R = x->dim[1];
    *K = x->dim[2];
    *G = c->dim[1];
    if (c->dim[0] != *P)
        return dt__error(DT_ERR_SHAPE, "%s: counts has %lld rows, x %lld", op, (long long)c->dim[0],
                         (long long)*P);
    if (wgrad) {
        if (w->dim[0] != *P || w->dim[1] != *R)
            return dt__error(DT_ERR_SHAPE, "%s: dy [%lld, %lld, .] for x [%lld, %lld, .]", op,
                             (long long)w->dim[0], (long long)w->dim[1], (long long)*P,
                             (long long)*R);
        *N = w->dim[2];
        return DT_OK;
    }
    int64_t wk = trans ? w->dim[2] : w->dim[1];
    *N = trans ? w->dim[1] : w->dim[2];
    if (w->dim[0] != *P * *G || wk != *K)
        return dt__error(DT_ERR_SHAPE,
                         "%s: w [%lld, %lld, %lld] for x [%lld, %lld, %lld] and "
                         "counts [%lld, %lld] (trans_w %d)",
                         op, (long long)w->dim[0], (long long)w->dim[1], (long long)w->dim[2],
                         (long long)*P, (long long)*R, (long long)*K, (long long)*P, (long long)*G,
                         trans);
    return DT_OK;
}

/* ---- grouped_matmul ----------------------------------------------------------------------- */

static dt_status gmm_infer(const dt_op_sig *sig, dt_op_shape *out)
{
    int64_t P = 0, R = 0, K = 0, N = 0, G = 0;
    dt_status st = check3("grouped_matmul", sig, 0, (int)sig->attrs->i[0], &P, &R, &K, &N, &G);
    if (st != DT_OK)
        return st;
    *out = (dt_op_shape){sig->in[0].dtype, 3, {P, R, N}};
    return DT_OK;
}

static dt_status gmm_rule(const dt_op_sig *sig, char *buf, size_t len)
{
    const char *r = sig->attrs->i[0] ? "pRk,(pG)nk,pG->pRn" : "pRk,(pG)kn,pG->pRn";
    if (strlen(r) + 1 > len)
        return DT_ERR_INVALID_ARGUMENT;
    memcpy(buf, r, strlen(r) + 1);
    return DT_OK;
}

/* The group offsets of one member's counts row into off[0..G] (off[G] = the rows used);
 * DT_ERR_INVALID_ARGUMENT for a negative count or a sum past R. */
static dt_status offsets(const char *op, const int64_t *c, int64_t G, int64_t R, int64_t *off)
{
    off[0] = 0;
    for (int64_t g = 0; g < G; g++) {
        if (c[g] < 0 || off[g] + c[g] > R)
            return dt_op_error(DT_ERR_INVALID_ARGUMENT,
                               "%s: counts row [.., %lld, ..] at group "
                               "%lld: negative or past the %lld rows",
                               op, (long long)c[g], (long long)g, (long long)R);
        off[g + 1] = off[g] + c[g];
    }
    return DT_OK;
}

/* One group's rows [r0, r1) of x [.., K] times w [K, N] (or [N, K] with trans) into out
 * [.., N]: every element a sum over k in ascending order accumulated in f64 (the loops run
 * over n innermost so they vectorise without reordering any element's sum). */
#define GMM_ROWS(T)                                                                                \
    static void gmm_rows_##T(const T *x, const T *w, T *out, double *acc, int64_t r0, int64_t r1,  \
                             int64_t K, int64_t N, int trans)                                      \
    {                                                                                              \
        int64_t sk = trans ? 1 : N, sn = trans ? K : 1;                                            \
        for (int64_t r = r0; r < r1; r++) {                                                        \
            const T *xr = x + r * K;                                                               \
            for (int64_t n = 0; n < N; n++)                                                        \
                acc[n] = 0.0;                                                                      \
            for (int64_t k = 0; k < K; k++) {                                                      \
                double xv = (double)xr[k];                                                         \
                const T *wk = w + k * sk;                                                          \
                for (int64_t n = 0; n < N; n++)                                                    \
                    acc[n] += xv * (double)wk[n * sn];                                             \
            }                                                                                      \
            for (int64_t n = 0; n < N; n++)                                                        \
                out[r * N + n] = (T)acc[n];                                                        \
        }                                                                                          \
    }
GMM_ROWS(float)
GMM_ROWS(double)

/* One device's block: local members Pl, rows R (whole), K, N its local slices, G groups. */
static dt_status gmm_cpu(const dt_op_kernel_args *a)
{
    const dt_op_buf *x = &a->in[0], *w = &a->in[1], *c = &a->in[2];
    int trans = (int)a->attrs.i[0], f64 = a->out.dtype == DT_DTYPE_F64;
    int64_t Pl = x->shape[0], R = x->shape[1], K = x->shape[2], N = a->out.shape[2];
    int64_t G = c->shape[1];
    size_t es = f64 ? sizeof(double) : sizeof(float);
    int64_t *off = malloc((size_t)(G + 1) * sizeof *off);
    double *acc = malloc((size_t)(N > 0 ? N : 1) * sizeof *acc);
    dt_status st = off && acc ? DT_OK : DT_ERR_NO_MEMORY;
    for (int64_t p = 0; p < Pl && st == DT_OK; p++) {
        st = offsets("grouped_matmul", (const int64_t *)c->data + p * G, G, R, off);
        const char *xp = (const char *)x->data + (size_t)(p * R * K) * es;
        char *op = (char *)a->out.data + (size_t)(p * R * N) * es;
        for (int64_t g = 0; g < G && st == DT_OK; g++) {
            const char *wp = (const char *)w->data + (size_t)((p * G + g) * K * N) * es;
            if (f64)
                gmm_rows_double((const double *)xp, (const double *)wp, (double *)op, acc, off[g],
                                off[g + 1], K, N, trans);
            else
                gmm_rows_float((const float *)xp, (const float *)wp, (float *)op, acc, off[g],
                               off[g + 1], K, N, trans);
        }
        if (st == DT_OK) /* padding rows */
            memset(op + (size_t)(off[G] * N) * es, 0, (size_t)((R - off[G]) * N) * es);
    }
    free(acc);
    free(off);
    return st;
}

/* y = x w:  dx = grouped(dy, w, !trans);  dw = wgrad(x, dy) (trans: wgrad(dy, x), [G, N, K]). */
static dt_status gmm_backward(const dt_op_grad *gr)
{
    int trans = (int)gr->attrs->i[0];
    dt_status st = DT_OK;
    if (gr->needs[0])
        st = dt_grouped_matmul(gr->dy, gr->in[1], gr->in[2], !trans, &gr->dx[0]);
    if (st == DT_OK && gr->needs[1])
        st = trans ? dt_grouped_matmul_wgrad(gr->dy, gr->in[0], gr->in[2], &gr->dx[1])
                   : dt_grouped_matmul_wgrad(gr->in[0], gr->dy, gr->in[2], &gr->dx[1]);
    return st;
}

static int rand_in(uint64_t *s, int lo, int hi) /* lo..hi */
{
    return lo + (int)(dt__shape_rng(s) % (uint64_t)(hi - lo + 1));
}

static dt_status gmm_sample(uint64_t seed, int max_dim, dt_op_sig *sig, dt_op_attrs *attrs)
{
    uint64_t s = seed * 0x9e3779b97f4a7c15ULL + 7;
    int64_t P = rand_in(&s, 1, 2), R = rand_in(&s, 1, max_dim), K = rand_in(&s, 1, max_dim);
    int64_t N = rand_in(&s, 1, max_dim), G = rand_in(&s, 1, 3);
    int trans = rand_in(&s, 0, 1);
    attrs->i[0] = trans;
    sig->nin = 3;
    sig->in[0] = (dt_op_shape){DT_DTYPE_F64, 3, {P, R, K}};
    sig->in[1] = trans ? (dt_op_shape){DT_DTYPE_F64, 3, {P * G, N, K}}
                       : (dt_op_shape){DT_DTYPE_F64, 3, {P * G, K, N}};
    sig->in[2] = (dt_op_shape){DT_DTYPE_I64, 2, {P, G}};
    return DT_OK;
}

/* Counts: each member's row sums to at most R (some groups empty, some padding). */
static dt_status counts_fill(const dt_op_sig *sig, int i, uint64_t seed, void *host, int64_t n)
{
    if (i != 2)
        return DT_ERR_UNSUPPORTED;
    int64_t R = sig->in[0].dim[1], G = sig->in[2].dim[1];
    uint64_t s = seed;
    for (int64_t k = 0; k < n; k += G) {
        int64_t left = R;
        for (int64_t g = 0; g < G; g++) {
            int64_t v = (int64_t)(dt__shape_rng(&s) % (uint64_t)(left + 1));
            ((int64_t *)host)[k + g] = v;
            left -= v;
        }
    }
    return DT_OK;
}

const dt_op_def dt__def_grouped_matmul = {
    .name = "grouped_matmul",
    .nin = 3,
    .rule_fn = gmm_rule,
    .infer = gmm_infer,
    .cpu = gmm_cpu,
    .backward = gmm_backward,
    .linearity = DT_OP_LINEAR_MULTI,
    .linear_in = 3u,
    .reduce = DT_REDUCE_SUM,
    .doc = "experts' grouped GEMM: y[p, rows of g] = x[p, rows of g] w[p*G+g] (counts [P, G])",
    .family = "moe",
    .sample = gmm_sample,
    .fill = counts_fill,
};

/* ---- grouped_matmul_wgrad ----------------------------------------------------------------- */

static dt_status wg_infer(const dt_op_sig *sig, dt_op_shape *out)
{
    int64_t P = 0, R = 0, K = 0, N = 0, G = 0;
    dt_status st = check3("grouped_matmul_wgrad", sig, 1, 0, &P, &R, &K, &N, &G);
    if (st != DT_OK)
        return st;
    *out = (dt_op_shape){sig->in[0].dtype, 3, {P * G, K, N}};
    return DT_OK;
}

/* dw [K, N] of one group: rows [r0, r1) added in row order, each element in f64. */
#define WG_ROWS(T)                                                                                 \
    static void wg_rows_##T(const T *x, const T *dy, T *dw, double *acc, int64_t r0, int64_t r1,   \
                            int64_t K, int64_t N)                                                  \
    {                                                                                              \
        memset(acc, 0, (size_t)(K * N) * sizeof *acc);                                             \
        for (int64_t r = r0; r < r1; r++)                                                          \
            for (int64_t k = 0; k < K; k++) {                                                      \
                double xv = (double)x[r * K + k];                                                  \
                double *ak = acc + k * N;                                                          \
                const T *dr = dy + r * N;                                                          \
                for (int64_t n = 0; n < N; n++)                                                    \
                    ak[n] += xv * (double)dr[n];                                                   \
            }                                                                                      \
        for (int64_t e = 0; e < K * N; e++)                                                        \
            dw[e] = (T)acc[e];                                                                     \
    }
WG_ROWS(float)
WG_ROWS(double)

static dt_status wg_cpu(const dt_op_kernel_args *a)
{
    const dt_op_buf *x = &a->in[0], *dy = &a->in[1], *c = &a->in[2];
    int f64 = a->out.dtype == DT_DTYPE_F64;
    int64_t Pl = x->shape[0], R = x->shape[1], K = x->shape[2], N = dy->shape[2];
    int64_t G = c->shape[1];
    size_t es = f64 ? sizeof(double) : sizeof(float);
    int64_t *off = malloc((size_t)(G + 1) * sizeof *off);
    double *acc = malloc((size_t)(K * N > 0 ? K * N : 1) * sizeof *acc);
    dt_status st = off && acc ? DT_OK : DT_ERR_NO_MEMORY;
    for (int64_t p = 0; p < Pl && st == DT_OK; p++) {
        st = offsets("grouped_matmul_wgrad", (const int64_t *)c->data + p * G, G, R, off);
        const char *xp = (const char *)x->data + (size_t)(p * R * K) * es;
        const char *dp = (const char *)dy->data + (size_t)(p * R * N) * es;
        for (int64_t g = 0; g < G && st == DT_OK; g++) {
            char *wp = (char *)a->out.data + (size_t)((p * G + g) * K * N) * es;
            if (f64)
                wg_rows_double((const double *)xp, (const double *)dp, (double *)wp, acc, off[g],
                               off[g + 1], K, N);
            else
                wg_rows_float((const float *)xp, (const float *)dp, (float *)wp, acc, off[g],
                              off[g + 1], K, N);
        }
    }
    free(acc);
    free(off);
    return st;
}

static dt_status wg_sample(uint64_t seed, int max_dim, dt_op_sig *sig, dt_op_attrs *attrs)
{
    dt_status st = gmm_sample(seed, max_dim, sig, attrs);
    int64_t P = sig->in[0].dim[0], R = sig->in[0].dim[1];
    int64_t N = attrs->i[0] ? sig->in[1].dim[1] : sig->in[1].dim[2];
    attrs->i[0] = 0;
    sig->in[1] = (dt_op_shape){DT_DTYPE_F64, 3, {P, R, N}};
    return st;
}

const dt_op_def dt__def_grouped_matmul_wgrad = {
    .name = "grouped_matmul_wgrad",
    .nin = 3,
    .rule = "pRk,pRn,pG->(pG)kn",
    .infer = wg_infer,
    .cpu = wg_cpu,
    .linearity = DT_OP_LINEAR_MULTI,
    .linear_in = 3u,
    .reduce = DT_REDUCE_SUM,
    .doc = "weight gradient of grouped_matmul: dw[p*G+g] = sum over g's rows of x^T dy",
    .family = "moe",
    .sample = wg_sample,
    .fill = counts_fill,
};

const dt_op_def *const dt__defs_moe[] = {&dt__def_grouped_matmul, &dt__def_grouped_matmul_wgrad,
                                         NULL};

/* ---- public wrappers ---------------------------------------------------------------------- */

static dt_status run3(const dt_op_def *def, const char *fn, const dt_tensor *a, const dt_tensor *b,
                      const dt_tensor *c, int trans, dt_tensor **out)
{
    if (!a || !b || !c || !out)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "%s: NULL argument", fn);
    dt_op_attrs at = DT_OP_ATTRS_INIT;
    at.i[0] = trans ? 1 : 0;
    const dt_tensor *in[3] = {a, b, c};
    dt_tensor *t = NULL;
    dt_status st = dt__op_run(def, in, 3, &at, NULL, &t);
    /* counts out of range are seen only by the client holding them: one outcome for all */
    st = dt__mesh_agree(dt_layout_mesh(dt_tensor_layout(a)), st, fn);
    if (st != DT_OK) {
        dt_tensor_destroy(t);
        return st;
    }
    *out = t;
    return DT_OK;
}

dt_status dt_grouped_matmul(const dt_tensor *x, const dt_tensor *w, const dt_tensor *counts,
                            int trans_w, dt_tensor **out)
{
    return run3(&dt__def_grouped_matmul, "dt_grouped_matmul", x, w, counts, trans_w, out);
}

dt_status dt_grouped_matmul_wgrad(const dt_tensor *x, const dt_tensor *dy, const dt_tensor *counts,
                                  dt_tensor **out)
{
    return run3(&dt__def_grouped_matmul_wgrad, "dt_grouped_matmul_wgrad", x, dy, counts, 0, out);
}
