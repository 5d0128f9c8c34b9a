/* Element types: sizes, names, text parsing and DLPack type conversion, all driven by one
 * table indexed by dt_dtype; and the names of the reductions (dtensor/dtype.h). */
#include <string.h>

#include "dtensor/dtype.h"
#include "runtime/error.h"

typedef struct dtype_info {
    const char *name;
    size_t size;
    uint8_t dl_code; /* DLDataTypeCode */
} dtype_info;

static const dtype_info dtype_table[DT_DTYPE_COUNT_] = {
    [DT_DTYPE_F32] = {"f32", 4, kDLFloat},  [DT_DTYPE_F64] = {"f64", 8, kDLFloat},
    [DT_DTYPE_F16] = {"f16", 2, kDLFloat},  [DT_DTYPE_BF16] = {"bf16", 2, kDLBfloat},
    [DT_DTYPE_I32] = {"i32", 4, kDLInt},    [DT_DTYPE_I64] = {"i64", 8, kDLInt},
    [DT_DTYPE_U8] = {"u8", 1, kDLUInt},
};

static int valid(dt_dtype dtype)
{
    return (int)dtype >= 0 && dtype < DT_DTYPE_COUNT_;
}

size_t dt_dtype_size(dt_dtype dtype)
{
    return valid(dtype) ? dtype_table[dtype].size : 0;
}

const char *dt_dtype_name(dt_dtype dtype)
{
    return valid(dtype) ? dtype_table[dtype].name : "?";
}

dt_status dt_dtype_parse(const char *text, dt_dtype *dtype_out)
{
    if (!text || !dtype_out)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "dt_dtype_parse: NULL argument");
    for (int i = 0; i < DT_DTYPE_COUNT_; i++) {
        if (strcmp(text, dtype_table[i].name) == 0) {
            *dtype_out = (dt_dtype)i;
            return DT_OK;
        }
    }
    return dt__error(DT_ERR_PARSE,
                     "unknown dtype '%s' (expected f32, f64, f16, bf16, i32, i64 or u8)", text);
}

/* An invalid dtype maps to {kDLOpaqueHandle, 0, 0}, which dt_dtype_from_dlpack rejects. */
DLDataType dt_dtype_to_dlpack(dt_dtype dtype)
{
    DLDataType t = {kDLOpaqueHandle, 0, 0};
    if (valid(dtype)) {
        t.code = dtype_table[dtype].dl_code;
        t.bits = (uint8_t)(dtype_table[dtype].size * 8);
        t.lanes = 1;
    }
    return t;
}

dt_status dt_dtype_from_dlpack(DLDataType type, dt_dtype *dtype_out)
{
    if (!dtype_out)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "dt_dtype_from_dlpack: NULL dtype_out");
    if (type.lanes == 1) {
        for (int i = 0; i < DT_DTYPE_COUNT_; i++) {
            if (type.code == dtype_table[i].dl_code && type.bits == dtype_table[i].size * 8) {
                *dtype_out = (dt_dtype)i;
                return DT_OK;
            }
        }
    }
    return dt__error(DT_ERR_UNSUPPORTED,
                     "DLPack type (code %u, bits %u, lanes %u) is not supported: expected "
                     "lanes 1 and float 16/32/64, bfloat 16, int 32/64 or uint 8",
                     (unsigned)type.code, (unsigned)type.bits, (unsigned)type.lanes);
}

static const char *const reduce_names[] = {"sum", "max", "min", "avg"};
#define NUM_REDUCE_OPS ((int)(sizeof reduce_names / sizeof reduce_names[0]))

const char *dt_reduce_op_name(dt_reduce_op op)
{
    if ((int)op < 0 || (int)op >= NUM_REDUCE_OPS)
        return "unknown";
    return reduce_names[op];
}

dt_status dt_reduce_op_parse(const char *text, dt_reduce_op *op_out)
{
    if (!text || !op_out)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "dt_reduce_op_parse: NULL argument");
    for (int i = 0; i < NUM_REDUCE_OPS; i++) {
        if (strcmp(text, reduce_names[i]) == 0) {
            *op_out = (dt_reduce_op)i;
            return DT_OK;
        }
    }
    return dt__error(DT_ERR_PARSE, "reduction '%s' is not one of sum, max, min, avg", text);
}
