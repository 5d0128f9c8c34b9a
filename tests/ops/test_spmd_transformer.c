/* The transformer ops: local kernels against f64 references written here (and their gradients
 * against central finite differences of those references), then every distributed op in
 * several layouts against the local kernels on the whole tensors (a single-device result),
 * with the natural output layouts the docs promise. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "ops/ops_impl.h"
#include "ops_test_util.h"

#define B 4
#define T 5
#define C 8
#define H 4
#define V 11
#define N (B * T * C)

/* A layout of any rank from one spec per dim ("b", "m", "x" or NULL) and an optional sum-partial
 * mesh dim. */
static dt_layout *lay(const dt_mesh *m, int rank, const char *const *specs, const char *partial)
{
    const char *s[DT_MAX_RANK];
    for (int i = 0; i < rank; i++)
        s[i] = specs && specs[i] ? specs[i] : DT_UNSHARDED;
    dt_reduce_op op = DT_REDUCE_SUM;
    dt_layout *l = NULL;
    DT_ASSERT_OK(dt_layout_create_partial(m, rank, s, partial ? 1 : 0, &partial, &op, &l));
    return l;
}

/* ---- f64 references --------------------------------------------------------------------- */

static void ref_layer_norm(int rows, int cols, const double *x, const double *g,
                           const double *b, double *y)
{
    for (int i = 0; i < rows; i++) {
        double mu = 0, var = 0;
        for (int j = 0; j < cols; j++)
            mu += x[i * cols + j] / cols;
        for (int j = 0; j < cols; j++)
            var += (x[i * cols + j] - mu) * (x[i * cols + j] - mu) / cols;
        for (int j = 0; j < cols; j++)
            y[i * cols + j] = (x[i * cols + j] - mu) / sqrt(var + 1e-5) * g[j] + b[j];
    }
}

static void ref_attention(const double *q, const double *k, const double *v, int heads,
                          double *y)
{
    int hd = C / heads;
    for (int b = 0; b < B; b++)
        for (int h = 0; h < heads; h++)
            for (int t = 0; t < T; t++) {
                double s[T], mx = -INFINITY, sum = 0;
                for (int j = 0; j <= t; j++) {
                    s[j] = 0;
                    for (int d = 0; d < hd; d++)
                        s[j] += q[(b * T + t) * C + h * hd + d] * k[(b * T + j) * C + h * hd + d];
                    s[j] /= sqrt((double)hd);
                    mx = s[j] > mx ? s[j] : mx;
                }
                for (int j = 0; j <= t; j++)
                    sum += (s[j] = exp(s[j] - mx));
                for (int d = 0; d < hd; d++) {
                    double acc = 0;
                    for (int j = 0; j <= t; j++)
                        acc += s[j] / sum * v[(b * T + j) * C + h * hd + d];
                    y[(b * T + t) * C + h * hd + d] = acc;
                }
            }
}

static double ref_xent(int rows, int vocab, const double *x, const int32_t *labels)
{
    double total = 0;
    for (int i = 0; i < rows; i++) {
        double mx = -INFINITY, s = 0;
        for (int j = 0; j < vocab; j++)
            mx = x[i * vocab + j] > mx ? x[i * vocab + j] : mx;
        for (int j = 0; j < vocab; j++)
            s += exp(x[i * vocab + j] - mx);
        total += log(s) + mx - x[i * vocab + labels[i]];
    }
    return total / rows;
}

static void widen(const float *x, double *y, int n)
{
    for (int i = 0; i < n; i++)
        y[i] = x[i];
}

static double dot(const double *a, const float *w, int n)
{
    double s = 0;
    for (int i = 0; i < n; i++)
        s += a[i] * w[i];
    return s;
}

/* ---- local kernels ---------------------------------------------------------------------- */

static void test_layer_norm_kernel_matches_reference_and_finite_differences(void)
{
    enum { ROWS = 6 };
    float x[ROWS * C], g[C], b[C], y[ROWS * C], w[ROWS * C], dx[ROWS * C], dg[C], db[C];
    double xd[ROWS * C], gd[C], bd[C], yd[ROWS * C];
    ot_fill_real(x, ROWS * C, -2, 2, 1);
    ot_fill_real(g, C, 0.5f, 1.5f, 2);
    ot_fill_real(b, C, -1, 1, 3);
    ot_fill_real(w, ROWS * C, -1, 1, 4);
    widen(x, xd, ROWS * C);
    widen(g, gd, C);
    widen(b, bd, C);
    DT_ASSERT_OK(dt_kernel_layer_norm(ROWS, C, x, g, b, 1e-5f, y));
    ref_layer_norm(ROWS, C, xd, gd, bd, yd);
    for (int i = 0; i < ROWS * C; i++)
        CU_ASSERT(fabs(y[i] - yd[i]) < 1e-5);
    /* The gradient of L = sum(w y) against central differences of the f64 reference. */
    DT_ASSERT_OK(dt_kernel_layer_norm_grad(ROWS, C, x, g, w, 1e-5f, dx, dg, db));
    double h = 1e-6;
    for (int i = 0; i < ROWS * C; i++) {
        double f[2];
        for (int s = 0; s < 2; s++) {
            xd[i] += s ? -2 * h : h;
            ref_layer_norm(ROWS, C, xd, gd, bd, yd);
            f[s] = dot(yd, w, ROWS * C);
        }
        xd[i] += h;
        CU_ASSERT(fabs(dx[i] - (f[0] - f[1]) / (2 * h)) < 1e-4);
    }
    for (int j = 0; j < C; j++) {
        double f[2], e[2];
        for (int s = 0; s < 2; s++) {
            gd[j] += s ? -2 * h : h;
            ref_layer_norm(ROWS, C, xd, gd, bd, yd);
            f[s] = dot(yd, w, ROWS * C);
        }
        gd[j] += h;
        for (int s = 0; s < 2; s++) {
            bd[j] += s ? -2 * h : h;
            ref_layer_norm(ROWS, C, xd, gd, bd, yd);
            e[s] = dot(yd, w, ROWS * C);
        }
        bd[j] += h;
        CU_ASSERT(fabs(dg[j] - (f[0] - f[1]) / (2 * h)) < 1e-4);
        CU_ASSERT(fabs(db[j] - (e[0] - e[1]) / (2 * h)) < 1e-4);
    }
    DT_ASSERT_FAILS(dt_kernel_layer_norm(ROWS, 0, x, g, b, 1e-5f, y), DT_ERR_INVALID_ARGUMENT);
}

static void test_softmax_kernel_is_stable_along_the_middle_dim(void)
{
    /* [2, 3, 4] along the middle dim, with huge values that overflow a naive exp. */
    float x[24], y[24], dy[24], dx[24];
    ot_fill_real(x, 24, -3, 3, 5);
    x[0] = 1000.0f;
    ot_fill_real(dy, 24, -1, 1, 6);
    DT_ASSERT_OK(dt_kernel_softmax(2, 3, 4, x, y));
    DT_ASSERT_OK(dt_kernel_softmax_grad(2, 3, 4, y, dy, dx));
    for (int o = 0; o < 2; o++)
        for (int c = 0; c < 4; c++) {
            double mx = -INFINITY, s = 0, p[3], sdy = 0;
            for (int j = 0; j < 3; j++)
                mx = fmax(mx, x[o * 12 + j * 4 + c]);
            for (int j = 0; j < 3; j++)
                s += (p[j] = exp(x[o * 12 + j * 4 + c] - mx));
            for (int j = 0; j < 3; j++) {
                p[j] /= s;
                sdy += p[j] * dy[o * 12 + j * 4 + c];
            }
            for (int j = 0; j < 3; j++) {
                CU_ASSERT(fabs(y[o * 12 + j * 4 + c] - p[j]) < 1e-6);
                /* Jacobian of softmax: dx_j = p_j (dy_j - sum p dy). */
                CU_ASSERT(fabs(dx[o * 12 + j * 4 + c] - p[j] * (dy[o * 12 + j * 4 + c] - sdy)) <
                          1e-6);
            }
        }
    CU_ASSERT(isfinite(y[0]) && fabs(y[0] - 1.0) < 1e-6);
}

static void test_attention_kernel_matches_reference_and_finite_differences(void)
{
    float q[N], k[N], v[N], y[N], w[N], dq[N], dk[N], dv[N];
    double qd[N], kd[N], vd[N], yd[N];
    ot_fill_real(q, N, -1, 1, 7);
    ot_fill_real(k, N, -1, 1, 8);
    ot_fill_real(v, N, -1, 1, 9);
    ot_fill_real(w, N, -1, 1, 10);
    widen(q, qd, N);
    widen(k, kd, N);
    widen(v, vd, N);
    DT_ASSERT_OK(dt_kernel_attention(B, T, H, C / H, 1, q, k, v, y));
    ref_attention(qd, kd, vd, H, yd);
    for (int i = 0; i < N; i++)
        CU_ASSERT(fabs(y[i] - yd[i]) < 1e-5);
    DT_ASSERT_OK(dt_kernel_attention_grad(B, T, H, C / H, 1, q, k, v, w, dq, dk, dv));
    double *in[3] = {qd, kd, vd};
    const float *g[3] = {dq, dk, dv};
    double h = 1e-6;
    int bad = 0;
    for (int a = 0; a < 3; a++)
        for (int i = 0; i < N; i++) {
            double f[2];
            for (int s = 0; s < 2; s++) {
                in[a][i] += s ? -2 * h : h;
                ref_attention(qd, kd, vd, H, yd);
                f[s] = dot(yd, w, N);
            }
            in[a][i] += h;
            bad += fabs(g[a][i] - (f[0] - f[1]) / (2 * h)) > 1e-4;
        }
    CU_ASSERT_EQUAL(bad, 0);
    /* The causal mask: the first query sees only the first key, so y = v there. */
    for (int d = 0; d < C; d++)
        CU_ASSERT(fabs(y[d] - v[d]) < 1e-6);
}

static void test_embedding_slices_add_up_to_the_lookup(void)
{
    enum { NID = 7, DIM = 3 };
    float table[V * DIM], out[NID * DIM], part[NID * DIM], sum[NID * DIM] = {0};
    float dout[NID * DIM], dt[V * DIM], ds[V * DIM];
    int32_t ids[NID] = {0, 10, 3, 3, 7, 5, 10};
    ot_fill_real(table, V * DIM, -1, 1, 11);
    ot_fill_real(dout, NID * DIM, -1, 1, 12);
    DT_ASSERT_OK(dt_kernel_embedding(NID, ids, 0, V, V, DIM, table, out));
    DT_ASSERT_OK(dt_kernel_embedding_grad(NID, ids, 0, V, V, DIM, dout, dt));
    for (int i = 0; i < NID; i++)
        for (int j = 0; j < DIM; j++)
            CU_ASSERT_EQUAL(out[i * DIM + j], table[ids[i] * DIM + j]);
    /* Three slices [0,4) [4,8) [8,11): their outputs add up, their gradients tile. */
    int lo[4] = {0, 4, 8, 11};
    for (int s = 0; s < 3; s++) {
        DT_ASSERT_OK(dt_kernel_embedding(NID, ids, lo[s], lo[s + 1] - lo[s], V, DIM,
                                         table + lo[s] * DIM, part));
        for (int i = 0; i < NID * DIM; i++)
            sum[i] += part[i];
        DT_ASSERT_OK(dt_kernel_embedding_grad(NID, ids, lo[s], lo[s + 1] - lo[s], V, DIM, dout,
                                              ds + lo[s] * DIM));
    }
    CU_ASSERT_EQUAL(ot_mismatches("embedding slices", sum, out, NID * DIM, 0, 0), 0);
    CU_ASSERT_EQUAL(ot_mismatches("embedding grad slices", ds, dt, V * DIM, 0, 0), 0);
    /* Row 3 was looked up twice: its gradient is the sum of both. */
    CU_ASSERT_EQUAL(dt[3 * DIM], dout[2 * DIM] + dout[3 * DIM]);
}

/* PyTorch's IndexError: an id outside the whole table fails, also on a slice of it (where
 * the in-table ids outside the slice still give zeros), naming the id and the table's rows. */
static void test_embedding_kernels_reject_ids_outside_the_table(void)
{
    enum { NID = 5, DIM = 3 };
    const int32_t bad[3] = {V, -1, INT32_MAX};
    float table[V * DIM], out[NID * DIM], dout[NID * DIM] = {0}, dt[V * DIM];
    ot_fill_real(table, V * DIM, -1, 1, 14);
    for (int b = 0; b < 3; b++) {
        int32_t ids[NID] = {0, 10, 3, 3, 7};
        ids[3] = bad[b];
        char want[64];
        snprintf(want, sizeof want, "id %d (position 3)", (int)bad[b]);
        for (int slice = 0; slice < 2; slice++) {
            int64_t lo = slice ? 4 : 0, rows = slice ? 4 : V;
            DT_ASSERT_FAILS(dt_kernel_embedding(NID, ids, lo, rows, V, DIM, table + lo * DIM, out),
                            DT_ERR_INVALID_ARGUMENT);
            DT_ASSERT_ERROR_MENTIONS(want);
            DT_ASSERT_ERROR_MENTIONS("table of 11 rows");
            DT_ASSERT_FAILS(dt_kernel_embedding_grad(NID, ids, lo, rows, V, DIM, dout, dt),
                            DT_ERR_INVALID_ARGUMENT);
            DT_ASSERT_ERROR_MENTIONS(want);
        }
    }
    /* A slice reaching past the table is refused too. */
    int32_t ok[NID] = {0, 1, 2, 3, 4};
    DT_ASSERT_FAILS(dt_kernel_embedding(NID, ok, 8, 4, V, DIM, table, out),
                    DT_ERR_INVALID_ARGUMENT);
}

static void test_vocab_xent_pieces_match_the_full_softmax_cross_entropy(void)
{
    enum { ROWS = 6 };
    float x[ROWS * V], mx[ROWS], se[ROWS] = {0}, tg[ROWS] = {0}, s1[ROWS], t1[ROWS], loss;
    float full, dfull[ROWS * V], d[ROWS * V];
    int32_t labels[ROWS] = {0, 10, 4, 5, 3, 9};
    ot_fill_real(x, ROWS * V, -4, 4, 13);
    DT_ASSERT_OK(dt_kernel_reduce_axis(DT_REDUCE_MAX, ROWS, V, 1, x, mx));
    /* Two slices of the vocabulary [0,5) and [5,11), columns taken out of each row. */
    float xs[ROWS * V];
    int lo[3] = {0, 5, 11};
    for (int s = 0; s < 2; s++) {
        int w = lo[s + 1] - lo[s];
        for (int i = 0; i < ROWS; i++)
            memcpy(xs + i * w, x + i * V + lo[s], (size_t)w * sizeof(float));
        DT_ASSERT_OK(dt_kernel_vocab_xent_stats(ROWS, w, xs, mx, lo[s], V, labels, s1, t1));
        for (int i = 0; i < ROWS; i++) {
            se[i] += s1[i];
            tg[i] += t1[i];
        }
    }
    DT_ASSERT_OK(dt_kernel_vocab_xent_loss(ROWS, mx, se, tg, labels, 1.0f / ROWS, &loss));
    DT_ASSERT_OK(dt_kernel_softmax_xent(ROWS, V, x, labels, 1.0f / ROWS, &full));
    double xd[ROWS * V];
    widen(x, xd, ROWS * V);
    CU_ASSERT(fabs(loss - ref_xent(ROWS, V, xd, labels)) < 1e-5);
    CU_ASSERT(fabs(loss - full) < 1e-5);
    DT_ASSERT_OK(dt_kernel_vocab_xent_grad(ROWS, V, x, mx, se, 0, labels, 1.0f / ROWS, d));
    DT_ASSERT_OK(dt_kernel_softmax_xent_grad(ROWS, V, x, labels, 1.0f / ROWS, dfull));
    CU_ASSERT_EQUAL(ot_mismatches("vocab xent grad", d, dfull, ROWS * V, 1e-7f, 1e-5f), 0);
    /* A negative label ignores its row: no loss, zero gradient. */
    float l5;
    labels[2] = -1;
    DT_ASSERT_OK(dt_kernel_vocab_xent_stats(ROWS, V, x, mx, 0, V, labels, s1, t1));
    DT_ASSERT_OK(dt_kernel_vocab_xent_loss(ROWS, mx, s1, t1, labels, 1.0f / ROWS, &l5));
    DT_ASSERT_OK(dt_kernel_vocab_xent_grad(ROWS, V, x, mx, s1, 0, labels, 1.0f / ROWS, d));
    double xr[ROWS * V];
    int32_t kept[ROWS - 1];
    for (int i = 0, o = 0; i < ROWS; i++)
        if (i != 2) {
            widen(x + i * V, xr + o * V, V);
            kept[o++] = labels[i];
        }
    CU_ASSERT(fabs(l5 - ref_xent(ROWS - 1, V, xr, kept) * (ROWS - 1) / ROWS) < 1e-5);
    for (int j = 0; j < V; j++)
        CU_ASSERT_EQUAL(d[2 * V + j], 0.0f);
    labels[2] = V;
    DT_ASSERT_FAILS(dt_kernel_vocab_xent_stats(ROWS, V, x, mx, 0, V, labels, s1, t1),
                    DT_ERR_INVALID_ARGUMENT);
    DT_ASSERT_ERROR_MENTIONS("row 2");
}

/* The CPU backend's whole-row kernels (the vocabulary on one device, ops/vocab.c) give the
 * pieces' bits: row max, sum of exponentials, target, and the gradient without statistics
 * given; widths below, at and above a vector of 8, an ignored row, and a label out of range. */
static void test_vocab_xent_whole_rows_give_the_pieces_bits(void)
{
    enum { ROWS = 5, W = 43 };
    static const int widths[] = {1, 8, V, W};
    float x[ROWS * W], mx[ROWS], se[ROWS], tg[ROWS], mx2[ROWS], se2[ROWS], tg2[ROWS];
    float d[ROWS * W], d2[ROWS * W];
    ot_fill_real(x, ROWS * W, -30, 30, 7);
    for (int k = 0; k < 4; k++) {
        int w = widths[k];
        int32_t labels[ROWS] = {0, w - 1, -1, w / 2, w > 2 ? 2 : 0};
        DT_ASSERT_OK(dt_kernel_reduce_axis(DT_REDUCE_MAX, ROWS, w, 1, x, mx));
        DT_ASSERT_OK(dt_kernel_vocab_xent_stats(ROWS, w, x, mx, 0, w, labels, se, tg));
        DT_ASSERT_OK(dt_kernel_vocab_xent_grad(ROWS, w, x, mx, se, 0, labels, 0.37f, d));
        memset(d2, 0x7f, sizeof d2);
        DT_ASSERT_OK(dt__kernel_vocab_xent_rows_stats(ROWS, w, x, labels, mx2, se2, tg2));
        DT_ASSERT_OK(dt__kernel_vocab_xent_rows_grad(ROWS, w, x, labels, 0.37f, d2));
        CU_ASSERT_EQUAL(memcmp(mx, mx2, sizeof mx), 0);
        CU_ASSERT_EQUAL(memcmp(se, se2, sizeof se), 0);
        for (int i = 0; i < ROWS; i++)
            CU_ASSERT_EQUAL(labels[i] >= 0 ? memcmp(&tg[i], &tg2[i], sizeof(float)) : 0, 0);
        CU_ASSERT_EQUAL(memcmp(d, d2, (size_t)(ROWS * w) * sizeof(float)), 0);
        labels[3] = w;
        DT_ASSERT_FAILS(dt__kernel_vocab_xent_rows_grad(ROWS, w, x, labels, 1.0f, d2),
                        DT_ERR_INVALID_ARGUMENT);
        DT_ASSERT_ERROR_MENTIONS("row 3");
        DT_ASSERT_FAILS(dt__kernel_vocab_xent_rows_stats(ROWS, w, x, labels, mx2, se2, tg2),
                        DT_ERR_INVALID_ARGUMENT);
    }
}

/* ---- distributed ops -------------------------------------------------------------------- */

/* Layouts of a [B, T, C] activation on the 2-D mesh (b x m) and on the 1-D mesh (x). */
static const char *const act2d[][3] = {
    {"b", NULL, NULL}, {"b", NULL, "m"}, {NULL, NULL, "m"}, {NULL, "m", NULL}, {"m", "b", NULL},
};
static const char *const act1d[][3] = {{"x", NULL, NULL}, {NULL, NULL, "x"}, {NULL, NULL, NULL}};

static dt_mesh *mesh_of(int two, int *nl)
{
    *nl = two ? 5 : 3;
    return two ? ot_mesh_2d() : ot_mesh_1d();
}

static const char *const *act_spec(int two, int i)
{
    return two ? act2d[i] : act1d[i];
}

static void test_matmul_nd_projection_keeps_the_rows_and_follows_the_2d_rules(void)
{
    enum { D = 6 };
    float x[N], w[C * D], ref[B * T * D], got[B * T * D], dy[B * T * D], dx[N], dw[C * D];
    float gx[N], gw[C * D];
    ot_fill_int(x, N, -3, 3, 20);
    ot_fill_int(w, C * D, -3, 3, 21);
    ot_fill_int(dy, B * T * D, -3, 3, 22);
    DT_ASSERT_OK(dt_kernel_gemm(0, 0, B * T, D, C, 1, x, DT_DTYPE_F32, C, w, DT_DTYPE_F32, D, 0,
                                ref, D));
    DT_ASSERT_OK(dt_kernel_gemm(0, 1, B * T, C, D, 1, dy, DT_DTYPE_F32, D, w, DT_DTYPE_F32, D, 0,
                                dx, C));
    DT_ASSERT_OK(dt_kernel_gemm(1, 0, C, D, B * T, 1, x, DT_DTYPE_F32, C, dy, DT_DTYPE_F32, D, 0,
                                dw, D));
    int64_t xs[3] = {B, T, C}, ws[2] = {C, D}, ys[3] = {B, T, D};
    for (int two = 0; two < 2; two++) {
        int nl;
        dt_mesh *m = mesh_of(two, &nl);
        const char *wspec[3][2] = {{NULL, NULL}, {NULL, two ? "m" : "x"}, {two ? "m" : "x", NULL}};
        for (int i = 0; i < nl; i++)
            for (int j = 0; j < 3; j++) {
                dt_layout *lx = lay(m, 3, act_spec(two, i), NULL), *lw = lay(m, 2, wspec[j], NULL);
                dt_tensor *tx = ot_tensor(lx, DT_DTYPE_F32, xs, x);
                dt_tensor *tw = ot_tensor(lw, DT_DTYPE_F32, ws, w), *y = NULL;
                DT_ASSERT_OK(dt_matmul_nd(tx, tw, 0, 0, NULL, &y));
                CU_ASSERT_EQUAL(dt_tensor_rank(y), 3);
                ot_fetch(y, got);
                CU_ASSERT_EQUAL(ot_mismatches("matmul_nd", got, ref, B * T * D, 0, 0), 0);
                /* Batch-sharded rows with a column-parallel weight: [b, -, m], no traffic. */
                if (two && i == 0 && j == 1) {
                    CU_ASSERT_EQUAL(ot_spec(y, 0), 0);
                    CU_ASSERT_EQUAL(ot_spec(y, 2), 1);
                    CU_ASSERT(!ot_is_partial(y));
                }
                /* Width sharded like a row-parallel weight: partial over m. */
                if (two && i == 1 && j == 2)
                    CU_ASSERT(ot_is_partial(y));
                /* Rows sharded along T (context parallel): computed where they are, T keeps
                 * its sharding, no gather. */
                if (two && i >= 3) {
                    CU_ASSERT_EQUAL(ot_spec(y, 1), i == 3 ? 1 : 0);
                    if (j == 1 && i == 3)
                        CU_ASSERT_EQUAL(ot_spec(y, 2), -1); /* m shards T already */
                    if (j == 1 && i == 4)
                        CU_ASSERT_EQUAL(ot_spec(y, 0), 1);
                }
                dt_tensor *tdy = ot_tensor(dt_tensor_layout(y), DT_DTYPE_F32, ys, dy);
                dt_tensor *gdx = NULL, *gdw = NULL;
                DT_ASSERT_OK(dt_matmul_nd_backward(tx, tw, 0, 0, tdy, NULL, NULL, &gdx, &gdw));
                ot_fetch(gdx, gx);
                ot_fetch(gdw, gw);
                CU_ASSERT_EQUAL(ot_mismatches("matmul_nd dx", gx, dx, N, 0, 0), 0);
                CU_ASSERT_EQUAL(ot_mismatches("matmul_nd dw", gw, dw, C * D, 0, 0), 0);
                dt_tensor_destroy(gdx);
                dt_tensor_destroy(gdw);
                dt_tensor_destroy(tdy);
                dt_tensor_destroy(y);
                dt_tensor_destroy(tx);
                dt_tensor_destroy(tw);
                dt_layout_destroy(lx);
                dt_layout_destroy(lw);
            }
        dt_mesh_destroy(m);
    }
}

static void test_matmul_nd_batched_runs_one_gemm_per_matrix(void)
{
    /* [B, T, C] x [B, T, C]^T -> [B, T, T] (attention scores without the scale). */
    float a[N], b[N], ref[B * T * T], got[B * T * T], dc[B * T * T], da[N], db[N], ga[N], gb[N];
    ot_fill_int(a, N, -3, 3, 23);
    ot_fill_int(b, N, -3, 3, 24);
    ot_fill_int(dc, B * T * T, -3, 3, 25);
    for (int i = 0; i < B; i++) {
        DT_ASSERT_OK(dt_kernel_gemm(0, 1, T, T, C, 1, a + i * T * C, DT_DTYPE_F32, C,
                                    b + i * T * C, DT_DTYPE_F32, C, 0, ref + i * T * T, T));
        DT_ASSERT_OK(dt_kernel_gemm(0, 0, T, C, T, 1, dc + i * T * T, DT_DTYPE_F32, T,
                                    b + i * T * C, DT_DTYPE_F32, C, 0, da + i * T * C, C));
        DT_ASSERT_OK(dt_kernel_gemm(1, 0, T, C, T, 1, dc + i * T * T, DT_DTYPE_F32, T,
                                    a + i * T * C, DT_DTYPE_F32, C, 0, db + i * T * C, C));
    }
    int64_t s[3] = {B, T, C}, cs[3] = {B, T, T};
    int nl;
    dt_mesh *m = mesh_of(1, &nl);
    for (int i = 0; i < nl; i++) {
        dt_layout *la = lay(m, 3, act_spec(1, i), NULL), *lb = lay(m, 3, act_spec(1, (i + 1) % nl),
                                                                    NULL);
        dt_tensor *ta = ot_tensor(la, DT_DTYPE_F32, s, a), *tb = ot_tensor(lb, DT_DTYPE_F32, s, b);
        dt_tensor *c = NULL, *gda = NULL, *gdb = NULL;
        DT_ASSERT_OK(dt_matmul_nd(ta, tb, 0, 1, NULL, &c));
        ot_fetch(c, got);
        CU_ASSERT_EQUAL(ot_mismatches("batched", got, ref, B * T * T, 0, 0), 0);
        CU_ASSERT_EQUAL(ot_spec(c, 0), ot_spec(ta, 0));
        dt_tensor *tdc = ot_tensor(dt_tensor_layout(c), DT_DTYPE_F32, cs, dc);
        DT_ASSERT_OK(dt_matmul_nd_backward(ta, tb, 0, 1, tdc, NULL, NULL, &gda, &gdb));
        ot_fetch(gda, ga);
        ot_fetch(gdb, gb);
        CU_ASSERT_EQUAL(ot_mismatches("batched da", ga, da, N, 0, 0), 0);
        CU_ASSERT_EQUAL(ot_mismatches("batched db", gb, db, N, 0, 0), 0);
        dt_tensor_destroy(gda);
        dt_tensor_destroy(gdb);
        dt_tensor_destroy(tdc);
        dt_tensor_destroy(c);
        dt_tensor_destroy(ta);
        dt_tensor_destroy(tb);
        dt_layout_destroy(la);
        dt_layout_destroy(lb);
    }
    dt_mesh_destroy(m);
}

static void test_layer_norm_and_softmax_gather_only_their_dim(void)
{
    float x[N], g[C], b[C], dy[N], y[N], dx[N], dg[C], db[C], got[N], gg[C];
    ot_fill_real(x, N, -2, 2, 30);
    ot_fill_real(g, C, 0.5f, 1.5f, 31);
    ot_fill_real(b, C, -1, 1, 32);
    ot_fill_real(dy, N, -1, 1, 33);
    int64_t s[3] = {B, T, C}, cs[1] = {C};
    for (int two = 0; two < 2; two++) {
        int nl;
        dt_mesh *m = mesh_of(two, &nl);
        dt_layout *lp = lay(m, 1, NULL, NULL);
        dt_tensor *tg = ot_tensor(lp, DT_DTYPE_F32, cs, g), *tb = ot_tensor(lp, DT_DTYPE_F32, cs, b);
        for (int i = 0; i < nl; i++) {
            dt_layout *lx = lay(m, 3, act_spec(two, i), NULL);
            dt_tensor *tx = ot_tensor(lx, DT_DTYPE_F32, s, x), *tdy = ot_tensor(lx, DT_DTYPE_F32, s, dy);
            dt_tensor *ty = NULL, *tdx = NULL, *tdg = NULL, *tdb = NULL;
            DT_ASSERT_OK(dt_layer_norm(tx, tg, tb, 1e-5f, &ty));
            DT_ASSERT_OK(dt_kernel_layer_norm(B * T, C, x, g, b, 1e-5f, y));
            ot_fetch(ty, got);
            CU_ASSERT_EQUAL(ot_mismatches("layer_norm", got, y, N, 0, 0), 0);
            CU_ASSERT_EQUAL(ot_spec(ty, 2), -1);
            CU_ASSERT_EQUAL(ot_spec(ty, 0), ot_spec(tx, 0));
            DT_ASSERT_OK(dt_layer_norm_backward(tx, tg, tdy, 1e-5f, &tdx, &tdg, &tdb));
            DT_ASSERT_OK(dt_kernel_layer_norm_grad(B * T, C, x, g, dy, 1e-5f, dx, dg, db));
            ot_fetch(tdx, got);
            CU_ASSERT_EQUAL(ot_mismatches("layer_norm dx", got, dx, N, 0, 0), 0);
            ot_fetch(tdg, gg);
            CU_ASSERT_EQUAL(ot_mismatches("layer_norm dgamma", gg, dg, C, 1e-6f, 1e-5f), 0);
            ot_fetch(tdb, gg);
            CU_ASSERT_EQUAL(ot_mismatches("layer_norm dbeta", gg, db, C, 1e-6f, 1e-5f), 0);
            /* Row-sharded x: the parameter gradients are partial sums over those dims. */
            CU_ASSERT_EQUAL(ot_is_partial(tdg), ot_spec(tx, 0) >= 0 || ot_spec(tx, 1) >= 0);
            dt_tensor_destroy(ty);
            dt_tensor_destroy(tdx);
            dt_tensor_destroy(tdg);
            dt_tensor_destroy(tdb);
            /* Softmax along each dim. */
            for (int axis = -1; axis < 3; axis++) {
                int a = axis < 0 ? 2 : axis;
                int64_t outer = a == 0 ? 1 : (a == 1 ? B : B * T), len = s[a];
                int64_t inner = a == 0 ? T * C : (a == 1 ? C : 1);
                DT_ASSERT_OK(dt_softmax(tx, axis, &ty));
                DT_ASSERT_OK(dt_kernel_softmax(outer, len, inner, x, y));
                ot_fetch(ty, got);
                CU_ASSERT_EQUAL(ot_mismatches("softmax", got, y, N, 0, 0), 0);
                CU_ASSERT_EQUAL(ot_spec(ty, a), -1);
                DT_ASSERT_OK(dt_softmax_backward(ty, tdy, axis, &tdx));
                DT_ASSERT_OK(dt_kernel_softmax_grad(outer, len, inner, y, dy, dx));
                ot_fetch(tdx, got);
                CU_ASSERT_EQUAL(ot_mismatches("softmax dx", got, dx, N, 0, 0), 0);
                dt_tensor_destroy(ty);
                dt_tensor_destroy(tdx);
            }
            dt_tensor_destroy(tx);
            dt_tensor_destroy(tdy);
            dt_layout_destroy(lx);
        }
        dt_tensor_destroy(tg);
        dt_tensor_destroy(tb);
        dt_layout_destroy(lp);
        dt_mesh_destroy(m);
    }
}

static void test_attention_keeps_whole_heads_on_each_device(void)
{
    float q[N], k[N], v[N], dy[N], y[N], dq[N], dk[N], dv[N], got[N];
    ot_fill_real(q, N, -1, 1, 40);
    ot_fill_real(k, N, -1, 1, 41);
    ot_fill_real(v, N, -1, 1, 42);
    ot_fill_real(dy, N, -1, 1, 43);
    int64_t s[3] = {B, T, C};
    /* H heads split over m (whole heads per device), and 1 head (width gathered). */
    int64_t heads[2] = {H, 1};
    for (int hi = 0; hi < 2; hi++) {
        DT_ASSERT_OK(dt_kernel_attention(B, T, heads[hi], C / heads[hi], 1, q, k, v, y));
        DT_ASSERT_OK(dt_kernel_attention_grad(B, T, heads[hi], C / heads[hi], 1, q, k, v, dy, dq,
                                              dk, dv));
        for (int two = 0; two < 2; two++) {
            int nl;
            dt_mesh *m = mesh_of(two, &nl);
            for (int i = 0; i < nl; i++) {
                dt_layout *lx = lay(m, 3, act_spec(two, i), NULL);
                dt_layout *lk = lay(m, 3, act_spec(two, (i + 1) % nl), NULL);
                dt_tensor *tq = ot_tensor(lx, DT_DTYPE_F32, s, q), *tk = ot_tensor(lk, DT_DTYPE_F32, s, k);
                dt_tensor *tv = ot_tensor(lx, DT_DTYPE_F32, s, v), *tdy = ot_tensor(lk, DT_DTYPE_F32, s, dy);
                dt_tensor *ty = NULL, *g[3] = {NULL, NULL, NULL};
                DT_ASSERT_OK(dt_attention(tq, tk, tv, heads[hi], 1, &ty));
                ot_fetch(ty, got);
                CU_ASSERT_EQUAL(ot_mismatches("attention", got, y, N, 0, 0), 0);
                int wdim = ot_spec(tq, 2);
                if (wdim >= 0 && heads[hi] % dt_mesh_dim_size(m, wdim) == 0)
                    CU_ASSERT_EQUAL(ot_spec(ty, 2), wdim);
                if (heads[hi] == 1)
                    CU_ASSERT_EQUAL(ot_spec(ty, 2), -1);
                CU_ASSERT_EQUAL(ot_spec(ty, 1), -1);
                DT_ASSERT_OK(dt_attention_backward(tq, tk, tv, heads[hi], 1, tdy, &g[0], &g[1],
                                                   &g[2]));
                const float *want[3] = {dq, dk, dv};
                for (int j = 0; j < 3; j++) {
                    ot_fetch(g[j], got);
                    CU_ASSERT_EQUAL(ot_mismatches("attention grad", got, want[j], N, 0, 0), 0);
                    dt_tensor_destroy(g[j]);
                }
                dt_tensor_destroy(ty);
                dt_tensor_destroy(tq);
                dt_tensor_destroy(tk);
                dt_tensor_destroy(tv);
                dt_tensor_destroy(tdy);
                dt_layout_destroy(lx);
                dt_layout_destroy(lk);
            }
            dt_mesh_destroy(m);
        }
    }
}

static void test_embedding_with_the_vocabulary_sharded_is_partial_over_its_dim(void)
{
    float table[V * C], out[N], dout[N], dtab[V * C], got[N], gt[V * C];
    int32_t ids[B * T];
    for (int i = 0; i < B * T; i++)
        ids[i] = (i * 7 + 3) % V;
    ot_fill_real(table, V * C, -1, 1, 50);
    ot_fill_real(dout, N, -1, 1, 51);
    DT_ASSERT_OK(dt_kernel_embedding(B * T, ids, 0, V, V, C, table, out));
    DT_ASSERT_OK(dt_kernel_embedding_grad(B * T, ids, 0, V, V, C, dout, dtab));
    int64_t ts[2] = {V, C}, is[2] = {B, T}, os[3] = {B, T, C};
    for (int two = 0; two < 2; two++) {
        int nl;
        dt_mesh *m = mesh_of(two, &nl);
        const char *mdim = two ? "m" : "x";
        const char *tspec[3][2] = {{mdim, NULL}, {NULL, NULL}, {NULL, mdim}};
        const char *ispec[3][2] = {{two ? "b" : NULL, NULL}, {NULL, NULL}, {mdim, NULL}};
        for (int i = 0; i < 3; i++)
            for (int j = 0; j < 3; j++) {
                dt_layout *lt = lay(m, 2, tspec[i], NULL), *li = lay(m, 2, ispec[j], NULL);
                dt_tensor *tt = ot_tensor(lt, DT_DTYPE_F32, ts, table);
                dt_tensor *ti = ot_tensor(li, DT_DTYPE_I32, is, ids), *y = NULL, *g = NULL;
                DT_ASSERT_OK(dt_embedding(tt, ti, NULL, &y));
                ot_fetch(y, got);
                CU_ASSERT_EQUAL(ot_mismatches("embedding", got, out, N, 0, 0), 0);
                CU_ASSERT_EQUAL(ot_is_partial(y), i == 0);
                dt_tensor *td = ot_tensor(dt_tensor_layout(y), DT_DTYPE_F32, os, dout);
                /* dout arrives reduced (as a loss's gradient does). */
                dt_layout *ld = lay(m, 3, NULL, NULL);
                dt_tensor *tdr = NULL;
                DT_ASSERT_OK(dt_relayout(td, ld, &tdr));
                DT_ASSERT_OK(dt_embedding_backward(tt, ti, tdr, NULL, &g));
                ot_fetch(g, gt);
                CU_ASSERT_EQUAL(ot_mismatches("embedding grad", gt, dtab, V * C, 1e-6f, 1e-5f), 0);
                CU_ASSERT_EQUAL(ot_spec(g, 0), i == 0 ? dt_mesh_dim_index(m, mdim) : -1);
                dt_tensor_destroy(g);
                dt_tensor_destroy(tdr);
                dt_tensor_destroy(td);
                dt_layout_destroy(ld);
                dt_tensor_destroy(y);
                dt_tensor_destroy(tt);
                dt_tensor_destroy(ti);
                dt_layout_destroy(lt);
                dt_layout_destroy(li);
            }
        dt_mesh_destroy(m);
    }
}

/* One bad id, at the last position (on the last shard when the ids are split over the
 * batch, so on one client only at np 2 and 4), fails the lookup and its backward on every
 * client, replicated or vocabulary-sharded table; the next good lookup is exact. */
static void test_embedding_rejects_ids_outside_the_table_on_every_client(void)
{
    const int32_t bad[3] = {V, -1, INT32_MAX};
    float table[V * C], ref[N], got[N], dout[N] = {0};
    int32_t ids[B * T];
    for (int i = 0; i < B * T; i++)
        ids[i] = (i * 7 + 3) % V;
    ot_fill_real(table, V * C, -1, 1, 52);
    DT_ASSERT_OK(dt_kernel_embedding(B * T, ids, 0, V, V, C, table, ref));
    int64_t ts[2] = {V, C}, is[2] = {B, T}, os[3] = {B, T, C};
    for (int two = 0; two < 2; two++) {
        int nl;
        dt_mesh *m = mesh_of(two, &nl);
        const char *mdim = two ? "m" : "x";
        /* {table spec, ids spec}: replicated; vocabulary sharded; ids over the batch. */
        const char *tspec[3][2] = {{NULL, NULL}, {mdim, NULL}, {two ? mdim : NULL, NULL}};
        const char *ispec[3][2] = {{NULL, NULL}, {NULL, NULL}, {two ? "b" : "x", NULL}};
        for (int k = 0; k < 3; k++)
            for (int b = 0; b < 3; b++) {
                int32_t wrong[B * T];
                memcpy(wrong, ids, sizeof ids);
                wrong[B * T - 1] = bad[b];
                char want[32];
                snprintf(want, sizeof want, "id %d", (int)bad[b]);
                dt_layout *lt = lay(m, 2, tspec[k], NULL), *li = lay(m, 2, ispec[k], NULL);
                dt_layout *ld = lay(m, 3, NULL, NULL);
                dt_tensor *tt = ot_tensor(lt, DT_DTYPE_F32, ts, table);
                dt_tensor *tw = ot_tensor(li, DT_DTYPE_I32, is, wrong);
                dt_tensor *ti = ot_tensor(li, DT_DTYPE_I32, is, ids);
                dt_tensor *td = ot_tensor(ld, DT_DTYPE_F32, os, dout), *y = NULL, *g = NULL;
                DT_ASSERT_FAILS(dt_embedding(tt, tw, NULL, &y), DT_ERR_INVALID_ARGUMENT);
                DT_ASSERT_ERROR_MENTIONS(want);
                DT_ASSERT_ERROR_MENTIONS("table of 11 rows");
                CU_ASSERT_PTR_NULL(y);
                DT_ASSERT_FAILS(dt_embedding_backward(tt, tw, td, NULL, &g),
                                DT_ERR_INVALID_ARGUMENT);
                DT_ASSERT_ERROR_MENTIONS(want);
                CU_ASSERT_PTR_NULL(g);
                DT_ASSERT_OK(dt_embedding(tt, ti, NULL, &y));
                ot_fetch(y, got);
                CU_ASSERT_EQUAL(ot_mismatches("embedding after a refused one", got, ref, N, 0, 0),
                                0);
                dt_tensor_destroy(y);
                dt_tensor_destroy(td);
                dt_tensor_destroy(ti);
                dt_tensor_destroy(tw);
                dt_tensor_destroy(tt);
                dt_layout_destroy(ld);
                dt_layout_destroy(li);
                dt_layout_destroy(lt);
            }
        dt_mesh_destroy(m);
    }
}

static void test_vocab_xent_never_gathers_the_vocabulary(void)
{
    float x[B * T * V], d[B * T * V], got[B * T * V], loss;
    int32_t labels[B * T];
    for (int i = 0; i < B * T; i++)
        labels[i] = (i * 5 + 1) % V;
    ot_fill_real(x, B * T * V, -4, 4, 60);
    DT_ASSERT_OK(dt_kernel_softmax_xent(B * T, V, x, labels, 1.0f / (B * T), &loss));
    DT_ASSERT_OK(dt_kernel_softmax_xent_grad(B * T, V, x, labels, 2.0f / (B * T), d));
    int64_t xs[3] = {B, T, V}, ls[2] = {B, T};
    for (int two = 0; two < 2; two++) {
        int nl;
        dt_mesh *m = mesh_of(two, &nl);
        for (int i = 0; i < nl; i++) {
            dt_layout *lx = lay(m, 3, act_spec(two, i), NULL), *ll = lay(m, 2, NULL, NULL);
            dt_tensor *tx = ot_tensor(lx, DT_DTYPE_F32, xs, x);
            dt_tensor *tl = ot_tensor(ll, DT_DTYPE_I32, ls, labels), *tloss = NULL, *g = NULL;
            DT_ASSERT_OK(dt_vocab_xent(tx, tl, NULL, &tloss));
            double v = 0;
            DT_ASSERT_OK(dt_item(tloss, &v));
            CU_ASSERT(fabs(v - loss) < 1e-5);
            CU_ASSERT_EQUAL(ot_is_partial(tloss), ot_spec(tx, 0) >= 0 || ot_spec(tx, 1) >= 0);
            DT_ASSERT_OK(dt_vocab_xent_backward(tx, tl, 2.0f, &g));
            CU_ASSERT(dt_layout_equal(dt_tensor_layout(g), lx));
            ot_fetch(g, got);
            CU_ASSERT_EQUAL(ot_mismatches("vocab xent grad", got, d, B * T * V, 1e-7f, 1e-5f), 0);
            dt_tensor_destroy(g);
            dt_tensor_destroy(tloss);
            dt_tensor_destroy(tx);
            dt_tensor_destroy(tl);
            dt_layout_destroy(lx);
            dt_layout_destroy(ll);
        }
        dt_mesh_destroy(m);
    }
}

/* A label past the vocabulary, in the last row only (one client's shard when the rows are
 * split over clients), fails the loss and its backward on every client, whatever the layout;
 * the next loss is exact. */
static void test_vocab_xent_rejects_a_label_past_the_vocabulary_on_every_client(void)
{
    float x[B * T * V], loss;
    int32_t labels[B * T], wrong[B * T];
    for (int i = 0; i < B * T; i++)
        labels[i] = (i * 5 + 1) % V;
    memcpy(wrong, labels, sizeof labels);
    wrong[B * T - 1] = V;
    ot_fill_real(x, B * T * V, -4, 4, 61);
    DT_ASSERT_OK(dt_kernel_softmax_xent(B * T, V, x, labels, 1.0f / (B * T), &loss));
    int64_t xs[3] = {B, T, V}, ls[2] = {B, T};
    for (int two = 0; two < 2; two++) {
        int nl;
        dt_mesh *m = mesh_of(two, &nl);
        for (int i = 0; i < nl; i++) {
            dt_layout *lx = lay(m, 3, act_spec(two, i), NULL), *ll = lay(m, 2, NULL, NULL);
            dt_tensor *tx = ot_tensor(lx, DT_DTYPE_F32, xs, x);
            dt_tensor *tl = ot_tensor(ll, DT_DTYPE_I32, ls, labels);
            dt_tensor *tw = ot_tensor(ll, DT_DTYPE_I32, ls, wrong), *tloss = NULL, *g = NULL;
            DT_ASSERT_FAILS(dt_vocab_xent(tx, tw, NULL, &tloss), DT_ERR_INVALID_ARGUMENT);
            DT_ASSERT_ERROR_MENTIONS("label 11");
            CU_ASSERT_PTR_NULL(tloss);
            DT_ASSERT_FAILS(dt_vocab_xent_backward(tx, tw, 1.0f, &g), DT_ERR_INVALID_ARGUMENT);
            DT_ASSERT_ERROR_MENTIONS("label 11");
            CU_ASSERT_PTR_NULL(g);
            DT_ASSERT_OK(dt_vocab_xent(tx, tl, NULL, &tloss));
            double v = 0;
            DT_ASSERT_OK(dt_item(tloss, &v));
            CU_ASSERT(fabs(v - loss) < 1e-5);
            dt_tensor_destroy(tloss);
            dt_tensor_destroy(tw);
            dt_tensor_destroy(tl);
            dt_tensor_destroy(tx);
            dt_layout_destroy(lx);
            dt_layout_destroy(ll);
        }
        dt_mesh_destroy(m);
    }
}

static void test_elementwise_and_reductions_take_16_bit_operands(void)
{
    float a[N], b[N], ref[N], got[N], sum[B * T], gs[B * T];
    ot_fill_real(a, N, -4, 4, 70);
    ot_fill_real(b, N, -4, 4, 71);
    int64_t s[3] = {B, T, C};
    dt_dtype types[2] = {DT_DTYPE_BF16, DT_DTYPE_F16};
    int nl;
    dt_mesh *m = mesh_of(1, &nl);
    for (int t = 0; t < 2; t++) {
        /* Operands exactly representable in the 16-bit type, results rounded once from f32. */
        float ra[N], rb[N];
        memcpy(ra, a, sizeof ra);
        memcpy(rb, b, sizeof rb);
        dt_test_round(ra, N, types[t]);
        dt_test_round(rb, N, types[t]);
        for (int i = 0; i < nl; i++) {
            dt_layout *l = lay(m, 3, act_spec(1, i), NULL);
            dt_tensor *fa = ot_tensor(l, DT_DTYPE_F32, s, ra), *fb = ot_tensor(l, DT_DTYPE_F32, s, rb);
            dt_tensor *ha = NULL, *hb = NULL, *c = NULL, *w = NULL, *r = NULL;
            DT_ASSERT_OK(dt_cast(fa, types[t], &ha));
            DT_ASSERT_OK(dt_cast(fb, types[t], &hb));
            DT_ASSERT_OK(dt_mul(ha, hb, NULL, &c));
            CU_ASSERT_EQUAL(dt_tensor_dtype(c), types[t]);
            DT_ASSERT_OK(dt_cast(c, DT_DTYPE_F32, &w));
            ot_fetch(w, got);
            DT_ASSERT_OK(dt_kernel_mul(N, ra, rb, ref));
            dt_test_round(ref, N, types[t]);
            CU_ASSERT_EQUAL(ot_mismatches("16-bit mul", got, ref, N, 0, 0), 0);
            dt_tensor_destroy(c);
            dt_tensor_destroy(w);
            /* GELU keeps the dtype; a mixed add gives f32. */
            DT_ASSERT_OK(dt_gelu(ha, &c));
            CU_ASSERT_EQUAL(dt_tensor_dtype(c), types[t]);
            dt_tensor_destroy(c);
            DT_ASSERT_OK(dt_add(ha, fb, NULL, &c));
            CU_ASSERT_EQUAL(dt_tensor_dtype(c), DT_DTYPE_F32);
            ot_fetch(c, got);
            DT_ASSERT_OK(dt_kernel_add(N, ra, rb, ref));
            CU_ASSERT_EQUAL(ot_mismatches("mixed add", got, ref, N, 0, 0), 0);
            dt_tensor_destroy(c);
            /* Sum over the last dim in f32: the widened values summed in f32. */
            DT_ASSERT_OK(dt_reduce(ha, DT_REDUCE_SUM, -1, NULL, &r));
            CU_ASSERT_EQUAL(dt_tensor_dtype(r), DT_DTYPE_F32);
            ot_fetch(r, gs);
            DT_ASSERT_OK(dt_kernel_reduce_axis(DT_REDUCE_SUM, B * T, C, 1, ra, sum));
            CU_ASSERT_EQUAL(ot_mismatches("16-bit sum", gs, sum, B * T, 1e-6f, 1e-6f), 0);
            dt_tensor_destroy(r);
            dt_tensor_destroy(ha);
            dt_tensor_destroy(hb);
            dt_tensor_destroy(fa);
            dt_tensor_destroy(fb);
            dt_layout_destroy(l);
        }
    }
    dt_mesh_destroy(m);
}

static void test_transformer_ops_reject_bad_operands(void)
{
    dt_mesh *m = ot_mesh_1d();
    int64_t s[3] = {B, T, C}, s2[2] = {B, T};
    float x[N] = {0};
    int32_t ids[B * T] = {0};
    dt_layout *l3 = lay(m, 3, NULL, NULL), *l2 = lay(m, 2, NULL, NULL);
    dt_tensor *a = ot_tensor(l3, DT_DTYPE_F32, s, x), *i = ot_tensor(l2, DT_DTYPE_I32, s2, ids);
    dt_tensor *out = NULL;
    DT_ASSERT_FAILS(dt_attention(a, a, a, 3, 1, &out), DT_ERR_SHAPE);
    DT_ASSERT_ERROR_MENTIONS("3 heads");
    DT_ASSERT_FAILS(dt_matmul_nd(a, i, 0, 0, NULL, &out), DT_ERR_SHAPE);
    DT_ASSERT_FAILS(dt_layer_norm(a, a, a, 1e-5f, &out), DT_ERR_SHAPE);
    DT_ASSERT_FAILS(dt_softmax(a, 3, &out), DT_ERR_INVALID_ARGUMENT);
    DT_ASSERT_FAILS(dt_vocab_xent(a, a, NULL, &out), DT_ERR_SHAPE);
    DT_ASSERT_FAILS(dt_embedding(a, i, NULL, &out), DT_ERR_SHAPE);
    CU_ASSERT_PTR_NULL(out);
    dt_tensor_destroy(a);
    dt_tensor_destroy(i);
    dt_layout_destroy(l3);
    dt_layout_destroy(l2);
    dt_mesh_destroy(m);
}

int main(int argc, char **argv)
{
    static const dt_test_case cases[] = {
        DT_TEST(test_layer_norm_kernel_matches_reference_and_finite_differences),
        DT_TEST(test_softmax_kernel_is_stable_along_the_middle_dim),
        DT_TEST(test_attention_kernel_matches_reference_and_finite_differences),
        DT_TEST(test_embedding_slices_add_up_to_the_lookup),
        DT_TEST(test_embedding_kernels_reject_ids_outside_the_table),
        DT_TEST(test_vocab_xent_pieces_match_the_full_softmax_cross_entropy),
        DT_TEST(test_vocab_xent_whole_rows_give_the_pieces_bits),
        DT_TEST(test_matmul_nd_projection_keeps_the_rows_and_follows_the_2d_rules),
        DT_TEST(test_matmul_nd_batched_runs_one_gemm_per_matrix),
        DT_TEST(test_layer_norm_and_softmax_gather_only_their_dim),
        DT_TEST(test_attention_keeps_whole_heads_on_each_device),
        DT_TEST(test_embedding_with_the_vocabulary_sharded_is_partial_over_its_dim),
        DT_TEST(test_embedding_rejects_ids_outside_the_table_on_every_client),
        DT_TEST(test_vocab_xent_never_gathers_the_vocabulary),
        DT_TEST(test_vocab_xent_rejects_a_label_past_the_vocabulary_on_every_client),
        DT_TEST(test_elementwise_and_reductions_take_16_bit_operands),
        DT_TEST(test_transformer_ops_reject_bad_operands),
        DT_TEST_END,
    };
    return dt_test_main(argc, argv, "spmd_transformer", cases, 1);
}
