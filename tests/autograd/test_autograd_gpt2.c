/* examples/gpt2's training pattern on one long-lived tape (its model.c linked in): watch,
 * begin, forward, end, dt_tape_backward without grad_fn, dt_tape_take_grad, dt_tape_reset,
 * then every forward output destroyed; several steps on the same tape. Every tensor of a step
 * must be released (LeakSanitizer fails the test otherwise: the sanitizer build), the tape
 * must be empty after each step, the steps must agree bit for bit, and one gradient is checked
 * against a central finite difference of the loss. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "../ops/ops_test_util.h"
#include "../../examples/gpt2/model.h"

enum { B = 2, T = 4, V = 16, STEPS = 3 };

typedef struct fix {
    dt_mesh *mesh;
    dt_layout *l_ids;
    gpt2 *m;
    dt_tensor *x, *y;
    int n;
} fix;

static void fix_make(fix *f)
{
    memset(f, 0, sizeof *f);
    const char *names[2] = {"batch", "model"};
    int64_t nd = dt_test_num_devices(), sizes[2] = {2, nd / 2};
    DT_ASSERT_OK(dt_mesh_create("grid", 2, names, sizes, dt_test_device_type(), &f->mesh));
    /* 4 heads: the model dim (up to 4 devices) must divide them (tensor parallel). */
    gpt2_config cfg = {.layers = 1, .width = 8, .heads = 4, .vocab = V, .context = T};
    DT_ASSERT_OK(gpt2_create(f->mesh, &cfg, DT_DTYPE_F32, &f->m));
    DT_ASSERT_OK(gpt2_init_random(f->m, 5));
    f->n = gpt2_num_params(f->m);
    const char *sp[2] = {"batch", DT_UNSHARDED};
    DT_ASSERT_OK(dt_layout_create(f->mesh, 2, sp, &f->l_ids));
    int32_t hx[B * T], hy[B * T];
    for (int i = 0; i < B * T; i++) {
        hx[i] = (int32_t)((i * 5 + 3) % V);
        hy[i] = (int32_t)((i * 7 + 1) % V);
    }
    int64_t s[2] = {B, T};
    f->x = ot_tensor(f->l_ids, DT_DTYPE_I32, s, hx);
    f->y = ot_tensor(f->l_ids, DT_DTYPE_I32, s, hy);
}

static void fix_free(fix *f)
{
    dt_tensor_destroy(f->x);
    dt_tensor_destroy(f->y);
    gpt2_destroy(f->m);
    dt_layout_destroy(f->l_ids);
    dt_mesh_destroy(f->mesh);
}

static float *fetch(const dt_tensor *t)
{
    float *h = malloc((size_t)dt_tensor_numel(t) * sizeof *h);
    ot_fetch(t, h);
    return h;
}

/* Sets element j of the replicated f32 parameter i on every local device. */
static void set_elem(fix *f, int i, int64_t j, float value)
{
    dt_tensor *p = gpt2_params(f->m)[i];
    int64_t n = dt_tensor_numel(p);
    float *h = fetch(p);
    h[j] = value;
    for (int k = 0; k < dt_tensor_num_local(p); k++)
        DT_ASSERT_OK(dt_tensor_local_write(p, k, h, (size_t)n * sizeof *h));
    free(h);
}

/* One step as train_gpt2 runs it; the gradients are kept, fetched, in g[i] (host). */
static double step(fix *f, dt_tape *tape, float **g)
{
    dt_tensor **grads = calloc((size_t)f->n, sizeof *grads);
    double loss = 0;
    DT_ASSERT_OK(gpt2_grads(f->m, tape, f->x, f->y, 1.0f, &loss, grads));
    /* Nothing of the recording is left on the tape. */
    dt_tape_stats st;
    DT_ASSERT_OK(dt_tape_get_stats(tape, &st));
    CU_ASSERT_EQUAL(st.nodes, 0);
    CU_ASSERT_EQUAL(st.saved_tensors, 0);
    CU_ASSERT_EQUAL(st.saved_bytes, 0);
    CU_ASSERT_EQUAL(st.grad_tensors, 0);
    for (int i = 0; i < f->n; i++) {
        CU_ASSERT_PTR_NOT_NULL_FATAL(grads[i]);
        if (g)
            g[i] = fetch(grads[i]);
        dt_tensor_destroy(grads[i]);
    }
    free(grads);
    return loss;
}

static void test_gpt2_steps_on_one_tape_release_everything_and_agree(void)
{
    fix f;
    fix_make(&f);
    dt_tape_opts to = DT_TAPE_OPTS_INIT;
    to.accumulate = 0;
    dt_tape *tape = NULL;
    DT_ASSERT_OK(dt_tape_create(&to, &tape));
    float **first = calloc((size_t)f.n, sizeof *first), **now = calloc((size_t)f.n, sizeof *now);
    double loss0 = step(&f, tape, first);
    /* Near ln(V) at GPT-2's initialisation (weights of std 0.02). */
    CU_ASSERT(fabs(loss0 - log((double)V)) < 0.1);
    for (int s = 1; s < STEPS; s++) {
        double loss = step(&f, tape, now);
        CU_ASSERT_EQUAL(loss, loss0);
        for (int i = 0; i < f.n; i++) {
            int64_t n = dt_tensor_numel(gpt2_params(f.m)[i]);
            CU_ASSERT(memcmp(now[i], first[i], (size_t)n * sizeof(float)) == 0);
            free(now[i]);
        }
    }
    /* The final LayerNorm's bias (the last parameter, replicated): d loss / d b[j] against
     * (loss(b[j] + h) - loss(b[j] - h)) / 2h. */
    int last = f.n - 1;
    const int64_t j = 3;
    const float h = 1e-2f;
    float b0 = 0;
    {
        float *b = fetch(gpt2_params(f.m)[last]);
        b0 = b[j];
        free(b);
    }
    set_elem(&f, last, j, b0 + h);
    double lp = step(&f, tape, NULL);
    set_elem(&f, last, j, b0 - h);
    double lm = step(&f, tape, NULL);
    set_elem(&f, last, j, b0);
    double fd = (lp - lm) / (2.0 * (double)h);
    double an = (double)first[last][j];
    if (!(fabs(fd - an) <= 2e-3 + 1e-2 * fabs(an)))
        fprintf(stderr, "[rank %d] lnf.b[%lld]: tape %.6g, finite difference %.6g\n",
                dt_client_id(), (long long)j, an, fd);
    CU_ASSERT(fabs(fd - an) <= 2e-3 + 1e-2 * fabs(an));
    CU_ASSERT(fabs(an) > 1e-4); /* a real check, not 0 against 0 */
    for (int i = 0; i < f.n; i++)
        free(first[i]);
    free(first);
    free(now);
    dt_tape_destroy(tape);
    fix_free(&f);
}

int main(int argc, char **argv)
{
    static const dt_test_case cases[] = {
        DT_TEST(test_gpt2_steps_on_one_tape_release_everything_and_agree),
        DT_TEST_END,
    };
    return dt_test_main_device(argc, argv, "autograd_gpt2", cases);
}
