/* Meshes from YAML: several meshes per file selected by name, both dims forms, device_ids, the
 * names listing, and every error with the line:column where the bad token was written. */
#include <stdlib.h>
#include <string.h>

#include "harness.h"

static char path_buf[4096];

static const char *data(const char *name)
{
    snprintf(path_buf, sizeof path_buf, "%s/mesh/%s", dt_test_srcdir(), name);
    return path_buf;
}

static void test_mesh_yaml_selects_each_mesh_of_a_file_by_name(void)
{
    dt_mesh *m = NULL;
    DT_ASSERT_OK(dt_mesh_from_yaml_file(data("meshes.yaml"), "train", &m));
    CU_ASSERT_STRING_EQUAL(dt_mesh_name(m), "train");
    CU_ASSERT_EQUAL(dt_mesh_device_type(m), DT_DEVICE_GPU);
    CU_ASSERT_EQUAL(dt_mesh_rank(m), 2);
    CU_ASSERT_STRING_EQUAL(dt_mesh_dim_name(m, 0), "batch");
    CU_ASSERT_STRING_EQUAL(dt_mesh_dim_name(m, 1), "model");
    CU_ASSERT_EQUAL(dt_mesh_dim_size(m, 0), 2);
    CU_ASSERT_EQUAL(dt_mesh_dim_size(m, 1), 4);
    for (int p = 0; p < 8; p++)
        CU_ASSERT_EQUAL(dt_mesh_device_id(m, p), p);
    dt_mesh_destroy(m);

    /* Sequence form of dims, lower-case device type, explicit reversed device ids. */
    DT_ASSERT_OK(dt_mesh_from_yaml_file(data("meshes.yaml"), "host", &m));
    CU_ASSERT_STRING_EQUAL(dt_mesh_name(m), "host");
    CU_ASSERT_EQUAL(dt_mesh_device_type(m), DT_DEVICE_CPU);
    CU_ASSERT_STRING_EQUAL(dt_mesh_dim_name(m, 0), "batch");
    CU_ASSERT_STRING_EQUAL(dt_mesh_dim_name(m, 1), "model");
    for (int p = 0; p < 8; p++) {
        CU_ASSERT_EQUAL(dt_mesh_device_id(m, p), 7 - p);
        CU_ASSERT_EQUAL(dt_mesh_position(m, 7 - p), p);
    }
    /* No runtime: every device is local, listed by device id. */
    CU_ASSERT_EQUAL(dt_mesh_num_local_devices(m), 8);
    for (int i = 0; i < 8; i++)
        CU_ASSERT_EQUAL(dt_mesh_local_device_id(m, i), i);
    char buf[1024];
    dt_mesh_format(m, buf, sizeof buf);
    CU_ASSERT_PTR_NOT_NULL(strstr(buf, "host|batch=2,model=4|7,6,5,4,3,2,1,0|0,1,2,3,4,5,6,7|"
                                       "/job:localhost/replica:0/task:0/device:CPU:0,"));
    dt_mesh_destroy(m);

    /* device_type defaults to CPU. */
    DT_ASSERT_OK(dt_mesh_from_yaml_file(data("meshes.yaml"), "line", &m));
    CU_ASSERT_EQUAL(dt_mesh_device_type(m), DT_DEVICE_CPU);
    CU_ASSERT_EQUAL(dt_mesh_size(m), 8);
    dt_mesh_destroy(m);

    /* NULL selects the first. */
    DT_ASSERT_OK(dt_mesh_from_yaml_file(data("meshes.yaml"), NULL, &m));
    CU_ASSERT_STRING_EQUAL(dt_mesh_name(m), "train");
    dt_mesh_destroy(m);
}

static void test_mesh_yaml_names_lists_every_mesh(void)
{
    char names[2][DT_NAME_MAX];
    int count = -1;
    DT_ASSERT_OK(dt_mesh_yaml_names(data("meshes.yaml"), 2, names, &count));
    CU_ASSERT_EQUAL(count, 3);
    CU_ASSERT_STRING_EQUAL(names[0], "train");
    CU_ASSERT_STRING_EQUAL(names[1], "host");
    count = -1;
    DT_ASSERT_OK(dt_mesh_yaml_names(data("meshes.yaml"), 0, NULL, &count));
    CU_ASSERT_EQUAL(count, 3);
    DT_ASSERT_FAILS(dt_mesh_yaml_names(data("bad_repeated_dim.yaml"), 2, names, &count),
                    DT_ERR_PARSE);
    DT_ASSERT_FAILS(dt_mesh_yaml_names(data("no_such_file.yaml"), 2, names, &count),
                    DT_ERR_IO);
}

static void test_mesh_yaml_missing_select_is_not_found_and_lists_names(void)
{
    dt_mesh *m = NULL;
    DT_ASSERT_FAILS(dt_mesh_from_yaml_file(data("meshes.yaml"), "eval", &m), DT_ERR_NOT_FOUND);
    DT_ASSERT_ERROR_MENTIONS("'eval'");
    DT_ASSERT_ERROR_MENTIONS("'train', 'host', 'line'");
    CU_ASSERT_PTR_NULL(m);
    DT_ASSERT_FAILS(dt_mesh_from_yaml_string("", NULL, &m), DT_ERR_NOT_FOUND);
    DT_ASSERT_ERROR_MENTIONS("defines no mesh");
}

static void test_mesh_yaml_missing_file_is_io_error(void)
{
    dt_mesh *m = NULL;
    DT_ASSERT_FAILS(dt_mesh_from_yaml_file(data("no_such_file.yaml"), NULL, &m), DT_ERR_IO);
    DT_ASSERT_ERROR_MENTIONS("no_such_file.yaml");
    CU_ASSERT_PTR_NULL(m);
}

static void test_mesh_yaml_file_error_names_file_line_column(void)
{
    dt_mesh *m = NULL;
    DT_ASSERT_FAILS(dt_mesh_from_yaml_file(data("bad_repeated_dim.yaml"), NULL, &m),
                    DT_ERR_PARSE);
    DT_ASSERT_ERROR_MENTIONS("bad_repeated_dim.yaml:7:12: dimension 'model' repeated");
    CU_ASSERT_PTR_NULL(m);
}

static void test_mesh_yaml_string_forms(void)
{
    dt_mesh *m = NULL;
    /* Several documents in one stream, and `mesh` next to `meshes`. */
    const char *docs = "---\n"
                       "mesh: {name: a, dims: {x: 1}}\n"
                       "---\n"
                       "meshes: [{name: b, dims: [{x: 2}, {y: 3}]}]\n"
                       "mesh: {name: c, device_type: GPU, dims: {z: 4},\n"
                       "       device_ids: [3, 1, 2, 0]}\n";
    DT_ASSERT_OK(dt_mesh_from_yaml_string(docs, "b", &m));
    CU_ASSERT_EQUAL(dt_mesh_size(m), 6);
    CU_ASSERT_STRING_EQUAL(dt_mesh_dim_name(m, 1), "y");
    dt_mesh_destroy(m);
    DT_ASSERT_OK(dt_mesh_from_yaml_string(docs, "c", &m));
    CU_ASSERT_EQUAL(dt_mesh_device_type(m), DT_DEVICE_GPU);
    CU_ASSERT_EQUAL(dt_mesh_device_id(m, 0), 3);
    CU_ASSERT_EQUAL(dt_mesh_position(m, 0), 3);
    dt_mesh_destroy(m);
    /* An unnamed mesh is selected by NULL. */
    DT_ASSERT_OK(dt_mesh_from_yaml_string("mesh:\n  dims: {x: 2}\n", NULL, &m));
    CU_ASSERT_STRING_EQUAL(dt_mesh_name(m), "");
    dt_mesh_destroy(m);
    /* A TPU mesh describes TPU devices, named as TensorFlow names them. */
    char buf[256];
    DT_ASSERT_OK(dt_mesh_from_yaml_string("mesh: {name: t, device_type: tpu, dims: {x: 2}}\n",
                                          NULL, &m));
    CU_ASSERT_EQUAL(dt_mesh_device_type(m), DT_DEVICE_TPU);
    CU_ASSERT_STRING_EQUAL(dt_mesh_device_type_name(m), "TPU");
    dt_mesh_format(m, buf, sizeof buf);
    CU_ASSERT_STRING_EQUAL(buf, "t|x=2|0,1|0,1|/job:localhost/replica:0/task:0/device:TPU:0,"
                                "/job:localhost/replica:0/task:0/device:TPU:1");
    dt_mesh_destroy(m);
}

/* Expects the YAML string to fail with DT_ERR_PARSE (or `want`) at "<string>:line:col: ". */
static void check_yaml_rejects(const char *text, dt_status want, int line, int col,
                               const char *needle)
{
    dt_mesh *m = NULL;
    char loc[64];
    dt_clear_error();
    DT_ASSERT_FAILS(dt_mesh_from_yaml_string(text, NULL, &m), want);
    CU_ASSERT_PTR_NULL(m);
    snprintf(loc, sizeof loc, "<string>:%d:%d: ", line, col);
    DT_ASSERT_ERROR_MENTIONS(loc);
    if (needle)
        DT_ASSERT_ERROR_MENTIONS(needle);
}

static void test_mesh_yaml_rejects_bad_structure_at_line_column(void)
{
    check_yaml_rejects("mesh_list:\n  - dims: {x: 2}\n", DT_ERR_PARSE, 1, 1,
                       "unknown key 'mesh_list'");
    check_yaml_rejects("- mesh: {dims: {x: 2}}\n", DT_ERR_PARSE, 1, 1, "expected a mapping");
    check_yaml_rejects("mesh:\n  name: a\n  dimz: {x: 2}\n", DT_ERR_PARSE, 3, 3,
                       "unknown key 'dimz'");
    check_yaml_rejects("mesh:\n  name: a\n", DT_ERR_PARSE, 2, 3, "no 'dims'");
    check_yaml_rejects("mesh:\n  dims: {x: 1}\n  dims: {y: 1}\n", DT_ERR_PARSE, 3, 3,
                       "key 'dims' repeated");
    check_yaml_rejects("mesh: [1, 2]\n", DT_ERR_PARSE, 1, 7, "must be a mapping");
    check_yaml_rejects("meshes: {a: 1}\n", DT_ERR_PARSE, 1, 9, "sequence");
    check_yaml_rejects("mesh:\n  dims: 4\n", DT_ERR_PARSE, 2, 9, "dims must be");
    check_yaml_rejects("mesh:\n  dims:\n    - x: 1\n    - {y: 1, z: 2}\n", DT_ERR_PARSE, 4, 7,
                       "one {name: size}");
    check_yaml_rejects("mesh:\n  dims: {x: 2}\n  device_ids: 0\n", DT_ERR_PARSE, 3, 15,
                       "sequence of integers");
    check_yaml_rejects("mesh:\n  name: [a]\n  dims: {x: 2}\n", DT_ERR_PARSE, 2, 9,
                       "must be a string");
    check_yaml_rejects("meshes:\n  - name: a\n    dims: {x: 1}\n  - name: a\n    dims: {x: 1}\n",
                       DT_ERR_PARSE, 4, 11, "mesh name 'a' repeated (first at line 2)");
}

static void test_mesh_yaml_rejects_bad_values_at_line_column(void)
{
    check_yaml_rejects("mesh:\n  dims: {x: 2, 1y: 2}\n", DT_ERR_PARSE, 2, 16,
                       "'1y' is not an identifier");
    check_yaml_rejects("mesh:\n  dims: {x: 2, any: 2}\n", DT_ERR_PARSE, 2, 16, "reserved");
    check_yaml_rejects("mesh:\n  dims: {x: 2, '': 2}\n", DT_ERR_PARSE, 2, 16, "empty name");
    check_yaml_rejects("mesh:\n  dims: {x: 0}\n", DT_ERR_PARSE, 2, 13, "size 0");
    check_yaml_rejects("mesh:\n  dims:\n    - x: -2\n", DT_ERR_PARSE, 3, 10, "size -2");
    check_yaml_rejects("mesh:\n  dims: {x: two}\n", DT_ERR_PARSE, 2, 13, "'two'");
    check_yaml_rejects("mesh:\n  dims: {a: 1, b: 1, c: 1, d: 1, e: 1, f: 1, g: 1, h: 1, i: 1}\n",
                       DT_ERR_PARSE, 2, 58, "more than 8");
    check_yaml_rejects("mesh:\n  dims: {}\n", DT_ERR_PARSE, 2, 9, "at least one dimension");
    check_yaml_rejects("mesh:\n  device_type: XPU\n  dims: {x: 2}\n", DT_ERR_PARSE, 2, 16,
                       "CPU, GPU or TPU, not 'XPU'");
    check_yaml_rejects("mesh:\n  name: a|b\n  dims: {x: 2}\n", DT_ERR_PARSE, 2, 9,
                       "mesh name 'a|b'");
    check_yaml_rejects("mesh:\n  name: train\n  dims: {batch: 2, model: 2}\n"
                       "  device_ids: [0, 1, 2]\n",
                       DT_ERR_PARSE, 4, 15,
                       "3 device ids for a mesh of 4 devices (batch=2,model=2)");
    check_yaml_rejects("mesh:\n  dims: {x: 4}\n  device_ids: [0, 1, 1, 3]\n", DT_ERR_PARSE, 3, 22,
                       "device id 1 repeated");
    check_yaml_rejects("mesh:\n  dims: {x: 2}\n  device_ids: [0, -1]\n", DT_ERR_PARSE, 3, 19,
                       "device id -1 is out of range");
    check_yaml_rejects("mesh:\n  dims: {x: 2}\n  device_ids: [0, x]\n", DT_ERR_PARSE, 3, 19,
                       "must be an integer");
}

static void test_mesh_yaml_reports_syntax_errors_at_line_column(void)
{
    /* A tab cannot start a token: libyaml stops at line 2, column 1. */
    check_yaml_rejects("mesh:\n\tname: a\n", DT_ERR_PARSE, 2, 1, "cannot start any token");
    /* An unclosed flow mapping: libyaml notices at the end of the input (line 4, column 1). */
    check_yaml_rejects("mesh:\n  name: a\n  dims: {x: 2\n", DT_ERR_PARSE, 4, 1,
                       "did not find expected");
    check_yaml_rejects("mesh:\n  dims: *nowhere\n", DT_ERR_PARSE, 2, 9, "undefined alias");
}

int main(int argc, char **argv)
{
    static const dt_test_case cases[] = {
        DT_TEST(test_mesh_yaml_selects_each_mesh_of_a_file_by_name),
        DT_TEST(test_mesh_yaml_names_lists_every_mesh),
        DT_TEST(test_mesh_yaml_missing_select_is_not_found_and_lists_names),
        DT_TEST(test_mesh_yaml_missing_file_is_io_error),
        DT_TEST(test_mesh_yaml_file_error_names_file_line_column),
        DT_TEST(test_mesh_yaml_string_forms),
        DT_TEST(test_mesh_yaml_rejects_bad_structure_at_line_column),
        DT_TEST(test_mesh_yaml_rejects_bad_values_at_line_column),
        DT_TEST(test_mesh_yaml_reports_syntax_errors_at_line_column),
        DT_TEST_END,
    };
    return dt_test_main(argc, argv, "mesh_yaml", cases, 0);
}
