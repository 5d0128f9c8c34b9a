/* examples/train's MLP on the tape against its former hand-written backward (kept here as the
 * reference): the same gradients bit for bit, on a batch x model mesh, f32 and bf16 parameters;
 * the grad-ready callback reports each parameter once. */
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "../ops/ops_test_util.h"
#include "../../examples/train/model.h"

static int same_bits(const dt_tensor *a, const dt_tensor *b)
{
    int64_t n = dt_tensor_numel(a);
    if (!a || !b || n != dt_tensor_numel(b))
        return 0;
    float *ha = malloc((size_t)n * sizeof *ha), *hb = malloc((size_t)n * sizeof *hb);
    ot_fetch(a, ha);
    ot_fetch(b, hb);
    int same = memcmp(ha, hb, (size_t)n * sizeof *ha) == 0;
    free(ha);
    free(hb);
    return same;
}

static dt_status bias_f32(const dt_tensor *b, dt_tensor **out)
{
    if (dt_tensor_dtype(b) == DT_DTYPE_F32) {
        *out = dt_tensor_retain(b);
        return DT_OK;
    }
    return dt_cast(b, DT_DTYPE_F32, out);
}

/* The MLP's backward as examples/train/model.c wrote it by hand before the tape. */
static void hand_grads(dt_tensor *const *p, const dt_layout *l_rows2, const dt_tensor *x,
                       const dt_tensor *y, float loss_scale, dt_tensor **g)
{
    dt_tensor *b1 = NULL, *b2 = NULL, *xw = NULL, *h = NULL, *a = NULL, *aw = NULL;
    dt_tensor *logits = NULL, *dlogits = NULL, *da = NULL, *dh = NULL;
    DT_ASSERT_OK(bias_f32(p[1], &b1));
    DT_ASSERT_OK(dt_matmul(x, p[0], 0, 0, NULL, &xw));
    DT_ASSERT_OK(dt_bias_add(xw, b1, &h));
    DT_ASSERT_OK(dt_relu(h, &a));
    DT_ASSERT_OK(bias_f32(p[3], &b2));
    DT_ASSERT_OK(dt_matmul(a, p[2], 0, 0, l_rows2, &aw));
    DT_ASSERT_OK(dt_bias_add(aw, b2, &logits));
    DT_ASSERT_OK(dt_softmax_xent_backward(logits, y, loss_scale, &dlogits));
    DT_ASSERT_OK(dt_bias_grad(dlogits, NULL, &g[3]));
    DT_ASSERT_OK(dt_matmul_backward(a, p[2], 0, 0, dlogits, NULL, NULL, &da, &g[2]));
    DT_ASSERT_OK(dt_relu_backward(h, da, &dh));
    DT_ASSERT_OK(dt_bias_grad(dh, NULL, &g[1]));
    DT_ASSERT_OK(dt_matmul_backward(x, p[0], 0, 0, dh, NULL, NULL, NULL, &g[0]));
    dt_tensor *all[] = {b1, b2, xw, h, a, aw, logits, dlogits, da, dh};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        dt_tensor_destroy(all[i]);
}

typedef struct seen {
    int n, idx[8];
} seen;

static dt_status on_grad(void *arg, int index, const dt_tensor *grad)
{
    seen *s = arg;
    CU_ASSERT_PTR_NOT_NULL(grad);
    if (s->n < 8)
        s->idx[s->n++] = index;
    return DT_OK;
}

static void check(dt_dtype dtype)
{
    const char *names[2] = {"batch", "model"};
    int64_t n = dt_test_num_devices(), sizes[2] = {2, n / 2};
    dt_mesh *mesh = NULL;
    DT_ASSERT_OK(dt_mesh_create("grid", 2, names, sizes, dt_test_device_type(), &mesh));
    mlp *m = NULL;
    DT_ASSERT_OK(mlp_create(mesh, 12, 8, 5, dtype, 7, &m));
    enum { ROWS = 8 };
    float hx[ROWS * 12];
    int32_t hy[ROWS];
    ot_fill_real(hx, ROWS * 12, 0, 1, 3);
    for (int i = 0; i < ROWS; i++)
        hy[i] = (int32_t)((i * 3 + 1) % 5);
    dt_tensor *x = NULL, *y = NULL;
    DT_ASSERT_OK(mlp_inputs(m, ROWS, hx, hy, &x, &y));
    dt_tensor *got[MLP_NPARAMS] = {0}, *ref[MLP_NPARAMS] = {0};
    seen s = {0};
    double loss = 0;
    DT_ASSERT_OK(mlp_grads_each(m, x, y, 256.0f, &loss, on_grad, &s, got));
    const char *sp[2] = {"batch", DT_UNSHARDED};
    dt_layout *l_rows2 = NULL;
    DT_ASSERT_OK(dt_layout_create(mesh, 2, sp, &l_rows2));
    hand_grads(mlp_params(m), l_rows2, x, y, 256.0f, ref);
    for (int i = 0; i < MLP_NPARAMS; i++) {
        CU_ASSERT(same_bits(got[i], ref[i]));
        CU_ASSERT(dt_layout_equal(dt_tensor_layout(got[i]), dt_tensor_layout(ref[i])));
        CU_ASSERT(ot_is_partial(got[i]));
    }
    /* Each once: f32 in reverse layer order (b2 W2 b1 W1); 16-bit biases come through their
     * casts, recorded before each layer's matmul, so W2 b2 W1 b1. */
    static const int want32[4] = {3, 2, 1, 0}, want16[4] = {2, 3, 0, 1};
    const int *want = dtype == DT_DTYPE_F32 ? want32 : want16;
    CU_ASSERT_EQUAL_FATAL(s.n, MLP_NPARAMS);
    for (int i = 0; i < MLP_NPARAMS; i++)
        CU_ASSERT_EQUAL(s.idx[i], want[i]);
    CU_ASSERT(loss > 0);
    for (int i = 0; i < MLP_NPARAMS; i++) {
        dt_tensor_destroy(got[i]);
        dt_tensor_destroy(ref[i]);
    }
    dt_layout_destroy(l_rows2);
    dt_tensor_destroy(x);
    dt_tensor_destroy(y);
    mlp_destroy(m);
    dt_mesh_destroy(mesh);
}

static void test_mlp_on_the_tape_matches_its_hand_written_backward_in_f32(void)
{
    check(DT_DTYPE_F32);
}

static void test_mlp_on_the_tape_matches_its_hand_written_backward_in_bf16(void)
{
    check(DT_DTYPE_BF16);
}

int main(int argc, char **argv)
{
    static const dt_test_case cases[] = {
        DT_TEST(test_mlp_on_the_tape_matches_its_hand_written_backward_in_f32),
        DT_TEST(test_mlp_on_the_tape_matches_its_hand_written_backward_in_bf16),
        DT_TEST_END,
    };
    return dt_test_main_device(argc, argv, "autograd_mlp", cases);
}
