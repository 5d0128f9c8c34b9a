/* ops/k_binary: the CPU kernels of the broadcasting binary ops (add ... minimum, the
 * comparisons) and the broadcast iteration plan every elementwise kernel of the family walks.
 * The inner loop runs over the merged contiguous last dims with one operand a vector or a
 * scalar, so it vectorises; large float outputs of add/sub/mul/div use streaming stores. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <tgmath.h>

#include "ops/def_elem.h"
#include "runtime/error.h"

int64_t dt__ew_plan_make(int rank, const int64_t *shape, int nin, const dt_op_buf *in,
                         dt__ew_plan *p)
{
    int64_t cs[DT_OP_MAX_IN][DT_MAX_RANK];
    int64_t total = 1;
    for (int d = 0; d < rank; d++)
        total *= shape[d];
    for (int k = 0; k < nin; k++) {
        int64_t s = 1;
        for (int j = in[k].rank - 1; j >= 0; j--) {
            cs[k][j] = s;
            s *= in[k].shape[j];
        }
    }
    memset(p, 0, sizeof *p);
    p->nin = nin;
    int m = 0;
    for (int d = 0; d < rank; d++) {
        if (shape[d] == 1)
            continue;
        int64_t st[DT_OP_MAX_IN];
        for (int k = 0; k < nin; k++) {
            int j = d - (rank - in[k].rank);
            st[k] = j >= 0 && in[k].shape[j] != 1 ? cs[k][j] : 0;
        }
        int merge = m > 0;
        for (int k = 0; k < nin && merge; k++)
            merge = p->st[k][m - 1] == st[k] * shape[d];
        if (merge) {
            p->n[m - 1] *= shape[d];
            for (int k = 0; k < nin; k++)
                p->st[k][m - 1] = st[k];
        } else {
            p->n[m] = shape[d];
            for (int k = 0; k < nin; k++)
                p->st[k][m] = st[k];
            m++;
        }
    }
    if (m == 0) {
        p->n[0] = 1;
        m = 1;
    }
    p->rank = m;
    return total;
}

void dt__ew_plan_rows(const dt__ew_plan *p, dt__ew_row_fn fn, void *ctx)
{
    int r = p->rank;
    int64_t len = p->n[r - 1], rows = 1;
    for (int d = 0; d < r - 1; d++)
        rows *= p->n[d];
    int64_t idx[DT_MAX_RANK] = {0}, off[DT_OP_MAX_IN] = {0};
    for (int64_t row = 0; row < rows; row++) {
        fn(row, off, len, ctx);
        for (int d = r - 2; d >= 0; d--) {
            idx[d]++;
            for (int k = 0; k < p->nin; k++)
                off[k] += p->st[k][d];
            if (idx[d] < p->n[d])
                break;
            idx[d] = 0;
            for (int k = 0; k < p->nin; k++)
                off[k] -= p->st[k][d] * p->n[d];
        }
    }
}

/* ---- inner loops: vv (both vectors), vs (b a scalar), sv (a a scalar) ------------------ */

typedef void (*inner_fn)(int64_t n, const void *a, const void *b, void *o);
typedef struct bin_fns {
    inner_fn vv, vs, sv;
} bin_fns;

#define BIN_FNS(NAME, T, TO, EXPR)                                                          \
    static void NAME##_vv(int64_t n, const void *pa, const void *pb, void *po)              \
    {                                                                                       \
        const T *restrict a = pa;                                                           \
        const T *restrict b = pb;                                                           \
        TO *restrict o = po;                                                                \
        for (int64_t i = 0; i < n; i++) {                                                   \
            T x = a[i], y = b[i];                                                           \
            o[i] = (TO)(EXPR);                                                              \
        }                                                                                   \
    }                                                                                       \
    static void NAME##_vs(int64_t n, const void *pa, const void *pb, void *po)              \
    {                                                                                       \
        const T *restrict a = pa;                                                           \
        const T y = *(const T *)pb;                                                         \
        TO *restrict o = po;                                                                \
        for (int64_t i = 0; i < n; i++) {                                                   \
            T x = a[i];                                                                     \
            o[i] = (TO)(EXPR);                                                              \
        }                                                                                   \
    }                                                                                       \
    static void NAME##_sv(int64_t n, const void *pa, const void *pb, void *po)              \
    {                                                                                       \
        const T x = *(const T *)pa;                                                         \
        const T *restrict b = pb;                                                           \
        TO *restrict o = po;                                                                \
        for (int64_t i = 0; i < n; i++) {                                                   \
            T y = b[i];                                                                     \
            o[i] = (TO)(EXPR);                                                              \
        }                                                                                   \
    }

#define FNS(NAME) {NAME##_vv, NAME##_vs, NAME##_sv}

/* NaN propagates through maximum and minimum (PyTorch). */
#define MAX_EXPR (x > y || x != x ? x : y)
#define MIN_EXPR (x < y || x != x ? x : y)

#define ARITH(T, S)                                                                         \
    BIN_FNS(add_##S, T, T, x + y)                                                           \
    BIN_FNS(sub_##S, T, T, x - y)                                                           \
    BIN_FNS(mul_##S, T, T, x * y)                                                           \
    BIN_FNS(div_##S, T, T, x / y)                                                           \
    BIN_FNS(pow_##S, T, T, pow(x, y))                                                       \
    BIN_FNS(max_##S, T, T, MAX_EXPR)                                                        \
    BIN_FNS(min_##S, T, T, MIN_EXPR)
ARITH(float, f32)
ARITH(double, f64)

#define CMP(T, S)                                                                           \
    BIN_FNS(eq_##S, T, uint8_t, x == y)                                                     \
    BIN_FNS(ne_##S, T, uint8_t, x != y)                                                     \
    BIN_FNS(lt_##S, T, uint8_t, x < y)                                                      \
    BIN_FNS(le_##S, T, uint8_t, x <= y)                                                     \
    BIN_FNS(gt_##S, T, uint8_t, x > y)                                                      \
    BIN_FNS(ge_##S, T, uint8_t, x >= y)
CMP(float, f32)
CMP(double, f64)
CMP(int32_t, i32)
CMP(int64_t, i64)
CMP(uint8_t, u8)

#define NOFNS {NULL, NULL, NULL}
#define ARITH_ROW(N) {FNS(N##_f32), FNS(N##_f64), NOFNS, NOFNS, NOFNS}
#define CMP_ROW(N) {FNS(N##_f32), FNS(N##_f64), FNS(N##_i32), FNS(N##_i64), FNS(N##_u8)}

static const bin_fns table[DT__BIN_COUNT_][5] = {
    [DT__BIN_ADD] = ARITH_ROW(add), [DT__BIN_SUB] = ARITH_ROW(sub),
    [DT__BIN_MUL] = ARITH_ROW(mul), [DT__BIN_DIV] = ARITH_ROW(div),
    [DT__BIN_POW] = ARITH_ROW(pow), [DT__BIN_MAXIMUM] = ARITH_ROW(max),
    [DT__BIN_MINIMUM] = ARITH_ROW(min),
    [DT__BIN_EQ] = CMP_ROW(eq), [DT__BIN_NE] = CMP_ROW(ne), [DT__BIN_LT] = CMP_ROW(lt),
    [DT__BIN_LE] = CMP_ROW(le), [DT__BIN_GT] = CMP_ROW(gt), [DT__BIN_GE] = CMP_ROW(ge),
};

/* ---- streaming stores: outputs larger than the caches skip the read-for-ownership of the
 * destination lines (as memcpy does), a third less memory traffic. Same IEEE operations, so
 * the same bits as the plain loops. x86-64 only (SSE2 is baseline there). */
#if defined(__x86_64__) && defined(__GNUC__)
#include <emmintrin.h>
#define NT_PATH 1
#define NT_MIN_BYTES ((int64_t)8 << 20)

#define NT_FNS(NAME, T, V, W, LOAD, SET1, OP, STREAM, EXPR)                                 \
    static void NAME##_nt(int64_t n, const T *a, const T *b, int sa, int sb, T *o)          \
    {                                                                                       \
        int64_t i = 0;                                                                      \
        for (; i < n && ((uintptr_t)(o + i) & 15u); i++) {                                  \
            T x = a[sa ? i : 0], y = b[sb ? i : 0];                                         \
            o[i] = EXPR;                                                                    \
        }                                                                                   \
        if (sa && sb)                                                                       \
            for (; i + W <= n; i += W)                                                      \
                STREAM(o + i, OP(LOAD(a + i), LOAD(b + i)));                                \
        else if (sa) {                                                                      \
            V vb = SET1(*b);                                                                \
            for (; i + W <= n; i += W)                                                      \
                STREAM(o + i, OP(LOAD(a + i), vb));                                         \
        } else {                                                                            \
            V va = SET1(*a);                                                                \
            for (; i + W <= n; i += W)                                                      \
                STREAM(o + i, OP(va, LOAD(b + i)));                                         \
        }                                                                                   \
        for (; i < n; i++) {                                                                \
            T x = a[sa ? i : 0], y = b[sb ? i : 0];                                         \
            o[i] = EXPR;                                                                    \
        }                                                                                   \
    }
#define NT_F32(N, OP, E)                                                                    \
    NT_FNS(N##_f32, float, __m128, 4, _mm_loadu_ps, _mm_set1_ps, OP, _mm_stream_ps, E)
#define NT_F64(N, OP, E)                                                                    \
    NT_FNS(N##_f64, double, __m128d, 2, _mm_loadu_pd, _mm_set1_pd, OP, _mm_stream_pd, E)
NT_F32(add, _mm_add_ps, x + y)
NT_F32(sub, _mm_sub_ps, x - y)
NT_F32(mul, _mm_mul_ps, x * y)
NT_F32(div, _mm_div_ps, x / y)
NT_F64(add, _mm_add_pd, x + y)
NT_F64(sub, _mm_sub_pd, x - y)
NT_F64(mul, _mm_mul_pd, x * y)
NT_F64(div, _mm_div_pd, x / y)
#endif

typedef struct bin_run {
    const char *a, *b;
    char *o;
    size_t ea, eb, eo;
    inner_fn fn;
    int sa, sb; /* vector (1) or scalar (0) operands of the inner loop */
    int nt;     /* streaming stores */
    int col, op;
} bin_run;

static void call(const bin_run *r, int64_t len, const void *pa, const void *pb, void *po)
{
#ifdef NT_PATH
    if (r->nt) {
        if (r->col == 0) {
            void (*f)(int64_t, const float *, const float *, int, int, float *) =
                r->op == DT__BIN_ADD ? add_f32_nt : r->op == DT__BIN_SUB ? sub_f32_nt
                : r->op == DT__BIN_MUL ? mul_f32_nt : div_f32_nt;
            f(len, pa, pb, r->sa, r->sb, po);
        } else {
            void (*f)(int64_t, const double *, const double *, int, int, double *) =
                r->op == DT__BIN_ADD ? add_f64_nt : r->op == DT__BIN_SUB ? sub_f64_nt
                : r->op == DT__BIN_MUL ? mul_f64_nt : div_f64_nt;
            f(len, pa, pb, r->sa, r->sb, po);
        }
        return;
    }
#endif
    r->fn(len, pa, pb, po);
}

static void bin_row(int64_t row, const int64_t *offs, int64_t len, void *ctx)
{
    const bin_run *r = ctx;
    call(r, len, r->a + (size_t)offs[0] * r->ea, r->b + (size_t)offs[1] * r->eb,
         r->o + (size_t)(row * len) * r->eo);
}

static void choose(bin_run *r, const bin_fns *f, int64_t total, int64_t len)
{
    r->fn = r->sa && r->sb ? f->vv : r->sa ? f->vs : f->sv;
#ifdef NT_PATH
    r->nt = r->op <= DT__BIN_DIV && r->col <= 1 && total * (int64_t)r->eo >= NT_MIN_BYTES &&
            len * (int64_t)r->eo >= 4096;
#else
    (void)total;
    (void)len;
#endif
}

/* Short rows (a bias of a few elements): the two last dims at once, each operand contiguous
 * through both, a row repeated along the outer one (copied into a tile of K rows), or one
 * scalar; K rows are then one inner loop. Returns 0 (nothing done) when the shape does not
 * fit or a tile cannot be had. */
#define TILE_ELEMS 4096
static int run_tiled(const dt__ew_plan *p, bin_run *r, const bin_fns *f, int64_t total)
{
    int R = p->rank;
    if (R < 2 || p->n[R - 1] >= 1024)
        return 0;
    int64_t len = p->n[R - 1], rows = p->n[R - 2];
    int64_t K = TILE_ELEMS / len < rows ? TILE_ELEMS / len : rows;
    if (K < 2)
        return 0;
    int kind[2]; /* 0 contiguous, 1 repeated row, 2 scalar */
    for (int k = 0; k < 2; k++) {
        int64_t si = p->st[k][R - 1], so = p->st[k][R - 2];
        kind[k] = si == 1 && so == len ? 0 : si == 1 && so == 0 ? 1 : si == 0 && so == 0 ? 2 : -1;
        if (kind[k] < 0)
            return 0;
    }
    const char *data[2] = {r->a, r->b};
    size_t es[2] = {r->ea, r->eb};
    char *tile[2] = {NULL, NULL};
    for (int k = 0; k < 2; k++)
        if (kind[k] == 1 && !(tile[k] = malloc((size_t)(K * len) * es[k]))) {
            free(tile[0]);
            return 0;
        }
    r->sa = kind[0] != 2;
    r->sb = kind[1] != 2;
    choose(r, f, total, K * len);
    int64_t outer = 1, idx[DT_MAX_RANK] = {0}, off[2] = {0, 0};
    for (int d = 0; d < R - 2; d++)
        outer *= p->n[d];
    for (int64_t o = 0; o < outer; o++) {
        for (int k = 0; k < 2; k++)
            if (kind[k] == 1)
                for (int64_t j = 0; j < K; j++)
                    memcpy(tile[k] + (size_t)(j * len) * es[k], data[k] + (size_t)off[k] * es[k],
                           (size_t)len * es[k]);
        for (int64_t j = 0; j < rows; j += K) {
            int64_t kk = rows - j < K ? rows - j : K;
            const void *ptr[2];
            for (int k = 0; k < 2; k++)
                ptr[k] = kind[k] == 1 ? (const void *)tile[k]
                         : data[k] + (size_t)(off[k] + (kind[k] == 0 ? j * len : 0)) * es[k];
            call(r, kk * len, ptr[0], ptr[1], r->o + (size_t)((o * rows + j) * len) * r->eo);
        }
        for (int d = R - 3; d >= 0; d--) {
            idx[d]++;
            for (int k = 0; k < 2; k++)
                off[k] += p->st[k][d];
            if (idx[d] < p->n[d])
                break;
            idx[d] = 0;
            for (int k = 0; k < 2; k++)
                off[k] -= p->st[k][d] * p->n[d];
        }
    }
    free(tile[0]);
    free(tile[1]);
    return 1;
}

dt_status dt__k_binary(const dt_op_kernel_args *a, dt__bin_op op)
{
    const dt_op_buf *ia = &a->in[0], *ib = &a->in[1], *o = &a->out;
    int col = dt__elem_col(ia->dtype);
    if ((unsigned)op >= DT__BIN_COUNT_ || col < 0 || ib->dtype != ia->dtype ||
        !table[op][col].vv)
        return dt__error(DT_ERR_SHAPE, "binary kernel: dtypes %s and %s not supported",
                         dt_dtype_name(ia->dtype), dt_dtype_name(ib->dtype));
    dt__ew_plan p;
    int64_t total = dt__ew_plan_make(o->rank, o->shape, 2, a->in, &p);
    if (total == 0)
        return DT_OK;
    bin_run r = {.a = ia->data, .b = ib->data, .o = o->data,
                 .ea = dt_dtype_size(ia->dtype), .eb = dt_dtype_size(ib->dtype),
                 .eo = dt_dtype_size(o->dtype), .col = col, .op = (int)op};
    const bin_fns *f = &table[op][col];
    if (!run_tiled(&p, &r, f, total)) {
        int last = p.rank - 1;
        r.sa = p.st[0][last] != 0 || p.n[last] == 1;
        r.sb = p.st[1][last] != 0 || p.n[last] == 1;
        choose(&r, f, total, p.n[last]);
        dt__ew_plan_rows(&p, bin_row, &r);
    }
#ifdef NT_PATH
    if (r.nt)
        _mm_sfence();
#endif
    return DT_OK;
}
