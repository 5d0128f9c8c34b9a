/* The reduce family's CPU kernels called directly on host blocks (no runtime): every
 * reduction, log_softmax, cumsum, topk, einsum and cross_entropy against naive references or
 * hand-worked values, in f32 and f64, and their errors. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cblas.h>

#include "harness.h"
#include "kernel_util.h"

static uint64_t rng = 12345;

static double rnd_int(int lo, int hi)
{
    return (double)dt__rd_randint(&rng, lo, hi);
}

/* Naive reduction of x [3, 4, 5] over mask at (i, j, k) kept coordinates. */
static double naive_reduce(const double *x, const int64_t *sh, uint64_t mask, int kind,
                           const int64_t *keep)
{
    double acc = kind == RK_MAX ? -INFINITY : kind == RK_MIN ? INFINITY : 0, n = 0;
    int64_t lo[3], hi[3];
    for (int d = 0; d < 3; d++) {
        lo[d] = mask >> d & 1 ? 0 : keep[d];
        hi[d] = mask >> d & 1 ? sh[d] : keep[d] + 1;
    }
    for (int64_t i = lo[0]; i < hi[0]; i++)
        for (int64_t j = lo[1]; j < hi[1]; j++)
            for (int64_t k = lo[2]; k < hi[2]; k++) {
                double v = x[(i * sh[1] + j) * sh[2] + k];
                n++;
                if (kind == RK_SUM || kind == RK_MEAN)
                    acc += v;
                else if (kind == RK_MAX)
                    acc = v > acc ? v : acc;
                else
                    acc = v < acc ? v : acc;
            }
    return kind == RK_MEAN ? acc / n : acc;
}

static void test_sum_mean_max_min_match_a_naive_reference_over_every_axis_set(void)
{
    const int64_t sh[3] = {3, 4, 5};
    double x[60], y[60];
    float xf[60], yf[60];
    for (int e = 0; e < 60; e++)
        xf[e] = (float)(x[e] = rnd_int(-9, 9));
    const dt_op_def *defs[4] = {&dt__def_sum, &dt__def_mean, &dt__def_max, &dt__def_min};
    for (int kind = 0; kind < 4; kind++)
        for (uint64_t mask = 1; mask < 8; mask++)
            for (int keep = 0; keep < 2; keep++) {
                dt_op_attrs at = DT_OP_ATTRS_INIT;
                at.i[0] = (int64_t)mask;
                at.i[1] = keep;
                int64_t osh[3];
                int orank = 0;
                for (int d = 0; d < 3; d++)
                    if (!(mask >> d & 1) || keep)
                        osh[orank++] = mask >> d & 1 ? 1 : sh[d];
                dt_op_buf in = kbuf(x, DT_DTYPE_F64, 3, sh);
                DT_ASSERT_OK(krun(defs[kind], &at, 1, &in, kbuf(y, DT_DTYPE_F64, orank, osh)));
                in = kbuf(xf, DT_DTYPE_F32, 3, sh);
                DT_ASSERT_OK(krun(defs[kind], &at, 1, &in, kbuf(yf, DT_DTYPE_F32, orank, osh)));
                int64_t o = 0, keepc[3];
                for (keepc[0] = 0; keepc[0] < (mask & 1 ? 1 : 3); keepc[0]++)
                    for (keepc[1] = 0; keepc[1] < (mask & 2 ? 1 : 4); keepc[1]++)
                        for (keepc[2] = 0; keepc[2] < (mask & 4 ? 1 : 5); keepc[2]++, o++) {
                            double want = naive_reduce(x, sh, mask, kind, keepc);
                            CU_ASSERT(fabs(y[o] - want) < 1e-12);
                            CU_ASSERT(yf[o] == (float)want);
                        }
            }
}

static void test_mean_divides_by_the_global_count_of_a_sharded_axis(void)
{
    /* The first half of a [4] axis on one device: its partial sum over the global count. */
    double x[2] = {1, 3}, y;
    int64_t sh[1] = {2}, osh[1];
    dt_op_buf in = kbuf(x, DT_DTYPE_F64, 1, sh);
    in.global[0] = 4;
    dt_op_attrs at = DT_OP_ATTRS_INIT;
    DT_ASSERT_OK(krun(&dt__def_mean, &at, 1, &in, kbuf(&y, DT_DTYPE_F64, 0, osh)));
    CU_ASSERT_DOUBLE_EQUAL(y, 1.0, 1e-15);
}

static void test_logsumexp_and_var_match_hand_worked_values(void)
{
    double x[6] = {0, log(2.0), log(3.0), 1, 2, 6}, y[2];
    int64_t sh[2] = {2, 3}, osh[1] = {2};
    dt_op_attrs at = DT_OP_ATTRS_INIT;
    at.i[0] = 2;
    dt_op_buf in = kbuf(x, DT_DTYPE_F64, 2, sh);
    DT_ASSERT_OK(krun(&dt__def_logsumexp, &at, 1, &in, kbuf(y, DT_DTYPE_F64, 1, osh)));
    CU_ASSERT_DOUBLE_EQUAL(y[0], log(6.0), 1e-14);
    CU_ASSERT_DOUBLE_EQUAL(y[1], log(exp(1) + exp(2) + exp(6)), 1e-14);
    at.i[2] = 1; /* unbiased: row 1 mean 3, squares 4 + 1 + 9 = 14, / 2 */
    DT_ASSERT_OK(krun(&dt__def_var, &at, 1, &in, kbuf(y, DT_DTYPE_F64, 1, osh)));
    CU_ASSERT_DOUBLE_EQUAL(y[1], 7.0, 1e-14);
    at.i[2] = 0;
    DT_ASSERT_OK(krun(&dt__def_var, &at, 1, &in, kbuf(y, DT_DTYPE_F64, 1, osh)));
    CU_ASSERT_DOUBLE_EQUAL(y[1], 14.0 / 3, 1e-14);
}

static void test_argmax_and_argmin_take_the_first_extreme_and_add_the_block_offset(void)
{
    float x[8] = {1, 5, 5, 0, 2, 2, -1, -1};
    int64_t sh[2] = {2, 4}, osh[1] = {2}, y[2];
    dt_op_attrs at = DT_OP_ATTRS_INIT;
    at.i[0] = 2;
    dt_op_buf in = kbuf(x, DT_DTYPE_F32, 2, sh);
    DT_ASSERT_OK(krun(&dt__def_argmax, &at, 1, &in, kbuf(y, DT_DTYPE_I64, 1, osh)));
    CU_ASSERT(y[0] == 1 && y[1] == 0);
    DT_ASSERT_OK(krun(&dt__def_argmin, &at, 1, &in, kbuf(y, DT_DTYPE_I64, 1, osh)));
    CU_ASSERT(y[0] == 3 && y[1] == 2);
    at.i[0] = 1; /* along rows of a block starting at row 6 */
    in.global[0] = 8;
    in.offset[0] = 6;
    int64_t osh2[1] = {4}, y4[4];
    DT_ASSERT_OK(krun(&dt__def_argmax, &at, 1, &in, kbuf(y4, DT_DTYPE_I64, 1, osh2)));
    CU_ASSERT(y4[0] == 7 && y4[1] == 6 && y4[2] == 6 && y4[3] == 6);
}

static void test_reduce_grad_splits_max_ties_and_broadcasts_sum(void)
{
    double x[6] = {1, 3, 3, 2, 0, 2}, y[2] = {3, 2}, dy[2] = {1, 4}, dx[6];
    int64_t sh[2] = {2, 3}, osh[1] = {2};
    dt_op_attrs at = DT_OP_ATTRS_INIT;
    at.i[0] = 2;
    at.i[3] = RK_MAX;
    dt_op_buf in[3] = {kbuf(x, DT_DTYPE_F64, 2, sh), kbuf(y, DT_DTYPE_F64, 1, osh),
                       kbuf(dy, DT_DTYPE_F64, 1, osh)};
    DT_ASSERT_OK(krun(&dt__def_reduce_grad, &at, 3, in, kbuf(dx, DT_DTYPE_F64, 2, sh)));
    double want[6] = {0, 0.5, 0.5, 2, 0, 2};
    for (int e = 0; e < 6; e++)
        CU_ASSERT_DOUBLE_EQUAL(dx[e], want[e], 0);
    at.i[3] = RK_MEAN;
    DT_ASSERT_OK(krun(&dt__def_reduce_grad, &at, 3, in, kbuf(dx, DT_DTYPE_F64, 2, sh)));
    CU_ASSERT_DOUBLE_EQUAL(dx[0], 1.0 / 3, 1e-15);
    CU_ASSERT_DOUBLE_EQUAL(dx[5], 4.0 / 3, 1e-15);
}

static void test_log_softmax_and_its_gradient_match_naive_formulas(void)
{
    double x[12], y[12], dy[12], dx[12];
    int64_t sh[3] = {2, 3, 2};
    for (int e = 0; e < 12; e++) {
        x[e] = rnd_int(-5, 5) / 3.0;
        dy[e] = rnd_int(-5, 5);
    }
    dt_op_attrs at = DT_OP_ATTRS_INIT;
    at.i[0] = 1;
    dt_op_buf in = kbuf(x, DT_DTYPE_F64, 3, sh);
    DT_ASSERT_OK(krun(&dt__def_log_softmax, &at, 1, &in, kbuf(y, DT_DTYPE_F64, 3, sh)));
    for (int a = 0; a < 2; a++)
        for (int c = 0; c < 2; c++) {
            double s = 0, sd = 0;
            for (int b = 0; b < 3; b++) {
                s += exp(x[(a * 3 + b) * 2 + c]);
                sd += dy[(a * 3 + b) * 2 + c];
            }
            for (int b = 0; b < 3; b++)
                CU_ASSERT_DOUBLE_EQUAL(y[(a * 3 + b) * 2 + c], x[(a * 3 + b) * 2 + c] - log(s),
                                       1e-14);
            dt_op_buf g[2] = {kbuf(y, DT_DTYPE_F64, 3, sh), kbuf(dy, DT_DTYPE_F64, 3, sh)};
            DT_ASSERT_OK(krun(&dt__def_log_softmax_grad, &at, 2, g, kbuf(dx, DT_DTYPE_F64, 3, sh)));
            for (int b = 0; b < 3; b++) {
                int k = (a * 3 + b) * 2 + c;
                CU_ASSERT_DOUBLE_EQUAL(dx[k], dy[k] - exp(x[k]) / s * sd, 1e-13);
            }
        }
}

static void test_cumsum_runs_forward_and_in_reverse(void)
{
    float x[6] = {1, 2, 3, 4, 5, 6}, y[6];
    int64_t sh[2] = {2, 3};
    dt_op_attrs at = DT_OP_ATTRS_INIT;
    at.i[0] = 1;
    dt_op_buf in = kbuf(x, DT_DTYPE_F32, 2, sh);
    DT_ASSERT_OK(krun(&dt__def_cumsum, &at, 1, &in, kbuf(y, DT_DTYPE_F32, 2, sh)));
    float want[6] = {1, 3, 6, 4, 9, 15};
    CU_ASSERT(memcmp(y, want, sizeof(y)) == 0);
    at.i[1] = 1;
    DT_ASSERT_OK(krun(&dt__def_cumsum, &at, 1, &in, kbuf(y, DT_DTYPE_F32, 2, sh)));
    float rev[6] = {6, 5, 3, 15, 11, 6};
    CU_ASSERT(memcmp(y, rev, sizeof(y)) == 0);
}

static void test_topk_is_sorted_and_breaks_ties_by_the_lower_index(void)
{
    double x[6] = {2, 7, 2, NAN, 7, 1};
    int64_t sh[1] = {6}, ksh[1] = {6}, idx[6];
    dt_op_attrs at = DT_OP_ATTRS_INIT;
    at.i[1] = 6;
    at.i[2] = 1;
    dt_op_buf in = kbuf(x, DT_DTYPE_F64, 1, sh);
    DT_ASSERT_OK(krun(&dt__def_topk_indices, &at, 1, &in, kbuf(idx, DT_DTYPE_I64, 1, ksh)));
    int64_t desc[6] = {3, 1, 4, 0, 2, 5};
    CU_ASSERT(memcmp(idx, desc, sizeof(idx)) == 0);
    at.i[1] = 3;
    at.i[2] = 0;
    ksh[0] = 3;
    DT_ASSERT_OK(krun(&dt__def_topk_indices, &at, 1, &in, kbuf(idx, DT_DTYPE_I64, 1, ksh)));
    CU_ASSERT(idx[0] == 5 && idx[1] == 0 && idx[2] == 2);
    double v[3], dx[6], dy[3] = {1, 2, 3};
    dt_op_buf tv[3] = {in, kbuf(idx, DT_DTYPE_I64, 1, ksh), kbuf(dy, DT_DTYPE_F64, 1, ksh)};
    DT_ASSERT_OK(krun(&dt__def_topk_values, &at, 2, tv, kbuf(v, DT_DTYPE_F64, 1, ksh)));
    CU_ASSERT(v[0] == 1 && v[1] == 2 && v[2] == 2);
    idx[2] = 0; /* two gradients land on one position */
    DT_ASSERT_OK(krun(&dt__def_topk_values_grad, &at, 3, tv, kbuf(dx, DT_DTYPE_F64, 1, sh)));
    double want[6] = {5, 0, 0, 0, 0, 1};
    CU_ASSERT(memcmp(dx, want, sizeof(dx)) == 0);
    idx[1] = 6;
    CU_ASSERT_EQUAL(krun(&dt__def_topk_values, &at, 2, tv, kbuf(v, DT_DTYPE_F64, 1, ksh)),
                    DT_ERR_INVALID_ARGUMENT);
    DT_ASSERT_ERROR_MENTIONS("index 6 out of range 0..5");
}

/* ---- einsum ------------------------------------------------------------------------------ */

/* Naive einsum on explicit letters with broadcasting (size 1 stretches). */
static void naive_einsum(const char *eq, int nin, const double *const *x, const int *rank,
                         const int64_t *const *sh, const int64_t *size, double *out, int64_t nout)
{
    dt__einsum_eq e;
    int r[2] = {rank[0], nin > 1 ? rank[1] : 0};
    CU_ASSERT_FATAL(dt__einsum_parse(eq, nin, r, &e) == DT_OK);
    char all[27];
    int nl = 0;
    for (int i = 0; i <= nin; i++)
        for (int d = 0; d < e.rank[i]; d++)
            if (!memchr(all, e.letters[i][d], (size_t)nl))
                all[nl++] = e.letters[i][d];
    memset(out, 0, sizeof(double) * (size_t)nout);
    int64_t v[26] = {0}, total = 1;
    for (int l = 0; l < nl; l++)
        total *= size[all[l] - 'a'];
    for (int64_t t = 0; t < total; t++) {
        int64_t rem = t;
        for (int l = nl - 1; l >= 0; l--) {
            v[all[l] - 'a'] = rem % size[all[l] - 'a'];
            rem /= size[all[l] - 'a'];
        }
        double p = 1;
        for (int i = 0; i < nin; i++) {
            int64_t off = 0;
            for (int d = 0; d < e.rank[i]; d++)
                off = off * sh[i][d] + (sh[i][d] == 1 ? 0 : v[e.letters[i][d] - 'a']);
            p *= x[i][off];
        }
        int64_t off = 0;
        for (int d = 0; d < e.rank[nin]; d++)
            off = off * size[e.letters[nin][d] - 'a'] + v[e.letters[nin][d] - 'a'];
        out[off] += p;
    }
}

typedef struct ecase {
    const char *eq;
    int nin, ra, rb;
    int64_t a[4], b[4];
} ecase;

static void test_einsum_matches_a_naive_sum_on_every_operand_order(void)
{
    static const ecase cases[] = {
        {"ij,jk->ik", 2, 2, 2, {3, 4}, {4, 5}},
        {"ij,kj->ik", 2, 2, 2, {3, 4}, {5, 4}},
        {"ji,jk->ik", 2, 2, 2, {4, 3}, {4, 5}},
        {"ij,jk->ki", 2, 2, 2, {3, 4}, {4, 5}},
        {"bij,bjk->bik", 2, 3, 3, {2, 3, 4}, {2, 4, 5}},
        {"ibj,bjk->bki", 2, 3, 3, {3, 2, 4}, {2, 4, 5}},
        {"bij,jk->bik", 2, 3, 2, {2, 3, 4}, {4, 5}},
        {"...ij,...jk->...ik", 2, 4, 3, {2, 1, 3, 4}, {3, 4, 2}},
        {"i,i->", 2, 1, 1, {5}, {5}},
        {"i,j->ij", 2, 1, 1, {3}, {4}},
        {"ij,j->i", 2, 2, 1, {3, 4}, {4}},
        {"abc,cd->", 2, 3, 2, {2, 3, 4}, {4, 2}},
        {"ij,jk->", 2, 2, 2, {3, 1}, {1, 5}},
        {"ij->ji", 1, 2, 0, {3, 4}, {0}},
        {"ijk->ki", 1, 3, 0, {2, 3, 4}, {0}},
        {"...i->...", 1, 3, 0, {2, 3, 4}, {0}},
        {"ij->", 1, 2, 0, {3, 4}, {0}},
    };
    for (size_t c = 0; c < sizeof(cases) / sizeof(*cases); c++) {
        const ecase *k = &cases[c];
        dt__einsum_eq e;
        int rank[2] = {k->ra, k->rb};
        DT_ASSERT_OK(dt__einsum_parse(k->eq, k->nin, rank, &e));
        int64_t size[26];
        for (int l = 0; l < 26; l++)
            size[l] = 1;
        const int64_t *sh[2] = {k->a, k->b};
        int64_t na = 1, nb = 1;
        for (int i = 0; i < k->nin; i++)
            for (int d = 0; d < e.rank[i]; d++)
                if (sh[i][d] > size[e.letters[i][d] - 'a'])
                    size[e.letters[i][d] - 'a'] = sh[i][d];
        for (int d = 0; d < k->ra; d++)
            na *= k->a[d];
        for (int d = 0; d < k->rb; d++)
            nb *= k->b[d];
        int64_t osh[DT_MAX_RANK], no = 1;
        for (int d = 0; d < e.rank[k->nin]; d++)
            no *= osh[d] = size[e.letters[k->nin][d] - 'a'];
        double a[64], b[64], want[64], got[64];
        float af[64], bf[64], gotf[64];
        for (int64_t i = 0; i < na; i++)
            af[i] = (float)(a[i] = rnd_int(-4, 4));
        for (int64_t i = 0; i < nb; i++)
            bf[i] = (float)(b[i] = rnd_int(-4, 4));
        const double *xs[2] = {a, b};
        naive_einsum(k->eq, k->nin, xs, rank, sh, size, want, no);
        dt_op_attrs at = DT_OP_ATTRS_INIT;
        strcpy(at.s, k->eq);
        dt_op_buf in[2] = {kbuf(a, DT_DTYPE_F64, k->ra, k->a), kbuf(b, DT_DTYPE_F64, k->rb, k->b)};
        DT_ASSERT_OK(
            krun(&dt__def_einsum, &at, k->nin, in, kbuf(got, DT_DTYPE_F64, e.rank[k->nin], osh)));
        dt_op_buf inf[2] = {kbuf(af, DT_DTYPE_F32, k->ra, k->a),
                            kbuf(bf, DT_DTYPE_F32, k->rb, k->b)};
        DT_ASSERT_OK(
            krun(&dt__def_einsum, &at, k->nin, inf, kbuf(gotf, DT_DTYPE_F32, e.rank[k->nin], osh)));
        for (int64_t i = 0; i < no; i++) {
            if (got[i] != want[i] || gotf[i] != (float)want[i])
                fprintf(stderr, "einsum %s: element %lld is %g / %g, want %g\n", k->eq,
                        (long long)i, got[i], (double)gotf[i], want[i]);
            CU_ASSERT(got[i] == want[i] && gotf[i] == (float)want[i]);
        }
    }
}

static void test_einsum_output_only_letters_broadcast_and_scale(void)
{
    /* "i->ij" with j of size 3 from attrs, scaled by 0.5: the backward of a sum. */
    double x[2] = {2, 4}, y[6];
    int64_t sh[1] = {2}, osh[2] = {2, 3};
    dt_op_attrs at = DT_OP_ATTRS_INIT;
    strcpy(at.s, "i->ij");
    at.i['j' - 'a'] = 3;
    at.f[0] = 0.5;
    dt_op_buf in = kbuf(x, DT_DTYPE_F64, 1, sh);
    DT_ASSERT_OK(krun(&dt__def_einsum, &at, 1, &in, kbuf(y, DT_DTYPE_F64, 2, osh)));
    double want[6] = {1, 1, 1, 2, 2, 2};
    CU_ASSERT(memcmp(y, want, sizeof(y)) == 0);
}

static void test_einsum_parse_rejects_bad_equations(void)
{
    dt__einsum_eq e;
    int r[2] = {2, 2};
    CU_ASSERT_EQUAL(dt__einsum_parse("ij,jk", 2, r, &e), DT_ERR_INVALID_ARGUMENT);
    DT_ASSERT_ERROR_MENTIONS("'->'");
    CU_ASSERT_EQUAL(dt__einsum_parse("iJ,jk->ik", 2, r, &e), DT_ERR_INVALID_ARGUMENT);
    DT_ASSERT_ERROR_MENTIONS("'J'");
    CU_ASSERT_EQUAL(dt__einsum_parse("ii,jk->ik", 2, r, &e), DT_ERR_INVALID_ARGUMENT);
    DT_ASSERT_ERROR_MENTIONS("twice");
    CU_ASSERT_EQUAL(dt__einsum_parse("ij,jk,kl->il", 2, r, &e), DT_ERR_INVALID_ARGUMENT);
    CU_ASSERT_EQUAL(dt__einsum_parse("ijk,jk->ik", 2, r, &e), DT_ERR_SHAPE);
    CU_ASSERT_EQUAL(dt__einsum_parse("i..j,jk->ik", 2, r, &e), DT_ERR_INVALID_ARGUMENT);
    int r3[2] = {3, 1};
    DT_ASSERT_OK(dt__einsum_parse("...j,j->...", 2, r3, &e));
    CU_ASSERT(e.rank[2] == 2 && e.letters[0][0] == e.letters[2][0]);
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void test_einsum_ij_jk_runs_at_sgemm_speed(void)
{
    enum { N = 512 };
    float *a = malloc(sizeof(float) * N * N), *b = malloc(sizeof(float) * N * N),
          *c = malloc(sizeof(float) * N * N), *d = malloc(sizeof(float) * N * N);
    CU_ASSERT_FATAL(a && b && c && d);
    for (int i = 0; i < N * N; i++) {
        a[i] = (float)rnd_int(-3, 3);
        b[i] = (float)rnd_int(-3, 3);
    }
    int64_t sh[2] = {N, N};
    dt_op_attrs at = DT_OP_ATTRS_INIT;
    strcpy(at.s, "ij,jk->ik");
    dt_op_buf in[2] = {kbuf(a, DT_DTYPE_F32, 2, sh), kbuf(b, DT_DTYPE_F32, 2, sh)};
    double best_e = 1e9, best_g = 1e9;
    for (int rep = 0; rep < 5; rep++) {
        double t0 = now_s();
        DT_ASSERT_OK(krun(&dt__def_einsum, &at, 2, in, kbuf(c, DT_DTYPE_F32, 2, sh)));
        double t1 = now_s();
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, N, N, 1.0f, a, N, b, N, 0.0f, d,
                    N);
        double t2 = now_s();
        best_e = t1 - t0 < best_e ? t1 - t0 : best_e;
        best_g = t2 - t1 < best_g ? t2 - t1 : best_g;
    }
    CU_ASSERT(memcmp(c, d, sizeof(float) * N * N) == 0);
    fprintf(stderr, "einsum ij,jk->ik 512: %.3f ms, sgemm %.3f ms (ratio %.3f)\n", best_e * 1e3,
            best_g * 1e3, best_g / best_e);
    /* The same sgemm on the caller's data (no copy): the ratio is only noise on a shared
     * machine, so it is asserted where the timing is trusted (DT_TEST_TIMING=1). */
    const char *timing = getenv("DT_TEST_TIMING");
    if (timing && timing[0] == '1')
        CU_ASSERT(best_g / best_e > 0.95);
    free(a);
    free(b);
    free(c);
    free(d);
}

/* ---- cross_entropy ----------------------------------------------------------------------- */

static void test_cross_entropy_kernels_match_hand_worked_values(void)
{
    double x[6] = {0, 0, log(2.0), 1, 1, 1}, loss, dy = 2, dx[6];
    int64_t count = 2;
    int64_t lb[2] = {2, -100}, xs[2] = {2, 3}, ls[1] = {2}, zs[1] = {0};
    dt_op_attrs at = DT_OP_ATTRS_INIT;
    at.i[0] = -100;
    dt_op_buf in[4] = {kbuf(x, DT_DTYPE_F64, 2, xs), kbuf(lb, DT_DTYPE_I64, 1, ls),
                       kbuf(&count, DT_DTYPE_I64, 0, zs), kbuf(&dy, DT_DTYPE_F64, 0, zs)};
    int64_t c = 0;
    DT_ASSERT_OK(krun(&dt__def_label_count, &at, 1, &in[1], kbuf(&c, DT_DTYPE_I64, 0, zs)));
    CU_ASSERT_EQUAL(c, 1);
    DT_ASSERT_OK(krun(&dt__def_cross_entropy, &at, 3, in, kbuf(&loss, DT_DTYPE_F64, 0, zs)));
    CU_ASSERT_DOUBLE_EQUAL(loss, (log(4.0) - log(2.0)) / 2, 1e-15);
    DT_ASSERT_OK(krun(&dt__def_cross_entropy_grad, &at, 4, in, kbuf(dx, DT_DTYPE_F64, 2, xs)));
    CU_ASSERT_DOUBLE_EQUAL(dx[0], 0.25, 1e-15);
    CU_ASSERT_DOUBLE_EQUAL(dx[2], 0.5 - 1, 1e-15);
    CU_ASSERT(dx[3] == 0 && dx[4] == 0 && dx[5] == 0);
    lb[1] = 3;
    CU_ASSERT_EQUAL(krun(&dt__def_cross_entropy, &at, 3, in, kbuf(&loss, DT_DTYPE_F64, 0, zs)),
                    DT_ERR_INVALID_ARGUMENT);
    DT_ASSERT_ERROR_MENTIONS("label 3 out of range 0..2");
}

static const dt_test_case cases[] = {
    DT_TEST(test_sum_mean_max_min_match_a_naive_reference_over_every_axis_set),
    DT_TEST(test_mean_divides_by_the_global_count_of_a_sharded_axis),
    DT_TEST(test_logsumexp_and_var_match_hand_worked_values),
    DT_TEST(test_argmax_and_argmin_take_the_first_extreme_and_add_the_block_offset),
    DT_TEST(test_reduce_grad_splits_max_ties_and_broadcasts_sum),
    DT_TEST(test_log_softmax_and_its_gradient_match_naive_formulas),
    DT_TEST(test_cumsum_runs_forward_and_in_reverse),
    DT_TEST(test_topk_is_sorted_and_breaks_ties_by_the_lower_index),
    DT_TEST(test_einsum_matches_a_naive_sum_on_every_operand_order),
    DT_TEST(test_einsum_output_only_letters_broadcast_and_scale),
    DT_TEST(test_einsum_parse_rejects_bad_equations),
    DT_TEST(test_einsum_ij_jk_runs_at_sgemm_speed),
    DT_TEST(test_cross_entropy_kernels_match_hand_worked_values),
    DT_TEST_END,
};

int main(int argc, char **argv)
{
    return dt_test_main(argc, argv, "opdef_reduce_kernels", cases, 0);
}
