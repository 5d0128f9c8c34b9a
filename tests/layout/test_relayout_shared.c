/* Tests of relayouts between layouts that place a tensor alike (they differ only by splits or
 * pending sums over a mesh dim of one device): the internal dt__relayout_shared and the ops
 * that use it move no bytes and share the source's buffers, while dt_relayout still hands
 * back a fresh copy. Values are checked against the host tensor they were packed from. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "layout/tensor_dev.h"

#define COLS 5

static dt_mesh *mesh_one_many(void)
{
    const char *names[2] = {"one", "many"};
    int64_t sizes[2] = {1, dt_test_num_devices()};
    dt_mesh *m = NULL;
    CU_ASSERT_FATAL(dt_mesh_create("one_many", 2, names, sizes, dt_test_device_type(), &m) ==
                    DT_OK);
    return m;
}

/* value of element (r, c) of the global [rows, COLS] tensor */
static float val(int64_t r, int64_t c, float salt)
{
    return (float)(r * COLS + c) * 0.25f + salt;
}

/* A [rows, COLS] f32 tensor with `layout` holding val(.., salt) (a sum over "one" has one
 * summand: each device holds the value). */
static dt_tensor *make(const dt_layout *layout, int64_t rows, float salt)
{
    int64_t shape[2] = {rows, COLS};
    int n = dt_test_num_local_devices();
    void **bufs = calloc((size_t)n + 1, sizeof *bufs);
    CU_ASSERT_FATAL(bufs != NULL);
    dt_tensor *probe = NULL;
    CU_ASSERT_FATAL(dt_tensor_zeros(layout, DT_DTYPE_F32, shape, &probe) == DT_OK);
    for (int i = 0; i < n; i++) {
        const int64_t *off = dt_tensor_local_offset(probe, i);
        const int64_t *len = dt_tensor_local(probe, i)->shape;
        float *b = malloc((size_t)(len[0] * len[1]) * sizeof *b + 1);
        CU_ASSERT_FATAL(b != NULL);
        for (int64_t r = 0; r < len[0]; r++)
            for (int64_t c = 0; c < len[1]; c++)
                b[r * len[1] + c] = val(off[0] + r, off[1] + c, salt);
        bufs[i] = b;
    }
    dt_tensor *t = NULL;
    CU_ASSERT_FATAL(dt_test_pack_host(layout, DT_DTYPE_F32, shape, (const void *const *)bufs,
                                      &t) == DT_OK);
    for (int i = 0; i < n; i++)
        free(bufs[i]);
    free(bufs);
    dt_tensor_destroy(probe);
    return t;
}

/* Every local element of t equals val(.., salt_a), plus val(.., salt_b) when `two`. */
static void check_values(const dt_tensor *t, float salt_a, float salt_b, int two)
{
    for (int i = 0; i < dt_tensor_num_local(t); i++) {
        const int64_t *off = dt_tensor_local_offset(t, i);
        const int64_t *len = dt_tensor_local(t, i)->shape;
        float *x = dt_test_local_get(t, i);
        int bad = 0;
        for (int64_t r = 0; r < len[0]; r++)
            for (int64_t c = 0; c < len[1]; c++) {
                float w = val(off[0] + r, off[1] + c, salt_a);
                if (two)
                    w += val(off[0] + r, off[1] + c, salt_b);
                bad += x[r * len[1] + c] != w;
            }
        CU_ASSERT_EQUAL(bad, 0);
        free(x);
    }
}

/* 1 if no relayout has executed since the last dt_relayout_cache_clear. */
static int nothing_moved(void)
{
    int count = 0;
    dt_relayout_stats s[1];
    return dt_relayout_last_stats(1, s, &count, NULL) == DT_ERR_STATE;
}

static void test_relayout_shared_over_one_device_dim_shares_buffers(void)
{
    dt_mesh *m = mesh_one_many();
    int64_t rows = 3 * dt_test_num_devices() + 1; /* uneven over "many" */
    /* rows split over "many" in both; the columns split over "one", or a sum over it. */
    const char *pairs[3][2] = {{"one", NULL}, {NULL, NULL}, {NULL, "one"}};
    for (int k = 0; k < 3; k++) {
        dt_layout *ls = dt_test_layout(m, 2, "many", pairs[k][0], pairs[k][1]);
        dt_layout *ld = dt_test_layout(m, 2, "many", pairs[(k + 1) % 3][0],
                                       pairs[(k + 1) % 3][1]);
        CU_ASSERT_TRUE(dt__layout_same_placement(ls, ld));
        dt_tensor *src = make(ls, rows, 1.0f), *out = NULL;
        dt_relayout_cache_clear();
        CU_ASSERT_EQUAL_FATAL(dt__relayout_shared(src, ld, &out), DT_OK);
        CU_ASSERT_TRUE(nothing_moved());
        CU_ASSERT_TRUE(dt_layout_equal(dt_tensor_layout(out), ld));
        for (int i = 0; i < dt_tensor_num_local(out); i++)
            CU_ASSERT_PTR_EQUAL(dt_tensor_local(out, i)->data, dt_tensor_local(src, i)->data);
        dt_tensor_destroy(src); /* the view keeps the memory alive */
        check_values(out, 1.0f, 0.0f, 0);
        dt_tensor_destroy(out);
        dt_layout_destroy(ld);
        dt_layout_destroy(ls);
    }
    dt_mesh_destroy(m);
}

static void test_relayout_shared_copies_when_placement_differs(void)
{
    dt_mesh *m = mesh_one_many();
    int64_t rows = 3 * dt_test_num_devices() + 1;
    dt_layout *ls = dt_test_layout(m, 2, "many", NULL, NULL);
    dt_layout *ld = dt_test_layout(m, 2, NULL, "one", NULL);
    CU_ASSERT_EQUAL(dt__layout_same_placement(ls, ld), dt_test_num_devices() == 1);
    dt_tensor *src = make(ls, rows, 2.0f), *out = NULL;
    dt_relayout_cache_clear();
    CU_ASSERT_EQUAL_FATAL(dt__relayout_shared(src, ld, &out), DT_OK);
    CU_ASSERT_EQUAL(nothing_moved(), dt_test_num_devices() == 1);
    check_values(out, 2.0f, 0.0f, 0);
    dt_tensor_destroy(out);
    dt_tensor_destroy(src);
    dt_layout_destroy(ld);
    dt_layout_destroy(ls);
    dt_mesh_destroy(m);
}

/* The public call keeps its promise of a new tensor: a copy even where nothing needs to move. */
static void test_relayout_public_returns_fresh_buffers(void)
{
    dt_mesh *m = mesh_one_many();
    dt_layout *ls = dt_test_layout(m, 2, "many", "one", NULL);
    dt_layout *ld = dt_test_layout(m, 2, "many", NULL, NULL);
    dt_tensor *src = make(ls, 2 * dt_test_num_devices(), 3.0f), *out = NULL;
    CU_ASSERT_EQUAL_FATAL(dt_relayout(src, ld, &out), DT_OK);
    for (int i = 0; i < dt_tensor_num_local(out); i++)
        CU_ASSERT_PTR_NOT_EQUAL(dt_tensor_local(out, i)->data, dt_tensor_local(src, i)->data);
    check_values(out, 3.0f, 0.0f, 0);
    dt_tensor_destroy(out);
    dt_tensor_destroy(src);
    dt_layout_destroy(ld);
    dt_layout_destroy(ls);
    dt_mesh_destroy(m);
}

/* An op whose inputs and requested output differ only over "one" relays nothing out. */
static void test_ops_relay_nothing_over_one_device_dim(void)
{
    dt_mesh *m = mesh_one_many();
    int64_t rows = 2 * dt_test_num_devices() + 1;
    dt_layout *la = dt_test_layout(m, 2, "many", "one", NULL);
    dt_layout *lb = dt_test_layout(m, 2, "many", NULL, NULL);
    dt_layout *lc = dt_test_layout(m, 2, "many", NULL, "one");
    dt_tensor *a = make(la, rows, 0.5f), *b = make(lb, rows, 4.0f), *c = NULL;
    dt_relayout_cache_clear();
    CU_ASSERT_EQUAL_FATAL(dt_add(a, b, lc, &c), DT_OK);
    CU_ASSERT_TRUE(nothing_moved());
    CU_ASSERT_TRUE(dt_layout_equal(dt_tensor_layout(c), lc));
    check_values(c, 0.5f, 4.0f, 1);
    dt_tensor_destroy(c);
    dt_tensor_destroy(b);
    dt_tensor_destroy(a);
    dt_layout_destroy(lc);
    dt_layout_destroy(lb);
    dt_layout_destroy(la);
    dt_mesh_destroy(m);
}

int main(int argc, char **argv)
{
    static const dt_test_case cases[] = {
        DT_TEST(test_relayout_shared_over_one_device_dim_shares_buffers),
        DT_TEST(test_relayout_shared_copies_when_placement_differs),
        DT_TEST(test_relayout_public_returns_fresh_buffers),
        DT_TEST(test_ops_relay_nothing_over_one_device_dim),
        DT_TEST_END,
    };
    return dt_test_main_device(argc, argv, "relayout_shared", cases);
}
