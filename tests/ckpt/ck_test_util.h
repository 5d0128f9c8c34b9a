/* Helpers of the ckpt tests: tensors whose global bytes are a hash of (seed, byte index), and
 * checking restored tensors against that single-device reference bit for bit. */
#ifndef DT_CK_TEST_UTIL_H
#define DT_CK_TEST_UTIL_H

#include <stddef.h>
#include <stdint.h>

#include "dtensor/dtensor.h"

/* Byte `i` of the reference global tensor `seed` (row-major, little-endian bytes). */
unsigned char ck_ref_byte(uint64_t seed, uint64_t i);
/* The whole reference tensor, malloc'ed (numel * dtype size bytes). */
unsigned char *ck_ref_tensor(uint64_t seed, int rank, const int64_t *shape, dt_dtype dtype);

/* A tensor on `layout` whose global value is the reference `seed`. Partial layouts get the
 * value on coordinate 0 of each partial dim and zeros elsewhere (so the sum is the value). */
dt_tensor *ck_make(const dt_layout *layout, dt_dtype dtype, const int64_t *shape,
                   uint64_t seed);
/* Number of local elements of t that differ from the reference `seed` (bytewise). Both read
 * and write components through dt_tensor_local_read/_write, so they work on any device. */
int64_t ck_mismatches(const dt_tensor *t, uint64_t seed);

/* A mesh over CPU devices 0..prod(sizes)-1 with dims "a", "b", ... (ck_mesh_of: of `type`). */
dt_mesh *ck_mesh(int ndims, const int64_t *sizes);
dt_mesh *ck_mesh_of(dt_device_type type, int ndims, const int64_t *sizes);
/* A layout from a comma-separated spec list such as "a,unsharded" ("" for rank 0). */
dt_layout *ck_layout(const dt_mesh *mesh, const char *specs);

/* A fresh scratch directory (dt_test_scratch_dir) into dir and the checkpoint path
 * <dir>/ckpt into ck. */
void ck_scratch(char *dir, size_t dlen, char *ck, size_t clen);

/* Restores `name` from checkpoint ck onto layout `specs` of mesh m (asserting the restore
 * succeeds) and returns its mismatches with the pattern of `seed` (ck_mismatches), -1 when
 * nothing was restored. */
int64_t ck_restored_mismatches(const dt_mesh *m, const char *ck, const char *name,
                               const char *specs, uint64_t seed);

/* Path of a file in dir. */
void ck_path(char *buf, size_t len, const char *dir, const char *name);

/* Client 0 replaces the first `from` in the index of checkpoint `ck` by `to`, between
 * barriers of MPI_COMM_WORLD. With `reseal`, it then recomputes the index's trailing
 * "index_crc32c" (as an editor that knows the format would), so that the checks behind it
 * are reached; without, the edit must be caught by that checksum. */
void ck_edit_index(const char *ck, const char *from, const char *to, int reseal);

#endif
