/* Mesh strings: exact round trips, the short form, the empty mesh, what the parsed mesh holds,
 * and every malformed or invalid string with its column. TensorFlow's own test strings are in
 * tests/layout/test_tf_strings.c. No runtime. */
#include <stdlib.h>
#include <string.h>

#include "harness.h"

static void check_rejects(const char *s, dt_status want, const char *needle1,
                          const char *needle2);

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

static void test_mesh_string_round_trips_names_ids_and_device_forms(void)
{
    /* Named, permuted global ids, no local devices at all. */
    check_round_trip("train|batch=2,model=3|5,4,3,2,1,0||");
    /* Device names kept verbatim: legacy forms, parts in any order, leading zeros, no id; the
     * global ones need not name their host. */
    check_round_trip("m|x=2|0,1|0,1|/job:w/task:0/cpu:0,/job:w/task:0/CPU:1");
    check_round_trip("|x=2|0,1|1,0|/job:w/replica:3/task:7/device:GPU:1,"
                     "/task:07/device:GPU:0/job:w");
    check_round_trip("|x=2|0,1|0|/job:w/task:0/device:CPU|CPU:0,/cpu:1");
    /* Global devices and use_xla_spmd together, sparse large ids. */
    check_round_trip("big|a=1,b=2,c=2|100,7,2147483647,0|7|/job:x/task:0/device:CPU:3|"
                     "/job:x/task:1/device:CPU:0,/job:x/task:0/device:CPU:3,"
                     "/job:x/task:2/device:CPU:9,/job:x/task:0/device:CPU:0|use_xla_spmd");
    /* Eight dimensions, the limit. */
    check_round_trip("|a=1,b=1,c=1,d=1,e=1,f=1,g=1,h=2|0,1|0,1|/job:j/task:0/device:CPU:0,"
                     "/job:j/task:0/device:CPU:1");
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
    /* Without a runtime every device is local, on task 0, named as TensorFlow's expansion
     * names them (tensor_layout_test.cc, AutoGenerateLayout). */
    const char *want = "|x=2,y=2|0,1,2,3|0,1,2,3|"
                       "/job:localhost/task:0/device:CPU:0,"
                       "/job:localhost/task:0/device:CPU:1,"
                       "/job:localhost/task:0/device:CPU:2,"
                       "/job:localhost/task:0/device:CPU:3";
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

    /* Named GPU short form; TensorFlow ignores what comes before the '*'. */
    DT_ASSERT_OK(dt_mesh_parse("GPU|x=2,y=1|gen*GPU", &m));
    dt_mesh_format(m, buf, sizeof buf);
    CU_ASSERT_STRING_EQUAL(buf, "GPU|x=2,y=1|0,1|0,1|"
                                "/job:localhost/task:0/device:GPU:0,"
                                "/job:localhost/task:0/device:GPU:1");
    CU_ASSERT_EQUAL(dt_mesh_device_type(m), DT_DEVICE_GPU);
    dt_mesh_destroy(m);

    /* Any type a device name can spell: TPU, and others kept by name. */
    DT_ASSERT_OK(dt_mesh_parse("|x=2|*XLA_CPU", &m));
    CU_ASSERT_EQUAL(dt_mesh_device_type(m), DT_DEVICE_OTHER);
    CU_ASSERT_STRING_EQUAL(dt_mesh_device_type_name(m), "XLA_CPU");
    dt_mesh_format(m, buf, sizeof buf);
    CU_ASSERT_STRING_EQUAL(buf, "|x=2|0,1|0,1|/job:localhost/task:0/device:XLA_CPU:0,"
                                "/job:localhost/task:0/device:XLA_CPU:1");
    dt_mesh_destroy(m);
}

static void test_mesh_parse_reads_device_types_from_names(void)
{
    static const struct {
        const char *text;
        dt_device_type type;
        const char *name;
    } cases[] = {
        {"|x=1|0|0|/job:a/task:0/device:CPU:0", DT_DEVICE_CPU, "CPU"},
        {"|x=1|0|0|/job:a/task:0/gpu:0", DT_DEVICE_GPU, "GPU"}, /* legacy form */
        {"|x=1|0|0|/job:a/task:0/device:TPU:0", DT_DEVICE_TPU, "TPU"},
        {"|x=1|0|0|/job:a/task:0/device:TPU_SYSTEM:0", DT_DEVICE_OTHER, "TPU_SYSTEM"},
        /* TensorFlow's types are case-sensitive: "cpu" after "device:" is not CPU. */
        {"|x=1|0|0|/job:a/task:0/device:cpu:0", DT_DEVICE_OTHER, "cpu"},
        /* The global names decide when present, and must agree with the local ones. */
        {"|x=2|0,1|||TPU:0,TPU:1", DT_DEVICE_TPU, "TPU"},
        /* No device named at all: a CPU mesh. */
        {"|x=2|0,1||", DT_DEVICE_CPU, "CPU"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        dt_mesh *m = NULL;
        DT_ASSERT_OK(dt_mesh_parse(cases[i].text, &m));
        CU_ASSERT_EQUAL(dt_mesh_device_type(m), cases[i].type);
        CU_ASSERT_STRING_EQUAL(dt_mesh_device_type_name(m), cases[i].name);
        dt_mesh_destroy(m);
    }
}

/* Parses `in` and expects `out` back (TensorFlow prints these strings differently too). */
static void check_parses_to(const char *in, const char *out)
{
    dt_mesh *m = NULL;
    char buf[512];
    DT_ASSERT_OK(dt_mesh_parse(in, &m));
    CU_ASSERT_EQUAL(dt_mesh_format(m, buf, sizeof buf), strlen(out));
    CU_ASSERT_STRING_EQUAL(buf, out);
    dt_mesh_destroy(m);
}

static void test_mesh_parse_gives_the_empty_mesh_for_strings_without_devices(void)
{
    dt_mesh *m = NULL;
    DT_ASSERT_OK(dt_mesh_parse("empty_mesh", &m));
    CU_ASSERT_TRUE(dt_mesh_is_empty(m));
    CU_ASSERT_EQUAL(dt_mesh_rank(m), 0);
    CU_ASSERT_EQUAL(dt_mesh_size(m), 0);
    CU_ASSERT_EQUAL(dt_mesh_num_local_devices(m), 0);
    CU_ASSERT_STRING_EQUAL(dt_mesh_device_type_name(m), "");
    dt_mesh *h = NULL;
    DT_ASSERT_OK(dt_mesh_host_mesh(m, &h)); /* itself */
    CU_ASSERT_TRUE(dt_mesh_is_empty(h));
    dt_mesh_destroy(h);
    dt_mesh_destroy(m);
    check_round_trip("empty_mesh");
    /* TensorFlow's Mesh::GetMesh returns its empty mesh for a device list without devices,
     * and the test expansion of a mesh of size 0 has none; the name goes with them. */
    check_parses_to("name|x=2|||", "empty_mesh");
    check_parses_to("||||", "empty_mesh");
    check_parses_to("||*CPU", "empty_mesh");
    check_parses_to("|x=2,y=0|*CPU", "empty_mesh");
    /* The dims are still checked, as TensorFlow checks them first. */
    check_rejects("|x=2,x=0|*CPU", DT_ERR_PARSE, "column 6:", "dimension 'x' repeated");
    check_rejects("|any=2|||", DT_ERR_PARSE, "column 2:", "reserved");
}

static void test_mesh_parse_reads_empty_optional_fields_as_absent(void)
{
    /* TensorFlow skips an empty sixth or seventh field and prints without it. */
    const char *d = "|x=1|0|0|/job:a/task:0/device:CPU:0";
    char in[128], out[128];
    snprintf(in, sizeof in, "%s|", d);
    check_parses_to(in, d);
    snprintf(in, sizeof in, "%s||" "use_xla_spmd", d);
    snprintf(out, sizeof out, "%s|use_xla_spmd", d);
    check_parses_to(in, out);
    snprintf(in, sizeof in, "%s|CPU:0|", d);
    snprintf(out, sizeof out, "%s|CPU:0", d);
    check_parses_to(in, out);
}

static void test_mesh_format_truncates_like_snprintf(void)
{
    const char *s = "ab|x=2|0,1|0,1|/job:a/task:0/device:CPU:0,/job:a/task:0/device:CPU:1";
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
    check_rejects("|x=1|0|||CPU:0|use_xla_spmd|z", DT_ERR_PARSE, "column 29:", "at most 7");
    check_rejects("|x=2", DT_ERR_PARSE, "Expected either 5, 6, 7 or 3 mesh parts", NULL);
    /* Seventh field other than use_xla_spmd; "xla" starts at column 16. */
    check_rejects("|x=1|0|||CPU:0|xla", DT_ERR_PARSE, "column 16:", "use_xla_spmd");
}

static void test_mesh_parse_rejects_bad_dims(void)
{
    /*                 123456789 */
    check_rejects("|x=2,x=2|0,1,2,3||", DT_ERR_PARSE, "column 6:", "dimension 'x' repeated");
    check_rejects("|x=2,=2|*CPU", DT_ERR_PARSE, "column 6:", "empty name");
    check_rejects("|x=2,9y=2|*CPU", DT_ERR_PARSE, "column 6:", "'9y' is not an identifier");
    check_rejects("|x=2,y-z=2|*CPU", DT_ERR_PARSE, "column 6:", "'y-z'");
    check_rejects("|unsharded=2|*CPU", DT_ERR_PARSE, "column 2:", "reserved");
    check_rejects("|x=2,y=0|0|0|/job:a/task:0/device:CPU:0", DT_ERR_PARSE, "column 8:",
                  "size 0");
    check_rejects("|x=-3|*CPU", DT_ERR_PARSE, "column 4:", "size -3");
    check_rejects("|x=two|*CPU", DT_ERR_PARSE, "column 4:", "'two'");
    check_rejects("|x=02|*CPU", DT_ERR_PARSE, "column 4:", "'02'");
    check_rejects("|x|*CPU", DT_ERR_PARSE, "column 2:", "name=size");
    check_rejects("||0|0|/job:a/task:0/device:CPU:0", DT_ERR_PARSE, "column 2:",
                  "at least one dimension");
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
#define J "/job:a/task:0/device:"
    check_rejects("|x=2|0,1|0,1|" J "CPU:0," J "CPU:0", DT_ERR_PARSE, "column 41:",
                  "device '" J "CPU:0' repeated");
    check_rejects("|x=2|0,1|0,1|" J "CPU:0," J "GPU:1", DT_ERR_PARSE, "column 41:",
                  "is GPU but the mesh's other devices are CPU");
    check_rejects("|x=2|0,1|0,1|" J "CPU:0,host7", DT_ERR_PARSE, "column 41:",
                  "'host7' is not a TensorFlow device name");
    check_rejects("|x=2|0,1|0,1|" J "CPU:0,/job:a/task:x/device:CPU:1", DT_ERR_PARSE,
                  "column 41:", "not a TensorFlow device name");
    check_rejects("|x=2|0,1|0,1|" J "CPU:0,/job:a/task:0/device:CPU:0/", DT_ERR_PARSE,
                  "column 41:", "not a TensorFlow device name");
    check_rejects("|x=2|0,1|0,1|" J "CPU:0,/job:9a/task:0/device:CPU:1", DT_ERR_PARSE,
                  "column 41:", "not a TensorFlow device name");
    check_rejects("|x=2|0,1|0,1|" J "CPU:0,", DT_ERR_PARSE, "column 41:", "empty device name");
    /* Local devices must name their job, task and type (TensorFlow's Mesh::GetMesh). */
    check_rejects("|x=1|0|0|CPU:0", DT_ERR_PARSE, "column 10:",
                  "Failed to either identify host or device type");
    check_rejects("|x=1|0|0|/job:a/task:*/device:CPU:0", DT_ERR_PARSE, "does not name its task",
                  NULL);
    check_rejects("|x=1|0|0|/job:a/task:0/device:*:0", DT_ERR_PARSE,
                  "does not name its device type", NULL);
    check_rejects("|x=2,y=2|CPU", DT_ERR_PARSE, "column 10:",
                  "Expected a * in mesh_gen_instructions");
    check_rejects("|x=2,y=2|*C*PU", DT_ERR_PARSE, "column 10:", "'*'");
    check_rejects("|x=2,y=2|*9PU", DT_ERR_PARSE, "column 11:", "device type after '*'");
    check_rejects("|x=2,y=2|*", DT_ERR_PARSE, "column 11:", "device type after '*'");
    /* Global device names: no repeats, type agreeing with the local ones. */
    check_rejects("|x=2|0,1|0|" J "CPU:0|CPU:1,CPU:1", DT_ERR_PARSE, "column 45:",
                  "device 'CPU:1' repeated");
    check_rejects("|x=2|0,1|0|" J "CPU:0|GPU:0,GPU:1", DT_ERR_PARSE, "column 12:",
                  "is CPU but the mesh's other devices are GPU");
#undef J
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
        DT_TEST(test_mesh_string_round_trips_names_ids_and_device_forms),
        DT_TEST(test_mesh_parse_reads_every_field),
        DT_TEST(test_mesh_parse_short_form_expands_to_all_devices_on_task0),
        DT_TEST(test_mesh_parse_reads_device_types_from_names),
        DT_TEST(test_mesh_parse_gives_the_empty_mesh_for_strings_without_devices),
        DT_TEST(test_mesh_parse_reads_empty_optional_fields_as_absent),
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
