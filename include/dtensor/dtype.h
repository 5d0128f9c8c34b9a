/* libdtensor element types and reductions: the dtypes of tensors and the reductions of
 * partial values, with their names, text forms and DLPack types. Shared by every layer from
 * the runtime up (runtime/ knows these and nothing of meshes, layouts or tensors). */
#ifndef DTENSOR_DTYPE_H
#define DTENSOR_DTYPE_H

#include <stddef.h>
#include <stdint.h>

#include <dlpack/dlpack.h>

#include "dtensor/export.h"
#include "dtensor/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The most dims a tensor (and a layout) has. */
#define DT_MAX_RANK 8

typedef enum dt_dtype {
    DT_DTYPE_F32 = 0,
    DT_DTYPE_F64 = 1,
    DT_DTYPE_F16 = 2,
    DT_DTYPE_BF16 = 3,
    DT_DTYPE_I32 = 4,
    DT_DTYPE_I64 = 5,
    DT_DTYPE_U8 = 6,
    DT_DTYPE_COUNT_ = 7,
} dt_dtype;

/* Bytes per element (0 for an invalid dtype). */
DT_API size_t dt_dtype_size(dt_dtype dtype);
/* "f32", "f64", "f16", "bf16", "i32", "i64", "u8" ("?" if invalid). */
DT_API const char *dt_dtype_name(dt_dtype dtype);
DT_API dt_status dt_dtype_parse(const char *text, dt_dtype *dtype_out);
/* DLPack conversions. DT_ERR_UNSUPPORTED for DLPack types outside the list (lanes != 1...). */
DT_API DLDataType dt_dtype_to_dlpack(dt_dtype dtype);
DT_API dt_status dt_dtype_from_dlpack(DLDataType type, dt_dtype *dtype_out);

/* The reduction a partial mesh dimension is waiting for. */
typedef enum dt_reduce_op {
    DT_REDUCE_SUM = 0,
    DT_REDUCE_MAX = 1,
    DT_REDUCE_MIN = 2,
    DT_REDUCE_AVG = 3,
} dt_reduce_op;

/* "sum", "max", "min", "avg" ("unknown" for other values). dt_reduce_op_parse accepts exactly
 * those names; DT_ERR_PARSE otherwise. */
DT_API const char *dt_reduce_op_name(dt_reduce_op op);
DT_API dt_status dt_reduce_op_parse(const char *text, dt_reduce_op *op_out);

#ifdef __cplusplus
}
#endif
#endif
