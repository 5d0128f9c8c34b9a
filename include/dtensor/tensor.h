/* libdtensor dt_tensor: a global tensor laid out on a mesh, one local component per local
 * device of the mesh, each exchangeable as a DLPack tensor. */
#ifndef DTENSOR_TENSOR_H
#define DTENSOR_TENSOR_H

#include <stddef.h>
#include <stdint.h>

#include <dlpack/dlpack.h>

#include "dtensor/dtype.h"
#include "dtensor/export.h"
#include "dtensor/layout.h"
#include "dtensor/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dt_tensor dt_tensor;

/* Creates a tensor of the given global shape (dt_layout_rank(layout) entries) and dtype,
 * allocating every local component (from the host pool for CPU meshes) and zero-filling it.
 * The mesh must be usable here (dt_mesh_check_devices). Local (no communication). */
DT_API dt_status dt_tensor_zeros(const dt_layout *layout, dt_dtype dtype, const int64_t *shape,
                                 dt_tensor **tensor_out);
/* Same, every element set to *value (one element of dtype, host memory). */
DT_API dt_status dt_tensor_filled(const dt_layout *layout, dt_dtype dtype, const int64_t *shape,
                                  const void *value, dt_tensor **tensor_out);

/* Packs local components into a tensor (DTensor's pack). components[i] is the component of
 * the mesh's i-th local device (n == dt_mesh_num_local_devices). Every component must have
 * the dtype, the shard shape of its device (dt_layout_shard) and the mesh's device type;
 * strides must be compact row-major (or NULL). Data are copied into the tensor's own memory,
 * so the caller keeps its buffers. DT_ERR_SHAPE names the device and the expected shape;
 * DT_ERR_DEVICE_MISMATCH when the mesh does not match the runtime's devices. Local. */
DT_API dt_status dt_tensor_pack(const dt_layout *layout, const int64_t *shape, int n,
                                const DLTensor *components, dt_tensor **tensor_out);

/* Packs taking ownership (zero copy): on success the tensor owns each managed tensor and
 * calls its deleter when destroyed; on failure nothing is taken. Same checks as above. */
DT_API dt_status dt_tensor_pack_managed(const dt_layout *layout, const int64_t *shape, int n,
                                        DLManagedTensor *const *components,
                                        dt_tensor **tensor_out);

/* Unpacks (DTensor's unpack): n must equal the number of local components; managed_out[i]
 * receives a new DLManagedTensor viewing component i without copying. Each holds a reference
 * on the tensor; call its deleter when done (the tensor may be destroyed first). Local. */
DT_API dt_status dt_tensor_unpack(const dt_tensor *tensor, int n, DLManagedTensor **managed_out);

/* Reference counting. dt_tensor_destroy accepts NULL. */
DT_API dt_tensor *dt_tensor_retain(const dt_tensor *tensor);
DT_API void dt_tensor_destroy(dt_tensor *tensor);

/* Queries. Borrowed results live as long as the tensor. Local. */
DT_API const dt_layout *dt_tensor_layout(const dt_tensor *tensor);
DT_API dt_dtype dt_tensor_dtype(const dt_tensor *tensor);
DT_API int dt_tensor_rank(const dt_tensor *tensor);
DT_API const int64_t *dt_tensor_shape(const dt_tensor *tensor);  /* global shape */
DT_API int64_t dt_tensor_numel(const dt_tensor *tensor);          /* global element count */
DT_API int dt_tensor_num_local(const dt_tensor *tensor);
/* Local component i as a borrowed DLTensor (data, shape, dtype, device), NULL if out of range.
 * Its byte_offset is 0 and strides NULL (compact row-major). device is {kDLCPU, 0} on a CPU
 * mesh and {kDLCUDA, the GPU's CUDA ordinal in this process} on a GPU mesh, so other libraries
 * select the right GPU from it; dt_tensor_pack expects the same. */
DT_API const DLTensor *dt_tensor_local(const dt_tensor *tensor, int i);
/* Mesh position and global offset (rank entries) of local component i. */
DT_API int64_t dt_tensor_local_position(const dt_tensor *tensor, int i);
DT_API const int64_t *dt_tensor_local_offset(const dt_tensor *tensor, int i);

/* Copies local component i to host memory `dst`, or host memory `src` into it, whatever device
 * holds it (on a GPU mesh a device copy, after the device's pending work). `bytes` must be the
 * component's size (numel * dtype size). Local. DT_ERR_INVALID_ARGUMENT for a bad index, a NULL
 * buffer or a wrong size (both sizes named); DT_ERR_CUDA or the failing kernel's status from the device. */
DT_API dt_status dt_tensor_local_read(const dt_tensor *tensor, int i, void *dst, size_t bytes);
DT_API dt_status dt_tensor_local_write(dt_tensor *tensor, int i, const void *src, size_t bytes);

#ifdef __cplusplus
}
#endif
#endif
