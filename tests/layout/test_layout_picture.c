/* dt_layout_picture: the text grid of blocks and their devices, against pictures drawn by hand
 * for rank 0, 1, 2 and 3 (with a partial dim), and its snprintf-style contract. */
#include <stdlib.h>
#include <string.h>

#include "harness.h"

static const char *const dim_names[] = {"x", "y", "z"};

static dt_mesh *make_mesh(int mrank, const int64_t *sizes)
{
    dt_mesh *m = NULL;
    DT_ASSERT_OK(dt_mesh_create(NULL, mrank, dim_names, sizes, DT_DEVICE_CPU, &m));
    return m;
}

/* Draws the picture and compares it with `want`, printing both when they differ. */
static void check_picture(const dt_layout *l, const int64_t *shape, const char *want)
{
    char buf[2048];
    size_t n = dt_layout_picture(l, shape, buf, sizeof buf);
    CU_ASSERT_EQUAL(n, strlen(want));
    if (strcmp(buf, want) != 0)
        fprintf(stderr, "picture differs; got:\n%s\nwanted:\n%s\n", buf, want);
    CU_ASSERT_STRING_EQUAL(buf, want);
}

static void test_picture_rank2_uneven_grid_labels_rows_columns_and_devices(void)
{
    const int64_t msize[] = {2, 3};
    dt_mesh *mesh = make_mesh(2, msize);
    const char *specs[] = {"x", "y"};
    dt_layout *l = NULL;
    DT_ASSERT_OK(dt_layout_create(mesh, 2, specs, &l));
    /* 7 rows over x=2: 0:4, 4:7; 5 columns over y=3: 0:2, 2:4, 4:5; device = 3x + y. */
    const int64_t shape[] = {7, 5};
    check_picture(l, shape,
                  "shape [7, 5], sharding_specs [x, y], mesh x=2,y=3\n"
                  "      0:2   2:4   4:5\n"
                  "    +-----+-----+-----+\n"
                  "0:4 |  0  |  1  |  2  |\n"
                  "    +-----+-----+-----+\n"
                  "4:7 |  3  |  4  |  5  |\n"
                  "    +-----+-----+-----+\n");
    dt_layout_destroy(l);
    dt_mesh_destroy(mesh);
}

static void test_picture_rank2_lists_strided_replicas(void)
{
    const int64_t msize[] = {2, 2, 2};
    dt_mesh *mesh = make_mesh(3, msize);
    const char *specs[] = {DT_UNSHARDED, "z"};
    dt_layout *l = NULL;
    DT_ASSERT_OK(dt_layout_create(mesh, 2, specs, &l));
    /* Device = 4x + 2y + z: z=0 holds columns 0:3 on 0,2,4,6; z=1 holds 3:6 on 1,3,5,7. */
    const int64_t shape[] = {4, 6};
    check_picture(l, shape,
                  "shape [4, 6], sharding_specs [unsharded, z], mesh x=2,y=2,z=2\n"
                  "        0:3       3:6\n"
                  "    +---------+---------+\n"
                  "0:4 | 0,2,4,6 | 1,3,5,7 |\n"
                  "    +---------+---------+\n");
    dt_layout_destroy(l);
    dt_mesh_destroy(mesh);
}

static void test_picture_rank1_is_one_row_of_blocks(void)
{
    const int64_t msize[] = {2, 2};
    dt_mesh *mesh = make_mesh(2, msize);
    dt_layout *l = NULL;
    DT_ASSERT_OK(dt_layout_batch_sharded(mesh, "x", 1, 0, &l));
    /* 5 over x=2: 0:3 on x=0 (devices 0,1), 3:5 on x=1 (devices 2,3). */
    const int64_t shape[] = {5};
    check_picture(l, shape,
                  "shape [5], sharding_specs [x], mesh x=2,y=2\n"
                  "  0:3   3:5\n"
                  "+-----+-----+\n"
                  "| 0,1 | 2,3 |\n"
                  "+-----+-----+\n");
    dt_layout_destroy(l);
    dt_mesh_destroy(mesh);
}

static void test_picture_rank0_is_one_cell_of_all_devices(void)
{
    const int64_t msize[] = {2, 2};
    dt_mesh *mesh = make_mesh(2, msize);
    dt_layout *l = NULL;
    DT_ASSERT_OK(dt_layout_replicated(mesh, 0, &l));
    check_picture(l, NULL,
                  "shape [], sharding_specs [], mesh x=2,y=2\n"
                  "+-----+\n"
                  "| 0-3 |\n"
                  "+-----+\n");
    dt_layout_destroy(l);
    dt_mesh_destroy(mesh);
}

static void test_picture_rank3_partial_draws_one_grid_per_trailing_shard(void)
{
    const int64_t msize[] = {2, 2, 2};
    dt_mesh *mesh = make_mesh(3, msize);
    const char *specs[] = {DT_UNSHARDED, "y", "x"};
    const char *pdims[] = {"z"};
    const dt_reduce_op ops[] = {DT_REDUCE_SUM};
    dt_layout *l = NULL;
    DT_ASSERT_OK(dt_layout_create_partial(mesh, 3, specs, 1, pdims, ops, &l));
    /* dim 1 (3 over y): 0:2, 2:3; dim 2 (5 over x): 0:3, 3:5; z holds summands, so each
     * block lists the two devices 4x + 2y + {0, 1}. */
    const int64_t shape[] = {2, 3, 5};
    check_picture(l, shape,
                  "shape [2, 3, 5], sharding_specs [unsharded, y, x], mesh x=2,y=2,z=2\n"
                  "partial: z=sum (the devices of a block hold values pending this "
                  "reduction)\n"
                  "[:, :, 0:3]\n"
                  "      0:2   2:3\n"
                  "    +-----+-----+\n"
                  "0:2 | 0,1 | 2,3 |\n"
                  "    +-----+-----+\n"
                  "[:, :, 3:5]\n"
                  "      0:2   2:3\n"
                  "    +-----+-----+\n"
                  "0:2 | 4,5 | 6,7 |\n"
                  "    +-----+-----+\n");
    dt_layout_destroy(l);
    dt_mesh_destroy(mesh);
}

static void test_picture_labels_blocks_with_device_ids_not_positions(void)
{
    /* A parsed mesh whose positions 0..3 hold devices 3, 2, 1, 0. */
    dt_mesh *mesh = NULL;
    DT_ASSERT_OK(dt_mesh_parse("|x=2,y=2|3,2,1,0|3,2,1,0|"
                               "/job:localhost/replica:0/task:0/device:CPU:3,"
                               "/job:localhost/replica:0/task:0/device:CPU:2,"
                               "/job:localhost/replica:0/task:0/device:CPU:1,"
                               "/job:localhost/replica:0/task:0/device:CPU:0",
                               &mesh));
    const char *specs[] = {"x", "y"};
    dt_layout *l = NULL;
    DT_ASSERT_OK(dt_layout_create(mesh, 2, specs, &l));
    const int64_t shape[] = {7, 5};
    check_picture(l, shape,
                  "shape [7, 5], sharding_specs [x, y], mesh x=2,y=2\n"
                  "      0:3   3:5\n"
                  "    +-----+-----+\n"
                  "0:4 |  3  |  2  |\n"
                  "    +-----+-----+\n"
                  "4:7 |  1  |  0  |\n"
                  "    +-----+-----+\n");
    dt_layout_destroy(l);
    dt_mesh_destroy(mesh);
}

static void test_picture_returns_needed_length_like_snprintf(void)
{
    const int64_t msize[] = {2, 2};
    dt_mesh *mesh = make_mesh(2, msize);
    dt_layout *l = NULL;
    DT_ASSERT_OK(dt_layout_replicated(mesh, 0, &l));
    char full[256], small[10];
    size_t n = dt_layout_picture(l, NULL, full, sizeof full);
    CU_ASSERT(n > sizeof small);
    CU_ASSERT_EQUAL(dt_layout_picture(l, NULL, NULL, 0), n);
    memset(small, 'Q', sizeof small);
    CU_ASSERT_EQUAL(dt_layout_picture(l, NULL, small, sizeof small), n);
    CU_ASSERT_EQUAL(small[sizeof small - 1], '\0');
    CU_ASSERT_EQUAL(strncmp(small, full, sizeof small - 1), 0);
    dt_layout_destroy(l);
    dt_mesh_destroy(mesh);
}

static void test_picture_of_negative_shape_is_empty_with_error(void)
{
    const int64_t msize[] = {2};
    dt_mesh *mesh = make_mesh(1, msize);
    dt_layout *l = NULL;
    DT_ASSERT_OK(dt_layout_batch_sharded(mesh, "x", 2, 1, &l));
    const int64_t shape[] = {3, -1};
    char buf[64] = "junk";
    dt_clear_error();
    CU_ASSERT_EQUAL(dt_layout_picture(l, shape, buf, sizeof buf), 0);
    CU_ASSERT_STRING_EQUAL(buf, "");
    DT_ASSERT_ERROR_MENTIONS("shape[1] = -1");
    dt_layout_destroy(l);
    dt_mesh_destroy(mesh);
}

int main(int argc, char **argv)
{
    static const dt_test_case cases[] = {
        DT_TEST(test_picture_rank2_uneven_grid_labels_rows_columns_and_devices),
        DT_TEST(test_picture_rank2_lists_strided_replicas),
        DT_TEST(test_picture_rank1_is_one_row_of_blocks),
        DT_TEST(test_picture_rank0_is_one_cell_of_all_devices),
        DT_TEST(test_picture_rank3_partial_draws_one_grid_per_trailing_shard),
        DT_TEST(test_picture_labels_blocks_with_device_ids_not_positions),
        DT_TEST(test_picture_returns_needed_length_like_snprintf),
        DT_TEST(test_picture_of_negative_shape_is_empty_with_error),
        DT_TEST_END,
    };
    return dt_test_main(argc, argv, "layout_picture", cases, 0);
}
