/* The shape and index family's definitions without the generic path: the rules their rule_fn
 * writes, their shape checks and messages, and their CPU kernels on hand-built local blocks
 * (whole and sharded) against a naive reference or hand-worked values. */
#include <stdio.h>
#include <string.h>

#include "harness.h"
#include "ops/shape_impl.h"

/* A signature of the given inputs and attributes. */
static dt_op_sig sig_of(int nin, const dt_op_shape *in, const dt_op_attrs *a)
{
    dt_op_sig s;
    memset(&s, 0, sizeof s);
    s.nin = nin;
    for (int k = 0; k < nin; k++)
        s.in[k] = in[k];
    s.attrs = a;
    return s;
}

static dt_op_shape shp(dt_dtype dtype, int rank, const int64_t *dim)
{
    dt_op_shape s = {dtype, rank, {0}};
    for (int d = 0; d < rank; d++)
        s.dim[d] = dim[d];
    return s;
}

/* The rule def writes for the call, into buf. */
static dt_status rule_of(const dt_op_def *def, int nin, const dt_op_shape *in, const dt_op_attrs *a,
                         char *buf, size_t len)
{
    dt_op_sig s = sig_of(nin, in, a);
    return def->rule_fn(&s, buf, len);
}

static void check_rule(const dt_op_def *def, int nin, const dt_op_shape *in, const dt_op_attrs *a,
                       const char *want)
{
    char buf[128];
    DT_ASSERT_OK(rule_of(def, nin, in, a, buf, sizeof buf));
    if (strcmp(buf, want) != 0)
        fprintf(stderr, "%s: rule %s, want %s\n", def->name, buf, want);
    CU_ASSERT_STRING_EQUAL(buf, want);
}

/* A local block: data, dtype, local shape at offset of the global shape (NULL: whole). */
static dt_op_buf blk(void *data, dt_dtype dtype, int rank, const int64_t *shape, const int64_t *off,
                     const int64_t *global)
{
    dt_op_buf b;
    memset(&b, 0, sizeof b);
    b.data = data;
    b.dtype = dtype;
    b.rank = rank;
    for (int d = 0; d < rank; d++) {
        b.shape[d] = shape[d];
        b.offset[d] = off ? off[d] : 0;
        b.global[d] = global ? global[d] : shape[d];
    }
    return b;
}

static dt_op_kernel_args args_of(const dt_op_attrs *a, int nin, const dt_op_buf *in, dt_op_buf out)
{
    dt_op_kernel_args k;
    memset(&k, 0, sizeof k);
    k.attrs = *a;
    k.nin = nin;
    for (int i = 0; i < nin; i++)
        k.in[i] = in[i];
    k.out = out;
    return k;
}

static dt_op_attrs attrs(int n, const int64_t *v)
{
    dt_op_attrs a = DT_OP_ATTRS_INIT;
    for (int k = 0; k < n; k++)
        a.i[k] = v[k];
    return a;
}

/* ---- reshape ---------------------------------------------------------------------------- */

static void test_reshape_rule_groups_dims_into_matching_runs(void)
{
    dt_op_shape x = shp(DT_DTYPE_F32, 2, (int64_t[]){6, 4});
    dt_op_attrs a = attrs(4, (int64_t[]){3, 2, 3, 4});
    check_rule(&dt__def_reshape, 1, &x, &a, "(ab)c->abc");
    a = attrs(4, (int64_t[]){3, 2, -1, 4});
    check_rule(&dt__def_reshape, 1, &x, &a, "(ab)c->abc");
    a = attrs(2, (int64_t[]){1, 24});
    check_rule(&dt__def_reshape, 1, &x, &a, "ab->(ab)");
    a = attrs(3, (int64_t[]){2, 2, 12});
    check_rule(&dt__def_reshape, 1, &x, &a, "(ab)c->a(bc)");
    dt_op_shape y = shp(DT_DTYPE_F32, 2, (int64_t[]){2, 3});
    a = attrs(3, (int64_t[]){2, 3, 2});
    check_rule(&dt__def_reshape, 1, &y, &a, "AB->CD");
    dt_op_shape z = shp(DT_DTYPE_F32, 3, (int64_t[]){6, 1, 4});
    a = attrs(4, (int64_t[]){3, 2, 3, 4});
    check_rule(&dt__def_reshape, 1, &z, &a, "(ab)Ac->abc");
    a = attrs(4, (int64_t[]){3, 1, 24, 1});
    check_rule(&dt__def_reshape, 1, &x, &a, "ab->A(ab)B");
}

static void test_reshape_infers_minus_one_and_rejects_bad_shapes(void)
{
    dt_op_shape x = shp(DT_DTYPE_F64, 2, (int64_t[]){6, 4}), o;
    dt_op_attrs a = attrs(3, (int64_t[]){2, -1, 3});
    dt_op_sig s = sig_of(1, &x, &a);
    DT_ASSERT_OK(dt__def_reshape.infer(&s, &o));
    CU_ASSERT_EQUAL(o.rank, 2);
    CU_ASSERT_EQUAL(o.dim[0], 8);
    CU_ASSERT_EQUAL(o.dim[1], 3);
    CU_ASSERT_EQUAL(o.dtype, DT_DTYPE_F64);
    a = attrs(3, (int64_t[]){2, 5, -1});
    DT_ASSERT_FAILS(dt__def_reshape.infer(&s, &o), DT_ERR_SHAPE);
    DT_ASSERT_ERROR_MENTIONS("[6,4]");
    a = attrs(3, (int64_t[]){2, 5, 5});
    DT_ASSERT_FAILS(dt__def_reshape.infer(&s, &o), DT_ERR_SHAPE);
    DT_ASSERT_ERROR_MENTIONS("reshape");
    a = attrs(3, (int64_t[]){2, -1, -1});
    DT_ASSERT_FAILS(dt__def_reshape.infer(&s, &o), DT_ERR_INVALID_ARGUMENT);
}

/* out = reshape of the global tensor 0..n-1; each output block checked on its own. */
static void test_reshape_kernel_places_sharded_blocks_by_global_index(void)
{
    float in[24], out[24];
    for (int k = 0; k < 24; k++)
        in[k] = (float)k;
    dt_op_attrs a = attrs(4, (int64_t[]){3, 2, 3, 4});
    /* Rows 3..5 of [6, 4] are output [1, :, :] of [2, 3, 4]: the copy path. */
    dt_op_buf i1 =
        blk(in + 12, DT_DTYPE_F32, 2, (int64_t[]){3, 4}, (int64_t[]){3, 0}, (int64_t[]){6, 4});
    dt_op_buf o1 =
        blk(out, DT_DTYPE_F32, 3, (int64_t[]){1, 3, 4}, (int64_t[]){1, 0, 0}, (int64_t[]){2, 3, 4});
    dt_op_kernel_args k = args_of(&a, 1, &i1, o1);
    DT_ASSERT_OK(dt__k_reshape(&k));
    for (int e = 0; e < 12; e++)
        CU_ASSERT_EQUAL(out[e], (float)(12 + e));
    /* Output [:, 1:2, :] from the whole input: element by element. */
    dt_op_buf i2 = blk(in, DT_DTYPE_F32, 2, (int64_t[]){6, 4}, NULL, NULL);
    dt_op_buf o2 =
        blk(out, DT_DTYPE_F32, 3, (int64_t[]){2, 1, 4}, (int64_t[]){0, 1, 0}, (int64_t[]){2, 3, 4});
    k = args_of(&a, 1, &i2, o2);
    DT_ASSERT_OK(dt__k_reshape(&k));
    for (int b = 0; b < 2; b++)
        for (int c = 0; c < 4; c++)
            CU_ASSERT_EQUAL(out[b * 4 + c], (float)(b * 12 + 4 + c));
    /* An output block whose elements the input block lacks is an error, not a crash. */
    k = args_of(&a, 1, &i1, o2);
    DT_ASSERT_FAILS(dt__k_reshape(&k), DT_ERR_INVALID_ARGUMENT);
}

/* ---- permute ---------------------------------------------------------------------------- */

static void test_permute_kernel_matches_naive_transpose_on_whole_and_sharded_blocks(void)
{
    double x[24], y[24];
    for (int k = 0; k < 24; k++)
        x[k] = k * 1.5;
    dt_op_attrs a = attrs(3, (int64_t[]){2, 0, 1}); /* [2,3,4] -> [4,2,3] */
    dt_op_shape xs = shp(DT_DTYPE_F64, 3, (int64_t[]){2, 3, 4});
    check_rule(&dt__def_permute, 1, &xs, &a, "abc->cab");
    dt_op_buf in = blk(x, DT_DTYPE_F64, 3, (int64_t[]){2, 3, 4}, NULL, NULL);
    dt_op_buf out = blk(y, DT_DTYPE_F64, 3, (int64_t[]){4, 2, 3}, NULL, NULL);
    dt_op_kernel_args k = args_of(&a, 1, &in, out);
    DT_ASSERT_OK(dt__k_permute(&k));
    for (int c = 0; c < 4; c++)
        for (int i = 0; i < 2; i++)
            for (int j = 0; j < 3; j++)
                CU_ASSERT_EQUAL(y[(c * 2 + i) * 3 + j], x[(i * 3 + j) * 4 + c]);
    /* The block of input dim 0 = 1 (sharded) is output dim 1 = 1. */
    dt_op_buf in1 = blk(x + 12, DT_DTYPE_F64, 3, (int64_t[]){1, 3, 4}, (int64_t[]){1, 0, 0},
                        (int64_t[]){2, 3, 4});
    dt_op_buf out1 =
        blk(y, DT_DTYPE_F64, 3, (int64_t[]){4, 1, 3}, (int64_t[]){0, 1, 0}, (int64_t[]){4, 2, 3});
    k = args_of(&a, 1, &in1, out1);
    DT_ASSERT_OK(dt__k_permute(&k));
    for (int c = 0; c < 4; c++)
        for (int j = 0; j < 3; j++)
            CU_ASSERT_EQUAL(y[c * 3 + j], x[(3 + j) * 4 + c]);
    dt_op_attrs bad = attrs(3, (int64_t[]){0, 0, 1});
    dt_op_shape o;
    dt_op_sig s = sig_of(1, &xs, &bad);
    DT_ASSERT_FAILS(dt__def_permute.infer(&s, &o), DT_ERR_INVALID_ARGUMENT);
    DT_ASSERT_ERROR_MENTIONS("permutation");
}

/* ---- slice, concat, expand, squeeze ----------------------------------------------------- */

static void test_slice_kernel_takes_python_ranges_and_its_backward_pads_zeros(void)
{
    float x[15], y[15], z[15];
    for (int k = 0; k < 15; k++)
        x[k] = (float)k;
    dt_op_shape xs = shp(DT_DTYPE_F32, 2, (int64_t[]){5, 3}), o;
    dt_op_attrs a = attrs(4, (int64_t[]){0, -4, 100, 2}); /* rows 1, 3 */
    dt_op_sig s = sig_of(1, &xs, &a);
    DT_ASSERT_OK(dt__def_slice.infer(&s, &o));
    CU_ASSERT_EQUAL(o.dim[0], 2);
    CU_ASSERT_EQUAL(o.dim[1], 3);
    check_rule(&dt__def_slice, 1, &xs, &a, "Ab->Bb");
    /* Columns 1..2 of the input (dim 1 sharded) give columns 1..2 of the output. */
    float xb[10];
    for (int r = 0; r < 5; r++)
        for (int c = 0; c < 2; c++)
            xb[r * 2 + c] = x[r * 3 + 1 + c];
    dt_op_buf in =
        blk(xb, DT_DTYPE_F32, 2, (int64_t[]){5, 2}, (int64_t[]){0, 1}, (int64_t[]){5, 3});
    dt_op_buf out =
        blk(y, DT_DTYPE_F32, 2, (int64_t[]){2, 2}, (int64_t[]){0, 1}, (int64_t[]){2, 3});
    dt_op_kernel_args k = args_of(&a, 1, &in, out);
    DT_ASSERT_OK(dt__k_slice(&k));
    float want[4] = {4, 5, 10, 11};
    CU_ASSERT_EQUAL(memcmp(y, want, sizeof want), 0);
    /* Backward: [2, 2] back into zeros of [5, 2]. */
    dt_op_attrs b = attrs(5, (int64_t[]){0, -4, 100, 2, 5});
    dt_op_buf dy = blk(y, DT_DTYPE_F32, 2, (int64_t[]){2, 2}, NULL, NULL);
    dt_op_buf dx = blk(z, DT_DTYPE_F32, 2, (int64_t[]){5, 2}, NULL, NULL);
    k = args_of(&b, 1, &dy, dx);
    DT_ASSERT_OK(dt__k_slice_backward(&k));
    float wz[10] = {0, 0, 4, 5, 0, 0, 10, 11, 0, 0};
    CU_ASSERT_EQUAL(memcmp(z, wz, sizeof wz), 0);
    a = attrs(4, (int64_t[]){0, 0, 5, 0});
    DT_ASSERT_FAILS(dt__def_slice.infer(&s, &o), DT_ERR_INVALID_ARGUMENT);
    DT_ASSERT_ERROR_MENTIONS("step");
    a = attrs(4, (int64_t[]){2, 0, 5, 1});
    DT_ASSERT_FAILS(dt__def_slice.infer(&s, &o), DT_ERR_INVALID_ARGUMENT);
    DT_ASSERT_ERROR_MENTIONS("axis 2");
}

static void test_concat_kernel_joins_blocks_and_checks_shapes(void)
{
    int32_t a0[4] = {1, 2, 3, 4}, a1[2] = {5, 6}, a2[6] = {7, 8, 9, 10, 11, 12}, y[12];
    dt_op_attrs a = attrs(1, (int64_t[]){1});
    dt_op_shape in[3] = {shp(DT_DTYPE_I32, 2, (int64_t[]){2, 2}),
                         shp(DT_DTYPE_I32, 2, (int64_t[]){2, 1}),
                         shp(DT_DTYPE_I32, 2, (int64_t[]){2, 3})};
    check_rule(&dt__def_concat, 3, in, &a, "aA,aB,aC->aD");
    dt_op_buf b[3] = {blk(a0, DT_DTYPE_I32, 2, (int64_t[]){2, 2}, NULL, NULL),
                      blk(a1, DT_DTYPE_I32, 2, (int64_t[]){2, 1}, NULL, NULL),
                      blk(a2, DT_DTYPE_I32, 2, (int64_t[]){2, 3}, NULL, NULL)};
    dt_op_kernel_args k = args_of(&a, 3, b, blk(y, DT_DTYPE_I32, 2, (int64_t[]){2, 6}, NULL, NULL));
    DT_ASSERT_OK(dt__k_concat(&k));
    int32_t want[12] = {1, 2, 5, 7, 8, 9, 3, 4, 6, 10, 11, 12};
    CU_ASSERT_EQUAL(memcmp(y, want, sizeof want), 0);
    dt_op_shape o;
    in[1].dim[0] = 3;
    dt_op_sig s = sig_of(3, in, &a);
    DT_ASSERT_FAILS(dt__def_concat.infer(&s, &o), DT_ERR_SHAPE);
    DT_ASSERT_ERROR_MENTIONS("input 1");
}

static void test_expand_kernel_broadcasts_size_one_and_new_dims(void)
{
    float x[3] = {1, 2, 3}, y[24];
    dt_op_attrs a = attrs(4, (int64_t[]){3, 2, -1, 4});
    dt_op_shape xs = shp(DT_DTYPE_F32, 2, (int64_t[]){3, 1}), o;
    dt_op_sig s = sig_of(1, &xs, &a);
    DT_ASSERT_OK(dt__def_expand.infer(&s, &o));
    CU_ASSERT_EQUAL(o.rank, 3);
    CU_ASSERT_EQUAL(o.dim[0], 2);
    CU_ASSERT_EQUAL(o.dim[1], 3);
    CU_ASSERT_EQUAL(o.dim[2], 4);
    check_rule(&dt__def_expand, 1, &xs, &a, "bc->abc");
    dt_op_buf in = blk(x, DT_DTYPE_F32, 2, (int64_t[]){3, 1}, NULL, NULL);
    dt_op_kernel_args k =
        args_of(&a, 1, &in, blk(y, DT_DTYPE_F32, 3, (int64_t[]){2, 3, 4}, NULL, NULL));
    DT_ASSERT_OK(dt__k_expand(&k));
    for (int e = 0; e < 24; e++)
        CU_ASSERT_EQUAL(y[e], x[(e / 4) % 3]);
    a = attrs(3, (int64_t[]){2, 4, 4});
    DT_ASSERT_FAILS(dt__def_expand.infer(&s, &o), DT_ERR_SHAPE);
    DT_ASSERT_ERROR_MENTIONS("[3,1]");
}

static void test_expand_backward_sums_the_expanded_dims_of_each_block(void)
{
    float dy[24], dx[3];
    for (int e = 0; e < 24; e++)
        dy[e] = (float)e;
    dt_op_attrs a = attrs(3, (int64_t[]){2, 3, 1});
    dt_op_shape ys = shp(DT_DTYPE_F32, 3, (int64_t[]){2, 3, 4}), o;
    check_rule(&dt__def_expand_backward, 1, &ys, &a, "abc->bB");
    dt_op_sig s = sig_of(1, &ys, &a);
    DT_ASSERT_OK(dt__def_expand_backward.infer(&s, &o));
    CU_ASSERT_EQUAL(o.rank, 2);
    CU_ASSERT_EQUAL(o.dim[0], 3);
    CU_ASSERT_EQUAL(o.dim[1], 1);
    dt_op_buf in = blk(dy, DT_DTYPE_F32, 3, (int64_t[]){2, 3, 4}, NULL, NULL);
    dt_op_kernel_args k =
        args_of(&a, 1, &in, blk(dx, DT_DTYPE_F32, 2, (int64_t[]){3, 1}, NULL, NULL));
    DT_ASSERT_OK(dt__k_expand_backward(&k));
    for (int r = 0; r < 3; r++) {
        float want = 0;
        for (int b = 0; b < 2; b++)
            for (int c = 0; c < 4; c++)
                want += dy[(b * 3 + r) * 4 + c];
        CU_ASSERT_EQUAL(dx[r], want);
    }
    s.in[0].dtype = DT_DTYPE_I32;
    DT_ASSERT_FAILS(dt__def_expand_backward.infer(&s, &o), DT_ERR_SHAPE);
}

static void test_squeeze_and_unsqueeze_rules_and_shapes(void)
{
    dt_op_shape xs = shp(DT_DTYPE_F32, 3, (int64_t[]){4, 1, 5}), o;
    dt_op_attrs a = attrs(1, (int64_t[]){-2});
    check_rule(&dt__def_squeeze, 1, &xs, &a, "aAc->ac");
    dt_op_sig s = sig_of(1, &xs, &a);
    DT_ASSERT_OK(dt__def_squeeze.infer(&s, &o));
    CU_ASSERT_EQUAL(o.rank, 2);
    CU_ASSERT_EQUAL(o.dim[1], 5);
    a = attrs(1, (int64_t[]){0});
    DT_ASSERT_FAILS(dt__def_squeeze.infer(&s, &o), DT_ERR_SHAPE);
    DT_ASSERT_ERROR_MENTIONS("not 1");
    a = attrs(1, (int64_t[]){-1});
    check_rule(&dt__def_unsqueeze, 1, &xs, &a, "abc->abcA");
    a = attrs(1, (int64_t[]){1});
    DT_ASSERT_OK(dt__def_unsqueeze.infer(&s, &o));
    CU_ASSERT_EQUAL(o.rank, 4);
    CU_ASSERT_EQUAL(o.dim[1], 1);
    CU_ASSERT_EQUAL(o.dim[2], 1);
    a = attrs(1, (int64_t[]){5});
    DT_ASSERT_FAILS(dt__def_unsqueeze.infer(&s, &o), DT_ERR_INVALID_ARGUMENT);
}

/* ---- index ops -------------------------------------------------------------------------- */

static void test_gather_and_scatter_add_kernels_match_hand_worked_values(void)
{
    double x[6] = {1, 2, 3, 4, 5, 6}; /* [2, 3] */
    int64_t idx[4] = {2, 0, 1, 1};    /* [2, 2], axis 1 */
    double y[4], z[6];
    dt_op_attrs a = attrs(1, (int64_t[]){1});
    dt_op_shape in[3] = {shp(DT_DTYPE_F64, 2, (int64_t[]){2, 3}),
                         shp(DT_DTYPE_I64, 2, (int64_t[]){2, 2}),
                         shp(DT_DTYPE_F64, 2, (int64_t[]){2, 2})};
    check_rule(&dt__def_gather, 2, in, &a, "aB,ab->ab");
    check_rule(&dt__def_scatter_add, 3, in, &a, "aB,aJ,aJ->aB");
    dt_op_buf b[3] = {blk(x, DT_DTYPE_F64, 2, (int64_t[]){2, 3}, NULL, NULL),
                      blk(idx, DT_DTYPE_I64, 2, (int64_t[]){2, 2}, NULL, NULL),
                      blk(y, DT_DTYPE_F64, 2, (int64_t[]){2, 2}, NULL, NULL)};
    dt_op_kernel_args k = args_of(&a, 2, b, blk(y, DT_DTYPE_F64, 2, (int64_t[]){2, 2}, NULL, NULL));
    DT_ASSERT_OK(dt__k_gather(&k));
    double wy[4] = {3, 1, 5, 5};
    CU_ASSERT_EQUAL(memcmp(y, wy, sizeof wy), 0);
    /* scatter_add(x, 1, idx, y): row 0 += {3 at 2, 1 at 0}, row 1 += {5 at 1, 5 at 1}. */
    k = args_of(&a, 3, b, blk(z, DT_DTYPE_F64, 2, (int64_t[]){2, 3}, NULL, NULL));
    DT_ASSERT_OK(dt__k_scatter_add(&k));
    double wz[6] = {2, 2, 6, 4, 15, 6};
    CU_ASSERT_EQUAL(memcmp(z, wz, sizeof wz), 0);
    /* Row 1 only (dim 0 sharded): the same values. */
    dt_op_buf r[3] = {
        blk(x + 3, DT_DTYPE_F64, 2, (int64_t[]){1, 3}, (int64_t[]){1, 0}, (int64_t[]){2, 3}),
        blk(idx + 2, DT_DTYPE_I64, 2, (int64_t[]){1, 2}, (int64_t[]){1, 0}, (int64_t[]){2, 2}),
        blk(y + 2, DT_DTYPE_F64, 2, (int64_t[]){1, 2}, (int64_t[]){1, 0}, (int64_t[]){2, 2})};
    double z1[3];
    k = args_of(&a, 3, r,
                blk(z1, DT_DTYPE_F64, 2, (int64_t[]){1, 3}, (int64_t[]){1, 0}, (int64_t[]){2, 3}));
    DT_ASSERT_OK(dt__k_scatter_add(&k));
    CU_ASSERT_EQUAL(memcmp(z1, wz + 3, sizeof z1), 0);
    idx[3] = 3;
    k = args_of(&a, 2, b, blk(y, DT_DTYPE_F64, 2, (int64_t[]){2, 2}, NULL, NULL));
    DT_ASSERT_FAILS(dt__k_gather(&k), DT_ERR_INVALID_ARGUMENT);
    DT_ASSERT_ERROR_MENTIONS("index 3 out of range [0, 3)");
    idx[3] = -1;
    k = args_of(&a, 3, b, blk(z, DT_DTYPE_F64, 2, (int64_t[]){2, 3}, NULL, NULL));
    DT_ASSERT_FAILS(dt__k_scatter_add(&k), DT_ERR_INVALID_ARGUMENT);
    DT_ASSERT_ERROR_MENTIONS("index -1");
    dt_op_shape o;
    in[1].dtype = DT_DTYPE_F32;
    dt_op_sig s = sig_of(2, in, &a);
    DT_ASSERT_FAILS(dt__def_gather.infer(&s, &o), DT_ERR_SHAPE);
    DT_ASSERT_ERROR_MENTIONS("i32 or i64");
}

static void test_index_select_and_index_add_kernels_match_hand_worked_values(void)
{
    float x[6] = {1, 2, 3, 4, 5, 6}; /* [3, 2], axis 0 */
    int32_t idx[4] = {2, 0, 2, 1};
    float y[8], z[6];
    dt_op_attrs a = attrs(1, (int64_t[]){0});
    dt_op_shape in[3] = {shp(DT_DTYPE_F32, 2, (int64_t[]){3, 2}),
                         shp(DT_DTYPE_I32, 1, (int64_t[]){4}),
                         shp(DT_DTYPE_F32, 2, (int64_t[]){4, 2})};
    check_rule(&dt__def_index_select, 2, in, &a, "Ab,a->ab");
    check_rule(&dt__def_index_add, 3, in, &a, "Ab,B,Bb->Ab");
    dt_op_buf b[3] = {blk(x, DT_DTYPE_F32, 2, (int64_t[]){3, 2}, NULL, NULL),
                      blk(idx, DT_DTYPE_I32, 1, (int64_t[]){4}, NULL, NULL),
                      blk(y, DT_DTYPE_F32, 2, (int64_t[]){4, 2}, NULL, NULL)};
    dt_op_kernel_args k = args_of(&a, 2, b, blk(y, DT_DTYPE_F32, 2, (int64_t[]){4, 2}, NULL, NULL));
    DT_ASSERT_OK(dt__k_index_select(&k));
    float wy[8] = {5, 6, 1, 2, 5, 6, 3, 4};
    CU_ASSERT_EQUAL(memcmp(y, wy, sizeof wy), 0);
    k = args_of(&a, 3, b, blk(z, DT_DTYPE_F32, 2, (int64_t[]){3, 2}, NULL, NULL));
    DT_ASSERT_OK(dt__k_index_add(&k));
    float wz[6] = {2, 4, 6, 8, 15, 18};
    CU_ASSERT_EQUAL(memcmp(z, wz, sizeof wz), 0);
    /* The index sharded (its second half) selects output rows 2..3. */
    dt_op_buf h[2] = {
        b[0], blk(idx + 2, DT_DTYPE_I32, 1, (int64_t[]){2}, (int64_t[]){2}, (int64_t[]){4})};
    k = args_of(&a, 2, h,
                blk(y, DT_DTYPE_F32, 2, (int64_t[]){2, 2}, (int64_t[]){2, 0}, (int64_t[]){4, 2}));
    DT_ASSERT_OK(dt__k_index_select(&k));
    CU_ASSERT_EQUAL(memcmp(y, wy + 4, 4 * sizeof(float)), 0);
    idx[1] = 7;
    k = args_of(&a, 2, b, blk(y, DT_DTYPE_F32, 2, (int64_t[]){4, 2}, NULL, NULL));
    DT_ASSERT_FAILS(dt__k_index_select(&k), DT_ERR_INVALID_ARGUMENT);
    DT_ASSERT_ERROR_MENTIONS("index 7 out of range [0, 3)");
    k = args_of(&a, 3, b, blk(z, DT_DTYPE_F32, 2, (int64_t[]){3, 2}, NULL, NULL));
    DT_ASSERT_FAILS(dt__k_index_add(&k), DT_ERR_INVALID_ARGUMENT);
    dt_op_shape o;
    in[2].dim[1] = 3;
    dt_op_sig s = sig_of(3, in, &a);
    DT_ASSERT_FAILS(dt__def_index_add.infer(&s, &o), DT_ERR_SHAPE);
    DT_ASSERT_ERROR_MENTIONS("src");
}

static void test_one_hot_kernel_writes_the_class_block_of_each_device(void)
{
    int64_t idx[3] = {2, 0, 3};
    double y[12];
    dt_op_attrs a = attrs(2, (int64_t[]){4, DT_DTYPE_F64});
    dt_op_shape in = shp(DT_DTYPE_I64, 1, (int64_t[]){3}), o;
    check_rule(&dt__def_one_hot, 1, &in, &a, "a->ab");
    dt_op_sig s = sig_of(1, &in, &a);
    DT_ASSERT_OK(dt__def_one_hot.infer(&s, &o));
    CU_ASSERT_EQUAL(o.dtype, DT_DTYPE_F64);
    CU_ASSERT_EQUAL(o.dim[1], 4);
    dt_op_buf b = blk(idx, DT_DTYPE_I64, 1, (int64_t[]){3}, NULL, NULL);
    /* Classes 2..3 of every row. */
    dt_op_kernel_args k =
        args_of(&a, 1, &b,
                blk(y, DT_DTYPE_F64, 2, (int64_t[]){3, 2}, (int64_t[]){0, 2}, (int64_t[]){3, 4}));
    DT_ASSERT_OK(dt__k_one_hot(&k));
    double w[6] = {1, 0, 0, 0, 0, 1};
    CU_ASSERT_EQUAL(memcmp(y, w, sizeof w), 0);
    idx[1] = 4;
    DT_ASSERT_FAILS(dt__k_one_hot(&k), DT_ERR_INVALID_ARGUMENT);
    DT_ASSERT_ERROR_MENTIONS("index 4 out of range [0, 4)");
    a.i[1] = DT_DTYPE_I32;
    DT_ASSERT_FAILS(dt__def_one_hot.infer(&s, &o), DT_ERR_SHAPE);
}

/* Every definition's validator sample is a call its infer and rule accept. */
static void test_every_sample_passes_its_own_checks(void)
{
    for (int i = 0; dt__defs_shape[i]; i++) {
        const dt_op_def *def = dt__defs_shape[i];
        int ok = 0;
        for (uint64_t seed = 0; seed < 200; seed++) {
            dt_op_sig s;
            memset(&s, 0, sizeof s);
            dt_op_attrs a = DT_OP_ATTRS_INIT;
            s.attrs = &a;
            if (def->sample(seed, 5, &s, &a) != DT_OK)
                continue;
            dt_op_shape o;
            char rule[128];
            dt_status st = def->infer(&s, &o);
            if (st == DT_OK)
                st = def->rule_fn(&s, rule, sizeof rule);
            if (st != DT_OK)
                fprintf(stderr, "%s sample %llu: %s\n", def->name, (unsigned long long)seed,
                        dt_last_error());
            CU_ASSERT_EQUAL(st, DT_OK);
            ok += st == DT_OK;
        }
        CU_ASSERT(ok > 100);
    }
}

int main(int argc, char **argv)
{
    static const dt_test_case cases[] = {
        DT_TEST(test_reshape_rule_groups_dims_into_matching_runs),
        DT_TEST(test_reshape_infers_minus_one_and_rejects_bad_shapes),
        DT_TEST(test_reshape_kernel_places_sharded_blocks_by_global_index),
        DT_TEST(test_permute_kernel_matches_naive_transpose_on_whole_and_sharded_blocks),
        DT_TEST(test_slice_kernel_takes_python_ranges_and_its_backward_pads_zeros),
        DT_TEST(test_concat_kernel_joins_blocks_and_checks_shapes),
        DT_TEST(test_expand_kernel_broadcasts_size_one_and_new_dims),
        DT_TEST(test_expand_backward_sums_the_expanded_dims_of_each_block),
        DT_TEST(test_squeeze_and_unsqueeze_rules_and_shapes),
        DT_TEST(test_gather_and_scatter_add_kernels_match_hand_worked_values),
        DT_TEST(test_index_select_and_index_add_kernels_match_hand_worked_values),
        DT_TEST(test_one_hot_kernel_writes_the_class_block_of_each_device),
        DT_TEST(test_every_sample_passes_its_own_checks),
        DT_TEST_END,
    };
    return dt_test_main(argc, argv, "opdef_shape_kernels", cases, 0);
}
