/* Host memory pool: alignment, reuse, byte accounting, the cache cap, trim, bad frees and
 * many threads at once. Runs without dt_init (the pool works before it) and a cap of 8 MiB. */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

#define CAP_MB 8
#define MiB ((size_t)1 << 20)

static dt_pool_stats stats(void)
{
    dt_pool_stats s;
    memset(&s, 0xff, sizeof s);
    dt_host_pool_stats(&s);
    return s;
}

/* Hand-worked class size for requests up to 1 MiB: the next power of two, at least 256. */
static size_t small_class(size_t n)
{
    size_t c = 256;
    while (c < n)
        c *= 2;
    return c;
}

static void test_pool_blocks_are_64_byte_aligned_and_writable(void)
{
    const size_t sizes[] = {0, 1, 63, 64, 65, 255, 256, 257, 1000, 4096, 65537, MiB, MiB + 1,
                            3 * MiB};
    void *p[sizeof sizes / sizeof sizes[0]];
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        DT_ASSERT_OK(dt_host_alloc(sizes[i], &p[i]));
        CU_ASSERT_PTR_NOT_NULL(p[i]);
        CU_ASSERT_EQUAL((uintptr_t)p[i] % 64, 0);
        memset(p[i], (int)i, sizes[i]);
    }
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        const unsigned char *b = p[i];
        for (size_t j = 0; j < sizes[i]; j += 97)
            CU_ASSERT_EQUAL(b[j], (unsigned char)i);
        for (size_t k = i + 1; k < sizeof sizes / sizeof sizes[0]; k++)
            CU_ASSERT_PTR_NOT_EQUAL(p[i], p[k]);
    }
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++)
        dt_host_free(p[i]);
}

static void test_pool_reuses_a_freed_block_of_the_same_class(void)
{
    void *p, *q, *r;
    dt_host_pool_trim();
    dt_pool_stats s0 = stats();
    DT_ASSERT_OK(dt_host_alloc(1000, &p));
    dt_host_free(p);
    DT_ASSERT_OK(dt_host_alloc(1000, &q));
    dt_pool_stats s1 = stats();
    CU_ASSERT_EQUAL(s1.allocs - s0.allocs, 2);
    CU_ASSERT_EQUAL(s1.reuses - s0.reuses, 1);
    CU_ASSERT_PTR_EQUAL(q, p); /* one cached block of that class: it comes back */
    dt_host_free(q);
    /* 900 bytes share the 1024-byte class. */
    DT_ASSERT_OK(dt_host_alloc(900, &r));
    CU_ASSERT_PTR_EQUAL(r, p);
    CU_ASSERT_EQUAL(stats().reuses - s0.reuses, 2);
    dt_host_free(r);
}

static void test_pool_accounts_bytes_in_use_and_cached(void)
{
    const size_t sizes[] = {1, 256, 257, 3000, 4096, 70000, MiB};
    void *p[sizeof sizes / sizeof sizes[0]];
    size_t want = 0, asked = 0;
    dt_host_pool_trim();
    dt_pool_stats s0 = stats();
    CU_ASSERT_EQUAL(s0.bytes_cached, 0);
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        DT_ASSERT_OK(dt_host_alloc(sizes[i], &p[i]));
        want += small_class(sizes[i]);
        asked += sizes[i];
    }
    dt_pool_stats s1 = stats();
    CU_ASSERT_EQUAL(s1.bytes_in_use - s0.bytes_in_use, want);
    CU_ASSERT_EQUAL(s1.bytes_requested - s0.bytes_requested, asked);
    CU_ASSERT_EQUAL(s1.bytes_cached, 0);
    CU_ASSERT_EQUAL(s1.reuses, s0.reuses);
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++)
        dt_host_free(p[i]);
    dt_pool_stats s2 = stats();
    CU_ASSERT_EQUAL(s2.bytes_in_use, s0.bytes_in_use);
    CU_ASSERT_EQUAL(s2.bytes_requested, s0.bytes_requested);
    CU_ASSERT_EQUAL(s2.bytes_cached, want);
}

/* The peak of bytes_requested: the most asked for at once, worked out by hand below (a block
 * freed before the next is taken does not add to it), and reset to the bytes live now. */
static void test_pool_peak_is_the_most_requested_at_once(void)
{
    void *a, *b, *c;
    dt_host_pool_reset_peak();
    size_t base = stats().bytes_requested;
    CU_ASSERT_EQUAL(stats().peak_bytes_requested, base);
    DT_ASSERT_OK(dt_host_alloc(3000, &a));
    DT_ASSERT_OK(dt_host_alloc(70000, &b));
    dt_host_free(a);
    DT_ASSERT_OK(dt_host_alloc(5000, &c)); /* 75000 live: above the 73000 before */
    CU_ASSERT_EQUAL(stats().peak_bytes_requested, base + 75000);
    dt_host_free(b);
    dt_host_free(c);
    CU_ASSERT_EQUAL(stats().bytes_requested, base);
    CU_ASSERT_EQUAL(stats().peak_bytes_requested, base + 75000);
    DT_ASSERT_OK(dt_host_alloc(100, &a));
    dt_host_pool_reset_peak();
    CU_ASSERT_EQUAL(stats().peak_bytes_requested, base + 100);
    dt_host_free(a);
    DT_ASSERT_OK(dt_host_alloc(50, &a));
    CU_ASSERT_EQUAL(stats().peak_bytes_requested, base + 100);
    dt_host_free(a);
}

static void test_pool_rounds_large_blocks_to_2mib_multiples_with_bounded_waste(void)
{
    const size_t sizes[] = {MiB + 1, 2 * MiB, 5 * MiB + 3, 8 * MiB, 8 * MiB + 1, 13 * MiB,
                            100 * MiB + 7};
    dt_host_pool_trim();
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        void *p;
        dt_pool_stats s0 = stats();
        DT_ASSERT_OK(dt_host_alloc(sizes[i], &p));
        uint64_t got = stats().bytes_in_use - s0.bytes_in_use;
        size_t slack = sizes[i] / 4 > 2 * MiB ? sizes[i] / 4 : 2 * MiB;
        CU_ASSERT(got >= sizes[i]);
        CU_ASSERT_EQUAL(got % (2 * MiB), 0);
        CU_ASSERT(got < sizes[i] + slack);
        dt_host_free(p);
    }
    dt_host_pool_trim();
}

static void test_pool_cache_stays_under_the_cap(void)
{
    void *p[12];
    dt_host_pool_trim();
    dt_pool_stats s0 = stats();
    CU_ASSERT_EQUAL(s0.bytes_limit, (uint64_t)CAP_MB * MiB);
    for (int i = 0; i < 12; i++)
        DT_ASSERT_OK(dt_host_alloc(MiB, &p[i]));
    for (int i = 0; i < 12; i++)
        dt_host_free(p[i]);
    dt_pool_stats s1 = stats();
    /* 12 MiB freed into an 8 MiB cache: it fills exactly, the rest went back. */
    CU_ASSERT_EQUAL(s1.bytes_cached, (uint64_t)CAP_MB * MiB);
    CU_ASSERT_EQUAL(s1.bytes_in_use, s0.bytes_in_use);
    /* A block larger than the cap is never cached. */
    dt_host_pool_trim();
    void *big;
    DT_ASSERT_OK(dt_host_alloc(2 * CAP_MB * MiB, &big));
    dt_host_free(big);
    CU_ASSERT_EQUAL(stats().bytes_cached, 0);
}

static void test_pool_trim_empties_the_cache(void)
{
    void *p[4], *q;
    for (int i = 0; i < 4; i++)
        DT_ASSERT_OK(dt_host_alloc(5000, &p[i]));
    for (int i = 0; i < 4; i++)
        dt_host_free(p[i]);
    CU_ASSERT(stats().bytes_cached >= 4 * 8192);
    dt_host_pool_trim();
    dt_pool_stats s0 = stats();
    CU_ASSERT_EQUAL(s0.bytes_cached, 0);
    DT_ASSERT_OK(dt_host_alloc(5000, &q));
    CU_ASSERT_EQUAL(stats().reuses, s0.reuses); /* nothing left to reuse */
    dt_host_free(q);
}

static void test_pool_ignores_and_counts_double_and_foreign_frees(void)
{
    void *p, *a, *b, *foreign = NULL;
    dt_host_pool_trim();
    DT_ASSERT_OK(dt_host_alloc(300, &p));
    dt_host_free(p);
    dt_pool_stats s0 = stats();
    dt_host_free(p); /* double free of a cached block */
    dt_pool_stats s1 = stats();
    CU_ASSERT_EQUAL(s1.bad_frees - s0.bad_frees, 1);
    CU_ASSERT_EQUAL(s1.bytes_cached, s0.bytes_cached);
    CU_ASSERT_EQUAL(s1.bytes_in_use, s0.bytes_in_use);
    /* The free list is intact: two allocations get two different blocks. */
    DT_ASSERT_OK(dt_host_alloc(300, &a));
    DT_ASSERT_OK(dt_host_alloc(300, &b));
    CU_ASSERT_PTR_NOT_EQUAL(a, b);
    dt_host_free(a);
    dt_host_free(b);
    /* A pointer the pool never handed out (its would-be header is zeros). */
    CU_ASSERT_EQUAL_FATAL(posix_memalign(&foreign, 64, 256), 0);
    memset(foreign, 0, 256);
    dt_host_free((char *)foreign + 64);
    CU_ASSERT_EQUAL(stats().bad_frees - s0.bad_frees, 2);
    free(foreign);
    dt_host_free(NULL);
    CU_ASSERT_EQUAL(stats().bad_frees - s0.bad_frees, 2);
}

static void test_pool_alloc_rejects_null_out_and_impossible_sizes(void)
{
    void *p = (void *)&p;
    DT_ASSERT_FAILS(dt_host_alloc(16, NULL), DT_ERR_INVALID_ARGUMENT);
    DT_ASSERT_FAILS(dt_host_alloc(SIZE_MAX, &p), DT_ERR_NO_MEMORY);
    DT_ASSERT_ERROR_MENTIONS("18446744073709551615");
    CU_ASSERT_PTR_EQUAL(p, (void *)&p); /* output untouched */
}

#define N_THREADS 8
#define N_ITERS 3000
#define N_LIVE 16

typedef struct worker {
    int id;
    int errors;
} worker;

static void fill(unsigned char *b, size_t n, unsigned tag)
{
    for (size_t i = 0; i < n; i++)
        b[i] = (unsigned char)(tag + i * 31);
}

static int check(const unsigned char *b, size_t n, unsigned tag)
{
    for (size_t i = 0; i < n; i++)
        if (b[i] != (unsigned char)(tag + i * 31))
            return 1;
    return 0;
}

static void *work(void *arg)
{
    worker *w = arg;
    unsigned rng = 12345u + (unsigned)w->id * 7919u;
    void *live[N_LIVE] = {0};
    size_t len[N_LIVE] = {0};
    unsigned tag[N_LIVE] = {0};
    for (int it = 0; it < N_ITERS; it++) {
        rng = rng * 1103515245u + 12345u;
        int slot = (int)((rng >> 8) % N_LIVE);
        if (live[slot]) {
            w->errors += check(live[slot], len[slot], tag[slot]);
            w->errors += (uintptr_t)live[slot] % 64 != 0;
            dt_host_free(live[slot]);
            live[slot] = NULL;
        } else {
            size_t n = ((rng >> 12) % 5000) + ((rng & 1) ? 0 : 60000);
            if (dt_host_alloc(n, &live[slot]) != DT_OK) {
                w->errors++;
                continue;
            }
            len[slot] = n;
            tag[slot] = (unsigned)(w->id * 1000003 + it);
            fill(live[slot], n, tag[slot]);
        }
    }
    for (int s = 0; s < N_LIVE; s++) {
        if (live[s]) {
            w->errors += check(live[s], len[s], tag[s]);
            dt_host_free(live[s]);
        }
    }
    return NULL;
}

static void test_pool_survives_many_threads_allocating_at_once(void)
{
    pthread_t th[N_THREADS];
    worker w[N_THREADS];
    dt_host_pool_trim();
    dt_pool_stats s0 = stats();
    for (int i = 0; i < N_THREADS; i++) {
        w[i].id = i;
        w[i].errors = 0;
        CU_ASSERT_EQUAL_FATAL(pthread_create(&th[i], NULL, work, &w[i]), 0);
    }
    for (int i = 0; i < N_THREADS; i++) {
        pthread_join(th[i], NULL);
        CU_ASSERT_EQUAL(w[i].errors, 0);
    }
    dt_pool_stats s1 = stats();
    CU_ASSERT_EQUAL(s1.bytes_in_use, s0.bytes_in_use);
    CU_ASSERT_EQUAL(s1.bad_frees, s0.bad_frees);
    CU_ASSERT(s1.allocs - s0.allocs > N_THREADS * N_ITERS / 4);
    CU_ASSERT(s1.reuses - s0.reuses > 0);
    CU_ASSERT(s1.bytes_cached <= s1.bytes_limit);
    dt_host_pool_trim();
    CU_ASSERT_EQUAL(stats().bytes_cached, 0);
}

int main(int argc, char **argv)
{
    static const dt_test_case cases[] = {
        DT_TEST(test_pool_blocks_are_64_byte_aligned_and_writable),
        DT_TEST(test_pool_reuses_a_freed_block_of_the_same_class),
        DT_TEST(test_pool_accounts_bytes_in_use_and_cached),
        DT_TEST(test_pool_peak_is_the_most_requested_at_once),
        DT_TEST(test_pool_rounds_large_blocks_to_2mib_multiples_with_bounded_waste),
        DT_TEST(test_pool_cache_stays_under_the_cap),
        DT_TEST(test_pool_trim_empties_the_cache),
        DT_TEST(test_pool_ignores_and_counts_double_and_foreign_frees),
        DT_TEST(test_pool_alloc_rejects_null_out_and_impossible_sizes),
        DT_TEST(test_pool_survives_many_threads_allocating_at_once),
        DT_TEST_END,
    };
    /* Read once, at the pool's first use, which comes after this. */
    setenv("DT_POOL_MAX_MB", "8", 1);
    return dt_test_main(argc, argv, "runtime_memory", cases, 0);
}
