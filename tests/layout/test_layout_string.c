/* Layout objects and their text: TensorFlow's layout strings round-trip exactly, the partial
 * extension, short-form meshes, rank 0, and every creation and parse error with its message. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "layout/layout_impl.h"

/* TensorFlow's full mesh form for n devices of one task, written here by hand:
 * |dims|0,..,n-1|0,..,n-1|/job:localhost/replica:0/task:0/device:CPU:0,... */
static void full_mesh(char *buf, size_t len, const char *dims, int n)
{
    size_t pos = (size_t)snprintf(buf, len, "|%s|", dims);
    for (int pass = 0; pass < 2; pass++) {
        for (int i = 0; i < n; i++)
            pos += (size_t)snprintf(buf + pos, len - pos, "%s%d", i ? "," : "", i);
        pos += (size_t)snprintf(buf + pos, len - pos, "|");
    }
    for (int i = 0; i < n; i++)
        pos += (size_t)snprintf(buf + pos, len - pos,
                                "%s/job:localhost/replica:0/task:0/device:CPU:%d", i ? "," : "",
                                i);
}

static dt_mesh *make_mesh(int mrank, const char *const *names, const int64_t *sizes)
{
    dt_mesh *m = NULL;
    DT_ASSERT_OK(dt_mesh_create(NULL, mrank, names, sizes, DT_DEVICE_CPU, &m));
    return m;
}

static const char *const xy[] = {"x", "y"};
static const int64_t two_by_two[] = {2, 2};

/* Parses `text`, formats it back and expects the very same string. */
static void check_round_trip(const char *text)
{
    dt_layout *l = NULL;
    char buf[4096];
    DT_ASSERT_OK(dt_layout_parse(text, &l));
    size_t n = dt_layout_format(l, buf, sizeof buf);
    CU_ASSERT_EQUAL(n, strlen(text));
    if (strcmp(buf, text) != 0)
        fprintf(stderr, "round trip changed\n  %s\nto\n  %s\n", text, buf);
    CU_ASSERT_STRING_EQUAL(buf, text);
    dt_layout_destroy(l);
}

/* Expects dt_layout_parse to fail with `want` and a message mentioning both needles. */
static void check_parse_error(const char *text, dt_status want, const char *needle1,
                              const char *needle2)
{
    dt_layout *l = (dt_layout *)(uintptr_t)1; /* must stay untouched */
    dt_clear_error();
    DT_ASSERT_FAILS(dt_layout_parse(text, &l), want);
    CU_ASSERT_EQUAL(l, (dt_layout *)(uintptr_t)1);
    DT_ASSERT_ERROR_MENTIONS(needle1);
    if (needle2)
        DT_ASSERT_ERROR_MENTIONS(needle2);
}

/* ---- TensorFlow's strings ---------------------------------------------------------------- */

static void test_layout_rank0_string_differs_from_one_unsharded_dim(void)
{
    /* layout_test.py, test_empty_sharding_spec_different_from_single_unsharded. */
    char mesh[1024], r0[2048], r1[2048], b0[2048], b1[2048];
    full_mesh(mesh, sizeof mesh, "batch=2,x=2", 4);
    snprintf(r0, sizeof r0, "sharding_specs: mesh:%s", mesh);
    snprintf(r1, sizeof r1, "sharding_specs:unsharded, mesh:%s", mesh);
    dt_layout *l0 = NULL, *l1 = NULL;
    DT_ASSERT_OK(dt_layout_parse(r0, &l0));
    DT_ASSERT_OK(dt_layout_parse(r1, &l1));
    CU_ASSERT_EQUAL(dt_layout_rank(l0), 0);
    CU_ASSERT_EQUAL(dt_layout_rank(l1), 1);
    CU_ASSERT_FALSE(dt_layout_equal(l0, l1));
    dt_layout_format(l0, b0, sizeof b0);
    dt_layout_format(l1, b1, sizeof b1);
    CU_ASSERT_STRING_EQUAL(b0, r0);
    CU_ASSERT_STRING_EQUAL(b1, r1);
    CU_ASSERT(dt_layout_is_replicated(l0));
    dt_layout_destroy(l0);
    dt_layout_destroy(l1);
}

static void test_layout_short_form_mesh_prints_expanded(void)
{
    /* tensor_layout_test.cc, AutoGenerateLayout: the short mesh form prints in full. */
    dt_layout *l = NULL, *again = NULL;
    dt_mesh *mesh = NULL;
    char got[2048], mesh_text[2048], want[4096], again_text[2048];
    DT_ASSERT_OK(dt_layout_parse("sharding_specs:x, mesh:|x=2,y=2|*CPU", &l));
    DT_ASSERT_OK(dt_mesh_parse("|x=2,y=2|*CPU", &mesh));
    dt_mesh_format(mesh, mesh_text, sizeof mesh_text);
    snprintf(want, sizeof want, "sharding_specs:x, mesh:%s", mesh_text);
    dt_layout_format(l, got, sizeof got);
    CU_ASSERT_STRING_EQUAL(got, want);
    /* TensorFlow expects the dims, then global and local ids 0..3, then device names. */
    const char *prefix = "sharding_specs:x, mesh:|x=2,y=2|0,1,2,3|0,1,2,3|";
    CU_ASSERT_EQUAL(strncmp(got, prefix, strlen(prefix)), 0);
    DT_ASSERT_OK(dt_layout_parse(got, &again));
    CU_ASSERT(dt_layout_equal(l, again));
    dt_layout_format(again, again_text, sizeof again_text);
    CU_ASSERT_STRING_EQUAL(again_text, got);
    CU_ASSERT(dt_mesh_equal(dt_layout_mesh(l), mesh));
    dt_layout_destroy(again);
    dt_layout_destroy(l);
    dt_mesh_destroy(mesh);
}

static void test_layout_parse_reads_tensorflow_test_layouts(void)
{
    dt_layout *l = NULL;
    /* tensor_layout_test.cc, ParseSimpleCpuMesh. */
    DT_ASSERT_OK(dt_layout_parse("sharding_specs:x,unsharded, mesh:|x=4,y=4|*CPU", &l));
    CU_ASSERT_EQUAL(dt_layout_rank(l), 2);
    CU_ASSERT_EQUAL(dt_mesh_size(dt_layout_mesh(l)), 16);
    CU_ASSERT_STRING_EQUAL(dt_layout_spec(l, 0), "x");
    CU_ASSERT_STRING_EQUAL(dt_layout_spec(l, 1), DT_UNSHARDED);
    CU_ASSERT_EQUAL(dt_layout_spec_mesh_dim(l, 0), 0);
    CU_ASSERT_EQUAL(dt_layout_spec_mesh_dim(l, 1), -1);
    CU_ASSERT_EQUAL(dt_layout_num_shards(l, 0), 4);
    CU_ASSERT_EQUAL(dt_layout_num_shards(l, 1), 1);
    CU_ASSERT_FALSE(dt_layout_is_replicated(l));
    dt_layout_destroy(l);

    /* ParseReplicatedLayout. */
    DT_ASSERT_OK(dt_layout_parse("sharding_specs:unsharded,unsharded, mesh:|x=4,y=4|*CPU", &l));
    CU_ASSERT(dt_layout_is_replicated(l));
    dt_layout_destroy(l);

    /* Transposed2DLayoutWithBatch: mesh dims in another order than the specs. */
    DT_ASSERT_OK(dt_layout_parse("sharding_specs:b1,b2,x,y, mesh:|x=2,y=2,b1=2,b2=2|*CPU", &l));
    CU_ASSERT_EQUAL(dt_layout_rank(l), 4);
    CU_ASSERT_EQUAL(dt_layout_spec_mesh_dim(l, 0), 2);
    CU_ASSERT_EQUAL(dt_layout_spec_mesh_dim(l, 1), 3);
    CU_ASSERT_EQUAL(dt_layout_spec_mesh_dim(l, 2), 0);
    CU_ASSERT_EQUAL(dt_layout_spec_mesh_dim(l, 3), 1);
    dt_layout_destroy(l);

    /* TruncateBeginning: a named short-form mesh. */
    DT_ASSERT_OK(dt_layout_parse("sharding_specs:x,y, mesh:CPU|x=2,y=2|*CPU", &l));
    CU_ASSERT_STRING_EQUAL(dt_mesh_name(dt_layout_mesh(l)), "CPU");
    CU_ASSERT_EQUAL(dt_layout_spec_mesh_dim(l, 1), 1);
    dt_layout_destroy(l);

    /* ScalarLayout (on CPU rather than TPU): "scalar" is rank 0, printed with no specs. */
    DT_ASSERT_OK(dt_layout_parse("sharding_specs:scalar, mesh:|x=4,y=4|*CPU", &l));
    CU_ASSERT_EQUAL(dt_layout_rank(l), 0);
    CU_ASSERT_EQUAL(dt_mesh_size(dt_layout_mesh(l)), 16);
    char buf[32];
    dt_layout_format(l, buf, sizeof buf);
    CU_ASSERT_STRING_EQUAL(buf, "sharding_specs: mesh:|x=4,y=4|0");
    dt_layout_destroy(l);
}

/* TensorFlow's failing strings (their reasons: tests/layout/test_tf_strings.c) point at the
 * offending column. */
static void test_layout_parse_errors_name_the_column(void)
{
    /* tensor_layout_test.cc, ParseFailsOnRepeatedShardingSpec. */
    check_parse_error("sharding_specs:x,x, mesh:|x=1,y=2|*CPU", DT_ERR_PARSE, "column 18",
                      "'x' already shards the tensor dim at column 16");
    /* ParseFailsOnInvalidScalarShardingSpec. */
    check_parse_error("sharding_specs:x,scalar, mesh:|x=1,y=2|*CPU", DT_ERR_PARSE,
                      "column 18", "'scalar' must be the only sharding spec");
    /* ParseFailsOnShardingSpecOverNonExistentMeshDim. */
    check_parse_error("sharding_specs:x,z, mesh:|x=1,y=2|*CPU", DT_ERR_PARSE, "column 18",
                      "'z' is neither 'unsharded' nor a mesh dimension (mesh dims: x, y)");
    /* ParseFailsOnBadDeviceString. */
    check_parse_error("sharding_specs:x,unsharded, d:TPU mesh:x=4,y=4", DT_ERR_PARSE,
                      "column 29", "expected 'mesh:' or 'partial:'");
    check_parse_error("sharding_specs:match,x,match, mesh:|x=2|*CPU", DT_ERR_PARSE, "column 24",
                      "'match' already appears at column 16");
}

static void test_layout_placeholders_are_held_and_printed(void)
{
    dt_mesh *mesh = make_mesh(2, xy, two_by_two);
    dt_layout *l = NULL;
    char buf[1024];
    const char *specs[] = {DT_ANY, "x", DT_MATCH, DT_ANY};
    DT_ASSERT_OK(dt_layout_create(mesh, 4, specs, &l));
    for (int i = 0; i < 4; i++)
        CU_ASSERT_STRING_EQUAL(dt_layout_spec(l, i), specs[i]);
    CU_ASSERT_EQUAL(dt_layout_spec_mesh_dim(l, 0), -1);
    CU_ASSERT_EQUAL(dt_layout_spec_mesh_dim(l, 1), 0);
    CU_ASSERT_EQUAL(dt_layout_num_shards(l, 2), 1);
    dt_layout_format(l, buf, sizeof buf);
    CU_ASSERT_EQUAL(strncmp(buf, "sharding_specs:any,x,match,any, mesh:|x=2,y=2|", 46), 0);
    /* The printed text reads back to an equal layout; 'any' differs from 'unsharded'. */
    dt_layout *again = NULL, *plain = NULL;
    DT_ASSERT_OK(dt_layout_parse(buf, &again));
    CU_ASSERT_TRUE(dt_layout_equal(l, again));
    const char *unsharded[] = {DT_UNSHARDED, "x", DT_MATCH, DT_ANY};
    DT_ASSERT_OK(dt_layout_create(mesh, 4, unsharded, &plain));
    CU_ASSERT_FALSE(dt_layout_equal(l, plain));
    /* No shards to compute: the shard math refuses, naming the first placeholder. */
    int64_t shape[4] = {4, 4, 4, 4}, off[4], sz[4];
    DT_ASSERT_FAILS(dt_layout_shard(l, shape, 0, off, sz), DT_ERR_INVALID_ARGUMENT);
    DT_ASSERT_ERROR_MENTIONS("tensor dim 0");
    DT_ASSERT_ERROR_MENTIONS("'any'");
    DT_ASSERT_FAILS(dt_layout_shard(plain, shape, 0, off, sz), DT_ERR_INVALID_ARGUMENT);
    DT_ASSERT_ERROR_MENTIONS("tensor dim 2");
    DT_ASSERT_ERROR_MENTIONS("'match'");
    /* 'match' at most once, as TensorFlow. */
    const char *two_match[] = {DT_MATCH, DT_MATCH};
    dt_layout *bad = NULL;
    DT_ASSERT_FAILS(dt_layout_create(mesh, 2, two_match, &bad), DT_ERR_INVALID_ARGUMENT);
    DT_ASSERT_ERROR_MENTIONS("tensor dims 0 and 1 are both 'match'");
    CU_ASSERT_PTR_NULL(bad);
    dt_layout_destroy(plain);
    dt_layout_destroy(again);
    dt_layout_destroy(l);
    dt_mesh_destroy(mesh);
}

static void test_layout_on_the_empty_mesh_prints_empty_layout(void)
{
    dt_layout *l = NULL;
    char buf[64];
    /* TensorFlow prints any layout on its empty mesh as "empty_layout". */
    static const char *const texts[] = {"empty_layout", "sharding_specs: mesh:empty_mesh",
                                        "sharding_specs:any, mesh:empty_mesh",
                                        "sharding_specs:unsharded, mesh:|x=2|||"};
    for (size_t i = 0; i < sizeof texts / sizeof texts[0]; i++) {
        DT_ASSERT_OK(dt_layout_parse(texts[i], &l));
        CU_ASSERT_EQUAL(dt_layout_format(l, buf, sizeof buf), strlen("empty_layout"));
        CU_ASSERT_STRING_EQUAL(buf, "empty_layout");
        CU_ASSERT_TRUE(dt_mesh_is_empty(dt_layout_mesh(l)));
        dt_layout_destroy(l);
    }
    /* A mesh dim of the empty mesh does not exist. */
    check_parse_error("sharding_specs:x, mesh:empty_mesh", DT_ERR_PARSE, "column 16",
                      "neither 'unsharded' nor a mesh dimension");
}

/* ---- the partial extension ------------------------------------------------------------- */

static void test_layout_partial_extension_round_trips(void)
{
    char mesh[1024], text[2048];
    full_mesh(mesh, sizeof mesh, "x=2,y=2,z=2", 8);
    snprintf(text, sizeof text, "sharding_specs:x,unsharded, partial:y=sum, mesh:%s", mesh);
    check_round_trip(text);
    snprintf(text, sizeof text, "sharding_specs:unsharded, partial:x=max;z=avg, mesh:%s", mesh);
    check_round_trip(text);
    snprintf(text, sizeof text, "sharding_specs: partial:x=min;y=sum;z=max, mesh:%s", mesh);
    check_round_trip(text);

    dt_layout *l = NULL;
    int d = -1;
    dt_reduce_op op = DT_REDUCE_SUM;
    snprintf(text, sizeof text, "sharding_specs:unsharded, partial:x=max;z=avg, mesh:%s", mesh);
    DT_ASSERT_OK(dt_layout_parse(text, &l));
    CU_ASSERT_EQUAL(dt_layout_num_partial(l), 2);
    DT_ASSERT_OK(dt_layout_partial(l, 0, &d, &op));
    CU_ASSERT_EQUAL(d, 0);
    CU_ASSERT_EQUAL(op, DT_REDUCE_MAX);
    DT_ASSERT_OK(dt_layout_partial(l, 1, &d, &op));
    CU_ASSERT_EQUAL(d, 2);
    CU_ASSERT_EQUAL(op, DT_REDUCE_AVG);
    DT_ASSERT_FAILS(dt_layout_partial(l, 2, &d, &op), DT_ERR_INVALID_ARGUMENT);
    DT_ASSERT_ERROR_MENTIONS("partial dim index 2");
    CU_ASSERT_FALSE(dt_layout_is_replicated(l));
    dt_layout_destroy(l);
}

/* The text without the mesh (error messages, the flight recorder): what precedes ", mesh:",
 * written by hand; a short buffer gets a terminated prefix. */
static void test_layout_specs_text_leaves_out_the_mesh(void)
{
    static const char *const cases[][2] = {
        {"sharding_specs:x,unsharded, mesh:", "sharding_specs:x,unsharded"},
        {"sharding_specs:unsharded, partial:x=max;z=avg, mesh:",
         "sharding_specs:unsharded, partial:x=max;z=avg"},
        {"sharding_specs: partial:y=sum, mesh:", "sharding_specs: partial:y=sum"},
        {"sharding_specs:z,x,y, mesh:", "sharding_specs:z,x,y"},
        {"sharding_specs: mesh:", "sharding_specs:"},
    };
    char mesh[1024], text[2048], got[256];
    full_mesh(mesh, sizeof mesh, "x=2,y=2,z=2", 8);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        dt_layout *l = NULL;
        snprintf(text, sizeof text, "%s%s", cases[i][0], mesh);
        DT_ASSERT_OK(dt_layout_parse(text, &l));
        dt__layout_format_specs(l, got, sizeof got);
        CU_ASSERT_STRING_EQUAL(got, cases[i][1]);
        dt__layout_format_specs(l, got, 10);
        CU_ASSERT_EQUAL(strlen(got), 9);
        CU_ASSERT(strncmp(got, cases[i][1], 9) == 0);
        dt_layout_destroy(l);
    }
}

static void test_layout_partial_dims_print_in_mesh_order(void)
{
    char mesh[1024], in[2048], want[2048], got[2048];
    full_mesh(mesh, sizeof mesh, "x=2,y=2,z=2", 8);
    snprintf(in, sizeof in, "sharding_specs:y, partial:z=avg;x=max, mesh:%s", mesh);
    snprintf(want, sizeof want, "sharding_specs:y, partial:x=max;z=avg, mesh:%s", mesh);
    dt_layout *a = NULL, *b = NULL;
    DT_ASSERT_OK(dt_layout_parse(in, &a));
    DT_ASSERT_OK(dt_layout_parse(want, &b));
    dt_layout_format(a, got, sizeof got);
    CU_ASSERT_STRING_EQUAL(got, want);
    CU_ASSERT(dt_layout_equal(a, b));
    dt_layout_destroy(a);
    dt_layout_destroy(b);
}

static void test_layout_create_partial_formats_and_parses_back(void)
{
    static const char *const names[] = {"dp", "tp", "pp"};
    static const int64_t sizes[] = {2, 3, 2};
    dt_mesh *mesh = make_mesh(3, names, sizes);
    const char *specs[] = {"tp", DT_UNSHARDED, "pp"};
    const char *pdims[] = {"dp"};
    const dt_reduce_op ops[] = {DT_REDUCE_SUM};
    dt_layout *l = NULL, *back = NULL;
    DT_ASSERT_OK(dt_layout_create_partial(mesh, 3, specs, 1, pdims, ops, &l));
    char text[2048], mesh_text[2048], want[4096];
    dt_mesh_format(mesh, mesh_text, sizeof mesh_text);
    snprintf(want, sizeof want, "sharding_specs:tp,unsharded,pp, partial:dp=sum, mesh:%s",
             mesh_text);
    dt_layout_format(l, text, sizeof text);
    CU_ASSERT_STRING_EQUAL(text, want);
    DT_ASSERT_OK(dt_layout_parse(text, &back));
    CU_ASSERT(dt_layout_equal(l, back));
    dt_layout_destroy(back);
    dt_layout_destroy(l);
    dt_mesh_destroy(mesh);
}

/* ---- parse errors ------------------------------------------------------------------------- */

static void test_layout_parse_errors_name_column_and_expectation(void)
{
    check_parse_error("", DT_ERR_PARSE, "column 1", "expected 'sharding_specs:'");
    check_parse_error("sharding_spec:x, mesh:|x=2|*CPU", DT_ERR_PARSE, "column 1",
                      "expected 'sharding_specs:'");
    check_parse_error("sharding_specs:x unsharded, mesh:|x=2|*CPU", DT_ERR_PARSE, "column 17",
                      "expected ',' after sharding spec 'x', found ' '");
    check_parse_error("sharding_specs:x,unsharded,mesh:|x=2|*CPU", DT_ERR_PARSE, "column 28",
                      "expected ' ' before 'mesh:'");
    check_parse_error("sharding_specs:x,, mesh:|x=2|*CPU", DT_ERR_PARSE, "column 18",
                      "expected a sharding spec");
    check_parse_error("sharding_specs:x,", DT_ERR_PARSE, "column 18", "unexpected end of text");
    check_parse_error("sharding_specs:x, mesh", DT_ERR_PARSE, "column 19", "expected 'mesh:'");
    check_parse_error("sharding_specs:x,u,u,u,u,u,u,u,u, mesh:|x=2|*CPU", DT_ERR_PARSE,
                      "column 32", "more than 8 sharding specs");
}

static void test_layout_parse_rejects_bad_mesh_part_with_its_column(void)
{
    dt_layout *l = NULL;
    dt_clear_error();
    dt_status st = dt_layout_parse("sharding_specs:x, mesh:", &l);
    CU_ASSERT_NOT_EQUAL(st, DT_OK);
    DT_ASSERT_ERROR_MENTIONS("column 24, in the mesh part");
    st = dt_layout_parse("sharding_specs:x, mesh:|x=2,x=2|*CPU", &l);
    CU_ASSERT_NOT_EQUAL(st, DT_OK);
    DT_ASSERT_ERROR_MENTIONS("column 24, in the mesh part");
}

static void test_layout_parse_errors_in_partial_dims(void)
{
    check_parse_error("sharding_specs:x, partial:y, mesh:|x=2,y=2|*CPU", DT_ERR_PARSE,
                      "column 28", "expected '=' and a reduction");
    check_parse_error("sharding_specs:x, partial:y=prod, mesh:|x=2,y=2|*CPU", DT_ERR_PARSE,
                      "column 29", "reduction 'prod' of partial dimension 'y'");
    check_parse_error("sharding_specs:x, partial:y=sum mesh:|x=2,y=2|*CPU", DT_ERR_PARSE,
                      "column 32", "expected ';' or ','");
    check_parse_error("sharding_specs:x, partial:y=sum,mesh:|x=2,y=2|*CPU", DT_ERR_PARSE,
                      "column 33", "expected ' mesh:'");
    check_parse_error("sharding_specs:x, partial:, mesh:|x=2,y=2|*CPU", DT_ERR_PARSE,
                      "column 27", "expected a partial mesh dimension name");
    check_parse_error("sharding_specs:x, partial:x=sum, mesh:|x=2,y=2|*CPU", DT_ERR_PARSE,
                      "column 27", "'x' cannot be partial: it is already used at column 16");
    check_parse_error("sharding_specs:x, partial:y=sum;y=max, mesh:|x=2,y=2|*CPU", DT_ERR_PARSE,
                      "column 33", "already used at column 27");
    check_parse_error("sharding_specs:x, partial:w=sum, mesh:|x=2,y=2|*CPU", DT_ERR_PARSE,
                      "column 27", "'w' is not a mesh dimension (mesh dims: x, y)");
}

static void test_layout_parse_rejects_other_tensorflow_layout_kinds(void)
{
    check_parse_error("maximal:true, mesh:|x=2|*CPU", DT_ERR_UNSUPPORTED, "'maximal'",
                      "not supported");
    check_parse_error("parted:x, mesh:|x=2|*CPU", DT_ERR_UNSUPPORTED, "'parted'",
                      "not supported");
}

/* ---- creation errors ------------------------------------------------------------------------ */

static void test_layout_create_rejects_bad_specs(void)
{
    dt_mesh *mesh = make_mesh(2, xy, two_by_two);
    dt_layout *l = NULL;
    const char *unknown[] = {"x", "w"};
    DT_ASSERT_FAILS(dt_layout_create(mesh, 2, unknown, &l), DT_ERR_INVALID_ARGUMENT);
    DT_ASSERT_ERROR_MENTIONS("spec 'w' of tensor dim 1");
    DT_ASSERT_ERROR_MENTIONS("mesh dims: x, y");
    const char *twice[] = {"y", "y"};
    DT_ASSERT_FAILS(dt_layout_create(mesh, 2, twice, &l), DT_ERR_INVALID_ARGUMENT);
    DT_ASSERT_ERROR_MENTIONS("'y' shards both tensor dims 0 and 1");
    const char *nine[9] = {DT_UNSHARDED, DT_UNSHARDED, DT_UNSHARDED, DT_UNSHARDED, DT_UNSHARDED,
                           DT_UNSHARDED, DT_UNSHARDED, DT_UNSHARDED, DT_UNSHARDED};
    DT_ASSERT_FAILS(dt_layout_create(mesh, 9, nine, &l), DT_ERR_INVALID_ARGUMENT);
    DT_ASSERT_ERROR_MENTIONS("rank 9 out of range 0..8");
    DT_ASSERT_FAILS(dt_layout_create(mesh, -1, nine, &l), DT_ERR_INVALID_ARGUMENT);
    DT_ASSERT_ERROR_MENTIONS("rank -1");
    const char *null_spec[] = {NULL};
    DT_ASSERT_FAILS(dt_layout_create(mesh, 1, null_spec, &l), DT_ERR_INVALID_ARGUMENT);
    DT_ASSERT_ERROR_MENTIONS("tensor dim 0 is NULL");
    DT_ASSERT_FAILS(dt_layout_create(NULL, 1, twice, &l), DT_ERR_INVALID_ARGUMENT);
    DT_ASSERT_ERROR_MENTIONS("mesh");
    CU_ASSERT_PTR_NULL(l);
    dt_mesh_destroy(mesh);
}

static void test_layout_create_partial_rejects_conflicts(void)
{
    dt_mesh *mesh = make_mesh(2, xy, two_by_two);
    dt_layout *l = NULL;
    const char *specs[] = {"x"};
    const char *px[] = {"x"}, *pyy[] = {"y", "y"}, *pw[] = {"w"}, *py[] = {"y"};
    const dt_reduce_op sum[] = {DT_REDUCE_SUM, DT_REDUCE_MAX};
    const dt_reduce_op bad[] = {(dt_reduce_op)7};
    DT_ASSERT_FAILS(dt_layout_create_partial(mesh, 1, specs, 1, px, sum, &l),
                    DT_ERR_INVALID_ARGUMENT);
    DT_ASSERT_ERROR_MENTIONS("'x' cannot be both partial and sharding tensor dim 0");
    DT_ASSERT_FAILS(dt_layout_create_partial(mesh, 1, specs, 2, pyy, sum, &l),
                    DT_ERR_INVALID_ARGUMENT);
    DT_ASSERT_ERROR_MENTIONS("'y' is partial twice");
    DT_ASSERT_FAILS(dt_layout_create_partial(mesh, 1, specs, 1, pw, sum, &l),
                    DT_ERR_INVALID_ARGUMENT);
    DT_ASSERT_ERROR_MENTIONS("partial dim 'w' is not a mesh dimension");
    DT_ASSERT_FAILS(dt_layout_create_partial(mesh, 1, specs, 1, py, bad, &l),
                    DT_ERR_INVALID_ARGUMENT);
    DT_ASSERT_ERROR_MENTIONS("invalid reduction 7");
    DT_ASSERT_FAILS(dt_layout_create_partial(mesh, 1, specs, 3, pyy, sum, &l),
                    DT_ERR_INVALID_ARGUMENT);
    DT_ASSERT_ERROR_MENTIONS("3 partial dims for a mesh of 2 dims");
    CU_ASSERT_PTR_NULL(l);
    dt_mesh_destroy(mesh);
}

static void test_layout_helpers_build_tensorflow_layouts(void)
{
    dt_mesh *mesh = make_mesh(2, xy, two_by_two);
    dt_layout *l = NULL, *ref = NULL;
    DT_ASSERT_OK(dt_layout_replicated(mesh, 3, &l));
    const char *rep[] = {DT_UNSHARDED, DT_UNSHARDED, DT_UNSHARDED};
    DT_ASSERT_OK(dt_layout_create(mesh, 3, rep, &ref));
    CU_ASSERT(dt_layout_equal(l, ref));
    CU_ASSERT(dt_layout_is_replicated(l));
    dt_layout_destroy(l);
    dt_layout_destroy(ref);

    DT_ASSERT_OK(dt_layout_batch_sharded(mesh, "y", 3, 1, &l));
    const char *mid[] = {DT_UNSHARDED, "y", DT_UNSHARDED};
    DT_ASSERT_OK(dt_layout_create(mesh, 3, mid, &ref));
    CU_ASSERT(dt_layout_equal(l, ref));
    dt_layout_destroy(l);
    /* Python-style negative axis, as TensorFlow's Layout.batch_sharded allows. */
    DT_ASSERT_OK(dt_layout_batch_sharded(mesh, "y", 3, -2, &l));
    CU_ASSERT(dt_layout_equal(l, ref));
    dt_layout_destroy(l);
    dt_layout_destroy(ref);

    DT_ASSERT_OK(dt_layout_inner_sharded(mesh, "x", 2, &l));
    CU_ASSERT_STRING_EQUAL(dt_layout_spec(l, 0), DT_UNSHARDED);
    CU_ASSERT_STRING_EQUAL(dt_layout_spec(l, 1), "x");
    CU_ASSERT_PTR_NULL(dt_layout_spec(l, 2));
    dt_layout_destroy(l);

    l = NULL;
    DT_ASSERT_FAILS(dt_layout_batch_sharded(mesh, "y", 2, 2, &l), DT_ERR_INVALID_ARGUMENT);
    DT_ASSERT_ERROR_MENTIONS("axis 2 out of range for rank 2");
    DT_ASSERT_FAILS(dt_layout_batch_sharded(mesh, "batch", 2, 0, &l), DT_ERR_INVALID_ARGUMENT);
    DT_ASSERT_ERROR_MENTIONS("'batch' is not a mesh dimension (mesh dims: x, y)");
    DT_ASSERT_FAILS(dt_layout_inner_sharded(mesh, "x", 0, &l), DT_ERR_INVALID_ARGUMENT);
    DT_ASSERT_ERROR_MENTIONS("rank 0");
    CU_ASSERT_PTR_NULL(l);
    dt_mesh_destroy(mesh);
}

/* ---- format, equality, ownership ---------------------------------------------------------- */

static void test_layout_format_returns_needed_length_like_snprintf(void)
{
    dt_layout *l = NULL;
    const char *text =
        "sharding_specs:x,unsharded, mesh:|x=1|0|0|/job:localhost/task:0/device:CPU:0";
    DT_ASSERT_OK(dt_layout_parse(text, &l));
    size_t n = strlen(text);
    CU_ASSERT_EQUAL(dt_layout_format(l, NULL, 0), n);
    char small[20];
    memset(small, 'Q', sizeof small);
    CU_ASSERT_EQUAL(dt_layout_format(l, small, sizeof small), n);
    CU_ASSERT_EQUAL(strlen(small), sizeof small - 1);
    CU_ASSERT_EQUAL(strncmp(small, text, sizeof small - 1), 0);
    /* Cut inside the mesh part too. */
    char *buf = malloc(n + 1);
    for (size_t len = 1; len <= n + 1; len++) {
        memset(buf, 'Q', n + 1);
        CU_ASSERT_EQUAL(dt_layout_format(l, buf, len), n);
        CU_ASSERT_EQUAL(strlen(buf), len - 1);
        CU_ASSERT_EQUAL(strncmp(buf, text, len - 1), 0);
    }
    free(buf);
    dt_layout_destroy(l);
}

static void test_layout_equal_compares_mesh_specs_and_partials(void)
{
    dt_mesh *m1 = make_mesh(2, xy, two_by_two), *m2 = make_mesh(2, xy, two_by_two);
    static const char *const xz[] = {"x", "z"};
    dt_mesh *m3 = make_mesh(2, xz, two_by_two);
    const char *sx[] = {"x", DT_UNSHARDED};
    const char *py[] = {"y"};
    const dt_reduce_op sum[] = {DT_REDUCE_SUM}, max[] = {DT_REDUCE_MAX};
    dt_layout *a = NULL, *b = NULL, *c = NULL, *p1 = NULL, *p2 = NULL, *p3 = NULL;
    DT_ASSERT_OK(dt_layout_create(m1, 2, sx, &a));
    DT_ASSERT_OK(dt_layout_create(m2, 2, sx, &b));
    DT_ASSERT_OK(dt_layout_create(m3, 2, sx, &c));
    DT_ASSERT_OK(dt_layout_create_partial(m1, 2, sx, 1, py, sum, &p1));
    DT_ASSERT_OK(dt_layout_create_partial(m2, 2, sx, 1, py, sum, &p2));
    DT_ASSERT_OK(dt_layout_create_partial(m1, 2, sx, 1, py, max, &p3));
    CU_ASSERT(dt_layout_equal(a, b));
    CU_ASSERT_FALSE(dt_layout_equal(a, c));
    CU_ASSERT_FALSE(dt_layout_equal(a, p1));
    CU_ASSERT(dt_layout_equal(p1, p2));
    CU_ASSERT_FALSE(dt_layout_equal(p1, p3));
    CU_ASSERT_FALSE(dt_layout_equal(a, NULL));
    dt_layout *all[] = {a, b, c, p1, p2, p3};
    for (int i = 0; i < 6; i++)
        dt_layout_destroy(all[i]);
    dt_mesh_destroy(m1);
    dt_mesh_destroy(m2);
    dt_mesh_destroy(m3);
}

static void test_layout_retain_keeps_layout_and_mesh_alive(void)
{
    dt_mesh *mesh = make_mesh(2, xy, two_by_two);
    dt_layout *l = NULL;
    DT_ASSERT_OK(dt_layout_batch_sharded(mesh, "x", 2, 0, &l));
    dt_mesh_destroy(mesh); /* the layout holds its own reference */
    dt_layout *r = dt_layout_retain(l);
    CU_ASSERT_PTR_EQUAL(r, l);
    dt_layout_destroy(l);
    CU_ASSERT_EQUAL(dt_mesh_size(dt_layout_mesh(r)), 4);
    CU_ASSERT_STRING_EQUAL(dt_layout_spec(r, 0), "x");
    dt_layout_destroy(r);
    dt_layout_destroy(NULL);
}

static void test_reduce_op_names_and_parse(void)
{
    static const char *const names[] = {"sum", "max", "min", "avg"};
    static const dt_reduce_op ops[] = {DT_REDUCE_SUM, DT_REDUCE_MAX, DT_REDUCE_MIN,
                                       DT_REDUCE_AVG};
    for (int i = 0; i < 4; i++) {
        dt_reduce_op op = (dt_reduce_op)99;
        CU_ASSERT_STRING_EQUAL(dt_reduce_op_name(ops[i]), names[i]);
        DT_ASSERT_OK(dt_reduce_op_parse(names[i], &op));
        CU_ASSERT_EQUAL(op, ops[i]);
    }
    dt_reduce_op op = DT_REDUCE_MIN;
    DT_ASSERT_FAILS(dt_reduce_op_parse("prod", &op), DT_ERR_PARSE);
    DT_ASSERT_ERROR_MENTIONS("'prod'");
    CU_ASSERT_EQUAL(op, DT_REDUCE_MIN);
    CU_ASSERT_STRING_EQUAL(dt_reduce_op_name((dt_reduce_op)42), "unknown");
}

int main(int argc, char **argv)
{
    static const dt_test_case cases[] = {
        DT_TEST(test_layout_rank0_string_differs_from_one_unsharded_dim),
        DT_TEST(test_layout_short_form_mesh_prints_expanded),
        DT_TEST(test_layout_parse_reads_tensorflow_test_layouts),
        DT_TEST(test_layout_parse_errors_name_the_column),
        DT_TEST(test_layout_placeholders_are_held_and_printed),
        DT_TEST(test_layout_on_the_empty_mesh_prints_empty_layout),
        DT_TEST(test_layout_partial_extension_round_trips),
        DT_TEST(test_layout_specs_text_leaves_out_the_mesh),
        DT_TEST(test_layout_partial_dims_print_in_mesh_order),
        DT_TEST(test_layout_create_partial_formats_and_parses_back),
        DT_TEST(test_layout_parse_errors_name_column_and_expectation),
        DT_TEST(test_layout_parse_rejects_bad_mesh_part_with_its_column),
        DT_TEST(test_layout_parse_errors_in_partial_dims),
        DT_TEST(test_layout_parse_rejects_other_tensorflow_layout_kinds),
        DT_TEST(test_layout_create_rejects_bad_specs),
        DT_TEST(test_layout_create_partial_rejects_conflicts),
        DT_TEST(test_layout_helpers_build_tensorflow_layouts),
        DT_TEST(test_layout_format_returns_needed_length_like_snprintf),
        DT_TEST(test_layout_equal_compares_mesh_specs_and_partials),
        DT_TEST(test_layout_retain_keeps_layout_and_mesh_alive),
        DT_TEST(test_reduce_op_names_and_parse),
        DT_TEST_END,
    };
    return dt_test_main(argc, argv, "layout_string", cases, 0);
}
