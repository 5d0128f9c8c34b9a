/* The training loops of docs/autograd.md, run as the doc shows them (the snippets between the
 * markers below are the doc's code: tests/autograd/check_doc_snippets.py keeps them equal):
 * a plain loop (forward, backward, step) needs no clearing with the tape's default, and
 * accumulation, asked for, sums the micro-batches' backward passes until dt_tape_zero_grad.
 * Both against the same steps computed with the explicit backward functions, bit for bit. */
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "../ops/ops_test_util.h"

enum { ROWS = 8, IN = 6, OUT = 5, STEPS = 4, MICRO = 2 };
static const float LR = 0.5f;

/* snippet plain */
/* Data-parallel softmax regression: x [rows, in] sharded over the batch, w [in, out]
 * replicated. The tape's default (accumulate 0) replaces the gradient at every backward
 * pass, so the plain loop is right as written: nothing to clear. */
static dt_status train_plain(dt_tensor *w, int steps, dt_tensor *const *x,
                             dt_tensor *const *labels, float lr)
{
    dt_tape *tape = NULL;
    dt_status st = dt_tape_create(NULL, &tape);
    if (st == DT_OK)
        st = dt_tape_watch(tape, w, 0);
    for (int step = 0; step < steps && st == DT_OK; step++) {
        dt_tensor *y = NULL, *loss = NULL;
        const dt_tensor *g = NULL;
        st = dt_tape_begin(tape); /* forward, recorded */
        if (st == DT_OK)
            st = dt_matmul(x[step], w, 0, 0, NULL, &y);
        if (st == DT_OK)
            st = dt_softmax_xent(y, labels[step], NULL, &loss);
        dt_tape_end(tape);
        if (st == DT_OK) /* this batch's gradient, partial over the batch */
            st = dt_tape_backward(tape, loss, NULL, 1.0f, NULL);
        if (st == DT_OK)
            st = dt_tape_grad(tape, 0, &g); /* borrowed until the next backward */
        if (st == DT_OK)
            st = dt_axpy(-lr, g, w); /* the step: w -= lr g (all-reduced into w's layout) */
        dt_tensor_destroy(loss);
        dt_tensor_destroy(y);
    }
    dt_tape_destroy(tape);
    return st;
}
/* end snippet */

/* snippet accumulate */
/* Gradient accumulation over `micro` micro-batches per step: asked for with accumulate 1,
 * the gradients of the backward passes add up until dt_tape_zero_grad, called before each
 * step's first micro-batch (PyTorch's optimizer.zero_grad()). The seed 1/micro makes the
 * sum the mean over the micro-batches. */
static dt_status train_accumulated(dt_tensor *w, int steps, int micro, dt_tensor *const *x,
                                   dt_tensor *const *labels, float lr)
{
    dt_tape_opts to = DT_TAPE_OPTS_INIT;
    to.accumulate = 1;
    dt_tape *tape = NULL;
    dt_status st = dt_tape_create(&to, &tape);
    if (st == DT_OK)
        st = dt_tape_watch(tape, w, 0);
    for (int step = 0; step < steps && st == DT_OK; step++) {
        dt_tape_zero_grad(tape); /* clear: a new step's sum starts */
        for (int m = 0; m < micro && st == DT_OK; m++) {
            dt_tensor *y = NULL, *loss = NULL;
            st = dt_tape_begin(tape);
            if (st == DT_OK)
                st = dt_matmul(x[step * micro + m], w, 0, 0, NULL, &y);
            if (st == DT_OK)
                st = dt_softmax_xent(y, labels[step * micro + m], NULL, &loss);
            dt_tape_end(tape);
            if (st == DT_OK) /* adds into the watched gradient */
                st = dt_tape_backward(tape, loss, NULL, 1.0f / (float)micro, NULL);
            dt_tensor_destroy(loss);
            dt_tensor_destroy(y);
        }
        const dt_tensor *g = NULL;
        if (st == DT_OK)
            st = dt_tape_grad(tape, 0, &g);
        if (st == DT_OK)
            st = dt_axpy(-lr, g, w);
    }
    dt_tape_destroy(tape);
    return st;
}
/* end snippet */

static dt_tensor *filled(const dt_layout *l, int64_t r, int64_t c, uint64_t seed)
{
    int64_t shape[2] = {r, c}, n = r * c;
    float *h = malloc((size_t)n * sizeof *h);
    ot_fill_real(h, n, -1, 1, seed);
    dt_tensor *t = ot_tensor(l, DT_DTYPE_F32, shape, h);
    free(h);
    return t;
}

/* dW of one batch with the explicit backward functions, dloss the seed. */
static dt_tensor *explicit_grad(const dt_tensor *x, const dt_tensor *w, const dt_tensor *lab,
                                float dloss)
{
    dt_tensor *y = NULL, *dy = NULL, *dw = NULL;
    DT_ASSERT_OK(dt_matmul(x, w, 0, 0, NULL, &y));
    DT_ASSERT_OK(dt_softmax_xent_backward(y, lab, dloss, &dy));
    DT_ASSERT_OK(dt_matmul_backward(x, w, 0, 0, dy, NULL, NULL, NULL, &dw));
    dt_tensor_destroy(dy);
    dt_tensor_destroy(y);
    return dw;
}

typedef struct fixture {
    dt_mesh *mesh;
    dt_layout *lx, *llab, *lw;
    dt_tensor *x[STEPS * MICRO], *lab[STEPS * MICRO];
} fixture;

static void fix_make(fixture *f)
{
    f->mesh = ot_mesh_1d();
    f->lx = dt_test_layout(f->mesh, 2, "x", NULL, NULL);
    const char *s[1] = {"x"};
    DT_ASSERT_OK(dt_layout_create(f->mesh, 1, s, &f->llab));
    f->lw = dt_test_layout(f->mesh, 2, NULL, NULL, NULL);
    for (int i = 0; i < STEPS * MICRO; i++) {
        f->x[i] = filled(f->lx, ROWS, IN, 10 + (uint64_t)i);
        int64_t shape[1] = {ROWS};
        int32_t k[ROWS];
        for (int r = 0; r < ROWS; r++)
            k[r] = (int32_t)((r * 3 + i) % OUT);
        f->lab[i] = ot_tensor(f->llab, DT_DTYPE_I32, shape, k);
    }
}

static void fix_free(fixture *f)
{
    for (int i = 0; i < STEPS * MICRO; i++) {
        dt_tensor_destroy(f->x[i]);
        dt_tensor_destroy(f->lab[i]);
    }
    dt_layout_destroy(f->lx);
    dt_layout_destroy(f->llab);
    dt_layout_destroy(f->lw);
    dt_mesh_destroy(f->mesh);
}

static int same_values(const dt_tensor *a, const dt_tensor *b)
{
    float ha[IN * OUT], hb[IN * OUT];
    ot_fetch(a, ha);
    ot_fetch(b, hb);
    return ot_mismatches("weights", ha, hb, IN * OUT, 0, 0) == 0;
}

/* A loop diverged when written from the doc with gradients accumulating by default: each
 * step must use its own batch's gradient only. */
static void test_the_plain_loop_of_the_doc_steps_with_each_batchs_own_gradient(void)
{
    fixture f;
    fix_make(&f);
    dt_tensor *w = filled(f.lw, IN, OUT, 3), *ref = filled(f.lw, IN, OUT, 3);
    DT_ASSERT_OK(train_plain(w, STEPS, f.x, f.lab, LR));
    for (int step = 0; step < STEPS; step++) {
        dt_tensor *g = explicit_grad(f.x[step], ref, f.lab[step], 1.0f);
        DT_ASSERT_OK(dt_axpy(-LR, g, ref));
        dt_tensor_destroy(g);
    }
    CU_ASSERT(same_values(w, ref));
    dt_tensor_destroy(w);
    dt_tensor_destroy(ref);
    fix_free(&f);
}

/* Two micro-batches per step: the step's gradient is exactly g0 + g1 (dt_add, in micro-batch
 * order), and dt_tape_zero_grad keeps a step's sum from reaching the next. */
static void test_accumulation_asked_for_sums_the_micro_batches_of_each_step(void)
{
    fixture f;
    fix_make(&f);
    dt_tensor *w = filled(f.lw, IN, OUT, 4), *ref = filled(f.lw, IN, OUT, 4);
    DT_ASSERT_OK(train_accumulated(w, STEPS, MICRO, f.x, f.lab, LR));
    for (int step = 0; step < STEPS; step++) {
        dt_tensor *g0 = explicit_grad(f.x[step * MICRO], ref, f.lab[step * MICRO], 0.5f);
        dt_tensor *g1 = explicit_grad(f.x[step * MICRO + 1], ref, f.lab[step * MICRO + 1], 0.5f);
        dt_tensor *g = NULL;
        DT_ASSERT_OK(dt_add(g0, g1, NULL, &g));
        DT_ASSERT_OK(dt_axpy(-LR, g, ref));
        dt_tensor_destroy(g);
        dt_tensor_destroy(g1);
        dt_tensor_destroy(g0);
    }
    CU_ASSERT(same_values(w, ref));
    dt_tensor_destroy(w);
    dt_tensor_destroy(ref);
    fix_free(&f);
}

/* Without accumulation a backward pass that does not reach a watched tensor leaves it no
 * gradient (not the previous pass's). */
static void test_a_pass_without_accumulation_leaves_no_stale_gradient(void)
{
    fixture f;
    fix_make(&f);
    dt_tensor *w = filled(f.lw, IN, OUT, 5), *v = filled(f.lw, IN, OUT, 6);
    dt_tape *tape = NULL;
    DT_ASSERT_OK(dt_tape_create(NULL, &tape));
    DT_ASSERT_OK(dt_tape_watch(tape, w, 0));
    DT_ASSERT_OK(dt_tape_watch(tape, v, 1));
    for (int pass = 0; pass < 2; pass++) {
        dt_tensor *y = NULL, *s = NULL, *loss = NULL;
        DT_ASSERT_OK(dt_tape_begin(tape));
        DT_ASSERT_OK(dt_matmul(f.x[pass], w, 0, 0, NULL, &y));
        if (pass == 0) { /* v is used in the first pass only */
            dt_tensor *z = NULL;
            DT_ASSERT_OK(dt_matmul(f.x[pass], v, 0, 0, NULL, &z));
            DT_ASSERT_OK(dt_add(y, z, NULL, &s));
            dt_tensor_destroy(z);
        } else {
            s = dt_tensor_retain(y);
        }
        DT_ASSERT_OK(dt_softmax_xent(s, f.lab[pass], NULL, &loss));
        DT_ASSERT_OK(dt_tape_end(tape));
        DT_ASSERT_OK(dt_tape_backward(tape, loss, NULL, 1.0f, NULL));
        const dt_tensor *gw = NULL, *gv = NULL;
        DT_ASSERT_OK(dt_tape_grad(tape, 0, &gw));
        DT_ASSERT_OK(dt_tape_grad(tape, 1, &gv));
        CU_ASSERT_PTR_NOT_NULL(gw);
        CU_ASSERT_EQUAL(gv != NULL, pass == 0);
        dt_tensor_destroy(loss);
        dt_tensor_destroy(s);
        dt_tensor_destroy(y);
    }
    dt_tape_destroy(tape);
    dt_tensor_destroy(v);
    dt_tensor_destroy(w);
    fix_free(&f);
}

int main(int argc, char **argv)
{
    static const dt_test_case cases[] = {
        DT_TEST(test_the_plain_loop_of_the_doc_steps_with_each_batchs_own_gradient),
        DT_TEST(test_accumulation_asked_for_sums_the_micro_batches_of_each_step),
        DT_TEST(test_a_pass_without_accumulation_leaves_no_stale_gradient),
        DT_TEST_END,
    };
    return dt_test_main_device(argc, argv, "autograd_loop", cases);
}
