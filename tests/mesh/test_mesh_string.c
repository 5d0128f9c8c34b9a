/* TensorFlow mesh strings: exact round trips (TensorFlow's own test strings among them), the
 * short form, what the parsed mesh holds, and every malformed or invalid string. No runtime. */
#include <stdlib.h>
#include <string.h>

#include "harness.h"

/* Parses s, formats it, and checks the text comes back byte for byte. */
static void check_round_trip(const char *s)
{
    dt_mesh *m = NULL;
    DT_ASSERT_OK(dt_mesh_parse(s, &m));
    size_t need = dt_mesh_format(m, NULL, 0);
    CU_ASSERT_EQUAL(need, strlen(s));
    char *buf = malloc(need + 1);
    CU_ASSERT_FATAL(buf != NULL);
    CU_ASSERT_EQUAL(dt_mesh_format(m, buf, need + 1), need);
    if (strcmp(buf, s) != 0)
        fprintf(stderr, "round trip:\n  in:  %s\n  out: %s\n", s, buf);
    CU_ASSERT_STRING_EQUAL(buf, s);
    free(buf);
    dt_mesh_destroy(m);
}

/* Mesh strings from TensorFlow's tests. Where TensorFlow uses TPU devices, which this library
 * does not have, the same string with GPU in their place. */
static const char *const tf_strings[] = {
    /* tensorflow/dtensor/cc/tensor_layout_test.cc, LayoutToFromStringNotSharded,
     * FromStringMeshWithoutXLASPMD (name "mesh:" there, as the layout prefix is not split off) */
    "|x=1|0|0|/job:localhost/task:0/device:CPU:0",
    "mesh:|x=1|0|0|/job:localhost/task:0/device:CPU:0",
    /* tensor_layout_test.cc, FromStringMeshWithXLASPMD */
    "mesh:|x=1|0|0|/job:localhost/task:0/device:CPU:0|use_xla_spmd",
    /* tensor_layout_test.cc, FromStringMeshWithGlobalDevices */
    "mesh:|x=2|0,1|0|/job:localhost/task:0/device:CPU:0|/job:localhost/"
    "task:0/device:CPU:0,/job:localhost/task:0/device:CPU:1",
    /* tensor_layout_test.cc, MultiHostPartiallyShardedReducedMesh (task 1's half of a mesh) */
    "|x=4,y=2|0,1,2,3,4,5,6,7|4,5,6,7|"
    "/job:localhost/task:1/device:CPU:0,/job:localhost/task:1/device:CPU:1,"
    "/job:localhost/task:1/device:CPU:2,/job:localhost/task:1/device:CPU:3",
    /* tensor_layout_test.cc, FlippedShardedMultiHostMeshes (local ids out of order) */
    "|x=4,y=2|0,1,2,3,4,5,6,7|6,7,4,5|"
    "/job:localhost/task:1/device:CPU:2,/job:localhost/task:1/device:CPU:3,"
    "/job:localhost/task:1/device:CPU:0,/job:localhost/task:1/device:CPU:1",
    /* tensor_layout_test.cc, MultiHostCommXYSharded */
    "|x=2,y=2|0,1,2,3|0,1,2,3|/job:localhost/task:0/device:CPU:0,/job:localhost/task:0/"
    "device:CPU:1,/job:localhost/task:1/device:CPU:0,/job:localhost/task:1/device:CPU:1",
    /* tensor_layout_test.cc, ConvertMeshDeviceType (expected mesh) */
    "mesh:|x=2,batch=1|0,1|0,1|/job:localhost/replica:0/task:0/device:CPU:0,"
    "/job:localhost/replica:0/task:0/device:CPU:1",
    /* tensorflow/dtensor/python/tests/layout_test.py, _MESH_2D_STRING (TPU -> GPU) */
    "|batch=2,x=2|0,1,2,3|0,1,2,3|"
    "/job:localhost/replica:0/task:0/device:GPU:0,"
    "/job:localhost/replica:0/task:0/device:GPU:1,"
    "/job:localhost/replica:0/task:0/device:GPU:2,"
    "/job:localhost/replica:0/task:0/device:GPU:3",
    /* layout_test.py, test_mesh_from_string_with_use_xla_spmd (TPU -> GPU) */
    "|batch=2|0,1|0,1|/job:localhost/replica:0/task:0"
    "/device:GPU:0,/job:localhost/replica:0/task:0/device:GPU:1|use_xla_spmd",
    /* layout_test.py, test_mesh_from_string_with_use_xla_spmd_and_global_devices (TPU -> GPU) */
    "|batch=2|0,1|0|/job:localhost/replica:0/task:0"
    "/device:GPU:0|/job:localhost/replica:0/task:0/device:GPU:0,"
    "/job:localhost/replica:0/task:0/device:GPU:1|use_xla_spmd",
    /* tensor_layout_test.cc, AutoGenerateLayout: the expanded form of |x=2,y=2|*CPU */
    "|x=2,y=2|0,1,2,3|0,1,2,3|/job:localhost/task:0/device:CPU:0,/"
    "job:localhost/task:0/device:CPU:1,/job:localhost/task:0/device:CPU:2,/"
    "job:localhost/task:0/device:CPU:3",
    NULL,
};

static void test_mesh_string_round_trips_tensorflow_test_strings(void)
{
    for (int i = 0; tf_strings[i]; i++)
        check_round_trip(tf_strings[i]);
}

static void test_mesh_string_round_trips_names_ids_and_device_forms(void)
{
    /* Named, permuted global ids, no local devices at all. */
    check_round_trip("train|batch=2,model=3|5,4,3,2,1,0||");
    /* Device names kept verbatim: legacy and local forms, lower-case type. */
    check_round_trip("m|x=2|0,1|0,1|/cpu:0,CPU:1");
    check_round_trip("|x=2|0,1|1,0|/job:w/replica:3/task:7/device:GPU:1,/device:GPU:0");
    /* Global devices and use_xla_spmd together, sparse large ids. */
    check_round_trip("big|a=1,b=2,c=2|100,7,2147483647,0|7|/job:x/task:0/device:CPU:3|"
                     "/job:x/task:1/device:CPU:0,/job:x/task:0/device:CPU:3,"
                     "/job:x/task:2/device:CPU:9,/job:x/task:0/device:CPU:0|use_xla_spmd");
    /* Eight dimensions, the limit. */
    check_round_trip("|a=1,b=1,c=1,d=1,e=1,f=1,g=1,h=2|0,1|0,1|CPU:0,CPU:1");
}

static void test_mesh_parse_reads_every_field(void)
{
    const char *s = "pp|stage=2,dp=3|10,11,12,13,14,15|12,10|"
                    "/job:w/task:1/device:GPU:0,/job:w/task:0/device:GPU:0|use_xla_spmd";
    dt_mesh *m = NULL;
    DT_ASSERT_OK(dt_mesh_parse(s, &m));
    CU_ASSERT_STRING_EQUAL(dt_mesh_name(m), "pp");
    CU_ASSERT_EQUAL(dt_mesh_device_type(m), DT_DEVICE_GPU);
    CU_ASSERT_EQUAL(dt_mesh_rank(m), 2);
    CU_ASSERT_EQUAL(dt_mesh_size(m), 6);
    CU_ASSERT_STRING_EQUAL(dt_mesh_dim_name(m, 0), "stage");
    CU_ASSERT_STRING_EQUAL(dt_mesh_dim_name(m, 1), "dp");
    CU_ASSERT_PTR_NULL(dt_mesh_dim_name(m, 2));
    CU_ASSERT_EQUAL(dt_mesh_dim_size(m, 0), 2);
    CU_ASSERT_EQUAL(dt_mesh_dim_size(m, 1), 3);
    CU_ASSERT_EQUAL(dt_mesh_dim_size(m, -1), 0);
    CU_ASSERT_EQUAL(dt_mesh_dim_index(m, "dp"), 1);
    CU_ASSERT_EQUAL(dt_mesh_dim_index(m, "tp"), -1);
    for (int p = 0; p < 6; p++) {
        CU_ASSERT_EQUAL(dt_mesh_device_id(m, p), 10 + p);
        CU_ASSERT_EQUAL(dt_mesh_position(m, 10 + p), p);
    }
    CU_ASSERT_EQUAL(dt_mesh_device_id(m, 6), -1);
    CU_ASSERT_EQUAL(dt_mesh_position(m, 0), -1);
    CU_ASSERT_EQUAL(dt_mesh_num_local_devices(m), 2);
    CU_ASSERT_EQUAL(dt_mesh_local_device_id(m, 0), 12);
    CU_ASSERT_EQUAL(dt_mesh_local_device_id(m, 1), 10);
    CU_ASSERT_EQUAL(dt_mesh_local_device_id(m, 2), -1);
    dt_mesh_destroy(m);
}

static void test_mesh_parse_short_form_expands_to_all_devices_on_task0(void)
{
    /* Without a runtime every device is local, on task 0, as in TensorFlow's tests. */
    const char *want = "|x=2,y=2|0,1,2,3|0,1,2,3|"
                       "/job:localhost/replica:0/task:0/device:CPU:0,"
                       "/job:localhost/replica:0/task:0/device:CPU:1,"
                       "/job:localhost/replica:0/task:0/device:CPU:2,"
                       "/job:localhost/replica:0/task:0/device:CPU:3";
    dt_mesh *m = NULL;
    char buf[1024];
    DT_ASSERT_OK(dt_mesh_parse("|x=2,y=2|*CPU", &m));
    CU_ASSERT_EQUAL(dt_mesh_format(m, buf, sizeof buf), strlen(want));
    CU_ASSERT_STRING_EQUAL(buf, want);
    CU_ASSERT_EQUAL(dt_mesh_device_type(m), DT_DEVICE_CPU);
    CU_ASSERT_EQUAL(dt_mesh_num_local_devices(m), 4);
    dt_mesh_destroy(m);
    /* The expanded text is itself a full string that round-trips. */
    check_round_trip(want);

    /* Named GPU short form (tensor_layout_test.cc HostShardMap uses "TPU|x=2,y=2|*TPU"). */
    DT_ASSERT_OK(dt_mesh_parse("GPU|x=2,y=1|*GPU", &m));
    dt_mesh_format(m, buf, sizeof buf);
    CU_ASSERT_STRING_EQUAL(buf, "GPU|x=2,y=1|0,1|0,1|"
                                "/job:localhost/replica:0/task:0/device:GPU:0,"
                                "/job:localhost/replica:0/task:0/device:GPU:1");
    CU_ASSERT_EQUAL(dt_mesh_device_type(m), DT_DEVICE_GPU);
    dt_mesh_destroy(m);
}

static void test_mesh_format_truncates_like_snprintf(void)
{
    const char *s = "ab|x=2|0,1|0,1|CPU:0,CPU:1";
    dt_mesh *m = NULL;
    DT_ASSERT_OK(dt_mesh_parse(s, &m));
    char buf[8];
    memset(buf, 'Z', sizeof buf);
    CU_ASSERT_EQUAL(dt_mesh_format(m, buf, sizeof buf), strlen(s));
    CU_ASSERT_STRING_EQUAL(buf, "ab|x=2|"); /* 7 bytes and the NUL */
    buf[0] = 'Z';
    CU_ASSERT_EQUAL(dt_mesh_format(m, buf, 1), strlen(s));
    CU_ASSERT_EQUAL(buf[0], '\0');
    dt_mesh_destroy(m);
}

/* Expects parse to fail with `want` and a message mentioning each of the two needles. */
static void check_rejects(const char *s, dt_status want, const char *needle1, const char *needle2)
{
    dt_mesh *m = (dt_mesh *)&m; /* must stay untouched */
    dt_mesh *const before = m;
    dt_clear_error();
    DT_ASSERT_FAILS(dt_mesh_parse(s, &m), want);
    CU_ASSERT_PTR_EQUAL(m, before);
    if (needle1)
        DT_ASSERT_ERROR_MENTIONS(needle1);
    if (needle2)
        DT_ASSERT_ERROR_MENTIONS(needle2);
}

static void test_mesh_parse_rejects_bad_field_counts(void)
{
    check_rejects("|x=2|0,1|0,1", DT_ERR_PARSE, "column 1:", "found 4");
    check_rejects("|x=2", DT_ERR_PARSE, "column 1:", "found 2");
    check_rejects("|x=1|0|0|CPU:0|CPU:0|use_xla_spmd|z", DT_ERR_PARSE, "column 35:",
                  "at most 7");
    check_rejects("empty_mesh", DT_ERR_PARSE, "empty_mesh", NULL);
    /* Seventh field other than use_xla_spmd; "xla" starts at column 22. */
    check_rejects("|x=1|0|0|CPU:0|CPU:0|xla", DT_ERR_PARSE, "column 22:", "use_xla_spmd");
    /* Empty global-device field: not canonical (would format without it). */
    check_rejects("|x=1|0|0|CPU:0|", DT_ERR_PARSE, "column 16:", "empty global device list");
    check_rejects("|x=1|0|0|CPU:0||use_xla_spmd", DT_ERR_PARSE, "column 16:",
                  "empty global device list");
}

static void test_mesh_parse_rejects_bad_dims(void)
{
    /*                 123456789 */
    check_rejects("|x=2,x=2|0,1,2,3||", DT_ERR_PARSE, "column 6:", "dimension 'x' repeated");
    check_rejects("|x=2,=2|*CPU", DT_ERR_PARSE, "column 6:", "empty name");
    check_rejects("|x=2,9y=2|*CPU", DT_ERR_PARSE, "column 6:", "'9y' is not an identifier");
    check_rejects("|x=2,y-z=2|*CPU", DT_ERR_PARSE, "column 6:", "'y-z'");
    check_rejects("|unsharded=2|*CPU", DT_ERR_PARSE, "column 2:", "reserved");
    check_rejects("|x=2,y=0|*CPU", DT_ERR_PARSE, "column 8:", "size 0");
    check_rejects("|x=-3|*CPU", DT_ERR_PARSE, "column 4:", "size -3");
    check_rejects("|x=two|*CPU", DT_ERR_PARSE, "column 4:", "'two'");
    check_rejects("|x=02|*CPU", DT_ERR_PARSE, "column 4:", "'02'");
    check_rejects("|x|*CPU", DT_ERR_PARSE, "column 2:", "name=size");
    check_rejects("||*CPU", DT_ERR_PARSE, "column 2:", "at least one dimension");
    check_rejects("|a=1,b=1,c=1,d=1,e=1,f=1,g=1,h=1,i=1|*CPU", DT_ERR_PARSE, "column 34:",
                  "more than 8");
    check_rejects("|x=65536,y=65536|*CPU", DT_ERR_PARSE, "column 12:", "more than");
    check_rejects("a b|x=1|*CPU", DT_ERR_PARSE, "column 1:", "mesh name 'a b'");
}

static void test_mesh_parse_rejects_bad_device_ids(void)
{
    /*             1234567890123456789 */
    check_rejects("|x=2,y=2|0,1,2||", DT_ERR_PARSE, "column 10:",
                  "3 device ids for a mesh of 4 devices (x=2,y=2)");
    check_rejects("|x=4|0,1,2,3,4||", DT_ERR_PARSE, "column 6:", "5 device ids");
    check_rejects("|x=4|0,1,1,3||", DT_ERR_PARSE, "column 10:", "device id 1 repeated");
    check_rejects("|x=4|3,2,0,1,0||", DT_ERR_PARSE, "column 6:", "5 device ids");
    check_rejects("|x=2|0,-1||", DT_ERR_PARSE, "column 8:", "'-1'");
    check_rejects("|x=2|0,,||", DT_ERR_PARSE, "column 8:", "found ''");
    check_rejects("|x=2|0,2147483648||", DT_ERR_PARSE, "column 8:", "out of range");
    check_rejects("|x=2|0,1|2|CPU:0", DT_ERR_PARSE, "column 10:",
                  "local device id 2 is not one of the mesh's device ids");
    check_rejects("|x=2|0,1|1,1|CPU:0,CPU:1", DT_ERR_PARSE, "column 12:",
                  "local device id 1 repeated");
    check_rejects("|x=2|0,1|0,1|CPU:0", DT_ERR_PARSE, "column 14:",
                  "1 local device names for 2 local device ids");
}

static void test_mesh_parse_rejects_bad_device_names(void)
{
    /*             123456789012345678 */
    check_rejects("|x=2|0,1|0,1|CPU:0,CPU:0", DT_ERR_PARSE, "column 20:",
                  "device 'CPU:0' repeated");
    check_rejects("|x=2|0,1|0,1|CPU:0,GPU:1", DT_ERR_PARSE, "column 20:",
                  "is GPU but the mesh's other devices are CPU");
    check_rejects("|x=2|0,1|0,1|CPU:0,host7", DT_ERR_PARSE, "column 20:",
                  "'host7' is not a TensorFlow device name");
    check_rejects("|x=2|0,1|0,1|CPU:0,/job:a/task:x/device:CPU:1", DT_ERR_PARSE, "column 20:",
                  "not a TensorFlow device name");
    check_rejects("|x=2|0,1|0,1|CPU:0,", DT_ERR_PARSE, "column 20:", "empty device name");
    check_rejects("|x=2|0,1|0,1|/job:a/task:0/device:TPU:0,/job:a/task:0/device:TPU:1",
                  DT_ERR_UNSUPPORTED, "column 14:", "'TPU'");
    check_rejects("|x=2,y=2|*TPU", DT_ERR_UNSUPPORTED, "column 11:", "'TPU'");
    check_rejects("|x=2,y=2|CPU", DT_ERR_PARSE, "column 10:", "'*CPU' or '*GPU'");
    /* Global device names: count, repeat, and type agreeing with the local ones. */
    check_rejects("|x=2|0,1|0|CPU:0|CPU:0", DT_ERR_PARSE, "column 18:",
                  "1 global device names for a mesh of 2 devices");
    check_rejects("|x=2|0,1|0|CPU:0|CPU:1,CPU:1", DT_ERR_PARSE, "column 24:",
                  "device 'CPU:1' repeated");
    check_rejects("|x=2|0,1|0|CPU:0|GPU:0,GPU:1", DT_ERR_PARSE, "column 12:",
                  "is CPU but the mesh's other devices are GPU");
}

static void test_mesh_parse_rejects_null_arguments(void)
{
    dt_mesh *m = NULL;
    DT_ASSERT_FAILS(dt_mesh_parse(NULL, &m), DT_ERR_INVALID_ARGUMENT);
    DT_ASSERT_FAILS(dt_mesh_parse("|x=1|*CPU", NULL), DT_ERR_INVALID_ARGUMENT);
}

int main(int argc, char **argv)
{
    static const dt_test_case cases[] = {
        DT_TEST(test_mesh_string_round_trips_tensorflow_test_strings),
        DT_TEST(test_mesh_string_round_trips_names_ids_and_device_forms),
        DT_TEST(test_mesh_parse_reads_every_field),
        DT_TEST(test_mesh_parse_short_form_expands_to_all_devices_on_task0),
        DT_TEST(test_mesh_format_truncates_like_snprintf),
        DT_TEST(test_mesh_parse_rejects_bad_field_counts),
        DT_TEST(test_mesh_parse_rejects_bad_dims),
        DT_TEST(test_mesh_parse_rejects_bad_device_ids),
        DT_TEST(test_mesh_parse_rejects_bad_device_names),
        DT_TEST(test_mesh_parse_rejects_null_arguments),
        DT_TEST_END,
    };
    return dt_test_main(argc, argv, "mesh_string", cases, 0);
}
