/* Meshes from dims: validation of dt_mesh_create, coordinates <-> positions and per-dimension
 * groups against a brute-force enumeration, host meshes, reference counting. No runtime. */
#include <stdlib.h>
#include <string.h>

#include "harness.h"

static dt_mesh *make(const char *name, int ndims, const char *const *names, const int64_t *sizes,
                     dt_device_type type)
{
    dt_mesh *m = NULL;
    DT_ASSERT_OK(dt_mesh_create(name, ndims, names, sizes, type, &m));
    return m;
}

/* Walks every coordinate of the grid in row-major order with an odometer and checks
 * dt_mesh_coords / dt_mesh_position_of against the running count, then checks every group
 * against a scan of all positions that agree on all other coordinates. */
static void check_grid(int ndims, const int64_t *sizes)
{
    static const char *const names[] = {"a", "b", "c", "d", "e", "f", "g", "h"};
    dt_mesh *m = make("g", ndims, names, sizes, DT_DEVICE_CPU);
    int64_t n = 1;
    for (int d = 0; d < ndims; d++)
        n *= sizes[d];
    CU_ASSERT_EQUAL(dt_mesh_size(m), n);
    int64_t(*all)[DT_MESH_MAX_DIMS] = calloc((size_t)n, sizeof *all);
    CU_ASSERT_FATAL(all != NULL);

    int64_t odo[DT_MESH_MAX_DIMS] = {0};
    for (int64_t p = 0; p < n; p++) {
        int64_t c[DT_MESH_MAX_DIMS], q = -1;
        DT_ASSERT_OK(dt_mesh_coords(m, p, c));
        CU_ASSERT_EQUAL(memcmp(c, odo, (size_t)ndims * sizeof *c), 0);
        DT_ASSERT_OK(dt_mesh_position_of(m, odo, &q));
        CU_ASSERT_EQUAL(q, p);
        CU_ASSERT_EQUAL(dt_mesh_device_id(m, p), p); /* created meshes: position == id */
        memcpy(all[p], odo, sizeof odo);
        for (int d = ndims - 1; d >= 0; d--) { /* advance the odometer */
            if (++odo[d] < sizes[d])
                break;
            odo[d] = 0;
        }
    }

    int64_t *got = malloc((size_t)n * sizeof *got), *want = malloc((size_t)n * sizeof *want);
    CU_ASSERT_FATAL(got && want);
    for (int d = 0; d < ndims; d++) {
        for (int64_t p = 0; p < n; p++) {
            int64_t k = 0;
            for (int64_t q = 0; q < n; q++) {
                int same = 1;
                for (int e = 0; e < ndims; e++)
                    same &= e == d || all[q][e] == all[p][e];
                if (same)
                    want[k++] = q; /* increasing q is increasing coordinate d */
            }
            CU_ASSERT_EQUAL(k, sizes[d]);
            DT_ASSERT_OK(dt_mesh_dim_group(m, d, p, got));
            CU_ASSERT_EQUAL(memcmp(got, want, (size_t)k * sizeof *got), 0);
        }
    }
    free(got);
    free(want);
    free(all);
    dt_mesh_destroy(m);
}

static void test_mesh_coords_and_groups_match_brute_force_1d(void)
{
    check_grid(1, (const int64_t[]){5});
    check_grid(1, (const int64_t[]){1});
}

static void test_mesh_coords_and_groups_match_brute_force_2d(void)
{
    check_grid(2, (const int64_t[]){3, 4});
    check_grid(2, (const int64_t[]){4, 1});
}

static void test_mesh_coords_and_groups_match_brute_force_3d(void)
{
    check_grid(3, (const int64_t[]){2, 3, 4});
    check_grid(4, (const int64_t[]){2, 1, 3, 2});
}

static void test_mesh_coords_hand_worked_values(void)
{
    /* TensorFlow's MeshDeviceLocations test: x=4,batch=8: 10 -> (1,2), 18 -> (2,2), 31 -> (3,7). */
    static const char *const names[] = {"x", "batch"};
    dt_mesh *m = make(NULL, 2, names, (const int64_t[]){4, 8}, DT_DEVICE_CPU);
    int64_t c[2];
    DT_ASSERT_OK(dt_mesh_coords(m, 10, c));
    CU_ASSERT(c[0] == 1 && c[1] == 2);
    DT_ASSERT_OK(dt_mesh_coords(m, 18, c));
    CU_ASSERT(c[0] == 2 && c[1] == 2);
    DT_ASSERT_OK(dt_mesh_coords(m, 31, c));
    CU_ASSERT(c[0] == 3 && c[1] == 7);
    DT_ASSERT_FAILS(dt_mesh_coords(m, 32, c), DT_ERR_INVALID_ARGUMENT);
    DT_ASSERT_ERROR_MENTIONS("position 32");
    DT_ASSERT_FAILS(dt_mesh_coords(m, -1, c), DT_ERR_INVALID_ARGUMENT);
    int64_t p = -7;
    DT_ASSERT_FAILS(dt_mesh_position_of(m, (const int64_t[]){4, 0}, &p), DT_ERR_INVALID_ARGUMENT);
    DT_ASSERT_ERROR_MENTIONS("dimension 'x'");
    CU_ASSERT_EQUAL(p, -7);
    /* Group along batch through position 10 is row 1: 8..15; along x: column 2: 2,10,18,26. */
    int64_t g[8];
    DT_ASSERT_OK(dt_mesh_dim_group(m, 1, 10, g));
    for (int k = 0; k < 8; k++)
        CU_ASSERT_EQUAL(g[k], 8 + k);
    DT_ASSERT_OK(dt_mesh_dim_group(m, 0, 10, g));
    CU_ASSERT(g[0] == 2 && g[1] == 10 && g[2] == 18 && g[3] == 26);
    DT_ASSERT_FAILS(dt_mesh_dim_group(m, 2, 0, g), DT_ERR_INVALID_ARGUMENT);
    DT_ASSERT_FAILS(dt_mesh_dim_group(m, 0, 32, g), DT_ERR_INVALID_ARGUMENT);
    dt_mesh_destroy(m);
}

static void test_mesh_create_formats_full_string_with_all_devices_local(void)
{
    static const char *const names[] = {"batch", "model"};
    dt_mesh *m = make("train", 2, names, (const int64_t[]){2, 2}, DT_DEVICE_CPU);
    const char *want = "train|batch=2,model=2|0,1,2,3|0,1,2,3|"
                       "/job:localhost/replica:0/task:0/device:CPU:0,"
                       "/job:localhost/replica:0/task:0/device:CPU:1,"
                       "/job:localhost/replica:0/task:0/device:CPU:2,"
                       "/job:localhost/replica:0/task:0/device:CPU:3";
    char buf[512];
    CU_ASSERT_EQUAL(dt_mesh_format(m, buf, sizeof buf), strlen(want));
    CU_ASSERT_STRING_EQUAL(buf, want);
    CU_ASSERT_EQUAL(dt_mesh_num_local_devices(m), 4);
    dt_mesh *p = NULL;
    DT_ASSERT_OK(dt_mesh_parse("|batch=2,model=2|*CPU", &p));
    CU_ASSERT_TRUE(dt_mesh_equal(m, p)); /* names may differ */
    dt_mesh_destroy(p);
    DT_ASSERT_OK(dt_mesh_parse("|batch=2,model=2|0,1,3,2|0|/job:a/task:0/device:CPU:0", &p));
    CU_ASSERT_FALSE(dt_mesh_equal(m, p)); /* ids differ */
    dt_mesh_destroy(p);
    DT_ASSERT_OK(dt_mesh_parse("|batch=2,model=2|*GPU", &p));
    CU_ASSERT_FALSE(dt_mesh_equal(m, p)); /* type differs */
    dt_mesh_destroy(p);
    DT_ASSERT_OK(dt_mesh_parse("|model=2,batch=2|*CPU", &p));
    CU_ASSERT_FALSE(dt_mesh_equal(m, p)); /* dims differ */
    dt_mesh_destroy(p);
    dt_mesh_destroy(m);
}

static void check_create_rejects(const char *name, int ndims, const char *const *names,
                                 const int64_t *sizes, const char *needle)
{
    dt_mesh *m = (dt_mesh *)&m;
    dt_mesh *const before = m;
    dt_clear_error();
    DT_ASSERT_FAILS(dt_mesh_create(name, ndims, names, sizes, DT_DEVICE_CPU, &m),
                    DT_ERR_INVALID_ARGUMENT);
    CU_ASSERT_PTR_EQUAL(m, before);
    DT_ASSERT_ERROR_MENTIONS(needle);
}

static void test_mesh_create_rejects_invalid_dims(void)
{
    const int64_t s22[] = {2, 2}, s20[] = {2, 0}, s2m[] = {2, -1};
    check_create_rejects("m", 2, (const char *const[]){"model", "model"}, s22,
                         "dimension 'model' repeated");
    check_create_rejects("m", 2, (const char *const[]){"x", ""}, s22, "dimension 1 has an empty");
    check_create_rejects("m", 2, (const char *const[]){"x", NULL}, s22, "empty name");
    check_create_rejects("m", 2, (const char *const[]){"x", "b-1"}, s22,
                         "'b-1' is not an identifier");
    check_create_rejects("m", 2, (const char *const[]){"x", "unsharded"}, s22, "reserved");
    check_create_rejects("m", 2, (const char *const[]){"x", "y"}, s20,
                         "dimension 'y' has size 0");
    check_create_rejects("m", 2, (const char *const[]){"x", "y"}, s2m,
                         "dimension 'y' has size -1");
    check_create_rejects("m", 0, NULL, NULL, "at least one dimension");
    static const char *const nine[] = {"a", "b", "c", "d", "e", "f", "g", "h", "i"};
    static const int64_t ones[9] = {1, 1, 1, 1, 1, 1, 1, 1, 1};
    check_create_rejects("m", 9, nine, ones, "at most 8");
    char longname[DT_NAME_MAX + 1];
    memset(longname, 'q', DT_NAME_MAX);
    longname[DT_NAME_MAX] = '\0';
    check_create_rejects("m", 1, (const char *const[]){longname}, ones, "longer than 63");
    check_create_rejects(longname, 1, (const char *const[]){"x"}, ones, "longer than 63");
    longname[DT_NAME_MAX - 1] = '\0'; /* 63 bytes: accepted */
    dt_mesh *m = make(longname, 1, (const char *const[]){longname}, ones, DT_DEVICE_CPU);
    CU_ASSERT_STRING_EQUAL(dt_mesh_name(m), longname);
    CU_ASSERT_STRING_EQUAL(dt_mesh_dim_name(m, 0), longname);
    dt_mesh_destroy(m);
    check_create_rejects("a|b", 1, (const char *const[]){"x"}, ones, "mesh name 'a|b'");
    check_create_rejects("a b", 1, (const char *const[]){"x"}, ones, "mesh name 'a b'");
    check_create_rejects("m", 2, (const char *const[]){"x", "y"},
                         (const int64_t[]){65536, 65536}, "more than");
    m = NULL;
    DT_ASSERT_FAILS(dt_mesh_create("m", 1, (const char *const[]){"x"}, ones, (dt_device_type)7, &m),
                    DT_ERR_INVALID_ARGUMENT);
    DT_ASSERT_FAILS(dt_mesh_create("m", 1, NULL, ones, DT_DEVICE_CPU, &m),
                    DT_ERR_INVALID_ARGUMENT);
    DT_ASSERT_FAILS(dt_mesh_create("m", 1, (const char *const[]){"x"}, ones, DT_DEVICE_CPU, NULL),
                    DT_ERR_INVALID_ARGUMENT);
    CU_ASSERT_PTR_NULL(m);
}

static void test_mesh_host_mesh_of_cpu_mesh_is_itself(void)
{
    dt_mesh *m = make("c", 1, (const char *const[]){"x"}, (const int64_t[]){4}, DT_DEVICE_CPU);
    dt_mesh *h = NULL;
    DT_ASSERT_OK(dt_mesh_host_mesh(m, &h));
    CU_ASSERT_PTR_EQUAL(h, m);
    dt_mesh_destroy(m);
    CU_ASSERT_EQUAL(dt_mesh_size(h), 4); /* still alive: h holds a reference */
    dt_mesh_destroy(h);
}

static void test_mesh_host_mesh_of_gpu_mesh_has_cpu_devices_same_shape(void)
{
    static const char *const names[] = {"batch", "model"};
    dt_mesh *g = make("train", 2, names, (const int64_t[]){2, 3}, DT_DEVICE_GPU);
    dt_mesh *h = NULL;
    DT_ASSERT_OK(dt_mesh_host_mesh(g, &h));
    dt_mesh_destroy(g); /* destroy order does not matter */
    CU_ASSERT_EQUAL(dt_mesh_device_type(h), DT_DEVICE_CPU);
    char buf[512];
    dt_mesh_format(h, buf, sizeof buf);
    CU_ASSERT_STRING_EQUAL(buf, "train|batch=2,model=3|0,1,2,3,4,5|0,1,2,3,4,5|"
                                "/job:localhost/replica:0/task:0/device:CPU:0,"
                                "/job:localhost/replica:0/task:0/device:CPU:1,"
                                "/job:localhost/replica:0/task:0/device:CPU:2,"
                                "/job:localhost/replica:0/task:0/device:CPU:3,"
                                "/job:localhost/replica:0/task:0/device:CPU:4,"
                                "/job:localhost/replica:0/task:0/device:CPU:5");
    dt_mesh *want = NULL;
    DT_ASSERT_OK(dt_mesh_parse("|batch=2,model=3|*CPU", &want));
    CU_ASSERT_TRUE(dt_mesh_equal(h, want));
    dt_mesh_destroy(want);
    dt_mesh_destroy(h);

    /* Parsed: permuted ids, global device names, use_xla_spmd; the type is swapped in place in
     * every name, the rest kept verbatim; use_xla_spmd is dropped. */
    DT_ASSERT_OK(dt_mesh_parse("p|x=2|1,0|1|/job:w/task:0/device:GPU:1|"
                               "/job:w/task:0/device:GPU:1,/gpu:0|use_xla_spmd",
                               &g));
    DT_ASSERT_OK(dt_mesh_host_mesh(g, &h));
    dt_mesh_format(h, buf, sizeof buf);
    CU_ASSERT_STRING_EQUAL(buf, "p|x=2|1,0|1|/job:w/task:0/device:CPU:1|"
                                "/job:w/task:0/device:CPU:1,/CPU:0");
    CU_ASSERT_EQUAL(dt_mesh_position(h, 0), 1);
    CU_ASSERT_EQUAL(dt_mesh_local_device_id(h, 0), 1);
    dt_mesh_destroy(h);
    dt_mesh_destroy(g);
}

static void test_mesh_retain_keeps_mesh_alive_until_last_destroy(void)
{
    dt_mesh *m = make("r", 1, (const char *const[]){"x"}, (const int64_t[]){2}, DT_DEVICE_CPU);
    dt_mesh *r1 = dt_mesh_retain(m), *r2 = dt_mesh_retain(r1);
    CU_ASSERT_PTR_EQUAL(r1, m);
    CU_ASSERT_PTR_EQUAL(r2, m);
    dt_mesh_destroy(m);
    dt_mesh_destroy(r1);
    CU_ASSERT_STRING_EQUAL(dt_mesh_name(r2), "r"); /* AddressSanitizer would flag a free */
    dt_mesh_destroy(r2);
    dt_mesh_destroy(NULL);
}

static void test_mesh_check_devices_needs_runtime(void)
{
    dt_mesh *m = make("train", 1, (const char *const[]){"x"}, (const int64_t[]){2}, DT_DEVICE_CPU);
    DT_ASSERT_FAILS(dt_mesh_check_devices(m), DT_ERR_STATE);
    DT_ASSERT_ERROR_MENTIONS("mesh 'train'");
    DT_ASSERT_ERROR_MENTIONS("dt_init");
    dt_mesh_destroy(m);
}

int main(int argc, char **argv)
{
    static const dt_test_case cases[] = {
        DT_TEST(test_mesh_coords_and_groups_match_brute_force_1d),
        DT_TEST(test_mesh_coords_and_groups_match_brute_force_2d),
        DT_TEST(test_mesh_coords_and_groups_match_brute_force_3d),
        DT_TEST(test_mesh_coords_hand_worked_values),
        DT_TEST(test_mesh_create_formats_full_string_with_all_devices_local),
        DT_TEST(test_mesh_create_rejects_invalid_dims),
        DT_TEST(test_mesh_host_mesh_of_cpu_mesh_is_itself),
        DT_TEST(test_mesh_host_mesh_of_gpu_mesh_has_cpu_devices_same_shape),
        DT_TEST(test_mesh_retain_keeps_mesh_alive_until_last_destroy),
        DT_TEST(test_mesh_check_devices_needs_runtime),
        DT_TEST_END,
    };
    return dt_test_main(argc, argv, "mesh_grid", cases, 0);
}
