/* The elementwise and random family's CPU kernels, shape functions and rules called directly
 * on host blocks (no runtime): every value against libm or a naive reference written here. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "elem_ref.h"
#include "ops/def_elem.h"

static const dt_op_def *def_of(const char *name)
{
    for (int i = 0; dt__defs_elem[i]; i++)
        if (strcmp(dt__defs_elem[i]->name, name) == 0)
            return dt__defs_elem[i];
    CU_FAIL_FATAL("no such definition");
    return NULL;
}

static dt_op_buf buf(void *data, dt_dtype t, int rank, const int64_t *shape)
{
    dt_op_buf b;
    memset(&b, 0, sizeof b);
    b.data = data;
    b.dtype = t;
    b.rank = rank;
    for (int d = 0; d < rank; d++)
        b.shape[d] = b.global[d] = shape[d];
    return b;
}

static dt_status run(const dt_op_def *def, const dt_op_attrs *at, int nin, const dt_op_buf *in,
                     dt_op_buf out)
{
    dt_op_kernel_args a;
    memset(&a, 0, sizeof a);
    if (at)
        a.attrs = *at;
    a.nin = nin;
    for (int k = 0; k < nin; k++)
        a.in[k] = in[k];
    a.out = out;
    a.user = def->user;
    return def->cpu(&a);
}

static dt_status infer(const dt_op_def *def, const dt_op_attrs *at, int nin,
                       const dt_op_shape *in, dt_op_shape *out)
{
    static const dt_op_attrs zero = DT_OP_ATTRS_INIT;
    dt_op_sig sig;
    memset(&sig, 0, sizeof sig);
    sig.nin = nin;
    for (int k = 0; k < nin; k++)
        sig.in[k] = in[k];
    sig.attrs = at ? at : &zero;
    sig.user = def->user;
    return def->infer(&sig, out);
}

static dt_op_shape shp(dt_dtype t, int rank, const int64_t *dims)
{
    dt_op_shape s;
    memset(&s, 0, sizeof s);
    s.dtype = t;
    s.rank = rank;
    for (int d = 0; d < rank; d++)
        s.dim[d] = dims[d];
    return s;
}

/* ---- unary --------------------------------------------------------------------------- */

static void test_unary_kernels_match_libm_in_f32_and_f64(void)
{
    static const char *names[] = {"exp", "log", "log1p", "sqrt", "rsqrt", "tanh", "sigmoid",
                                  "silu", "neg", "abs", "sign", "square", "reciprocal",
                                  "pow_scalar", "clamp", "add_scalar", "mul_scalar"};
    const double xs[] = {0.25, 1.5, 3.0, -0.75, -2.5, 0.0, 40.0, -100.0, 0.5, 7.0};
    enum { N = 10 };
    int64_t shape[2] = {2, 5};
    for (size_t o = 0; o < sizeof names / sizeof *names; o++) {
        const dt_op_def *def = def_of(names[o]);
        CU_ASSERT_STRING_EQUAL(def->family, "unary");
        CU_ASSERT_STRING_EQUAL(def->rule, "...->...");
        dt_op_attrs at = DT_OP_ATTRS_INIT;
        at.f[0] = !strcmp(names[o], "clamp") ? -1.0 : 1.75;
        at.f[1] = 2.0;
        float xf[N], yf[N];
        double xd[N], yd[N];
        for (int i = 0; i < N; i++) {
            xf[i] = (float)xs[i];
            xd[i] = xs[i];
        }
        dt_op_buf in = buf(xf, DT_DTYPE_F32, 2, shape);
        DT_ASSERT_OK(run(def, &at, 1, &in, buf(yf, DT_DTYPE_F32, 2, shape)));
        in = buf(xd, DT_DTYPE_F64, 2, shape);
        DT_ASSERT_OK(run(def, &at, 1, &in, buf(yd, DT_DTYPE_F64, 2, shape)));
        for (int i = 0; i < N; i++) {
            double wf = ref_unary(names[o], xs[i], at.f[0], at.f[1], 1);
            double wd = ref_unary(names[o], xs[i], at.f[0], at.f[1], 0);
            int okf = (float)wf == yf[i] || (isnan(wf) && isnan(yf[i]));
            int okd = wd == yd[i] || (isnan(wd) && isnan(yd[i]));
            if (!okf || !okd)
                fprintf(stderr, "%s(%g): f32 %.9g want %.9g, f64 %.17g want %.17g\n", names[o],
                        xs[i], (double)yf[i], wf, yd[i], wd);
            CU_ASSERT(okf && okd);
        }
    }
    /* an integer input is refused by the kernel and by infer, naming the op */
    int32_t xi[2] = {1, 2}, yi[2];
    int64_t two = 2;
    dt_op_buf in = buf(xi, DT_DTYPE_I32, 1, &two);
    DT_ASSERT_FAILS(run(def_of("exp"), NULL, 1, &in, buf(yi, DT_DTYPE_I32, 1, &two)),
                    DT_ERR_SHAPE);
    dt_op_shape s = shp(DT_DTYPE_I32, 1, &two), o;
    DT_ASSERT_FAILS(infer(def_of("sqrt"), NULL, 1, &s, &o), DT_ERR_SHAPE);
    DT_ASSERT_ERROR_MENTIONS("sqrt");
    DT_ASSERT_ERROR_MENTIONS("[2] i32");
}

/* ---- binary ---------------------------------------------------------------------------- */

typedef struct bcase {
    int ra;
    int64_t sa[3];
    int rb;
    int64_t sb[3];
} bcase;

static void test_binary_kernels_broadcast_like_numpy(void)
{
    static const char *names[] = {"add", "sub", "mul", "div", "pow", "maximum", "minimum",
                                  "eq", "ne", "lt", "le", "gt", "ge"};
    static const bcase cases[] = {
        {3, {2, 3, 4}, 3, {2, 3, 4}}, {3, {2, 3, 4}, 2, {3, 1}}, {3, {2, 3, 4}, 1, {4}},
        {3, {2, 3, 4}, 0, {0}},       {0, {0}, 3, {2, 3, 4}},    {3, {2, 1, 4}, 3, {1, 3, 1}},
        {2, {3, 1}, 3, {2, 1, 5}},    {1, {1}, 1, {6}},
        /* short rows run in tiles of many rows, with a remainder; a repeated row per outer */
        {3, {2, 600, 7}, 3, {2, 1, 7}}, {1, {7}, 3, {2, 600, 7}}, {3, {2, 600, 7}, 1, {1}},
    };
    for (size_t o = 0; o < sizeof names / sizeof *names; o++) {
        const dt_op_def *def = def_of(names[o]);
        int cmp = o >= 7;
        for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
            const bcase *bc = &cases[c];
            dt_op_shape in[2] = {shp(DT_DTYPE_F64, bc->ra, bc->sa),
                                 shp(DT_DTYPE_F64, bc->rb, bc->sb)};
            dt_op_shape os;
            DT_ASSERT_OK(infer(def, NULL, 2, in, &os));
            CU_ASSERT_EQUAL(os.dtype, cmp ? DT_DTYPE_U8 : DT_DTYPE_F64);
            int64_t na = 1, nb = 1, no = 1;
            for (int d = 0; d < bc->ra; d++)
                na *= bc->sa[d];
            for (int d = 0; d < bc->rb; d++)
                nb *= bc->sb[d];
            for (int d = 0; d < os.rank; d++)
                no *= os.dim[d];
            for (int f32 = 0; f32 < 2; f32++) {
                dt_dtype t = f32 ? DT_DTYPE_F32 : DT_DTYPE_F64;
                size_t es = f32 ? 4 : 8;
                char *a = malloc((size_t)na * es), *b = malloc((size_t)nb * es);
                char *y = malloc((size_t)no * es);
                for (int64_t i = 0; i < na; i++) {
                    double v = 0.5 + (double)((i * 7) % 5) * 0.25; /* positive: pow */
                    if (f32)
                        ((float *)a)[i] = (float)v;
                    else
                        ((double *)a)[i] = v;
                }
                for (int64_t i = 0; i < nb; i++) {
                    double v = 0.5 + (double)((i * 3) % 4) * 0.25;
                    if (f32)
                        ((float *)b)[i] = (float)v;
                    else
                        ((double *)b)[i] = v;
                }
                dt_op_buf ib[2] = {buf(a, t, bc->ra, bc->sa), buf(b, t, bc->rb, bc->sb)};
                DT_ASSERT_OK(run(def, NULL, 2, ib, buf(y, cmp ? DT_DTYPE_U8 : t, os.rank,
                                                      os.dim)));
                int64_t bad = 0;
                for (int64_t k = 0; k < no; k++) {
                    int64_t idx[3] = {0}, r = k;
                    for (int d = os.rank - 1; d >= 0; d--) {
                        idx[d] = r % os.dim[d];
                        r /= os.dim[d];
                    }
                    int64_t ka = ref_bidx(os.rank, idx, bc->ra, bc->sa);
                    int64_t kb = ref_bidx(os.rank, idx, bc->rb, bc->sb);
                    double x = f32 ? ((float *)a)[ka] : ((double *)a)[ka];
                    double z = f32 ? ((float *)b)[kb] : ((double *)b)[kb];
                    double want = ref_binary(names[o], x, z, 0), got;
                    if (f32 && !cmp)
                        want = !strcmp(names[o], "pow") ? (double)powf((float)x, (float)z)
                                                         : (double)(float)want;
                    if (cmp)
                        got = ((uint8_t *)y)[k];
                    else
                        got = f32 ? ((float *)y)[k] : ((double *)y)[k];
                    bad += got != want;
                }
                if (bad)
                    fprintf(stderr, "%s case %zu %s: %lld wrong\n", names[o], c,
                            f32 ? "f32" : "f64", (long long)bad);
                CU_ASSERT_EQUAL(bad, 0);
                free(a);
                free(b);
                free(y);
            }
        }
    }
}

static void test_comparisons_take_integers_and_nan_compares_false(void)
{
    int64_t n = 4;
    float a[4] = {1.0f, NAN, 2.0f, -1.0f}, b[4] = {1.0f, 1.0f, NAN, 0.0f};
    uint8_t y[4];
    dt_op_buf in[2] = {buf(a, DT_DTYPE_F32, 1, &n), buf(b, DT_DTYPE_F32, 1, &n)};
    DT_ASSERT_OK(run(def_of("eq"), NULL, 2, in, buf(y, DT_DTYPE_U8, 1, &n)));
    CU_ASSERT(y[0] == 1 && y[1] == 0 && y[2] == 0 && y[3] == 0);
    DT_ASSERT_OK(run(def_of("ne"), NULL, 2, in, buf(y, DT_DTYPE_U8, 1, &n)));
    CU_ASSERT(y[0] == 0 && y[1] == 1 && y[2] == 1 && y[3] == 1);
    DT_ASSERT_OK(run(def_of("ge"), NULL, 2, in, buf(y, DT_DTYPE_U8, 1, &n)));
    CU_ASSERT(y[0] == 1 && y[1] == 0 && y[2] == 0 && y[3] == 0);
    int64_t ia[4] = {5, -3, 7, 0}, ib = 0, one = 1;
    dt_op_buf ii[2] = {buf(ia, DT_DTYPE_I64, 1, &n), buf(&ib, DT_DTYPE_I64, 1, &one)};
    DT_ASSERT_OK(run(def_of("gt"), NULL, 2, ii, buf(y, DT_DTYPE_U8, 1, &n)));
    CU_ASSERT(y[0] == 1 && y[1] == 0 && y[2] == 1 && y[3] == 0);
    uint8_t ua[4] = {0, 1, 2, 255}, ub[4] = {1, 1, 1, 1};
    dt_op_buf iu[2] = {buf(ua, DT_DTYPE_U8, 1, &n), buf(ub, DT_DTYPE_U8, 1, &n)};
    DT_ASSERT_OK(run(def_of("le"), NULL, 2, iu, buf(y, DT_DTYPE_U8, 1, &n)));
    CU_ASSERT(y[0] == 1 && y[1] == 1 && y[2] == 0 && y[3] == 0);
    /* mixed dtypes and integer arithmetic are refused, naming the op and operands */
    dt_op_shape s[2] = {shp(DT_DTYPE_F32, 1, &n), shp(DT_DTYPE_I32, 1, &n)}, o;
    DT_ASSERT_FAILS(infer(def_of("lt"), NULL, 2, s, &o), DT_ERR_SHAPE);
    DT_ASSERT_ERROR_MENTIONS("lt");
    s[0].dtype = DT_DTYPE_I32;
    DT_ASSERT_FAILS(infer(def_of("add"), NULL, 2, s, &o), DT_ERR_SHAPE);
    DT_ASSERT_ERROR_MENTIONS("add");
}

static void test_binary_infer_rejects_shapes_that_do_not_broadcast(void)
{
    int64_t s1[2] = {2, 3}, s2[1] = {4};
    dt_op_shape in[2] = {shp(DT_DTYPE_F32, 2, s1), shp(DT_DTYPE_F32, 1, s2)}, o;
    DT_ASSERT_FAILS(infer(def_of("div"), NULL, 2, in, &o), DT_ERR_SHAPE);
    DT_ASSERT_ERROR_MENTIONS("div");
    DT_ASSERT_ERROR_MENTIONS("[2,3] f32");
    DT_ASSERT_ERROR_MENTIONS("[4] f32");
    /* masked_fill: the mask must broadcast to x, not x to the mask */
    int64_t s3[2] = {2, 1}, s4[2] = {2, 3};
    dt_op_shape m[2] = {shp(DT_DTYPE_F32, 2, s3), shp(DT_DTYPE_U8, 2, s4)};
    DT_ASSERT_FAILS(infer(def_of("masked_fill"), NULL, 2, m, &o), DT_ERR_SHAPE);
    DT_ASSERT_ERROR_MENTIONS("masked_fill");
    /* where: a and b of one float dtype */
    dt_op_shape w[3] = {shp(DT_DTYPE_U8, 2, s4), shp(DT_DTYPE_F32, 2, s4),
                        shp(DT_DTYPE_F64, 2, s4)};
    DT_ASSERT_FAILS(infer(def_of("where"), NULL, 3, w, &o), DT_ERR_SHAPE);
    w[2].dtype = DT_DTYPE_F32;
    w[0] = shp(DT_DTYPE_I64, 2, s3);
    DT_ASSERT_OK(infer(def_of("where"), NULL, 3, w, &o));
    CU_ASSERT(o.rank == 2 && o.dim[0] == 2 && o.dim[1] == 3 && o.dtype == DT_DTYPE_F32);
}

/* ---- where, masked_fill ---------------------------------------------------------------- */

static void test_where_and_masked_fill_pick_by_condition(void)
{
    int64_t sc[2] = {2, 1}, sa[1] = {3}, sb[2] = {2, 3}, one = 1;
    float cond[2] = {0.0f, -2.0f}; /* row 0 false, row 1 true (any nonzero) */
    double a[3] = {1, 2, 3}, b[6] = {10, 20, 30, 40, 50, 60}, y[6];
    dt_op_buf in[3] = {buf(cond, DT_DTYPE_F32, 2, sc), buf(a, DT_DTYPE_F64, 1, sa),
                       buf(b, DT_DTYPE_F64, 2, sb)};
    DT_ASSERT_OK(run(def_of("where"), NULL, 3, in, buf(y, DT_DTYPE_F64, 2, sb)));
    const double want[6] = {10, 20, 30, 1, 2, 3};
    CU_ASSERT(memcmp(y, want, sizeof want) == 0);
    /* a scalar b */
    double s = -1;
    in[2] = buf(&s, DT_DTYPE_F64, 0, &one);
    DT_ASSERT_OK(run(def_of("where"), NULL, 3, in, buf(y, DT_DTYPE_F64, 2, sb)));
    const double want2[6] = {-1, -1, -1, 1, 2, 3};
    CU_ASSERT(memcmp(y, want2, sizeof want2) == 0);
    /* integer operands (indices): a u8 condition picks i64 elements */
    uint8_t c8[2] = {1, 0};
    int64_t ia[3] = {7, 8, 9}, ib = -1, iy[6];
    dt_op_buf ii[3] = {buf(c8, DT_DTYPE_U8, 2, sc), buf(ia, DT_DTYPE_I64, 1, sa),
                       buf(&ib, DT_DTYPE_I64, 0, &one)};
    DT_ASSERT_OK(run(def_of("where"), NULL, 3, ii, buf(iy, DT_DTYPE_I64, 2, sb)));
    const int64_t wantl[6] = {7, 8, 9, -1, -1, -1};
    CU_ASSERT(memcmp(iy, wantl, sizeof wantl) == 0);
    dt_op_shape ws[3] = {shp(DT_DTYPE_U8, 2, sc), shp(DT_DTYPE_I64, 1, sa),
                         shp(DT_DTYPE_I64, 0, &one)}, wo;
    DT_ASSERT_OK(infer(def_of("where"), NULL, 3, ws, &wo));
    CU_ASSERT_EQUAL(wo.dtype, DT_DTYPE_I64);
    /* masked_fill, plain and inverted, mask u8 broadcast along rows */
    uint8_t mask[3] = {1, 0, 1};
    float x[6] = {1, 2, 3, 4, 5, 6}, z[6];
    dt_op_attrs at = DT_OP_ATTRS_INIT;
    at.f[0] = -7.5;
    dt_op_buf mi[2] = {buf(x, DT_DTYPE_F32, 2, sb), buf(mask, DT_DTYPE_U8, 1, sa)};
    DT_ASSERT_OK(run(def_of("masked_fill"), &at, 2, mi, buf(z, DT_DTYPE_F32, 2, sb)));
    const float wz[6] = {-7.5f, 2, -7.5f, -7.5f, 5, -7.5f};
    CU_ASSERT(memcmp(z, wz, sizeof wz) == 0);
    at.i[0] = 1;
    DT_ASSERT_OK(run(def_of("masked_fill"), &at, 2, mi, buf(z, DT_DTYPE_F32, 2, sb)));
    const float wi[6] = {1, -7.5f, 3, 4, -7.5f, 6};
    CU_ASSERT(memcmp(z, wi, sizeof wi) == 0);
}

/* ---- sum_to ---------------------------------------------------------------------------- */

static void test_sum_to_sums_the_broadcast_dims(void)
{
    const dt_op_def *def = def_of("sum_to");
    int64_t gs[3] = {2, 3, 4};
    float g[24];
    double gd[24];
    for (int i = 0; i < 24; i++)
        gd[i] = g[i] = (float)(i % 7) - 2.0f;
    struct { int r; int64_t s[3]; const char *rule; } cases[] = {
        {2, {3, 1}, "abc->bj"}, {1, {4}, "abc->c"}, {3, {1, 1, 4}, "abc->ijc"},
        {0, {0}, "abc->"}, {3, {2, 3, 4}, "abc->abc"}, {3, {2, 1, 1}, "abc->ajk"},
    };
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        dt_op_attrs at = DT_OP_ATTRS_INIT;
        at.i[0] = cases[c].r;
        for (int d = 0; d < cases[c].r; d++)
            at.i[1 + d] = cases[c].s[d];
        dt_op_shape in = shp(DT_DTYPE_F32, 3, gs), o;
        DT_ASSERT_OK(infer(def, &at, 1, &in, &o));
        dt_op_sig sig;
        memset(&sig, 0, sizeof sig);
        sig.nin = 1;
        sig.in[0] = in;
        sig.attrs = &at;
        char rule[64];
        DT_ASSERT_OK(def->rule_fn(&sig, rule, sizeof rule));
        CU_ASSERT_STRING_EQUAL(rule, cases[c].rule);
        float y[24];
        double yd[24], want[24] = {0};
        dt_op_buf ib = buf(g, DT_DTYPE_F32, 3, gs);
        DT_ASSERT_OK(run(def, &at, 1, &ib, buf(y, DT_DTYPE_F32, cases[c].r, cases[c].s)));
        ib = buf(gd, DT_DTYPE_F64, 3, gs);
        DT_ASSERT_OK(run(def, &at, 1, &ib, buf(yd, DT_DTYPE_F64, cases[c].r, cases[c].s)));
        for (int k = 0; k < 24; k++) {
            int64_t idx[3] = {k / 12, (k / 4) % 3, k % 4};
            want[ref_bidx(3, idx, cases[c].r, cases[c].s)] += gd[k];
        }
        int64_t no = 1;
        for (int d = 0; d < cases[c].r; d++)
            no *= cases[c].s[d];
        for (int64_t k = 0; k < no; k++) {
            CU_ASSERT_EQUAL(y[k], (float)want[k]);
            CU_ASSERT_EQUAL(yd[k], want[k]);
        }
    }
    /* a target g was not broadcast from */
    dt_op_attrs at = DT_OP_ATTRS_INIT;
    at.i[0] = 1;
    at.i[1] = 3;
    dt_op_shape in = shp(DT_DTYPE_F32, 3, gs), o;
    DT_ASSERT_FAILS(infer(def, &at, 1, &in, &o), DT_ERR_SHAPE);
    DT_ASSERT_ERROR_MENTIONS("sum_to");
}

/* ---- random ---------------------------------------------------------------------------- */

static void draw_block(const char *name, dt_dtype t, const int64_t *global, const int64_t *off,
                       const int64_t *len, double f0, double f1, void *out)
{
    dt_op_attrs at = DT_OP_ATTRS_INIT;
    at.i[10] = 1234;
    at.i[11] = 7;
    at.f[0] = f0;
    at.f[1] = f1;
    dt_op_buf b = buf(out, t, 2, len);
    for (int d = 0; d < 2; d++) {
        b.offset[d] = off[d];
        b.global[d] = global[d];
    }
    DT_ASSERT_OK(run(def_of(name), &at, 0, NULL, b));
}

static void test_random_kernels_draw_by_global_index_with_the_right_moments(void)
{
    enum { R = 100, C = 120, N = R * C };
    int64_t g[2] = {R, C};
    static const char *names[] = {"random_uniform", "random_normal", "random_bernoulli"};
    const double f0[] = {-1.0, 2.0, 0.3}, f1[] = {3.0, 0.5, 0.0};
    double *whole = malloc(N * sizeof *whole), *part = malloc(N * sizeof *part);
    float *wf = malloc(N * sizeof *wf);
    for (int o = 0; o < 3; o++) {
        int64_t z[2] = {0, 0};
        draw_block(names[o], DT_DTYPE_F64, g, z, g, f0[o], f1[o], whole);
        /* the same tensor in four blocks of uneven sizes */
        int64_t r0 = 37, c0 = 50;
        int64_t offs[4][2] = {{0, 0}, {0, c0}, {r0, 0}, {r0, c0}};
        int64_t lens[4][2] = {{r0, c0}, {r0, C - c0}, {R - r0, c0}, {R - r0, C - c0}};
        int64_t bad = 0;
        for (int k = 0; k < 4; k++) {
            draw_block(names[o], DT_DTYPE_F64, g, offs[k], lens[k], f0[o], f1[o], part);
            for (int64_t i = 0; i < lens[k][0]; i++)
                for (int64_t j = 0; j < lens[k][1]; j++)
                    bad += part[i * lens[k][1] + j] != whole[(offs[k][0] + i) * C + offs[k][1] + j];
        }
        CU_ASSERT_EQUAL(bad, 0);
        double s = 0, s2 = 0, lo = INFINITY, hi = -INFINITY;
        for (int i = 0; i < N; i++) {
            s += whole[i];
            s2 += whole[i] * whole[i];
            lo = fmin(lo, whole[i]);
            hi = fmax(hi, whole[i]);
        }
        double mean = s / N, var = s2 / N - mean * mean;
        double want_mean = o == 0 ? 1.0 : o == 1 ? 2.0 : 0.3;
        double want_var = o == 0 ? 16.0 / 12.0 : o == 1 ? 0.25 : 0.21;
        double sd = sqrt(want_var / N);
        if (fabs(mean - want_mean) > 5 * sd || fabs(var - want_var) > 0.05 * want_var)
            fprintf(stderr, "%s: mean %g (want %g), var %g (want %g)\n", names[o], mean,
                    want_mean, var, want_var);
        CU_ASSERT(fabs(mean - want_mean) <= 5 * sd);
        CU_ASSERT(fabs(var - want_var) <= 0.05 * want_var);
        if (o == 0)
            CU_ASSERT(lo >= -1.0 && hi < 3.0);
        if (o == 2)
            CU_ASSERT(lo == 0.0 && hi == 1.0);
        /* f32 draws are the f64 ones rounded (uniform, normal) */
        draw_block(names[o], DT_DTYPE_F32, g, z, g, f0[o], f1[o], wf);
        int64_t diff = 0;
        for (int i = 0; i < N; i++)
            diff += wf[i] != (float)whole[i];
        CU_ASSERT_EQUAL(diff, 0);
    }
    /* arange: the global index, in every integer and float dtype */
    int64_t n = 10, off = 4, len = 3;
    int32_t ai[3];
    dt_op_buf b = buf(ai, DT_DTYPE_I32, 1, &len);
    b.offset[0] = off;
    b.global[0] = n;
    DT_ASSERT_OK(run(def_of("arange"), NULL, 0, NULL, b));
    CU_ASSERT(ai[0] == 4 && ai[1] == 5 && ai[2] == 6);
    free(whole);
    free(part);
    free(wf);
}

static void test_random_infer_takes_shape_and_dtype_from_attributes(void)
{
    dt_op_attrs at = DT_OP_ATTRS_INIT;
    at.i[0] = 2;
    at.i[1] = 3;
    at.i[2] = 5;
    at.i[9] = DT_DTYPE_F64;
    dt_op_shape o;
    DT_ASSERT_OK(infer(def_of("random_normal"), &at, 0, NULL, &o));
    CU_ASSERT(o.rank == 2 && o.dim[0] == 3 && o.dim[1] == 5 && o.dtype == DT_DTYPE_F64);
    dt_op_sig sig;
    memset(&sig, 0, sizeof sig);
    sig.attrs = &at;
    char rule[32];
    DT_ASSERT_OK(def_of("random_normal")->rule_fn(&sig, rule, sizeof rule));
    CU_ASSERT_STRING_EQUAL(rule, "->ab");
    at.i[9] = DT_DTYPE_I32;
    DT_ASSERT_FAILS(infer(def_of("random_uniform"), &at, 0, NULL, &o), DT_ERR_SHAPE);
    DT_ASSERT_ERROR_MENTIONS("random_uniform");
    DT_ASSERT_OK(infer(def_of("arange"), &at, 0, NULL, &o));
    at.i[2] = -1;
    at.i[9] = DT_DTYPE_F32;
    DT_ASSERT_FAILS(infer(def_of("random_uniform"), &at, 0, NULL, &o),
                    DT_ERR_INVALID_ARGUMENT);
}

/* ---- mse ------------------------------------------------------------------------------- */

static void test_mse_kernel_gives_the_mean_and_its_blocks_add_up(void)
{
    const dt_op_def *def = def_of("mse");
    int64_t s[2] = {2, 4}, h[2] = {1, 4};
    float p[8] = {1, 2, 3, 4, 5, 6, 7, 8}, t[8] = {0, 2, 5, 4, 1, 6, 7, 10};
    float y, y0, y1;
    dt_op_buf in[2] = {buf(p, DT_DTYPE_F32, 2, s), buf(t, DT_DTYPE_F32, 2, s)};
    DT_ASSERT_OK(run(def, NULL, 2, in, buf(&y, DT_DTYPE_F32, 0, s)));
    CU_ASSERT_EQUAL(y, (1.0f + 4.0f + 16.0f + 4.0f) / 8.0f);
    /* the two rows as blocks of the global [2, 4]: partial sums of the mean */
    for (int r = 0; r < 2; r++) {
        dt_op_buf bl[2] = {buf(p + 4 * r, DT_DTYPE_F32, 2, h), buf(t + 4 * r, DT_DTYPE_F32, 2, h)};
        for (int k = 0; k < 2; k++) {
            bl[k].global[0] = 2;
            bl[k].offset[0] = r;
        }
        DT_ASSERT_OK(run(def, NULL, 2, bl, buf(r ? &y1 : &y0, DT_DTYPE_F32, 0, s)));
    }
    CU_ASSERT_EQUAL(y0 + y1, y);
    dt_op_sig sig;
    memset(&sig, 0, sizeof sig);
    sig.nin = 2;
    sig.in[0] = sig.in[1] = shp(DT_DTYPE_F32, 2, s);
    char rule[32];
    DT_ASSERT_OK(def->rule_fn(&sig, rule, sizeof rule));
    CU_ASSERT_STRING_EQUAL(rule, "ab,ab->");
    dt_op_shape o, bad[2] = {shp(DT_DTYPE_F32, 2, s), shp(DT_DTYPE_F32, 2, h)};
    DT_ASSERT_FAILS(infer(def, NULL, 2, bad, &o), DT_ERR_SHAPE);
    DT_ASSERT_ERROR_MENTIONS("mse");
}

static void test_every_definition_is_complete(void)
{
    int n = 0;
    for (int i = 0; dt__defs_elem[i]; i++, n++) {
        const dt_op_def *d = dt__defs_elem[i];
        CU_ASSERT(d->name && d->cpu && d->doc && d->family);
        CU_ASSERT(d->rule || d->rule_fn);
        CU_ASSERT(d->cuda == NULL);
        CU_ASSERT(d->infer != NULL);
        /* the validator's sample: every op but the constructors */
        CU_ASSERT((d->sample == NULL) == (d->nin == 0));
        if (d->sample) {
            for (uint64_t seed = 0; seed < 20; seed++) {
                dt_op_sig sig;
                dt_op_attrs at = DT_OP_ATTRS_INIT;
                memset(&sig, 0, sizeof sig);
                DT_ASSERT_OK(d->sample(seed, 4, &sig, &at));
                sig.attrs = &at;
                sig.user = d->user;
                dt_op_shape o;
                DT_ASSERT_OK(d->infer(&sig, &o));
            }
        }
    }
    CU_ASSERT_EQUAL(n, 38);
}

int main(int argc, char **argv)
{
    static const dt_test_case cases[] = {
        DT_TEST(test_unary_kernels_match_libm_in_f32_and_f64),
        DT_TEST(test_binary_kernels_broadcast_like_numpy),
        DT_TEST(test_comparisons_take_integers_and_nan_compares_false),
        DT_TEST(test_binary_infer_rejects_shapes_that_do_not_broadcast),
        DT_TEST(test_where_and_masked_fill_pick_by_condition),
        DT_TEST(test_sum_to_sums_the_broadcast_dims),
        DT_TEST(test_random_kernels_draw_by_global_index_with_the_right_moments),
        DT_TEST(test_random_infer_takes_shape_and_dtype_from_attributes),
        DT_TEST(test_mse_kernel_gives_the_mean_and_its_blocks_add_up),
        DT_TEST(test_every_definition_is_complete),
        DT_TEST_END};
    return dt_test_main(argc, argv, "opdef_elem_kernels", cases, 0);
}
