/* examples/gpt trained through the pipeline (examples/gpt/pipe.c, as train_gpt --pipe): a
 * tiny GPT (and the Llama variant) on pipe=2 x batch=B for a few AdamW steps of M=4
 * micro-batches under GPipe, 1F1B and interleaved 1F1B (V=2), against the same model without
 * pipelining on one stage's devices (every block on one tape per micro-batch, the gradients
 * accumulated in micro order, one ZeRO optimizer over batch). Without clipping the
 * parameters are equal bit for bit; with clipping every stage clips by the global norm
 * (dt_zero_opts.combine), whose sum of squares is added per stage first, so they agree
 * within rounding (relative 1e-5). Needs one stage per process: np 2 and 4. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "../../examples/gpt/pipe.h"

enum { VOCAB = 12, CTX = 8, WIDTH = 16, HEADS = 2, LAYERS = 4, ROWS = 16, MICRO = 4, STEPS = 3 };

static void batch(int step, int32_t *x, int32_t *y)
{
    for (int i = 0; i < ROWS * CTX; i++) {
        x[i] = (int32_t)((i * 7 + step * 3 + i / CTX) % VOCAB);
        y[i] = (i % 5 == 4) ? -1 : (int32_t)((i * 5 + step + 1) % VOCAB);
    }
}

static gpt_pipe_opts opts(dt_pipe_schedule_kind kind, int chunks, double clip)
{
    gpt_pipe_opts o;
    memset(&o, 0, sizeof o);
    o.schedule = kind;
    o.micro = MICRO;
    o.chunks = chunks;
    dt_zero_opts zo = DT_ZERO_OPTS_INIT;
    zo.stage = 1;
    zo.dp_dim = "batch";
    zo.clip_norm = clip;
    o.zero = zo;
    dt_optim_hparams hp = DT_OPTIM_ADAMW_INIT;
    hp.lr = 1e-2f;
    o.hp = hp;
    return o;
}

static int train(gpt_pipe *gp, double *clip_coef)
{
    int32_t x[ROWS * CTX], y[ROWS * CTX];
    *clip_coef = 1.0;
    for (int s = 0; s < STEPS; s++) {
        double loss = 0;
        dt_zero_step_info info;
        batch(s, x, y);
        DT_ASSERT_OK(gpt_pipe_step(gp, ROWS, x, y, 1e-2f, &loss, &info));
        CU_ASSERT(isfinite(loss) && loss > 0);
        CU_ASSERT_EQUAL(info.skipped, 0);
        if (info.clip_coef < *clip_coef)
            *clip_coef = info.clip_coef;
    }
    return 0;
}

static void compare(int llama, dt_pipe_schedule_kind kind, int chunks, double clip)
{
    int64_t P = 2, B = dt_test_num_devices() / 2;
    if (dt_test_num_devices() % 2 != 0 || (ROWS / MICRO) % B != 0)
        return;
    const char *names[2] = {"pipe", "batch"};
    int64_t sizes[2] = {P, B};
    dt_mesh *m = NULL;
    DT_ASSERT_OK(dt_mesh_create("gp", 2, names, sizes, dt_test_device_type(), &m));
    gpt_config cfg = {VOCAB, CTX, WIDTH, HEADS, LAYERS, llama, 0};
    gpt_pipe_opts o = opts(kind, chunks, clip);
    gpt_pipe *gp = NULL;
    dt_status st = gpt_pipe_create(m, &cfg, DT_DTYPE_F32, 7, &o, &gp);
    if (dt_num_clients() == 1) { /* one process holds both stages: refused */
        CU_ASSERT_EQUAL(st, DT_ERR_INVALID_ARGUMENT);
        dt_mesh_destroy(m);
        return;
    }
    DT_ASSERT_OK(st);
    double cc = 1, rcc = 1;
    train(gp, &cc);
    /* The reference on this stage's devices. */
    gpt_pipe_opts ro = opts(kind, 1, clip);
    gpt_pipe *ref = NULL;
    DT_ASSERT_OK(gpt_pipe_create(gpt_pipe_stage_mesh(gp), &cfg, DT_DTYPE_F32, 7, &ro, &ref));
    train(ref, &rcc);
    if (clip > 0) {
        CU_ASSERT(rcc < 1.0);
        CU_ASSERT(fabs(cc - rcc) <= 1e-5 * rcc);
    }
    /* An untrained model, to see that training moved the parameters. */
    gpt_pipe *init = NULL;
    DT_ASSERT_OK(gpt_pipe_create(gpt_pipe_stage_mesh(gp), &cfg, DT_DTYPE_F32, 7, &ro, &init));
    int held = 0, differ = 0, moved = 0;
    double worst = 0;
    for (int s = 0; s < gpt_pipe_num_slots(gp); s++) {
        const char *name = gpt_pipe_slot_name(gp, s);
        float a[WIDTH * 4 * WIDTH], b[WIDTH * 4 * WIDTH];
        int64_t n = 0;
        for (int64_t k = 1; k <= WIDTH * 4 * WIDTH; k++) /* find the count: try the shapes */
            if (gpt_pipe_param(ref, name, b, k) == 1) {
                n = k;
                break;
            }
        float c0[WIDTH * 4 * WIDTH];
        CU_ASSERT_EQUAL(gpt_pipe_param(init, name, c0, n), 1);
        int h = gpt_pipe_param(gp, name, a, n);
        CU_ASSERT(h >= 0);
        if (h != 1)
            continue;
        held++;
        for (int64_t i = 0; i < n; i++) {
            double d = fabs((double)a[i] - (double)b[i]);
            double rel = d / (fabs((double)b[i]) + 1e-6);
            worst = rel > worst ? rel : worst;
            differ += a[i] != b[i];
            moved += a[i] != c0[i];
        }
    }
    CU_ASSERT(held > 0);
    CU_ASSERT(moved > 0);
    if (dt_client_id() == 0)
        printf("%s %s V=%d clip %g: %d parameters on stage %d, %d elements moved, %d differ "
               "from the unpipelined run, worst relative %.3g\n", llama ? "llama" : "gpt",
               dt_pipe_schedule_kind_name(kind), chunks, clip, held, gpt_pipe_my_stage(gp),
               moved, differ, worst);
    gpt_pipe_destroy(init);
    if (clip > 0) {
        CU_ASSERT(worst <= 1e-5);
    } else {
        CU_ASSERT_EQUAL(differ, 0);
    }
    if ((clip > 0 && worst > 1e-5) || (clip <= 0 && differ))
        fprintf(stderr, "%s %s V=%d clip %g: %d elements differ, worst relative %.3g\n",
                llama ? "llama" : "gpt", dt_pipe_schedule_kind_name(kind), chunks, clip,
                differ, worst);
    gpt_pipe_destroy(ref);
    gpt_pipe_destroy(gp);
    dt_mesh_destroy(m);
}

static void test_gpt_pipelined_equals_unpipelined_bit_for_bit_without_clipping(void)
{
    compare(0, DT_PIPE_GPIPE, 1, 0.0);
    compare(0, DT_PIPE_1F1B, 1, 0.0);
    compare(0, DT_PIPE_INTERLEAVED, 2, 0.0);
}

static void test_gpt_pipelined_with_clipping_agrees_within_rounding(void)
{
    compare(0, DT_PIPE_1F1B, 1, 0.05);
}

static void test_llama_pipelined_equals_unpipelined(void)
{
    compare(1, DT_PIPE_1F1B, 1, 0.0);
}

int main(int argc, char **argv)
{
    static const dt_test_case cases[] = {
        DT_TEST(test_gpt_pipelined_equals_unpipelined_bit_for_bit_without_clipping),
        DT_TEST(test_gpt_pipelined_with_clipping_agrees_within_rounding),
        DT_TEST(test_llama_pipelined_equals_unpipelined),
        DT_TEST_END,
    };
    return dt_test_main_device(argc, argv, "pipe_gpt", cases);
}
