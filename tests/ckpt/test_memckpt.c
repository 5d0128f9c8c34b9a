/* In-memory checkpoints (dt_memckpt): each client a "host" of its own (a memory directory
 * "mem-%c"), steps saved node-locally with a buddy copy, the newest complete step found after
 * a host's memory is gone and restored bit for bit from the buddies' copies, no step when a
 * host and its buddy are both gone, jobs never seeing each other's memory, and the quick saves
 * after the first (recycled memory, the first save's plan). */
#define _XOPEN_SOURCE 700
#include <ftw.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ck_test_util.h"
#include "harness.h"

static const int64_t shape[2] = {8, 6};

static dt_mesh *all_mesh(void)
{
    int64_t n = dt_num_global_devices(DT_DEVICE_CPU);
    int64_t sizes[2] = {2, n / 2};
    return ck_mesh(2, sizes);
}

typedef struct saver {
    const dt_mesh *mesh;
    const dt_tensor *t;
} saver;

static dt_status save_w(void *arg, const char *dir, const dt_save_opts *opts)
{
    const saver *s = arg;
    const char *name = "w";
    return dt_save(s->mesh, dir, 1, &name, &s->t, opts);
}

/* A handle for job `job` whose clients each have a memory directory of their own. */
static dt_memckpt *open_job(const dt_mesh *m, const char *scratch, const char *job)
{
    char tmpl[400];
    snprintf(tmpl, sizeof tmpl, "%s/mem-%%c", scratch);
    dt_memckpt_opts o = DT_MEMCKPT_OPTS_INIT;
    o.job_id = job;
    o.dir = tmpl;
    dt_memckpt *mc = NULL;
    DT_ASSERT_OK(dt_memckpt_create(m, &o, &mc));
    return mc;
}

static void save_step(dt_memckpt *mc, const dt_mesh *m, int64_t step)
{
    dt_layout *l = ck_layout(m, "a,b");
    dt_tensor *t = ck_make(l, DT_DTYPE_F32, shape, (uint64_t)step);
    saver s = {m, t};
    DT_ASSERT_OK(dt_memckpt_save(mc, step, save_w, &s, NULL));
    dt_tensor_destroy(t);
    dt_layout_destroy(l);
}

/* Restores "w" from this client's directory of `step` onto another layout. */
static int64_t mismatches_at(const dt_mesh *m, const char *dir, uint64_t seed)
{
    return ck_restored_mismatches(m, dir, "w", "b,unsharded", seed);
}

static int rm_one(const char *p, const struct stat *sb, int flag, struct FTW *f)
{
    (void)sb, (void)flag, (void)f;
    return remove(p);
}

/* Client `who` loses its host's memory: its directory goes. */
static void lose_memory(const char *scratch, int who)
{
    MPI_Barrier(MPI_COMM_WORLD);
    if (dt_client_id() == who) {
        char p[400];
        snprintf(p, sizeof p, "%s/mem-%d", scratch, who);
        nftw(p, rm_one, 16, FTW_DEPTH | FTW_PHYS);
    }
    MPI_Barrier(MPI_COMM_WORLD);
}

static int count_steps(const char *scratch, const char *job)
{
    char p[600];
    snprintf(p, sizeof p, "%s/mem-%d/dtensor-mem-%s", scratch, dt_client_id(), job);
    int n = 0;
    for (int64_t s = 0; s < 10; s++) {
        char q[700];
        struct stat sb;
        snprintf(q, sizeof q, "%s/step-%010lld", p, (long long)s);
        n += stat(q, &sb) == 0;
    }
    return n;
}

static void test_memckpt_keeps_the_two_newest_steps_and_finds_the_newest(void)
{
    char scratch[256], ck[300];
    ck_scratch(scratch, sizeof scratch, ck, sizeof ck);
    dt_mesh *m = all_mesh();
    dt_memckpt *mc = open_job(m, scratch, "keep");
    for (int64_t s = 1; s <= 3; s++)
        save_step(mc, m, s);
    DT_ASSERT_OK(dt_memckpt_wait(mc));
    CU_ASSERT_EQUAL(count_steps(scratch, "keep"), 2);
    dt_memckpt_found f;
    DT_ASSERT_OK(dt_memckpt_find(mc, &f));
    CU_ASSERT_EQUAL(f.step, 3);
    CU_ASSERT_EQUAL(f.from_buddies, 0);
    CU_ASSERT_EQUAL(f.hosts, dt_num_clients());
    dt_memckpt_stats ms;
    DT_ASSERT_OK(dt_memckpt_stats_get(mc, &ms));
    CU_ASSERT_EQUAL(ms.buddy_same_host, dt_num_clients() == 1);
    CU_ASSERT(ms.own_bytes > 0);
    if (dt_num_clients() > 1)
        CU_ASSERT_EQUAL(ms.buddy, (dt_client_id() + 1) % dt_num_clients());
    char dir[1024];
    DT_ASSERT_OK(dt_memckpt_fetch(mc, f.step, dir, sizeof dir));
    CU_ASSERT_EQUAL(mismatches_at(m, dir, 3), 0);
    DT_ASSERT_OK(dt_memckpt_cleanup(mc));
    CU_ASSERT_EQUAL(count_steps(scratch, "keep"), 0);
    dt_memckpt_destroy(mc);
    dt_mesh_destroy(m);
    dt_test_scratch_remove(scratch);
}

static void test_a_lost_hosts_files_come_back_from_its_buddy_bit_for_bit(void)
{
    if (dt_num_clients() < 2)
        return; /* one client is one host: nothing to lose and keep */
    char scratch[256], ck[300];
    ck_scratch(scratch, sizeof scratch, ck, sizeof ck);
    dt_mesh *m = all_mesh();
    dt_memckpt *mc = open_job(m, scratch, "lost");
    save_step(mc, m, 4);
    save_step(mc, m, 5);
    DT_ASSERT_OK(dt_memckpt_wait(mc));
    dt_memckpt_destroy(mc);
    int n = dt_num_clients();
    lose_memory(scratch, n - 1);
    /* A new job (as a restart is) finds step 5 from the survivors' memory. */
    mc = open_job(m, scratch, "lost");
    dt_memckpt_found f;
    DT_ASSERT_OK(dt_memckpt_find(mc, &f));
    CU_ASSERT_EQUAL(f.step, 5);
    CU_ASSERT(f.from_buddies > 0);
    CU_ASSERT_EQUAL(f.hosts, n - 1);
    char dir[1024];
    DT_ASSERT_OK(dt_memckpt_fetch(mc, f.step, dir, sizeof dir));
    CU_ASSERT_EQUAL(mismatches_at(m, dir, 5), 0);
    DT_ASSERT_OK(dt_memckpt_cleanup(mc));
    dt_memckpt_destroy(mc);
    dt_mesh_destroy(m);
    dt_test_scratch_remove(scratch);
}

static void test_a_lost_host_and_its_buddy_leave_no_complete_step(void)
{
    if (dt_num_clients() < 2)
        return;
    char scratch[256], ck[300];
    ck_scratch(scratch, sizeof scratch, ck, sizeof ck);
    dt_mesh *m = all_mesh();
    dt_memckpt *mc = open_job(m, scratch, "both");
    save_step(mc, m, 1);
    DT_ASSERT_OK(dt_memckpt_wait(mc));
    dt_memckpt_destroy(mc);
    int n = dt_num_clients();
    lose_memory(scratch, n - 1);
    lose_memory(scratch, 0); /* n - 1's buddy (J = 1) */
    mc = open_job(m, scratch, "both");
    dt_memckpt_found f;
    DT_ASSERT_FAILS(dt_memckpt_find(mc, &f), DT_ERR_NOT_FOUND);
    if (n > 2)
        DT_ASSERT_ERROR_MENTIONS("lacks");
    DT_ASSERT_OK(dt_memckpt_cleanup(mc));
    dt_memckpt_destroy(mc);
    dt_mesh_destroy(m);
    dt_test_scratch_remove(scratch);
}

static void test_another_jobs_memory_is_never_found(void)
{
    char scratch[256], ck[300];
    ck_scratch(scratch, sizeof scratch, ck, sizeof ck);
    dt_mesh *m = all_mesh();
    dt_memckpt *a = open_job(m, scratch, "job-a");
    save_step(a, m, 2);
    dt_memckpt *b = open_job(m, scratch, "job-b");
    dt_memckpt_found f;
    DT_ASSERT_FAILS(dt_memckpt_find(b, &f), DT_ERR_NOT_FOUND);
    DT_ASSERT_ERROR_MENTIONS("job-b");
    DT_ASSERT_OK(dt_memckpt_find(a, &f));
    CU_ASSERT_EQUAL(f.step, 2);
    DT_ASSERT_OK(dt_memckpt_cleanup(a));
    DT_ASSERT_OK(dt_memckpt_cleanup(b));
    dt_memckpt_destroy(a);
    dt_memckpt_destroy(b);
    dt_mesh_destroy(m);
    dt_test_scratch_remove(scratch);
}

/* The saves after the first agree on nothing and reuse the memory of the oldest step kept
 * (its files and the buddy copies received into it, written over in place): six steps of
 * different data, two kept throughout, the newest restored bit for bit from the buddies'
 * copies once a host's memory is gone. */
static void test_quick_saves_reuse_the_oldest_step_and_stay_exact(void)
{
    char scratch[256], ck[300];
    ck_scratch(scratch, sizeof scratch, ck, sizeof ck);
    dt_mesh *m = all_mesh();
    dt_memckpt *mc = open_job(m, scratch, "quick");
    for (int64_t s = 1; s <= 6; s++) {
        save_step(mc, m, s);
        DT_ASSERT_OK(dt_memckpt_wait(mc));
        CU_ASSERT_EQUAL(count_steps(scratch, "quick"), s < 2 ? 1 : 2);
    }
    dt_memckpt_destroy(mc);
    int n = dt_num_clients();
    if (n > 1)
        lose_memory(scratch, n - 1);
    mc = open_job(m, scratch, "quick");
    dt_memckpt_found f;
    DT_ASSERT_OK(dt_memckpt_find(mc, &f));
    CU_ASSERT_EQUAL(f.step, 6);
    CU_ASSERT_EQUAL(f.from_buddies > 0, n > 1);
    char dir[1024];
    DT_ASSERT_OK(dt_memckpt_fetch(mc, f.step, dir, sizeof dir));
    CU_ASSERT_EQUAL(mismatches_at(m, dir, 6), 0);
    DT_ASSERT_OK(dt_memckpt_cleanup(mc));
    dt_memckpt_destroy(mc);
    dt_mesh_destroy(m);
    dt_test_scratch_remove(scratch);
}

/* A quick save reuses the first save's plan: a tensor of another shape is refused (alike on
 * every client, each seeing the same change), and the step before stays the newest. */
static void test_a_quick_save_refuses_another_structure(void)
{
    char scratch[256], ck[300];
    ck_scratch(scratch, sizeof scratch, ck, sizeof ck);
    dt_mesh *m = all_mesh();
    dt_memckpt *mc = open_job(m, scratch, "shape");
    save_step(mc, m, 1);
    save_step(mc, m, 2);
    dt_layout *l = ck_layout(m, "a,b");
    const int64_t other[2] = {8, 12};
    dt_tensor *t = ck_make(l, DT_DTYPE_F32, other, 3);
    saver sv = {m, t};
    DT_ASSERT_FAILS(dt_memckpt_save(mc, 3, save_w, &sv, NULL), DT_ERR_STATE);
    DT_ASSERT_ERROR_MENTIONS("first in-memory save");
    dt_tensor_destroy(t);
    dt_layout_destroy(l);
    DT_ASSERT_OK(dt_memckpt_wait(mc));
    dt_memckpt_found f;
    DT_ASSERT_OK(dt_memckpt_find(mc, &f));
    CU_ASSERT_EQUAL(f.step, 2);
    DT_ASSERT_OK(dt_memckpt_cleanup(mc));
    dt_memckpt_destroy(mc);
    dt_mesh_destroy(m);
    dt_test_scratch_remove(scratch);
}

static void test_memckpt_rejects_a_missing_or_bad_job_id(void)
{
    dt_mesh *m = all_mesh();
    dt_memckpt_opts o = DT_MEMCKPT_OPTS_INIT;
    dt_memckpt *mc = NULL;
    unsetenv("DT_JOB_ID");
    DT_ASSERT_FAILS(dt_memckpt_create(m, &o, &mc), DT_ERR_INVALID_ARGUMENT);
    DT_ASSERT_ERROR_MENTIONS("job id");
    o.job_id = "../x";
    DT_ASSERT_FAILS(dt_memckpt_create(m, &o, &mc), DT_ERR_INVALID_ARGUMENT);
    o.job_id = "ok";
    o.every = 0;
    DT_ASSERT_FAILS(dt_memckpt_create(m, &o, &mc), DT_ERR_INVALID_ARGUMENT);
    dt_mesh_destroy(m);
}

int main(int argc, char **argv)
{
    static const dt_test_case cases[] = {
        DT_TEST(test_memckpt_keeps_the_two_newest_steps_and_finds_the_newest),
        DT_TEST(test_a_lost_hosts_files_come_back_from_its_buddy_bit_for_bit),
        DT_TEST(test_a_lost_host_and_its_buddy_leave_no_complete_step),
        DT_TEST(test_another_jobs_memory_is_never_found),
        DT_TEST(test_quick_saves_reuse_the_oldest_step_and_stay_exact),
        DT_TEST(test_a_quick_save_refuses_another_structure),
        DT_TEST(test_memckpt_rejects_a_missing_or_bad_job_id),
        DT_TEST_END,
    };
    return dt_test_main(argc, argv, "ckpt_memckpt", cases, 1);
}
