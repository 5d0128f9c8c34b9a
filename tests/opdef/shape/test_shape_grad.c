/* Gradients of the shape and index family through a dt_tape against central finite
 * differences in f64 on one device: for each op, L = <w, op(inputs)> with a fixed w, the
 * tape's gradient of every differentiable input against (L(x + h e_k) - L(x - h e_k)) / 2h. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "../../ops/ops_test_util.h"

#define MAXIN 4

typedef struct gcase gcase;
typedef dt_status (*call_fn)(const gcase *c, const dt_tensor *const *in, dt_tensor **out);

struct gcase {
    const char *name;
    int nin;
    dt_dtype dtype[MAXIN];
    int rank[MAXIN];
    int64_t shape[MAXIN][DT_MAX_RANK];
    void *data[MAXIN];
    unsigned diff; /* bit i: input i is differentiated */
    call_fn call;
    int64_t arg[DT_MAX_RANK + 2];
};

static dt_mesh *one_device(void)
{
    const char *names[1] = {"x"};
    dt_mesh *m = NULL;
    DT_ASSERT_OK(dt_mesh_create("one", 1, names, (int64_t[]){1}, dt_test_device_type(), &m));
    return m;
}

static int64_t numel_of(int rank, const int64_t *shape)
{
    int64_t n = 1;
    for (int d = 0; d < rank; d++)
        n *= shape[d];
    return n;
}

/* The inputs as tensors on mesh. */
static void make_inputs(const gcase *c, const dt_mesh *mesh, dt_tensor **in)
{
    for (int i = 0; i < c->nin; i++) {
        dt_layout *l = NULL;
        DT_ASSERT_OK(dt_layout_replicated(mesh, c->rank[i], &l));
        DT_ASSERT_OK(dt_tensor_from_host(l, c->dtype[i], c->shape[i], c->data[i], &in[i]));
        dt_layout_destroy(l);
    }
}

/* L = <w, op(inputs)>, w[k] = 1 + (k % 5) / 4. */
static double loss_of(const gcase *c, const dt_mesh *mesh)
{
    dt_tensor *in[MAXIN] = {0}, *y = NULL;
    make_inputs(c, mesh, in);
    DT_ASSERT_OK(c->call(c, (const dt_tensor *const *)in, &y));
    int64_t n = dt_tensor_numel(y);
    double *v = malloc((size_t)(n ? n : 1) * sizeof *v), l = 0;
    ot_fetch(y, v);
    for (int64_t k = 0; k < n; k++)
        l += v[k] * (1 + (double)(k % 5) / 4);
    free(v);
    dt_tensor_destroy(y);
    for (int i = 0; i < c->nin; i++)
        dt_tensor_destroy(in[i]);
    return l;
}

static void check_grad(gcase *c)
{
    if (dt_test_num_local_devices() == 0)
        return;
    dt_mesh *mesh = one_device();
    dt_tensor *in[MAXIN] = {0}, *y = NULL, *w = NULL;
    dt_tape *tape = NULL;
    DT_ASSERT_OK(dt_tape_create(NULL, &tape));
    make_inputs(c, mesh, in);
    for (int i = 0; i < c->nin; i++)
        if (c->diff & (1u << i))
            DT_ASSERT_OK(dt_tape_watch(tape, in[i], i));
    DT_ASSERT_OK(dt_tape_begin(tape));
    dt_status st = c->call(c, (const dt_tensor *const *)in, &y);
    DT_ASSERT_OK(dt_tape_end(tape));
    if (st != DT_OK)
        fprintf(stderr, "%s: %s\n", c->name, dt_last_error());
    CU_ASSERT_EQUAL_FATAL(st, DT_OK);
    int64_t n = dt_tensor_numel(y);
    double *wv = malloc((size_t)(n ? n : 1) * sizeof *wv);
    for (int64_t k = 0; k < n; k++)
        wv[k] = 1 + (double)(k % 5) / 4;
    dt_layout *wl = NULL;
    DT_ASSERT_OK(dt_layout_replicated(mesh, dt_tensor_rank(y), &wl));
    DT_ASSERT_OK(dt_tensor_from_host(wl, DT_DTYPE_F64, dt_tensor_shape(y), wv, &w));
    st = dt_tape_backward(tape, y, w, 1.0f, NULL);
    if (st != DT_OK)
        fprintf(stderr, "%s backward: %s\n", c->name, dt_last_error());
    CU_ASSERT_EQUAL_FATAL(st, DT_OK);
    for (int i = 0; i < c->nin; i++) {
        if (!(c->diff & (1u << i)))
            continue;
        const dt_tensor *g = NULL;
        DT_ASSERT_OK(dt_tape_grad(tape, i, &g));
        CU_ASSERT_PTR_NOT_NULL_FATAL(g);
        int64_t m = numel_of(c->rank[i], c->shape[i]);
        CU_ASSERT_EQUAL_FATAL(dt_tensor_numel(g), m);
        CU_ASSERT_EQUAL_FATAL(dt_tensor_dtype(g), DT_DTYPE_F64);
        double *gv = malloc((size_t)m * sizeof *gv), *x = c->data[i], h = 1e-3;
        ot_fetch(g, gv);
        int bad = 0;
        for (int64_t k = 0; k < m; k++) {
            double keep = x[k];
            x[k] = keep + h;
            double lp = loss_of(c, mesh);
            x[k] = keep - h;
            double lm = loss_of(c, mesh);
            x[k] = keep;
            double fd = (lp - lm) / (2 * h);
            if (fabs(fd - gv[k]) > 1e-7 * (1 + fabs(fd))) {
                if (bad++ < 3)
                    fprintf(stderr, "%s: d/d input %d [%lld]: tape %.12g, differences %.12g\n",
                            c->name, i, (long long)k, gv[k], fd);
            }
        }
        CU_ASSERT_EQUAL(bad, 0);
        free(gv);
    }
    free(wv);
    dt_layout_destroy(wl);
    dt_tensor_destroy(w);
    dt_tensor_destroy(y);
    for (int i = 0; i < c->nin; i++)
        dt_tensor_destroy(in[i]);
    dt_tape_destroy(tape);
    dt_mesh_destroy(mesh);
}

static void set_in(gcase *c, int i, dt_dtype dtype, int rank, const int64_t *shape, void *data)
{
    c->dtype[i] = dtype;
    c->rank[i] = rank;
    if (rank)
        memcpy(c->shape[i], shape, (size_t)rank * sizeof *shape);
    c->data[i] = data;
}

static void fill(double *x, int n, int seed)
{
    for (int k = 0; k < n; k++)
        x[k] = sin(seed * 7.1 + k * 1.3);
}

/* ---- the calls -------------------------------------------------------------------------- */

static dt_status c_reshape(const gcase *c, const dt_tensor *const *in, dt_tensor **out)
{
    return dt_reshape(in[0], (int)c->arg[0], c->arg + 1, out);
}

static dt_status c_permute(const gcase *c, const dt_tensor *const *in, dt_tensor **out)
{
    int perm[3] = {(int)c->arg[0], (int)c->arg[1], (int)c->arg[2]};
    return dt_permute(in[0], perm, out);
}

static dt_status c_slice(const gcase *c, const dt_tensor *const *in, dt_tensor **out)
{
    return dt_slice(in[0], (int)c->arg[0], c->arg[1], c->arg[2], c->arg[3], out);
}

static dt_status c_concat(const gcase *c, const dt_tensor *const *in, dt_tensor **out)
{
    return dt_concat(in, c->nin, (int)c->arg[0], out);
}

static dt_status c_stack(const gcase *c, const dt_tensor *const *in, dt_tensor **out)
{
    return dt_stack(in, c->nin, (int)c->arg[0], out);
}

/* Split [4, 5] on axis 1 into 2 and 3 and keep the second part (the first gets no
 * gradient). Both parts used would sum x's two gradients with the tape's dt_add, which takes
 * f32 only. */
static dt_status c_split(const gcase *c, const dt_tensor *const *in, dt_tensor **out)
{
    (void)c;
    dt_tensor *p[2] = {0};
    dt_status st = dt_split(in[0], 1, (int64_t[]){2, 3}, 2, p);
    if (st != DT_OK)
        return st;
    dt_tensor_destroy(p[0]);
    *out = p[1];
    return DT_OK;
}

static dt_status c_expand(const gcase *c, const dt_tensor *const *in, dt_tensor **out)
{
    return dt_expand(in[0], (int)c->arg[0], c->arg + 1, out);
}

/* unsqueeze at arg[0], then squeeze it again at arg[1] of the result... composed: the
 * unsqueezed tensor's gradient goes through both. */
static dt_status c_squeeze(const gcase *c, const dt_tensor *const *in, dt_tensor **out)
{
    dt_tensor *u = NULL, *p = NULL;
    dt_status st = dt_unsqueeze(in[0], (int)c->arg[0], &u);
    if (st == DT_OK)
        st = dt_permute(u, (int[]){2, 0, 1}, &p);
    if (st == DT_OK)
        st = dt_squeeze(p, (int)c->arg[1], out);
    dt_tensor_destroy(u);
    dt_tensor_destroy(p);
    return st;
}

static dt_status c_gather(const gcase *c, const dt_tensor *const *in, dt_tensor **out)
{
    return dt_gather(in[0], (int)c->arg[0], in[1], out);
}

static dt_status c_scatter_add(const gcase *c, const dt_tensor *const *in, dt_tensor **out)
{
    return dt_scatter_add(in[0], (int)c->arg[0], in[1], in[2], out);
}

static dt_status c_index_select(const gcase *c, const dt_tensor *const *in, dt_tensor **out)
{
    return dt_index_select(in[0], (int)c->arg[0], in[1], out);
}

static dt_status c_index_add(const gcase *c, const dt_tensor *const *in, dt_tensor **out)
{
    return dt_index_add(in[0], (int)c->arg[0], in[1], in[2], out);
}

/* ---- tests ------------------------------------------------------------------------------ */

static void test_reshape_permute_and_slice_gradients_match_finite_differences(void)
{
    double x[24];
    fill(x, 24, 1);
    gcase r = {.name = "reshape", .nin = 1, .diff = 1, .call = c_reshape, .arg = {3, 2, -1, 4}};
    set_in(&r, 0, DT_DTYPE_F64, 2, (int64_t[]){6, 4}, x);
    check_grad(&r);
    gcase p = {.name = "permute", .nin = 1, .diff = 1, .call = c_permute, .arg = {1, 2, 0}};
    set_in(&p, 0, DT_DTYPE_F64, 3, (int64_t[]){2, 3, 4}, x);
    check_grad(&p);
    gcase s = {.name = "slice", .nin = 1, .diff = 1, .call = c_slice, .arg = {1, -5, 6, 2}};
    set_in(&s, 0, DT_DTYPE_F64, 2, (int64_t[]){4, 6}, x);
    check_grad(&s);
}

static void test_concat_split_and_stack_gradients_match_finite_differences(void)
{
    double a[8], b[12], x[20];
    fill(a, 8, 2);
    fill(b, 12, 3);
    fill(x, 20, 4);
    gcase c = {.name = "concat", .nin = 2, .diff = 3, .call = c_concat, .arg = {1}};
    set_in(&c, 0, DT_DTYPE_F64, 2, (int64_t[]){4, 2}, a);
    set_in(&c, 1, DT_DTYPE_F64, 2, (int64_t[]){4, 3}, b);
    check_grad(&c);
    gcase s = {.name = "split", .nin = 1, .diff = 1, .call = c_split};
    set_in(&s, 0, DT_DTYPE_F64, 2, (int64_t[]){4, 5}, x);
    check_grad(&s);
    gcase t = {.name = "stack", .nin = 2, .diff = 3, .call = c_stack, .arg = {-1}};
    set_in(&t, 0, DT_DTYPE_F64, 2, (int64_t[]){2, 4}, a);
    set_in(&t, 1, DT_DTYPE_F64, 2, (int64_t[]){2, 4}, b);
    check_grad(&t);
}

static void test_expand_squeeze_and_unsqueeze_gradients_match_finite_differences(void)
{
    double x[6], y[6];
    fill(x, 6, 5);
    fill(y, 6, 6);
    gcase e = {.name = "expand", .nin = 1, .diff = 1, .call = c_expand, .arg = {3, 2, 3, 4}};
    set_in(&e, 0, DT_DTYPE_F64, 2, (int64_t[]){3, 1}, x);
    check_grad(&e);
    gcase s = {.name = "squeeze", .nin = 1, .diff = 1, .call = c_squeeze, .arg = {-1, 0}};
    set_in(&s, 0, DT_DTYPE_F64, 2, (int64_t[]){2, 3}, y);
    check_grad(&s);
}

static void test_index_op_gradients_match_finite_differences(void)
{
    double x[12], src[9], s2[12];
    fill(x, 12, 7);                              /* [3, 4] */
    fill(src, 9, 8);                             /* [3, 3] */
    fill(s2, 12, 9);                             /* [3, 4] */
    int64_t gi[9] = {3, 0, 3, 1, 1, 2, 0, 0, 3}; /* [3, 3] along axis 1 */
    int32_t si[3] = {2, 0, 2};                   /* along axis 0 */
    gcase g = {.name = "gather", .nin = 2, .diff = 1, .call = c_gather, .arg = {1}};
    set_in(&g, 0, DT_DTYPE_F64, 2, (int64_t[]){3, 4}, x);
    set_in(&g, 1, DT_DTYPE_I64, 2, (int64_t[]){3, 3}, gi);
    check_grad(&g);
    gcase sa = {.name = "scatter_add", .nin = 3, .diff = 5, .call = c_scatter_add, .arg = {1}};
    set_in(&sa, 0, DT_DTYPE_F64, 2, (int64_t[]){3, 4}, x);
    set_in(&sa, 1, DT_DTYPE_I64, 2, (int64_t[]){3, 3}, gi);
    set_in(&sa, 2, DT_DTYPE_F64, 2, (int64_t[]){3, 3}, src);
    check_grad(&sa);
    gcase is = {.name = "index_select", .nin = 2, .diff = 1, .call = c_index_select, .arg = {0}};
    set_in(&is, 0, DT_DTYPE_F64, 2, (int64_t[]){3, 4}, x);
    set_in(&is, 1, DT_DTYPE_I32, 1, (int64_t[]){3}, si);
    check_grad(&is);
    gcase ia = {.name = "index_add", .nin = 3, .diff = 5, .call = c_index_add, .arg = {0}};
    set_in(&ia, 0, DT_DTYPE_F64, 2, (int64_t[]){3, 4}, x);
    set_in(&ia, 1, DT_DTYPE_I32, 1, (int64_t[]){3}, si);
    set_in(&ia, 2, DT_DTYPE_F64, 2, (int64_t[]){3, 4}, s2);
    check_grad(&ia);
}

int main(int argc, char **argv)
{
    static const dt_test_case cases[] = {
        DT_TEST(test_reshape_permute_and_slice_gradients_match_finite_differences),
        DT_TEST(test_concat_split_and_stack_gradients_match_finite_differences),
        DT_TEST(test_expand_squeeze_and_unsqueeze_gradients_match_finite_differences),
        DT_TEST(test_index_op_gradients_match_finite_differences),
        DT_TEST_END,
    };
    return dt_test_main_device(argc, argv, "opdef_shape_grad", cases);
}
