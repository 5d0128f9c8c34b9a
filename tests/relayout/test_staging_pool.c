/* The staged transport's pool of host staging (runtime/staging_pool.c), on the simulated
 * accelerator with DT_TRANSPORT=staged: a second relayout takes every staging block from the
 * pool (no new allocation) and gives the same values as computed here; the pool holds no
 * more than DT_STAGED_POOL_MB (0: nothing) and trim (what dt_finalize calls) empties it; a
 * bad DT_STAGED_POOL_MB is refused; threads sharing it never get the same block; dt_finalize
 * gives back what the pool holds (the program starts MPI itself, so it can look after). */
#include <mpi.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "rl_test_util.h"
#include "runtime/device.h"
#include "runtime/staging.h"
#include "runtime/transport.h"

static dt__staging_stats pool(void)
{
    dt__staging_stats s;
    dt__staging_stats_get(&s);
    return s;
}

/* A GPU mesh over every device, rows sharded, and the replicated layout: relaying out from
 * rows to replicated is an all-gather whose pieces cross processes. */
typedef struct fixture {
    dt_mesh *mesh;
    dt_layout *rows, *rep;
    int64_t shape[2];
} fixture;

static void fixture_make(fixture *f)
{
    const char *names[1] = {"x"};
    int64_t sizes[1] = {dt_test_num_devices()};
    DT_ASSERT_OK(dt_mesh_create("line", 1, names, sizes, DT_DEVICE_GPU, &f->mesh));
    f->rows = rl_layout2(f->mesh, "x", DT_UNSHARDED, NULL);
    f->rep = rl_layout2(f->mesh, DT_UNSHARDED, DT_UNSHARDED, NULL);
    f->shape[0] = 3 * sizes[0] + 1; /* uneven shards */
    f->shape[1] = 300;              /* 1200-byte rows: one row per 1 KiB chunk */
}

static void fixture_free(fixture *f)
{
    dt_layout_destroy(f->rows);
    dt_layout_destroy(f->rep);
    dt_mesh_destroy(f->mesh);
}

/* Relays out a fresh rows-sharded tensor of `seed` to replicated and checks every value. */
static void gather_and_check(const fixture *f, uint64_t seed)
{
    dt_tensor *src = NULL, *dst = NULL;
    DT_ASSERT_OK(rl_make_tensor(f->rows, f->shape, DT_DTYPE_F32, seed, &src));
    DT_ASSERT_OK(dt_relayout(src, f->rep, &dst));
    CU_ASSERT_EQUAL(rl_check_tensor(dst, f->rows, seed), 0);
    dt_tensor_destroy(dst);
    dt_tensor_destroy(src);
}

static int crossing(void)
{
    return dt_num_clients() > 1; /* one process: no piece crosses, nothing is staged */
}

/* The second and third relayouts (new tensors, the cached plan) allocate no staging: every
 * slot comes from the pool, and what they take goes back. */
static void test_second_relayout_allocates_no_new_staging(void)
{
    setenv("DT_STAGED_CHUNK_KB", "1", 1); /* several chunks, 4 slots per transfer */
    dt__staging_trim();
    fixture f;
    fixture_make(&f);
    dt__staging_stats s0 = pool();
    gather_and_check(&f, 11);
    dt__staging_stats s1 = pool();
    CU_ASSERT_EQUAL(s1.bytes_live, 0);
    if (crossing()) {
        CU_ASSERT(s1.allocs > s0.allocs);
        CU_ASSERT(s1.bytes_cached > 0);
    }
    gather_and_check(&f, 12);
    gather_and_check(&f, 13);
    dt__staging_stats s2 = pool();
    CU_ASSERT_EQUAL(s2.allocs, s1.allocs);
    CU_ASSERT_EQUAL(s2.releases, s1.releases);
    CU_ASSERT_EQUAL(s2.bytes_live, 0);
    CU_ASSERT_EQUAL(s2.bytes_cached, s1.bytes_cached);
    /* Each later relayout took as many blocks from the pool as the first allocated. */
    CU_ASSERT_EQUAL(s2.reuses - s1.reuses, 2 * (s1.allocs - s0.allocs + s1.reuses - s0.reuses));
    printf("\n  (staging blocks: the first relayout allocated %llu, the next two %llu, reusing %llu)\n",
           (unsigned long long)(s1.allocs - s0.allocs), (unsigned long long)(s2.allocs - s1.allocs),
           (unsigned long long)(s2.reuses - s1.reuses));
    fixture_free(&f);
    unsetenv("DT_STAGED_CHUNK_KB");
}

/* DT_STAGED_POOL_MB=0 caches nothing: every relayout allocates its staging again and frees
 * it. Back to the default, the pool fills, and trim gives every block back. */
static void test_pool_is_bounded_and_trim_empties_it(void)
{
    fixture f;
    fixture_make(&f);
    setenv("DT_STAGED_POOL_MB", "0", 1);
    dt__staging_trim(); /* re-read at the next get */
    dt__staging_stats s0 = pool();
    gather_and_check(&f, 21);
    dt__staging_stats s1 = pool();
    gather_and_check(&f, 22);
    dt__staging_stats s2 = pool();
    CU_ASSERT_EQUAL(s2.bytes_cached, 0);
    CU_ASSERT_EQUAL(s2.allocs - s1.allocs, s1.allocs - s0.allocs);
    CU_ASSERT_EQUAL(s2.releases - s1.releases, s2.allocs - s1.allocs);
    CU_ASSERT_EQUAL(s2.reuses, s0.reuses);
    if (crossing()) {
        CU_ASSERT(s1.allocs > s0.allocs);
        CU_ASSERT_EQUAL(s2.bytes_limit, 0);
    }
    unsetenv("DT_STAGED_POOL_MB");
    dt__staging_trim();
    gather_and_check(&f, 23);
    dt__staging_stats s3 = pool();
    CU_ASSERT_EQUAL(s3.bytes_limit, (uint64_t)256 << 20);
    CU_ASSERT(s3.bytes_cached <= s3.bytes_limit);
    dt__staging_trim();
    dt__staging_stats s4 = pool();
    CU_ASSERT_EQUAL(s4.bytes_cached, 0);
    CU_ASSERT_EQUAL(s4.bytes_live, 0);
    if (crossing()) {
        CU_ASSERT(s3.bytes_cached > 0);
        CU_ASSERT(s4.releases > s3.releases);
    }
    fixture_free(&f);
}

/* A bad DT_STAGED_POOL_MB is refused by the first exchange that stages, before posting. */
static void test_bad_pool_size_is_refused(void)
{
    float buf[4] = {1, 2, 3, 4}, got[4] = {0};
    dt__xfer send = {.peer = dt_client_id(),
                     .region = {.base = buf, .dev = NULL, .rank = 1, .elem = sizeof(float),
                                .shape = {4}, .start = {0}, .count = {4}}};
    dt__xfer recv = send;
    recv.region.base = got;
    setenv("DT_STAGED_POOL_MB", "lots", 1);
    dt__staging_trim();
    DT_ASSERT_FAILS(dt__transport_staged()->exchange(&send, 1, &recv, 1, NULL, NULL),
                    DT_ERR_INVALID_ARGUMENT);
    DT_ASSERT_ERROR_MENTIONS("DT_STAGED_POOL_MB='lots'");
    unsetenv("DT_STAGED_POOL_MB");
    dt__staging_trim();
    /* The same exchange (to this client itself) then moves the values. */
    DT_ASSERT_OK(dt__transport_staged()->exchange(&send, 1, &recv, 1, NULL, NULL));
    CU_ASSERT_EQUAL(memcmp(buf, got, sizeof buf), 0);
}

enum { THREADS = 8, ROUNDS = 2000 };

typedef struct worker {
    const dt__device_kind *kind;
    int id;
    int64_t bad;     /* blocks another thread wrote into while this one held them */
    int64_t failed;  /* gets that failed */
} worker;

static void *work(void *arg)
{
    worker *w = arg;
    static const size_t sizes[3] = {1000, 5000, 70000}; /* classes 4, 8, 128 KiB */
    for (int r = 0; r < ROUNDS; r++) {
        size_t n = sizes[(r + w->id) % 3];
        unsigned char *p = NULL;
        if (dt__staging_get(w->kind, n, (void **)&p) != DT_OK) {
            w->failed++;
            continue;
        }
        memset(p, w->id + 1, n);
        for (size_t i = 0; i < n; i += 97)
            w->bad += p[i] != (unsigned char)(w->id + 1);
        w->bad += p[n - 1] != (unsigned char)(w->id + 1);
        dt__staging_put(w->kind, p, n);
    }
    return NULL;
}

/* Eight threads getting and putting blocks of three classes: no block is held by two at once,
 * every get is an allocation or a reuse, and with at most one block per thread live the pool
 * never allocates more than 8 blocks per class. */
static void test_pool_is_thread_safe(void)
{
    const dt__device *cpu = dt__device_local(DT_DEVICE_CPU, 0);
    CU_ASSERT_PTR_NOT_NULL_FATAL(cpu);
    dt__staging_trim();
    dt__staging_stats s0 = pool();
    worker w[THREADS];
    pthread_t th[THREADS];
    for (int i = 0; i < THREADS; i++) {
        w[i] = (worker){.kind = cpu->kind, .id = i};
        CU_ASSERT_EQUAL_FATAL(pthread_create(&th[i], NULL, work, &w[i]), 0);
    }
    int64_t bad = 0, failed = 0;
    for (int i = 0; i < THREADS; i++) {
        pthread_join(th[i], NULL);
        bad += w[i].bad;
        failed += w[i].failed;
    }
    dt__staging_stats s1 = pool();
    CU_ASSERT_EQUAL(bad, 0);
    CU_ASSERT_EQUAL(failed, 0);
    CU_ASSERT_EQUAL((s1.allocs - s0.allocs) + (s1.reuses - s0.reuses),
                    (uint64_t)THREADS * ROUNDS);
    CU_ASSERT(s1.allocs - s0.allocs <= (uint64_t)THREADS * 3);
    CU_ASSERT_EQUAL(s1.bytes_live, 0);
    CU_ASSERT_EQUAL(s1.releases, s0.releases);
    dt__staging_trim();
    CU_ASSERT_EQUAL(pool().bytes_cached, 0);
}

/* The last case: leaves staging in the pool for dt_finalize to give back (main checks). */
static uint64_t left_for_finalize;

static void test_relayout_leaves_staging_for_finalize(void)
{
    fixture f;
    fixture_make(&f);
    gather_and_check(&f, 31);
    dt__staging_stats s = pool();
    left_for_finalize = s.bytes_cached;
    if (crossing())
        CU_ASSERT(s.bytes_cached > 0);
    fixture_free(&f);
}

int main(int argc, char **argv)
{
    static const dt_test_case cases[] = {
        DT_TEST(test_second_relayout_allocates_no_new_staging),
        DT_TEST(test_pool_is_bounded_and_trim_empties_it),
        DT_TEST(test_bad_pool_size_is_refused),
        DT_TEST(test_pool_is_thread_safe),
        DT_TEST(test_relayout_leaves_staging_for_finalize),
        DT_TEST_END,
    };
    MPI_Init(&argc, &argv);
    dt__staging_stats before = pool();
    int rc = dt_test_main_gpu(argc, argv, "staging_pool", cases);
    /* dt_finalize emptied the pool (MPI is ours, so it still runs). */
    dt__staging_stats after = pool();
    int bad = rc != 77 && (after.bytes_cached != 0 || after.bytes_live != 0 ||
                           (left_for_finalize > 0 && after.releases == before.releases));
    if (bad)
        fprintf(stderr, "staging_pool: dt_finalize left %llu bytes of staging in the pool\n",
                (unsigned long long)after.bytes_cached);
    else if (rc == 0)
        printf("staging_pool: dt_finalize gave back the %llu bytes the pool held\n",
               (unsigned long long)left_for_finalize);
    int any = 0;
    MPI_Allreduce(&bad, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    MPI_Finalize();
    return any ? 1 : rc;
}
