/* Asynchronous saves: the checkpoint holds the tensors and values as they were at the call
 * although the caller overwrites and frees them at once (with staging memory bounded below
 * the data, so the call itself waits for the writer), a second save waits for the first,
 * dt_save_test reports the end, and the manager's asynchronous steps prune and point latest.
 * Restores are compared with the single-device reference bit for bit. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ck_test_util.h"
#include "harness.h"

static dt_mesh *all_mesh(void)
{
    int64_t n = dt_num_global_devices(DT_DEVICE_CPU);
    int64_t sizes[2] = {2, n / 2};
    return ck_mesh(2, sizes);
}

/* Overwrites every local element of t (what a training step does to its parameters). */
static void scribble(dt_tensor *t)
{
    size_t elem = dt_dtype_size(dt_tensor_dtype(t));
    for (int i = 0; i < dt_tensor_num_local(t); i++) {
        const DLTensor *x = dt_tensor_local(t, i);
        int64_t n = 1;
        for (int d = 0; d < x->ndim; d++)
            n *= x->shape[d];
        memset(x->data, 0xA5, (size_t)n * elem);
    }
}

/* Restores "w" (seed `seed`, shape) from dir onto other layouts; checks it and "rng". */
static void check_restore(const char *dir, const int64_t *shape, uint64_t seed,
                          const unsigned char *rng, size_t nrng)
{
    dt_mesh *m = all_mesh();
    dt_layout *l = ck_layout(m, "b,unsharded");
    dt_tensor *out = NULL;
    const char *name = "w";
    DT_ASSERT_OK(dt_restore(m, dir, 1, &name, (const dt_layout *const *)&l, &out));
    CU_ASSERT_EQUAL(dt_tensor_shape(out)[0], shape[0]);
    CU_ASSERT_EQUAL(ck_mismatches(out, seed), 0);
    dt_ckpt *c = NULL;
    const void *got = NULL;
    size_t ngot = 0;
    DT_ASSERT_OK(dt_ckpt_open(dir, &c));
    DT_ASSERT_OK(dt_ckpt_value_bytes(c, "rng", &got, &ngot));
    CU_ASSERT_EQUAL(ngot, nrng);
    CU_ASSERT(ngot == nrng && memcmp(got, rng, nrng) == 0);
    dt_ckpt_close(c);
    dt_tensor_destroy(out);
    dt_layout_destroy(l);
    dt_mesh_destroy(m);
}

static dt_save_request *start(const char *dir, const int64_t *shape, uint64_t seed,
                              unsigned char *rng, size_t nrng, uint64_t staging)
{
    dt_mesh *m = all_mesh();
    dt_layout *l = ck_layout(m, "a,b");
    dt_tensor *t = ck_make(l, DT_DTYPE_F32, shape, seed);
    const char *name = "w";
    dt_ckpt_value v = {.name = "rng", .type = DT_CKPT_VALUE_BYTES, .bytes = rng,
                       .nbytes = nrng};
    dt_save_opts o = DT_SAVE_OPTS_INIT;
    o.values = &v;
    o.nvalues = 1;
    o.chunk_bytes = 64 << 10;
    o.staging_bytes = staging;
    dt_save_request *req = NULL;
    DT_ASSERT_OK(dt_save_async(m, dir, 1, &name, (const dt_tensor *const *)&t, &o, &req));
    /* The caller goes on at once: its tensor and value change, then go away. */
    scribble(t);
    memset(rng, 0, nrng);
    dt_tensor_destroy(t);
    dt_layout_destroy(l);
    dt_mesh_destroy(m);
    return req;
}

static void test_async_save_holds_the_values_of_the_call_with_bounded_staging(void)
{
    char dir[256], ck[300];
    ck_scratch(dir, sizeof dir, ck, sizeof ck);
    int64_t shape[2] = {384, 1024};   /* 1.5 MiB; each client stages at most 256 KiB */
    unsigned char rng[40], want[40];
    for (int i = 0; i < 40; i++)
        rng[i] = want[i] = (unsigned char)(i * 7 + 1);
    dt_save_request *req = start(ck, shape, 11, rng, sizeof rng, 256 << 10);
    CU_ASSERT_PTR_NOT_NULL_FATAL(req);
    int done = 0;
    while (dt_save_test(req, &done) == DT_OK && !done)
        usleep(1000);
    DT_ASSERT_OK(dt_save_wait(req));
    check_restore(ck, shape, 11, want, sizeof want);
    /* Replacing it asynchronously, without a bound. */
    for (int i = 0; i < 40; i++)
        rng[i] = want[i] = (unsigned char)(i * 3 + 2);
    DT_ASSERT_OK(dt_save_wait(start(ck, shape, 12, rng, sizeof rng, 0)));
    check_restore(ck, shape, 12, want, sizeof want);
    dt_test_scratch_remove(dir);
}

static void test_a_second_save_waits_for_the_first(void)
{
    char dir[256], a[300], b[300];
    dt_test_scratch_dir(dir, sizeof dir);
    snprintf(a, sizeof a, "%s/a", dir);
    snprintf(b, sizeof b, "%s/b", dir);
    int64_t shape[2] = {64, 256};
    unsigned char ra[8] = {1, 2, 3, 4, 5, 6, 7, 8}, rb[8] = {9, 9, 9, 9, 9, 9, 9, 9};
    unsigned char wa[8], wb[8];
    memcpy(wa, ra, 8);
    memcpy(wb, rb, 8);
    dt_save_request *qa = start(a, shape, 21, ra, 8, 0);
    dt_save_request *qb = start(b, shape, 22, rb, 8, 0);
    int done = 0;
    DT_ASSERT_OK(dt_save_test(qa, &done));
    CU_ASSERT_EQUAL(done, 1);   /* the second one's start waited for it */
    /* A synchronous save waits for the asynchronous one too. */
    dt_mesh *m = all_mesh();
    dt_layout *l = ck_layout(m, "a,b");
    dt_tensor *t = ck_make(l, DT_DTYPE_F32, shape, 23);
    const char *name = "w";
    snprintf(a, sizeof a, "%s/c", dir);
    DT_ASSERT_OK(dt_save(m, a, 1, &name, (const dt_tensor *const *)&t, NULL));
    DT_ASSERT_OK(dt_save_test(qb, &done));
    CU_ASSERT_EQUAL(done, 1);
    DT_ASSERT_OK(dt_save_wait(qb));
    DT_ASSERT_OK(dt_save_wait(qa));
    snprintf(a, sizeof a, "%s/a", dir);
    check_restore(a, shape, 21, wa, 8);
    check_restore(b, shape, 22, wb, 8);
    dt_tensor_destroy(t);
    dt_layout_destroy(l);
    dt_mesh_destroy(m);
    DT_ASSERT_FAILS(dt_save_wait(NULL), DT_ERR_INVALID_ARGUMENT);
    dt_test_scratch_remove(dir);
}

static void test_async_steps_prune_and_point_latest(void)
{
    char dir[256], root[300], latest[400];
    dt_test_scratch_dir(dir, sizeof dir);
    snprintf(root, sizeof root, "%s/run", dir);
    int64_t shape[2] = {32, 16};
    dt_mesh *m = all_mesh();
    dt_layout *l = ck_layout(m, "a,b");
    const char *name = "w";
    dt_ckpt_keep keep = {.last = 2, .every = 0};
    dt_save_request *prev = NULL;
    for (int64_t s = 1; s <= 4; s++) {
        dt_tensor *t = ck_make(l, DT_DTYPE_F32, shape, (uint64_t)(100 + s));
        dt_save_request *req = NULL;
        DT_ASSERT_OK(dt_save_step_async(m, root, s, &keep, 1, &name,
                                        (const dt_tensor *const *)&t, NULL, &req));
        scribble(t);
        dt_tensor_destroy(t);
        if (prev)   /* the training loop collects the previous save's outcome */
            DT_ASSERT_OK(dt_save_wait(prev));
        prev = req;
    }
    DT_ASSERT_OK(dt_save_wait(prev));
    dt_ckpt_step *v = NULL;
    int64_t n = 0, step = -1;
    DT_ASSERT_OK(dt_ckpt_list_steps(root, &v, &n));
    CU_ASSERT_EQUAL(n, 2);
    CU_ASSERT(n == 2 && v[0].step == 3 && v[1].step == 4 && v[0].complete && v[1].complete);
    dt_ckpt_steps_free(v);
    DT_ASSERT_OK(dt_ckpt_latest(root, &step, latest, sizeof latest));
    CU_ASSERT_EQUAL(step, 4);
    CU_ASSERT_EQUAL(ck_restored_mismatches(m, latest, name, "unsharded,b", 104), 0);
    dt_layout_destroy(l);
    dt_mesh_destroy(m);
    dt_test_scratch_remove(dir);
}

int main(int argc, char **argv)
{
    static const dt_test_case cases[] = {
        DT_TEST(test_async_save_holds_the_values_of_the_call_with_bounded_staging),
        DT_TEST(test_a_second_save_waits_for_the_first),
        DT_TEST(test_async_steps_prune_and_point_latest),
        DT_TEST_END,
    };
    return dt_test_main(argc, argv, "ckpt_async", cases, 1);
}
