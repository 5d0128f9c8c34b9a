/* The staging memory of asynchronous saves is kept between saves (issue 16): the second and
 * later saves of a training loop allocate none (their copy goes into memory already mapped),
 * the kept buffer never exceeds the bound of the save that uses it (a smaller bound trims
 * it), and DT_CKPT_STAGING_KEEP=0 frees it after each save. Counted with the library's own
 * staging counters on every client; each checkpoint is restored and compared with the
 * single-device reference. With DT_CKPT_STAGING_KEEP=0 in the environment the first case
 * fails (it is the check that reuse happens). */
#include <mpi.h>
#include <stdlib.h>
#include <string.h>

#include "ck_test_util.h"
#include "ckpt/ckpt_impl.h" /* dt__ckpt_stage_stats */
#include "runtime/comm.h"     /* dt__mpi_thread_level */
#include "harness.h"

enum { ROWS = 256, COLS = 512 };   /* 512 KiB of f32 over all clients */

static dt_mesh *all_mesh(void)
{
    int64_t n = dt_num_global_devices(DT_DEVICE_CPU);
    int64_t sizes[2] = {2, n / 2};
    return ck_mesh(2, sizes);
}

/* Bytes of t held by this client (the slices it writes: "a,b" shards everything). */
static uint64_t local_bytes(const dt_tensor *t)
{
    uint64_t bytes = 0;
    for (int i = 0; i < dt_tensor_num_local(t); i++)
        bytes += dt_test_local_bytes(t, i);
    return bytes;
}

/* An asynchronous save of the reference `seed` ({rows, COLS} f32) into ck with staging bound
 * `bound`, waited for, then restored on another layout and compared; *mine: this client's
 * bytes. */
static void save_rows(const char *ck, int64_t rows, uint64_t seed, uint64_t bound,
                      uint64_t *mine)
{
    int64_t shape[2] = {rows, COLS};
    dt_mesh *m = all_mesh();
    dt_layout *l = ck_layout(m, "a,b");
    dt_tensor *t = ck_make(l, DT_DTYPE_F32, shape, seed);
    *mine = local_bytes(t);
    const char *name = "w";
    dt_save_opts o = DT_SAVE_OPTS_INIT;
    o.chunk_bytes = 16 << 10;   /* pieces of at most 16 KiB: any bound below is raised */
    o.staging_bytes = bound;
    dt_save_request *req = NULL;
    DT_ASSERT_OK(dt_save_async(m, ck, 1, &name, (const dt_tensor *const *)&t, &o, &req));
    dt_tensor_destroy(t);
    DT_ASSERT_OK(dt_save_wait(req));
    CU_ASSERT_EQUAL(ck_restored_mismatches(m, ck, name, "unsharded,b", seed), 0);
    dt_layout_destroy(l);
    dt_mesh_destroy(m);
}

static void save_and_check(const char *ck, uint64_t seed, uint64_t bound, uint64_t *mine)
{
    save_rows(ck, ROWS, seed, bound, mine);
}

static ck_stage_stats stats(void)
{
    ck_stage_stats s;
    dt__ckpt_stage_stats(&s);
    return s;
}

static void test_later_saves_reuse_the_first_saves_staging(void)
{
    /* Without MPI_THREAD_MULTIPLE (dt_init asks for it) a save runs whole in the call and
     * stages nothing. */
    CU_ASSERT_FATAL(dt__mpi_thread_level() >= MPI_THREAD_MULTIPLE);
    char dir[256], ck[300];
    ck_scratch(dir, sizeof dir, ck, sizeof ck);
    uint64_t mine = 0;
    save_and_check(ck, 1, 0, &mine);   /* may allocate (or reuse an earlier case's) */
    ck_stage_stats first = stats();
    CU_ASSERT(mine > 0);
    CU_ASSERT_EQUAL(first.kept_bytes, mine);   /* no bound: all of this client's bytes */
    for (uint64_t k = 2; k <= 4; k++)
        save_and_check(ck, k, 0, &mine);
    ck_stage_stats later = stats();
    CU_ASSERT_EQUAL(later.allocs, first.allocs);          /* no new staging */
    CU_ASSERT_EQUAL(later.reuses, first.reuses + 3);
    CU_ASSERT_EQUAL(later.kept_bytes, mine);
    /* The same with a bound below the data: the kept buffer is the bound. */
    uint64_t bound = 64 << 10;
    save_and_check(ck, 5, bound, &mine);
    ck_stage_stats bounded = stats();
    CU_ASSERT(mine > bound);
    CU_ASSERT_EQUAL(bounded.kept_bytes, bound);
    save_and_check(ck, 6, bound, &mine);
    save_and_check(ck, 7, bound, &mine);
    ck_stage_stats again = stats();
    CU_ASSERT_EQUAL(again.allocs, bounded.allocs);
    CU_ASSERT_EQUAL(again.reuses, bounded.reuses + 2);
    CU_ASSERT_EQUAL(again.kept_bytes, bound);
    dt_test_scratch_remove(dir);
}

static void test_a_smaller_bound_trims_the_kept_staging(void)
{
    char dir[256], ck[300];
    ck_scratch(dir, sizeof dir, ck, sizeof ck);
    uint64_t mine = 0;
    save_and_check(ck, 11, 128 << 10, &mine);
    ck_stage_stats big = stats();
    CU_ASSERT_EQUAL(big.kept_bytes, (uint64_t)128 << 10);
    /* A bound of 32 KiB: the 128 KiB buffer is not used, it is freed for a new one. */
    save_and_check(ck, 12, 32 << 10, &mine);
    ck_stage_stats small = stats();
    CU_ASSERT_EQUAL(small.allocs, big.allocs + 1);
    CU_ASSERT_EQUAL(small.reuses, big.reuses);
    CU_ASSERT_EQUAL(small.kept_bytes, (uint64_t)32 << 10);
    /* The bound grows back: a larger buffer again (the small one cannot hold the ring). */
    save_and_check(ck, 13, 128 << 10, &mine);
    ck_stage_stats grown = stats();
    CU_ASSERT_EQUAL(grown.allocs, small.allocs + 1);
    CU_ASSERT_EQUAL(grown.kept_bytes, (uint64_t)128 << 10);
    /* No bound with less data than the kept buffer would be fine, and a bound at least the
     * kept size reuses it. */
    save_and_check(ck, 14, 256 << 10, &mine);
    ck_stage_stats same = stats();
    uint64_t ring = mine < ((uint64_t)256 << 10) ? mine : (uint64_t)256 << 10;
    CU_ASSERT_EQUAL(same.allocs, grown.allocs + (ring > ((uint64_t)128 << 10)));
    /* Back to 128 KiB kept; a small save without a bound uses it (and it stays 128 KiB: the
     * buffer's own size is kept, not the small ring's), and a 32 KiB bound trims it. */
    save_and_check(ck, 15, 128 << 10, &mine);
    save_rows(ck, 32, 16, 0, &mine);   /* 64 KiB over all clients */
    ck_stage_stats reused = stats();
    CU_ASSERT(mine <= ((uint64_t)64 << 10));
    CU_ASSERT_EQUAL(reused.kept_bytes, (uint64_t)128 << 10);
    save_rows(ck, 32, 17, 32 << 10, &mine);
    ring = mine < ((uint64_t)32 << 10) ? mine : (uint64_t)32 << 10;
    CU_ASSERT_EQUAL(stats().kept_bytes, ring);
    dt_test_scratch_remove(dir);
}

static void test_staging_keep_0_frees_it_after_each_save(void)
{
    char dir[256], ck[300];
    ck_scratch(dir, sizeof dir, ck, sizeof ck);
    uint64_t mine = 0;
    setenv("DT_CKPT_STAGING_KEEP", "0", 1);
    ck_stage_stats before = stats();
    save_and_check(ck, 21, 0, &mine);
    save_and_check(ck, 22, 0, &mine);
    ck_stage_stats after = stats();
    unsetenv("DT_CKPT_STAGING_KEEP");
    CU_ASSERT_EQUAL(after.kept_bytes, 0);
    /* The first may reuse a buffer kept by an earlier case; the second cannot. */
    CU_ASSERT(after.allocs >= before.allocs + 1);
    CU_ASSERT_EQUAL(after.allocs + after.reuses, before.allocs + before.reuses + 2);
    dt_test_scratch_remove(dir);
}

/* DT_CKPT_STAGING_KEEP must be 0 or 1: anything else fails the save naming it (docs/env.md),
 * instead of silently keeping the staging; the next save, with the variable unset, works. */
static void test_staging_keep_unparsable_fails_the_save(void)
{
    char dir[256], ck[300];
    ck_scratch(dir, sizeof dir, ck, sizeof ck);
    int64_t shape[2] = {ROWS, COLS};
    dt_mesh *m = all_mesh();
    dt_layout *l = ck_layout(m, "a,b");
    dt_tensor *t = ck_make(l, DT_DTYPE_F32, shape, 31);
    const char *name = "w";
    dt_save_request *req = NULL;
    setenv("DT_CKPT_STAGING_KEEP", "no", 1);
    DT_ASSERT_FAILS(dt_save_async(m, ck, 1, &name, (const dt_tensor *const *)&t, NULL, &req),
                    DT_ERR_INVALID_ARGUMENT);
    DT_ASSERT_ERROR_MENTIONS("DT_CKPT_STAGING_KEEP='no' is neither 0 nor 1");
    unsetenv("DT_CKPT_STAGING_KEEP");
    CU_ASSERT_PTR_NULL(req);
    uint64_t mine = 0;
    save_and_check(ck, 32, 0, &mine);
    dt_tensor_destroy(t);
    dt_layout_destroy(l);
    dt_mesh_destroy(m);
    dt_test_scratch_remove(dir);
}

int main(int argc, char **argv)
{
    static const dt_test_case cases[] = {
        DT_TEST(test_later_saves_reuse_the_first_saves_staging),
        DT_TEST(test_a_smaller_bound_trims_the_kept_staging),
        DT_TEST(test_staging_keep_0_frees_it_after_each_save),
        DT_TEST(test_staging_keep_unparsable_fails_the_save),
        DT_TEST_END,
    };
    return dt_test_main(argc, argv, "ckpt_staging", cases, 1);
}
