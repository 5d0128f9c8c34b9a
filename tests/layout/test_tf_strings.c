/* TensorFlow's own mesh and layout strings, from its tests (each cited by file and test): the
 * ones TensorFlow accepts parse and print back as TensorFlow prints them (exactly, or with the
 * short mesh form expanded as TensorFlow expands it), and the ones it rejects are rejected with
 * its reason in the message. No runtime.
 *
 * Sources (tensorflow/tensorflow):
 *   CC  = tensorflow/dtensor/tests/tensor_layout_test.cc
 *   PY  = tensorflow/dtensor/python/tests/layout_test.py
 *   SRC = tensorflow/dtensor/cc/tensor_layout.cc (the rule; the string is from issue 18) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

#define CC "tensor_layout_test.cc "
#define PY "layout_test.py "
#define SRC "tensor_layout.cc "

/* Devices of TensorFlow's "/job:localhost/replica:0/task:0/device:TPU:i" meshes (PY). */
#define TPU4                                                                                   \
    "/job:localhost/replica:0/task:0/device:TPU:0,/job:localhost/replica:0/task:0/device:TPU:1," \
    "/job:localhost/replica:0/task:0/device:TPU:2,/job:localhost/replica:0/task:0/device:TPU:3"
#define MESH_2D "|batch=2,x=2|0,1,2,3|0,1,2,3|" TPU4 /* PY _MESH_2D_STRING */
/* Task 1's half of a 4x2 CPU mesh (CC MultiHost*ReducedMesh). */
#define MULTI                                                                                \
    "mesh:|x=4,y=2|0,1,2,3,4,5,6,7|4,5,6,7|"                                                   \
    "/job:localhost/task:1/device:CPU:0,/job:localhost/task:1/device:CPU:1,"                   \
    "/job:localhost/task:1/device:CPU:2,/job:localhost/task:1/device:CPU:3"
/* Two tasks of two devices each (CC MultiHostComm*Sharded), CPU and TPU. */
#define TWO_HOSTS(T)                                                                         \
    "|x=2,y=2|0,1,2,3|0,1,2,3|/job:localhost/task:0/device:" T ":0,/job:localhost/task:0/"     \
    "device:" T ":1,/job:localhost/task:1/device:" T ":0,/job:localhost/task:1/device:" T ":1"
/* CC ConvertMeshDeviceType's expected mesh, and LayoutToFromStringAny. */
#define CPU_MESH_2                                                                           \
    "mesh:|x=2,batch=1|0,1|0,1|/job:localhost/replica:0/task:0/device:CPU:0,"                  \
    "/job:localhost/replica:0/task:0/device:CPU:1"
#define ANY_LAYOUT "sharding_specs:any, mesh:|x=1|0|0|/job:localhost/task:0/device:CPU:0"

typedef struct accepted {
    const char *source;
    const char *text;
    /* What TensorFlow prints for it: NULL for `text` itself; "" for `text` with its short mesh
     * form (the final "|*TYPE") expanded to `devices` devices as TensorFlow's
     * GenerateMeshDevicesForTests does; else the literal text. */
    const char *prints;
    int devices;
} accepted;

static const accepted accepted_strings[] = {
    /* Meshes. */
    {CC "FromStringEmptyMesh", "empty_mesh", NULL, 0},
    {CC "FromStringMeshWithoutXLASPMD", "mesh:|x=1|0|0|/job:localhost/task:0/device:CPU:0", NULL,
     0},
    {CC "FromStringMeshWithXLASPMD",
     "mesh:|x=1|0|0|/job:localhost/task:0/device:CPU:0|use_xla_spmd", NULL, 0},
    {CC "FromStringMeshWithGlobalDevices",
     "mesh:|x=2|0,1|0|/job:localhost/task:0/device:CPU:0|/job:localhost/"
     "task:0/device:CPU:0,/job:localhost/task:0/device:CPU:1",
     NULL, 0},
    /* One global device name for two devices: TensorFlow does not count them. */
    {CC "FromStringMeshWithXLASPMDAndGlobalDevices",
     "mesh:|x=2|0,1|0|/job:localhost/task:0/device:CPU:0|/job:localhost/"
     "task:0/device:CPU:1|use_xla_spmd",
     NULL, 0},
    {CC "ConvertMeshDeviceType", "mesh:|x=2,batch=1|*TPU", "", 2},
    {CC "ConvertMeshDeviceType (expected mesh)", CPU_MESH_2, NULL, 0},
    {PY "test_mesh_reciprocal_string_rep", MESH_2D, NULL, 0},
    {PY "test_mesh_from_string_with_use_xla_spmd",
     "|batch=2|0,1|0,1|/job:localhost/replica:0/task:0"
     "/device:TPU:0,/job:localhost/replica:0/task:0/device:TPU:1|use_xla_spmd",
     NULL, 0},
    {PY "test_mesh_from_string_with_use_xla_spmd_and_global_devices",
     "|batch=2|0,1|0|/job:localhost/replica:0/task:0"
     "/device:TPU:0|/job:localhost/replica:0/task:0/device:TPU:0,"
     "/job:localhost/replica:0/task:0/device:TPU:1|use_xla_spmd",
     NULL, 0},
    {SRC "Mesh::FromString (issue 18's TPU mesh)",
     "TPU|x=2,y=2|0,1,2,3|0,1,2,3|" TPU4 "|use_xla_spmd", NULL, 0},

    /* Layouts. */
    {CC "FromStringEmptyLayout", "empty_layout", NULL, 0},
    {CC "LayoutToFromString (BatchLayout)", "sharding_specs:x,batch, mesh:|x=4,batch=8|*TPU", "",
     32},
    {CC "LayoutToFromStringNotSharded",
     "sharding_specs:x,unsharded, mesh:|x=1|0|0|/job:localhost/task:0/device:CPU:0", NULL, 0},
    {CC "LayoutToFromStringAny", ANY_LAYOUT, NULL, 0},
    {CC "AutoGenerateLayout", "sharding_specs:x, mesh:|x=2,y=2|*CPU",
     "sharding_specs:x, "
     "mesh:|x=2,y=2|0,1,2,3|0,1,2,3|/job:localhost/task:0/device:CPU:0,/"
     "job:localhost/task:0/device:CPU:1,/job:localhost/task:0/device:CPU:2,/"
     "job:localhost/task:0/device:CPU:3",
     0},
    /* "scalar" is rank 0, printed with no spec. */
    {CC "ScalarLayout", "sharding_specs:scalar, mesh:|x=4,y=4|*TPU", "", 16},
    {CC "ParseSimpleTpuMesh", "sharding_specs:x, mesh:|x=4,y=4|*TPU", "", 16},
    {CC "ParseSimpleCpuMesh", "sharding_specs:x,unsharded, mesh:|x=4,y=4|*CPU", "", 16},
    {CC "ParseReplicatedLayout", "sharding_specs:unsharded,unsharded, mesh:|x=4,y=4|*CPU", "",
     16},
    {CC "SingleHostFullyReplicatedReducedMesh",
     "sharding_specs:unsharded,unsharded, mesh:|x=2,y=2|*CPU", "", 4},
    {CC "MultiHostReplicatedReducedMesh", "sharding_specs:unsharded,unsharded, " MULTI, NULL, 0},
    {CC "MultiHostPartiallyShardedReducedMesh", "sharding_specs:x,unsharded, " MULTI, NULL, 0},
    {CC "MultiHostFullyShardedReducedMesh", "sharding_specs:x,y, " MULTI, NULL, 0},
    {CC "FlippedShardedMultiHostMeshes",
     "sharding_specs:x,y, mesh:|x=4,y=2|0,1,2,3,4,5,6,7|6,7,4,5|"
     "/job:localhost/task:1/device:CPU:2,/job:localhost/task:1/device:CPU:3,"
     "/job:localhost/task:1/device:CPU:0,/job:localhost/task:1/device:CPU:1",
     NULL, 0},
    {CC "Shards", "sharding_specs:x,y, mesh:|x=2,y=3|*CPU", "", 6},
    {CC "ShardsInverted", "sharding_specs:y,x, mesh:|x=2,y=3|*CPU", "", 6},
    {CC "HostShardMap", "sharding_specs:x,y, mesh:TPU|x=2,y=2|*TPU", "", 4},
    {CC "MultiHostMultiDeviceShards",
     "sharding_specs:x,unsharded, mesh:TPU|x=4,y=1|0,1,2,3|0,1,2,3|"
     "/job:localhost/task:0/device:TPU:0,/job:localhost/task:0/device:TPU:1,"
     "/job:localhost/task:1/device:TPU:0,/job:localhost/task:1/device:TPU:1",
     NULL, 0},
    {CC "MultiHostCommXYSharded (send)", "sharding_specs:y,x, mesh:" TWO_HOSTS("CPU"), NULL, 0},
    {CC "MultiHostCommXYSharded (recv)", "sharding_specs:x,y, mesh:" TWO_HOSTS("TPU"), NULL, 0},
    {CC "MultiHostCommXSharded (send)", "sharding_specs:x, mesh:" TWO_HOSTS("CPU"), NULL, 0},
    {CC "MultiHostCommXSharded (recv)", "sharding_specs:x, mesh:" TWO_HOSTS("TPU"), NULL, 0},
    {CC "Transposed2DLayoutWithBatch",
     "sharding_specs:b1,b2,y,x, mesh:|x=2,y=2,b1=2,b2=2|*CPU", "", 16},
    {CC "TruncateBeginning", "sharding_specs:x,y, mesh:CPU|x=2,y=2|*CPU", "", 4},
    {CC "TruncateEnd", "sharding_specs:y, mesh:CPU|x=2,y=2|*CPU", "", 4},
    {CC "ConcatenateDifferentMesh", "sharding_specs:y, mesh:CPU|y=2|*CPU", "", 2},
    {CC "EquivalentLayout", "sharding_specs:unsharded,y, mesh:|x=2,y=1|*TPU", "", 2},
    {PY "test_layout_reciprocal_string_rep (sharded_batch_and_x)",
     "sharding_specs:batch,x, mesh:" MESH_2D, NULL, 0},
    {PY "test_layout_reciprocal_string_rep (unsharded_explicit)",
     "sharding_specs:unsharded,unsharded, mesh:" MESH_2D, NULL, 0},
    {PY "test_empty_sharding_spec_different_from_single_unsharded",
     "sharding_specs: mesh:" MESH_2D, NULL, 0},
    {PY "test_empty_sharding_spec_different_from_single_unsharded",
     "sharding_specs:unsharded, mesh:" MESH_2D, NULL, 0},
    {SRC "Layout::GetLayout ('match', and 'any' more than once)",
     "sharding_specs:any,match,any, mesh:|x=2|*CPU", "", 2},
};

typedef struct rejected {
    const char *source;
    const char *text;
    const char *reason; /* TensorFlow's error, or its gist, which our message must contain */
} rejected;

static const rejected rejected_strings[] = {
    {CC "ParseFailsOnRepeatedShardingSpec", "sharding_specs:x,x, mesh:|x=1,y=2|*CPU",
     "Attempted to shard two or more tensor dimensions over mesh dimension"},
    {CC "ParseFailsOnInvalidScalarShardingSpec", "sharding_specs:x,scalar, mesh:|x=1,y=2|*CPU",
     "A scalar sharding_spec can only be used as a single sharding_spec"},
    {CC "ParseFailsOnShardingSpecOverNonExistentMeshDim",
     "sharding_specs:x,z, mesh:|x=1,y=2|*CPU", "refers to mesh dimension not contained in mesh"},
    {CC "ParseFailsOnBadDeviceString", "sharding_specs:x,unsharded, d:TPU mesh:x=4,y=4",
     "Expected 2 items but found 3"},
    {SRC "Layout::GetLayout ('match' twice)", "sharding_specs:match,match, mesh:|x=2|*CPU",
     "Attempted to shard two or more tensor dimensions over mesh dimension match"},
    /* Issue 18: a local device without its task, and local devices that do not divide. */
    {SRC "Mesh::GetMesh", "|x=1|0|0|/job:localhost/device:CPU:0",
     "Failed to either identify host or device type"},
    {SRC "Mesh::GetMesh",
     "|x=3|0,1,2|0,1|/job:localhost/replica:0/task:0/device:CPU:0,"
     "/job:localhost/replica:0/task:0/device:CPU:1",
     "Uneven local clusters with global_ids 3 and local_devices ids 2"},
    {SRC "Mesh::GetMesh", "|x=2|0,1|0,1|/job:a/task:0/device:CPU:0,/job:a/task:0/device:GPU:0",
     "More than one device type per mesh not supported"},
    {SRC "Mesh::GetMesh", "|x=4|0,1|0,1|/job:a/task:0/device:CPU:0,/job:a/task:0/device:CPU:1",
     "mesh size doesn't match number of devices"},
    {SRC "Mesh::GetMesh", "|x=2|0,1|0,1|/job:a/task:0/device:CPU:0", "not meeting requirements"},
    {SRC "Mesh::GetAbstractMesh", "|x=2,x=2|*CPU", "repeated mesh dimension"},
    {SRC "Mesh::GetAbstractMesh", "|match=2|*CPU", "mesh dimension name match is reserved"},
    {SRC "Mesh::FromString", "|x=2|0,1|0,1", "Expected either 5, 6, 7 or 3 mesh parts"},
    {SRC "Mesh::FromString", "|x=1|0|0|/job:a/task:0/device:CPU:0|CPU:0|spmd",
     "Expected string use_xla_spmd as the 7th argument"},
    {SRC "GenerateMeshDevicesForTests", "|x=2|CPU", "Expected a * in mesh_gen_instructions"},
};

static int is_layout(const char *text)
{
    return strncmp(text, "sharding_specs:", 15) == 0 || strcmp(text, "empty_layout") == 0;
}

/* Parses text as a layout or a mesh and formats it into buf. */
static dt_status parse_format(const char *text, char *buf, size_t len)
{
    dt_status st;
    if (is_layout(text)) {
        dt_layout *l = NULL;
        if ((st = dt_layout_parse(text, &l)) == DT_OK)
            dt_layout_format(l, buf, len);
        dt_layout_destroy(l);
    } else {
        dt_mesh *m = NULL;
        if ((st = dt_mesh_parse(text, &m)) == DT_OK)
            dt_mesh_format(m, buf, len);
        dt_mesh_destroy(m);
    }
    return st;
}

/* TensorFlow's expansion of a short form "...|*TYPE" at the end of text, written out by hand:
 * ids 0..n-1 global and local, devices /job:localhost/task:0/device:TYPE:i. */
static void expand(const char *text, int n, char *buf, size_t len)
{
    const char *star = strrchr(text, '*');
    size_t pos = (size_t)snprintf(buf, len, "%.*s", (int)(star - text), text);
    for (int pass = 0; pass < 2; pass++) {
        for (int i = 0; i < n; i++)
            pos += (size_t)snprintf(buf + pos, len - pos, "%s%d", i ? "," : "", i);
        pos += (size_t)snprintf(buf + pos, len - pos, "|");
    }
    for (int i = 0; i < n; i++)
        pos += (size_t)snprintf(buf + pos, len - pos, "%s/job:localhost/task:0/device:%s:%d",
                                i ? "," : "", star + 1, i);
}

static void test_tensorflow_accepted_strings_print_as_tensorflow_prints_them(void)
{
    static char want[8192], got[8192], again[8192];
    for (size_t i = 0; i < sizeof accepted_strings / sizeof accepted_strings[0]; i++) {
        const accepted *c = &accepted_strings[i];
        if (!c->prints)
            snprintf(want, sizeof want, "%s", c->text);
        else if (!c->prints[0])
            expand(c->text, c->devices, want, sizeof want);
        else
            snprintf(want, sizeof want, "%s", c->prints);
        /* ScalarLayout: TensorFlow drops "scalar" and prints no spec. */
        if (strncmp(want, "sharding_specs:scalar,", 22) == 0)
            memmove(want + 15, want + 22, strlen(want + 22) + 1);
        dt_clear_error();
        got[0] = '\0';
        dt_status st = parse_format(c->text, got, sizeof got);
        if (st != DT_OK || strcmp(got, want) != 0)
            fprintf(stderr, "%s\n  in:   %s\n  want: %s\n  got:  %s (%s)\n", c->source, c->text,
                    want, got, dt_last_error());
        CU_ASSERT_EQUAL(st, DT_OK);
        CU_ASSERT_STRING_EQUAL(got, want);
        /* What we print reads back to itself. */
        CU_ASSERT_EQUAL(parse_format(got, again, sizeof again), DT_OK);
        CU_ASSERT_STRING_EQUAL(again, got);
    }
}

static void test_tensorflow_rejected_strings_fail_with_tensorflows_reason(void)
{
    for (size_t i = 0; i < sizeof rejected_strings / sizeof rejected_strings[0]; i++) {
        const rejected *c = &rejected_strings[i];
        char buf[256];
        dt_clear_error();
        dt_status st = parse_format(c->text, buf, sizeof buf);
        if (st != DT_ERR_PARSE || !strstr(dt_last_error(), c->reason))
            fprintf(stderr, "%s\n  in:   %s\n  want: DT_ERR_PARSE mentioning \"%s\"\n  got:  %s %s\n",
                    c->source, c->text, c->reason, dt_status_name(st), dt_last_error());
        CU_ASSERT_EQUAL(st, DT_ERR_PARSE);
        CU_ASSERT_PTR_NOT_NULL(strstr(dt_last_error(), c->reason));
    }
}

/* What the parsed TensorFlow strings hold, beyond their text. */
static void test_tensorflow_strings_hold_their_device_types_and_placeholders(void)
{
    dt_mesh *m = NULL;
    dt_layout *l = NULL;
    /* PY test_mesh_device_type: the 2-D mesh is a TPU mesh, of 4 local devices. */
    DT_ASSERT_OK(dt_mesh_parse(MESH_2D, &m));
    CU_ASSERT_EQUAL(dt_mesh_device_type(m), DT_DEVICE_TPU);
    CU_ASSERT_STRING_EQUAL(dt_mesh_device_type_name(m), "TPU");
    CU_ASSERT_EQUAL(dt_mesh_num_local_devices(m), 4);
    dt_mesh_destroy(m);

    /* CC ConvertMeshDeviceType: the host mesh of the TPU mesh is the expected CPU mesh. */
    dt_mesh *cpu = NULL, *expected = NULL;
    DT_ASSERT_OK(dt_mesh_parse("mesh:|x=2,batch=1|*TPU", &m));
    DT_ASSERT_OK(dt_mesh_host_mesh(m, &cpu));
    DT_ASSERT_OK(dt_mesh_parse(CPU_MESH_2, &expected));
    CU_ASSERT_EQUAL(dt_mesh_device_type(cpu), DT_DEVICE_CPU);
    CU_ASSERT_TRUE(dt_mesh_equal(cpu, expected));
    CU_ASSERT_FALSE(dt_mesh_equal(m, expected));
    dt_mesh_destroy(expected);
    dt_mesh_destroy(cpu);
    dt_mesh_destroy(m);

    /* CC ParseSimpleTpuMesh / NumShardsAsVector: 16 TPU devices, dims sharded 4 ways. */
    DT_ASSERT_OK(dt_layout_parse("sharding_specs:x,batch, mesh:|x=4,batch=8|*TPU", &l));
    CU_ASSERT_EQUAL(dt_mesh_device_type(dt_layout_mesh(l)), DT_DEVICE_TPU);
    CU_ASSERT_EQUAL(dt_layout_num_shards(l, 0), 4);
    CU_ASSERT_EQUAL(dt_layout_num_shards(l, 1), 8);
    CU_ASSERT_FALSE(dt_layout_is_replicated(l));
    DT_ASSERT_OK(dt_layout_check_concrete(l)); /* concrete; only its devices are foreign */
    dt_layout_destroy(l);

    /* CC LayoutToFromStringAny: the placeholder is held and named. */
    DT_ASSERT_OK(dt_layout_parse(ANY_LAYOUT, &l));
    CU_ASSERT_STRING_EQUAL(dt_layout_spec(l, 0), DT_ANY);
    CU_ASSERT_EQUAL(dt_layout_spec_mesh_dim(l, 0), -1);
    CU_ASSERT_FALSE(dt_layout_is_replicated(l));
    DT_ASSERT_FAILS(dt_layout_check_concrete(l), DT_ERR_INVALID_ARGUMENT);
    DT_ASSERT_ERROR_MENTIONS("tensor dim 0");
    DT_ASSERT_ERROR_MENTIONS("'any'");
    dt_layout_destroy(l);

    /* CC FromStringEmptyLayout: on the empty mesh, and not a layout tensors can use. */
    DT_ASSERT_OK(dt_layout_parse("empty_layout", &l));
    CU_ASSERT_TRUE(dt_mesh_is_empty(dt_layout_mesh(l)));
    CU_ASSERT_EQUAL(dt_layout_rank(l), 0);
    DT_ASSERT_FAILS(dt_layout_check_concrete(l), DT_ERR_INVALID_ARGUMENT);
    DT_ASSERT_ERROR_MENTIONS("empty_layout");
    dt_layout_destroy(l);
}

int main(int argc, char **argv)
{
    static const dt_test_case cases[] = {
        DT_TEST(test_tensorflow_accepted_strings_print_as_tensorflow_prints_them),
        DT_TEST(test_tensorflow_rejected_strings_fail_with_tensorflows_reason),
        DT_TEST(test_tensorflow_strings_hold_their_device_types_and_placeholders),
        DT_TEST_END,
    };
    return dt_test_main(argc, argv, "tf_strings", cases, 0);
}
