/* Test harness shared by every CUnit test program: runtime set-up, a CUnit run on every
 * rank, failures gathered across ranks into one exit status. */
#ifndef DT_TEST_HARNESS_H
#define DT_TEST_HARNESS_H

#include <CUnit/CUnit.h>
#include <stdio.h>

#include "dtensor/dtensor.h"

typedef struct dt_test_case {
    const char *name;
    CU_TestFunc fn;
} dt_test_case;

#define DT_TEST(fn) {#fn, fn}
#define DT_TEST_END {NULL, NULL}

/* Runs `cases` as one CUnit suite. With init_runtime, dt_init runs first (DT_CPU_DEVICES from
 * the environment, binding off) and dt_finalize last. Returns the process exit code: 0 when
 * no rank failed, 1 otherwise (so meson marks the test failed whichever rank failed). */
int dt_test_main(int argc, char **argv, const char *suite, const dt_test_case *cases,
                 int init_runtime);

/* Like dt_test_main with the runtime, for tests of GPU meshes: exits 77 (meson's skip) when
 * any process has no GPU devices (no CUDA GPU, and DT_GPU=sim not set), saying so. */
int dt_test_main_gpu(int argc, char **argv, const char *suite, const dt_test_case *cases);

/* The device type the test's meshes use: DT_DEVICE_GPU when the environment says
 * DT_TEST_DEVICE=gpu (meson's "-gpu" variants), DT_DEVICE_CPU otherwise. */
dt_device_type dt_test_device_type(void);
/* Devices of dt_test_device_type(): in the job, and held by this client. */
int dt_test_num_devices(void);
int dt_test_num_local_devices(void);
/* dt_test_main with the runtime, or dt_test_main_gpu when dt_test_device_type() is GPU. */
int dt_test_main_device(int argc, char **argv, const char *suite, const dt_test_case *cases);

/* Bytes of local component i of t (numel * dtype size). */
size_t dt_test_local_bytes(const dt_tensor *t, int i);
/* The whole local component i of t copied into a new host buffer (malloc'd, never NULL,
 * freed by the caller) through dt_tensor_local_read, whatever device holds it. Fatal
 * assertion on failure. */
void *dt_test_local_get(const dt_tensor *t, int i);
/* Writes the whole local component i of t from host `src` through dt_tensor_local_write. */
void dt_test_local_set(dt_tensor *t, int i, const void *src);
/* Like dt_tensor_pack from host components (bufs[i]: component i of the mesh's local devices,
 * compact, the layout's shard shape), on any device type: a zeroed tensor whose components are
 * then written. Returns the failing call's status. */
dt_status dt_test_pack_host(const dt_layout *layout, dt_dtype dtype, const int64_t *shape,
                            const void *const *bufs, dt_tensor **out);

/* Layout of a rank-`rank` (<= 2) tensor on `mesh` from spec names (NULL = unsharded), sum-partial
 * over mesh dim `partial` when it is not NULL (fatal assertion on failure). */
dt_layout *dt_test_layout(const dt_mesh *mesh, int rank, const char *s0, const char *s1,
                          const char *partial);
/* Rounds n floats in place to dtype and back, as dt_kernel_cast does (f32: unchanged). */
void dt_test_round(float *x, int64_t n, dt_dtype dtype);
/* The row-major index in a tensor of `shape` of element k (row-major) of the box at offset
 * `off` of extent `len`, both of `rank` dims. */
int64_t dt_test_global_index(int rank, const int64_t *shape, const int64_t *off,
                             const int64_t *len, int64_t k);

/* A scratch directory every client shares: client 0 creates $TMPDIR (or /tmp)/dtest-XXXXXX,
 * every client gets its path in buf (fatal assertion if it cannot be made). Collective over
 * MPI_COMM_WORLD. */
void dt_test_scratch_dir(char *buf, size_t len);
/* Removes the scratch directory and everything in it (client 0) between two world barriers.
 * Collective over MPI_COMM_WORLD. */
void dt_test_scratch_remove(const char *dir);

/* Asserts that a dt_status call succeeded; on failure prints the call, status name and
 * dt_last_error() so the log says why, then fails the test (fatal). */
#define DT_ASSERT_OK(call)                                                                  \
    do {                                                                                    \
        dt_status st_ = (call);                                                             \
        if (st_ != DT_OK)                                                                   \
            fprintf(stderr, "[rank %d] %s:%d: %s -> %s: %s\n", dt_client_id(), __FILE__,   \
                    __LINE__, #call, dt_status_name(st_), dt_last_error());                 \
        CU_ASSERT_EQUAL_FATAL(st_, DT_OK);                                                  \
    } while (0)

/* Asserts that a call failed with `want` and left a non-empty error message. */
#define DT_ASSERT_FAILS(call, want)                                                         \
    do {                                                                                    \
        dt_status st_ = (call);                                                             \
        if (st_ != (want))                                                                  \
            fprintf(stderr, "[rank %d] %s:%d: %s -> %s, wanted %s (%s)\n", dt_client_id(), \
                    __FILE__, __LINE__, #call, dt_status_name(st_), dt_status_name(want),   \
                    dt_last_error());                                                       \
        CU_ASSERT_EQUAL(st_, (want));                                                       \
        CU_ASSERT(dt_last_error()[0] != '\0');                                              \
    } while (0)

/* Asserts that dt_last_error() contains `needle`; prints the message if not. */
#define DT_ASSERT_ERROR_MENTIONS(needle)                                                    \
    do {                                                                                    \
        if (!strstr(dt_last_error(), (needle)))                                             \
            fprintf(stderr, "%s:%d: error '%s' does not mention '%s'\n", __FILE__, __LINE__, \
                    dt_last_error(), (needle));                                             \
        CU_ASSERT_PTR_NOT_NULL(strstr(dt_last_error(), (needle)));                          \
    } while (0)

/* Directory of the test sources (for data files), from the DT_TEST_SRCDIR environment. */
const char *dt_test_srcdir(void);

#endif
