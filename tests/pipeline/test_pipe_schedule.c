/* Pipeline schedules: the printed tables against hand-worked ones (P=2 and P=4), the bubble
 * of every kind against (P-1)/(V*M+P-1) over a sweep, the live activations of 1F1B against
 * GPipe's, the global order against the dependencies, and bad arguments. No runtime. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "dtensor/pipeline.h"

static dt_pipe_schedule *make(dt_pipe_schedule_kind kind, int P, int M, int V)
{
    dt_pipe_schedule *s = NULL;
    DT_ASSERT_OK(dt_pipe_schedule_create(kind, P, M, V, &s));
    return s;
}

static void check_table(dt_pipe_schedule_kind kind, int P, int M, int V, const char *want)
{
    dt_pipe_schedule *s = make(kind, P, M, V);
    char buf[4096];
    size_t n = dt_pipe_schedule_format(s, buf, sizeof buf);
    CU_ASSERT_EQUAL(n, strlen(want));
    if (strcmp(buf, want) != 0)
        fprintf(stderr, "%s P=%d M=%d V=%d:\n%s--- wanted:\n%s", dt_pipe_schedule_kind_name(kind),
                P, M, V, buf, want);
    CU_ASSERT_STRING_EQUAL(buf, want);
    /* A short buffer gets a NUL-terminated prefix and the full length. */
    char small[8];
    CU_ASSERT_EQUAL(dt_pipe_schedule_format(s, small, sizeof small), n);
    CU_ASSERT_EQUAL(strlen(small), sizeof small - 1);
    CU_ASSERT_EQUAL(strncmp(small, want, sizeof small - 1), 0);
    dt_pipe_schedule_destroy(s);
}

/* Worked by hand: every step takes one slot; F(s,m) after F(s-1,m); B(s,m) after B(s+1,m). */
static void test_gpipe_table_matches_the_hand_worked_one(void)
{
    check_table(DT_PIPE_GPIPE, 2, 4, 1,
                "stage 0: F0 F1 F2 F3 .  .  B0 B1 B2 B3\n"
                "stage 1: .  F0 F1 F2 F3 B0 B1 B2 B3\n");
}

static void test_1f1b_tables_match_the_hand_worked_ones(void)
{
    check_table(DT_PIPE_1F1B, 2, 4, 1,
                "stage 0: F0 F1 .  B0 F2 B1 F3 B2 .  B3\n"
                "stage 1: .  F0 B0 F1 B1 F2 B2 F3 B3\n");
    check_table(DT_PIPE_1F1B, 4, 4, 1,
                "stage 0: F0 F1 F2 F3 .  .  .  B0 .  B1 .  B2 .  B3\n"
                "stage 1: .  F0 F1 F2 .  .  B0 F3 B1 .  B2 .  B3\n"
                "stage 2: .  .  F0 F1 .  B0 F2 B1 F3 B2 .  B3\n"
                "stage 3: .  .  .  F0 B0 F1 B1 F2 B2 F3 B3\n");
    /* Fewer micro-batches than stages: the warm-up stops at M. */
    check_table(DT_PIPE_1F1B, 3, 2, 1,
                "stage 0: F0 F1 .  .  .  B0 .  B1\n"
                "stage 1: .  F0 F1 .  B0 .  B1\n"
                "stage 2: .  .  F0 B0 F1 B1\n");
}

/* Megatron's order: micro-batches in groups of P through chunk 0, then chunk 1; stage s warms
 * up with 2(P-s-1) + (V-1)P forwards. Cells are F<micro>.<chunk>. */
static void test_interleaved_table_matches_the_hand_worked_one(void)
{
    check_table(DT_PIPE_INTERLEAVED, 2, 4, 2,
                "stage 0: F0.0 F1.0 F0.1 F1.1 F2.0 B0.1 F3.0 B1.1 F2.1 B0.0 F3.1 B1.0 .    B2.1 .  "
                "  B3.1 B2.0 B3.0\n"
                "stage 1: .    F0.0 F1.0 F0.1 B0.1 F1.1 B1.1 F2.0 B0.0 F3.0 B1.0 F2.1 B2.1 F3.1 B3.1 "
                "B2.0 B3.0\n");
    /* One stage: no bubble, the chunks hand over inside the stage. */
    check_table(DT_PIPE_INTERLEAVED, 1, 3, 2,
                "stage 0: F0.0 F0.1 B0.1 F1.0 B0.0 F1.1 B1.1 F2.0 B1.0 F2.1 B2.1 B2.0\n");
}

static void test_bubble_equals_the_theory_for_every_kind(void)
{
    for (int kind = 0; kind <= DT_PIPE_INTERLEAVED; kind++)
        for (int P = 1; P <= 8; P *= 2)
            for (int M = 1; M <= 16; M++)
                for (int V = 1; V <= (kind == DT_PIPE_INTERLEAVED ? 3 : 1); V++) {
                    if (V > 1 && M % P != 0)
                        continue;
                    dt_pipe_schedule *s = make((dt_pipe_schedule_kind)kind, P, M, V);
                    double want = (double)(P - 1) / ((double)V * M + P - 1);
                    CU_ASSERT_DOUBLE_EQUAL(dt_pipe_bubble_theory(P, M, V), want, 1e-15);
                    if (fabs(dt_pipe_schedule_bubble(s) - want) > 1e-12)
                        fprintf(stderr, "%s P=%d M=%d V=%d: bubble %.6f, theory %.6f\n",
                                dt_pipe_schedule_kind_name((dt_pipe_schedule_kind)kind), P, M, V,
                                dt_pipe_schedule_bubble(s), want);
                    CU_ASSERT_DOUBLE_EQUAL(dt_pipe_schedule_bubble(s), want, 1e-12);
                    /* Ideal length: each stage works 2MV slots plus 2(P-1) idle. */
                    CU_ASSERT_EQUAL(dt_pipe_schedule_length(s), 2 * (int64_t)M * V + 2 * (P - 1));
                    dt_pipe_schedule_destroy(s);
                }
}

static void test_1f1b_bounds_live_activations_and_gpipe_does_not(void)
{
    int P = 4, M = 8;
    dt_pipe_schedule *g = make(DT_PIPE_GPIPE, P, M, 1), *f = make(DT_PIPE_1F1B, P, M, 1);
    for (int s = 0; s < P; s++) {
        CU_ASSERT_EQUAL(dt_pipe_schedule_peak_live(g, s), M);
        CU_ASSERT_EQUAL(dt_pipe_schedule_peak_live(f, s), P - s);
    }
    CU_ASSERT_EQUAL(dt_pipe_schedule_peak_live(f, P), -1);
    dt_pipe_schedule_destroy(g);
    dt_pipe_schedule_destroy(f);
}

/* Every (virtual stage, micro, phase) appears once per stage; the global order puts each step
 * after its dependencies and keeps each stage's own order. */
static void test_global_order_respects_the_dependencies(void)
{
    for (int kind = 0; kind <= DT_PIPE_INTERLEAVED; kind++) {
        int P = 4, M = 8, V = kind == DT_PIPE_INTERLEAVED ? 2 : 1, VP = P * V;
        dt_pipe_schedule *s = make((dt_pipe_schedule_kind)kind, P, M, V);
        int64_t total = dt_pipe_schedule_total_steps(s);
        CU_ASSERT_EQUAL(total, 2 * (int64_t)P * M * V);
        CU_ASSERT_EQUAL(dt_pipe_schedule_num_steps(s, 0), 2 * (int64_t)M * V);
        int64_t *at = malloc((size_t)(2 * VP * M) * sizeof *at);
        for (int i = 0; i < 2 * VP * M; i++)
            at[i] = -1;
        int64_t *pos = calloc((size_t)P, sizeof *pos);
        for (int64_t i = 0; i < total; i++) {
            const dt_pipe_step *x = dt_pipe_schedule_global_step(s, i);
            int v = x->chunk * P + x->stage;
            CU_ASSERT_EQUAL(at[(x->phase * VP + v) * M + x->micro], -1);
            at[(x->phase * VP + v) * M + x->micro] = i;
            if (x->phase == DT_PIPE_F && v > 0)
                CU_ASSERT(at[(v - 1) * M + x->micro] >= 0 && at[(v - 1) * M + x->micro] < i);
            if (x->phase == DT_PIPE_B) {
                CU_ASSERT(at[v * M + x->micro] >= 0);
                if (v < VP - 1)
                    CU_ASSERT(at[(VP + v + 1) * M + x->micro] >= 0);
            }
            /* The stage's own list, in order. */
            CU_ASSERT_EQUAL(memcmp(dt_pipe_schedule_step(s, x->stage, pos[x->stage]++), x,
                                   sizeof *x), 0);
        }
        CU_ASSERT_PTR_NULL(dt_pipe_schedule_global_step(s, total));
        CU_ASSERT_PTR_NULL(dt_pipe_schedule_step(s, P, 0));
        free(pos);
        free(at);
        dt_pipe_schedule_destroy(s);
    }
}

static void test_bad_arguments_give_statuses(void)
{
    dt_pipe_schedule *s = NULL;
    DT_ASSERT_FAILS(dt_pipe_schedule_create(DT_PIPE_1F1B, 0, 4, 1, &s), DT_ERR_INVALID_ARGUMENT);
    DT_ASSERT_FAILS(dt_pipe_schedule_create(DT_PIPE_1F1B, 2, 0, 1, &s), DT_ERR_INVALID_ARGUMENT);
    DT_ASSERT_FAILS(dt_pipe_schedule_create(DT_PIPE_GPIPE, 2, 4, 2, &s), DT_ERR_INVALID_ARGUMENT);
    DT_ASSERT_FAILS(dt_pipe_schedule_create(DT_PIPE_INTERLEAVED, 4, 6, 2, &s),
                    DT_ERR_INVALID_ARGUMENT);
    DT_ASSERT_FAILS(dt_pipe_schedule_create((dt_pipe_schedule_kind)7, 2, 4, 1, &s),
                    DT_ERR_INVALID_ARGUMENT);
    DT_ASSERT_FAILS(dt_pipe_schedule_create(DT_PIPE_1F1B, 2, 4, 1, NULL),
                    DT_ERR_INVALID_ARGUMENT);
    CU_ASSERT_PTR_NULL(s);
    dt_pipe_schedule_kind k;
    DT_ASSERT_OK(dt_pipe_schedule_kind_parse("interleaved", &k));
    CU_ASSERT_EQUAL(k, DT_PIPE_INTERLEAVED);
    DT_ASSERT_FAILS(dt_pipe_schedule_kind_parse("zigzag", &k), DT_ERR_INVALID_ARGUMENT);
    CU_ASSERT_PTR_NOT_NULL(strstr(dt_last_error(), "zigzag"));
    CU_ASSERT_STRING_EQUAL(dt_pipe_schedule_kind_name(DT_PIPE_1F1B), "1f1b");
    dt_pipe_schedule_destroy(NULL);
}

int main(int argc, char **argv)
{
    static const dt_test_case cases[] = {
        DT_TEST(test_gpipe_table_matches_the_hand_worked_one),
        DT_TEST(test_1f1b_tables_match_the_hand_worked_ones),
        DT_TEST(test_interleaved_table_matches_the_hand_worked_one),
        DT_TEST(test_bubble_equals_the_theory_for_every_kind),
        DT_TEST(test_1f1b_bounds_live_activations_and_gpipe_does_not),
        DT_TEST(test_global_order_respects_the_dependencies),
        DT_TEST(test_bad_arguments_give_statuses),
        DT_TEST_END,
    };
    return dt_test_main(argc, argv, "pipe_schedule", cases, 0);
}
