/* Property tests of dt_relayout: seeded random shapes (sizes not divisible by the mesh
 * included), random source and destination layouts (partial included) on 1-D, 2-D and 3-D
 * meshes of all the devices present, every dtype; each result compared element for element
 * with the reference computed in rl_test_util.c, and each plan compared piece by piece with
 * the former all-pairs planner's (layout/relayout_plan_ref.c). Seed: DT_TEST_SEED (default 1). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "rl_plan_cmp.h"
#include "rl_test_util.h"

static uint64_t base_seed(void)
{
    const char *s = getenv("DT_TEST_SEED");
    return s ? strtoull(s, NULL, 10) : 1;
}

/* Mesh shapes over n devices: 1-D, 2-D and 3-D factorizations. */
static int mesh_shapes(int n, int64_t shapes[][3], int *ranks)
{
    int k = 0;
    shapes[k][0] = n;
    ranks[k++] = 1;
    for (int a = 2; a < n; a++)
        if (n % a == 0) {
            shapes[k][0] = a;
            shapes[k][1] = n / a;
            ranks[k++] = 2;
        }
    for (int a = 2; a <= n; a++)
        for (int b = 2; a * b <= n; b++)
            if (n % (a * b) == 0 && n / (a * b) >= 1 && k < 8) {
                shapes[k][0] = a;
                shapes[k][1] = b;
                shapes[k][2] = n / (a * b);
                ranks[k++] = 3;
            }
    return k;
}

static void run_trials(int trials_per_mesh)
{
    int ndev = dt_test_num_devices();
    int64_t shapes[8][3];
    int ranks[8];
    int nmesh = mesh_shapes(ndev, shapes, ranks);
    const char *names[3] = {"x", "y", "z"};
    static const dt_dtype dtypes[] = {DT_DTYPE_F32, DT_DTYPE_F64, DT_DTYPE_F16, DT_DTYPE_BF16,
                                      DT_DTYPE_I32, DT_DTYPE_I64, DT_DTYPE_U8};
    static const dt_reduce_op ops[] = {DT_REDUCE_SUM, DT_REDUCE_MAX, DT_REDUCE_MIN,
                                       DT_REDUCE_SUM};
    rl_rng rng = {base_seed()};
    int64_t failures = 0, done = 0;
    for (int mi = 0; mi < nmesh; mi++) {
        dt_mesh *mesh = NULL;
        DT_ASSERT_OK(dt_mesh_create("prop", ranks[mi], names, shapes[mi], dt_test_device_type(),
                                    &mesh));
        for (int t = 0; t < trials_per_mesh; t++) {
            uint64_t seed = rl_next(&rng);
            int rank = (int)rl_below(&rng, 4); /* 0..3 */
            int64_t shape[DT_MAX_RANK];
            for (int d = 0; d < rank; d++)
                shape[d] = rl_below(&rng, 10); /* 0..9: uneven, smaller than the mesh, empty */
            dt_dtype dtype = dtypes[rl_below(&rng, 7)];
            dt_reduce_op op = ops[rl_below(&rng, 4)];
            dt_layout *src_l = NULL, *dst_l = NULL;
            dt_tensor *src = NULL, *dst = NULL;
            DT_ASSERT_OK(rl_random_layout(&rng, mesh, rank, 1, op, &src_l));
            DT_ASSERT_OK(rl_random_layout(&rng, mesh, rank, (int)rl_below(&rng, 2), op, &dst_l));
            DT_ASSERT_OK(rl_make_tensor(src_l, shape, dtype, seed, &src));
            dt_status st = dt_relayout(src, dst_l, &dst);
            if (st != DT_OK) {
                char a[1024], b[1024];
                dt_layout_format(src_l, a, sizeof a);
                dt_layout_format(dst_l, b, sizeof b);
                fprintf(stderr, "relayout failed: %s: %s\n  from %s\n  to   %s\n",
                        dt_status_name(st), dt_last_error(), a, b);
                failures++;
            } else {
                int64_t bad = rl_check_tensor(dst, src_l, seed);
                if (bad) {
                    char a[1024], b[1024];
                    dt_layout_format(src_l, a, sizeof a);
                    dt_layout_format(dst_l, b, sizeof b);
                    fprintf(stderr, "[rank %d] trial %d/%d (%s, rank %d): %lld bad\n  from %s\n"
                            "  to   %s\n", dt_client_id(), mi, t, dt_dtype_name(dtype), rank,
                            (long long)bad, a, b);
                    failures++;
                }
            }
            /* The plan itself, piece by piece, against the former all-pairs planner's. */
            if (rl_plan_compare(src_l, dst_l, rank, shape, dtype, NULL, "random pair", NULL,
                                NULL, NULL))
                failures++;
            done++;
            dt_tensor_destroy(dst);
            dt_tensor_destroy(src);
            dt_layout_destroy(dst_l);
            dt_layout_destroy(src_l);
        }
        dt_mesh_destroy(mesh);
    }
    if (dt_client_id() == 0)
        printf("\n  %lld random relayouts on %d meshes of %d devices, seed %llu\n",
               (long long)done, nmesh, ndev, (unsigned long long)base_seed());
    CU_ASSERT_EQUAL(failures, 0);
}

static void test_relayout_random_layouts_match_reference(void)
{
    run_trials(60);
}

/* The same random pairs again (fewer than the cache's 32 slots): now every plan comes from
 * the cache and must give the same results. */
static void test_relayout_cached_plans_match_reference(void)
{
    dt_relayout_cache_clear();
    run_trials(4);
    run_trials(4);
    int n = 0, cached = 0;
    dt_relayout_stats s[16];
    DT_ASSERT_OK(dt_relayout_last_stats(16, s, &n, &cached));
    CU_ASSERT_EQUAL(cached, 1);
}

int main(int argc, char **argv)
{
    static const dt_test_case cases[] = {
        DT_TEST(test_relayout_random_layouts_match_reference),
        DT_TEST(test_relayout_cached_plans_match_reference),
        DT_TEST_END,
    };
    return dt_test_main_device(argc, argv, "relayout_property", cases);
}
