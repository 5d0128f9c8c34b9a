/* Meshes against the running runtime (one process with 8 CPU devices, or 2 and 4 processes with
 * 2 each): local ids of created, YAML and short-form meshes on every rank, and
 * dt_mesh_check_devices accepting a mesh of all present devices and rejecting the rest. */
#include <stdlib.h>
#include <string.h>

#include "harness.h"

/* This client's CPU device ids, from the runtime: the reference for every mesh below. */
static int my_ids(int *ids)
{
    int n = dt_num_local_devices(DT_DEVICE_CPU);
    for (int i = 0; i < n; i++)
        ids[i] = dt_local_device_id(DT_DEVICE_CPU, i);
    return n;
}

/* The mesh lists exactly this client's devices, by global id, in the runtime's order. */
static void check_locals_are_mine(const dt_mesh *m)
{
    int ids[256];
    int n = my_ids(ids);
    CU_ASSERT_EQUAL(dt_mesh_num_local_devices(m), n);
    for (int i = 0; i < n && i < dt_mesh_num_local_devices(m); i++)
        CU_ASSERT_EQUAL(dt_mesh_local_device_id(m, i), ids[i]);
}

static void test_mesh_of_all_devices_passes_check_on_every_rank(void)
{
    int n = dt_num_global_devices(DT_DEVICE_CPU), clients = dt_num_clients();
    CU_ASSERT_FATAL(n >= 1 && n % clients == 0);
    dt_mesh *m = NULL;
    DT_ASSERT_OK(dt_mesh_create("all", 1, (const char *const[]){"x"}, (const int64_t[]){n},
                                DT_DEVICE_CPU, &m));
    check_locals_are_mine(m);
    DT_ASSERT_OK(dt_mesh_check_devices(m));
    dt_mesh_destroy(m);

    /* 2-D: one row per client. */
    int64_t sizes[2] = {clients, n / clients};
    DT_ASSERT_OK(dt_mesh_create("grid", 2, (const char *const[]){"client", "local"}, sizes,
                                DT_DEVICE_CPU, &m));
    check_locals_are_mine(m);
    DT_ASSERT_OK(dt_mesh_check_devices(m));
    dt_mesh_destroy(m);
}

static void test_mesh_local_device_names_name_this_task_and_local_index(void)
{
    int n = dt_num_global_devices(DT_DEVICE_CPU), me = dt_client_id();
    dt_mesh *m = NULL;
    DT_ASSERT_OK(dt_mesh_create(NULL, 1, (const char *const[]){"x"}, (const int64_t[]){n},
                                DT_DEVICE_CPU, &m));
    int ids[256];
    int k = my_ids(ids);
    /* Expected text, built from the runtime's answers: |x=N|0..N-1|my ids|my names */
    char want[8192], *w = want;
    w += sprintf(w, "|x=%d|", n);
    for (int i = 0; i < n; i++)
        w += sprintf(w, "%s%d", i ? "," : "", i);
    w += sprintf(w, "|");
    for (int i = 0; i < k; i++)
        w += sprintf(w, "%s%d", i ? "," : "", ids[i]);
    w += sprintf(w, "|");
    for (int i = 0; i < k; i++)
        w += sprintf(w, "%s/job:localhost/replica:0/task:%d/device:CPU:%d", i ? "," : "", me, i);
    char got[8192];
    CU_ASSERT_EQUAL(dt_mesh_format(m, got, sizeof got), strlen(want));
    CU_ASSERT_STRING_EQUAL(got, want);
    dt_mesh_destroy(m);
}

static void test_mesh_short_form_and_yaml_take_this_clients_devices(void)
{
    int n = dt_num_global_devices(DT_DEVICE_CPU), clients = dt_num_clients();
    char text[256];
    dt_mesh *m = NULL;
    snprintf(text, sizeof text, "s|x=%d|*CPU", n);
    DT_ASSERT_OK(dt_mesh_parse(text, &m));
    check_locals_are_mine(m);
    DT_ASSERT_OK(dt_mesh_check_devices(m));
    dt_mesh_destroy(m);

    /* Reversed device ids: positions change, the local set does not. */
    char yaml[1024], *y = yaml;
    y += sprintf(y, "mesh:\n  name: rev\n  dims: {a: %d, b: %d}\n  device_ids: [", clients,
                 n / clients);
    for (int i = 0; i < n; i++)
        y += sprintf(y, "%s%d", i ? ", " : "", n - 1 - i);
    sprintf(y, "]\n");
    DT_ASSERT_OK(dt_mesh_from_yaml_string(yaml, "rev", &m));
    check_locals_are_mine(m);
    for (int id = 0; id < n; id++)
        CU_ASSERT_EQUAL(dt_mesh_position(m, id), n - 1 - id);
    DT_ASSERT_OK(dt_mesh_check_devices(m));
    dt_mesh_destroy(m);
}

static void test_mesh_check_devices_rejects_more_devices_than_present(void)
{
    int n = dt_num_global_devices(DT_DEVICE_CPU), clients = dt_num_clients();
    int per = dt_num_local_devices(DT_DEVICE_CPU);
    char want[128];
    dt_mesh *m = NULL;
    DT_ASSERT_OK(dt_mesh_create("train", 1, (const char *const[]){"x"}, (const int64_t[]){2 * n},
                                DT_DEVICE_CPU, &m));
    DT_ASSERT_FAILS(dt_mesh_check_devices(m), DT_ERR_DEVICE_MISMATCH);
    snprintf(want, sizeof want, "mesh 'train' has %d CPU devices but %d client%s x %d = %d", 2 * n,
             clients, clients > 1 ? "s" : "", per, n);
    DT_ASSERT_ERROR_MENTIONS(want);
    dt_mesh_destroy(m);

    /* A mesh over a subset of the devices present is valid (devices 0..n-2). */
    if (n > 1) {
        DT_ASSERT_OK(dt_mesh_create("small", 1, (const char *const[]){"x"},
                                    (const int64_t[]){n - 1}, DT_DEVICE_CPU, &m));
        DT_ASSERT_OK(dt_mesh_check_devices(m));
        dt_mesh_destroy(m);
    }
    /* ... and over any subset, not only a prefix: the even devices, spread over clients. */
    if (n > 1) {
        char text[4096], *t = text;
        int k = (n + 1) / 2;
        t += sprintf(t, "mesh:\n  dims: {x: %d}\n  device_ids: [", k);
        for (int i = 0; i < k; i++)
            t += sprintf(t, "%s%d", i ? ", " : "", 2 * i);
        sprintf(t, "]\n");
        DT_ASSERT_OK(dt_mesh_from_yaml_string(text, NULL, &m));
        DT_ASSERT_OK(dt_mesh_check_devices(m));
        dt_mesh_destroy(m);
    }
    /* More GPUs than any machine here has. */
    int g = dt_num_global_devices(DT_DEVICE_GPU) + 1;
    DT_ASSERT_OK(dt_mesh_create("gpus", 1, (const char *const[]){"x"}, (const int64_t[]){g},
                                DT_DEVICE_GPU, &m));
    DT_ASSERT_FAILS(dt_mesh_check_devices(m), DT_ERR_DEVICE_MISMATCH);
    DT_ASSERT_ERROR_MENTIONS("GPU devices");
    dt_mesh_destroy(m);
}

static void test_mesh_check_devices_rejects_absent_ids_and_foreign_locals(void)
{
    int n = dt_num_global_devices(DT_DEVICE_CPU), me = dt_client_id();
    char text[4096], *t = text, want[128];
    dt_mesh *m = NULL;
    /* Right count, but device id n is not present (n-1 left out). */
    t += sprintf(t, "|x=%d|", n);
    for (int i = 0; i < n; i++)
        t += sprintf(t, "%s%d", i ? "," : "", i == n - 1 ? n : i);
    sprintf(t, "||");
    DT_ASSERT_OK(dt_mesh_parse(text, &m));
    DT_ASSERT_FAILS(dt_mesh_check_devices(m), DT_ERR_DEVICE_MISMATCH);
    snprintf(want, sizeof want, "holds CPU device %d", n);
    DT_ASSERT_ERROR_MENTIONS(want);
    dt_mesh_destroy(m);

    /* Every client claims device 0 alone: wrong for every client (each owns >= 2 devices). */
    CU_ASSERT_FATAL(dt_num_local_devices(DT_DEVICE_CPU) >= 2);
    t = text;
    t += sprintf(t, "|x=%d|", n);
    for (int i = 0; i < n; i++)
        t += sprintf(t, "%s%d", i ? "," : "", i);
    sprintf(t, "|0|/job:localhost/replica:0/task:0/device:CPU:0");
    DT_ASSERT_OK(dt_mesh_parse(text, &m));
    DT_ASSERT_FAILS(dt_mesh_check_devices(m), DT_ERR_DEVICE_MISMATCH);
    snprintf(want, sizeof want, "lists local CPU devices 0 but this client (%d of %d) owns", me,
             dt_num_clients());
    DT_ASSERT_ERROR_MENTIONS(want);
    dt_mesh_destroy(m);
}

int main(int argc, char **argv)
{
    static const dt_test_case cases[] = {
        DT_TEST(test_mesh_of_all_devices_passes_check_on_every_rank),
        DT_TEST(test_mesh_local_device_names_name_this_task_and_local_index),
        DT_TEST(test_mesh_short_form_and_yaml_take_this_clients_devices),
        DT_TEST(test_mesh_check_devices_rejects_more_devices_than_present),
        DT_TEST(test_mesh_check_devices_rejects_absent_ids_and_foreign_locals),
        DT_TEST_END,
    };
    return dt_test_main(argc, argv, "mesh_runtime", cases, 1);
}
