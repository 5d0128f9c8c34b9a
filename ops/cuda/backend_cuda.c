/* The CUDA kernel backend: dt_kernel_*'s argument checks and errors in front of the launches
 * of the ops/cuda .cu files, per-device scratch, device selection and sync, the table. */
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ops/cuda/cuda_ops.h"
#include "ops/ops_impl.h"
#include "runtime/comm.h"
#include "runtime/device.h"
#include "runtime/error.h"

static pthread_mutex_t scratch_lock = PTHREAD_MUTEX_INITIALIZER;
static void *scratch_ptr[DT__CU_MAX_DEVICES];
static size_t scratch_size[DT__CU_MAX_DEVICES];
/* CUDA devices this thread selected since its last sync (bit per ordinal). */
static _Thread_local uint64_t touched;
/* dt__cuda_fault's words (one per device, under scratch_lock), the devices whose word this
 * thread handed out since its last sync, and what a fault found there is named after. */
static unsigned long long *fault_word[DT__CU_MAX_DEVICES];
static _Thread_local uint64_t fault_pending;
static _Thread_local const char *fault_op;
static _Thread_local int64_t fault_limit;

dt_status dt__cuda_check(cudaError_t err, const char *what)
{
    if (err == cudaSuccess)
        return DT_OK;
    cudaGetLastError();
    return dt__error(err == cudaErrorMemoryAllocation ? DT_ERR_NO_MEMORY : DT_ERR_CUDA,
                     "%s: %s (%s)", what, cudaGetErrorString(err), cudaGetErrorName(err));
}

void dt__cuda_lock(void)
{
    pthread_mutex_lock(&scratch_lock);
}

void dt__cuda_unlock(void)
{
    pthread_mutex_unlock(&scratch_lock);
}

static dt_status current_ordinal(const char *what, int *ord_out)
{
    int ord = 0;
    dt_status st = dt__cuda_check(cudaGetDevice(&ord), what);
    if (st != DT_OK)
        return st;
    if (ord < 0 || ord >= DT__CU_MAX_DEVICES)
        return dt__error(DT_ERR_UNSUPPORTED, "%s: CUDA device %d beyond the %d the ops keep "
                         "state for", what, ord, DT__CU_MAX_DEVICES);
    *ord_out = ord;
    return DT_OK;
}

dt_status dt__cuda_scratch(size_t bytes, void **ptr_out)
{
    int ord = 0;
    dt_status st = current_ordinal("ops scratch: cudaGetDevice", &ord);
    if (st != DT_OK)
        return st;
    if (scratch_size[ord] < bytes) {
        size_t want = bytes < ((size_t)1 << 16) ? ((size_t)1 << 16) : bytes;
        void *p = NULL;
        /* cudaFree waits for the kernels still reading the old buffer. */
        if (scratch_ptr[ord])
            cudaFree(scratch_ptr[ord]);
        scratch_ptr[ord] = NULL;
        scratch_size[ord] = 0;
        cudaError_t err = cudaMalloc(&p, want);
        if (err != cudaSuccess) {
            cudaGetLastError();
            return dt__error(err == cudaErrorMemoryAllocation ? DT_ERR_NO_MEMORY : DT_ERR_CUDA,
                             "ops scratch: cudaMalloc of %zu bytes on CUDA device %d: %s", want,
                             ord, cudaGetErrorString(err));
        }
        scratch_ptr[ord] = p;
        scratch_size[ord] = want;
    }
    *ptr_out = scratch_ptr[ord];
    return DT_OK;
}

dt_status dt__cuda_fault(const char *op, int64_t limit, unsigned long long **slot_out)
{
    int ord = 0;
    dt_status st = current_ordinal(op, &ord);
    if (st != DT_OK)
        return st;
    pthread_mutex_lock(&scratch_lock);
    if (!fault_word[ord]) {
        void *p = NULL;
        st = dt__cuda_check(cudaMalloc(&p, sizeof *fault_word[ord]), op);
        /* Synchronous: the word is all ones before any kernel can see it. */
        if (st == DT_OK)
            st = dt__cuda_check(cudaMemset(p, 0xff, sizeof *fault_word[ord]), op);
        if (st == DT_OK)
            fault_word[ord] = p;
        else if (p)
            cudaFree(p);
    }
    pthread_mutex_unlock(&scratch_lock);
    if (st != DT_OK)
        return st;
    fault_pending |= (uint64_t)1 << ord;
    fault_op = op;
    fault_limit = limit;
    *slot_out = fault_word[ord];
    return DT_OK;
}

/* After the devices are synced: the fault words handed out since the last sync, each read
 * and reset (also when st already failed, so that no stale fault is left for a later op); the
 * first fault found becomes the status unless st is an error already. */
static dt_status read_faults(dt_status st)
{
    uint64_t mask = fault_pending;
    fault_pending = 0;
    for (int d = 0; d < DT__CU_MAX_DEVICES && mask; d++) {
        uint64_t bit = (uint64_t)1 << d;
        if (!(mask & bit))
            continue;
        mask &= ~bit;
        unsigned long long w = DT__CUDA_FAULT_NONE;
        cudaError_t err = cudaSetDevice(d);
        if (err == cudaSuccess)
            err = cudaMemcpy(&w, fault_word[d], sizeof w, cudaMemcpyDeviceToHost);
        if (err == cudaSuccess && w != DT__CUDA_FAULT_NONE)
            err = cudaMemset(fault_word[d], 0xff, sizeof w);
        if (err != cudaSuccess && st == DT_OK)
            st = dt__cuda_check(err, "ops (CUDA): reading the kernels' fault word");
        else if (err != cudaSuccess)
            cudaGetLastError();
        if (st == DT_OK && w != DT__CUDA_FAULT_NONE)
            st = dt__error(DT_ERR_INVALID_ARGUMENT, "%s: id %d (position %llu) is outside the "
                           "table of %lld rows (ids 0..%lld)", fault_op,
                           (int)(int32_t)(uint32_t)(w & 0xffffffffu), w >> 32,
                           (long long)fault_limit, (long long)(fault_limit - 1));
    }
    return st;
}

/* dt_finalize: scratch and cuBLAS handles go (the next use recreates them). */
static void release_all(void)
{
    int cur = -1;
    if (cudaGetDevice(&cur) != cudaSuccess)
        cudaGetLastError();
    pthread_mutex_lock(&scratch_lock);
    for (int d = 0; d < DT__CU_MAX_DEVICES; d++) {
        if (scratch_ptr[d] && cudaSetDevice(d) == cudaSuccess)
            cudaFree(scratch_ptr[d]);
        scratch_ptr[d] = NULL;
        scratch_size[d] = 0;
        if (fault_word[d] && cudaSetDevice(d) == cudaSuccess)
            cudaFree(fault_word[d]);
        fault_word[d] = NULL;
    }
    pthread_mutex_unlock(&scratch_lock);
    dt__cuda_gemm_release();
    if (cur >= 0)
        cudaSetDevice(cur);
    cudaGetLastError();
}

static void register_release(void)
{
    dt__at_finalize(release_all);
}

/* 1 if CUDA ordinal `ord` holds one of this client's GPU devices. */
static int is_local_ordinal(int ord)
{
    const dt__device *d;
    for (int j = 0; (d = dt__device_local(DT_DEVICE_GPU, j)) != NULL; j++)
        if (d->ordinal == ord)
            return 1;
    return 0;
}

/* device_id: a component's DLTensor device_id, the CUDA ordinal of one of this client's GPU
 * devices. */
static dt_status cuda_set_device(int device_id)
{
    if (!is_local_ordinal(device_id))
        return dt__error(DT_ERR_INVALID_ARGUMENT, "ops (CUDA): CUDA device %d is not one of "
                         "this client's GPUs", device_id);
    if (device_id >= DT__CU_MAX_DEVICES)
        return dt__error(DT_ERR_UNSUPPORTED, "ops (CUDA): CUDA device %d beyond the %d the "
                         "ops keep state for", device_id, DT__CU_MAX_DEVICES);
    /* Finalize hooks stay registered across dt_init/dt_finalize cycles: register once. */
    static pthread_once_t hook_once = PTHREAD_ONCE_INIT;
    pthread_once(&hook_once, register_release);
    dt_status st = dt__cuda_check(cudaSetDevice(device_id), "ops (CUDA): cudaSetDevice");
    if (st == DT_OK)
        touched |= (uint64_t)1 << device_id;
    return st;
}

/* Waits for every device this thread selected since the last sync (or the current one), so
 * results are complete and asynchronous kernel faults surface here, then reads the fault
 * words of the checks launched since (dt__cuda_fault). */
static dt_status cuda_sync(void)
{
    dt_status st = DT_OK;
    uint64_t mask = touched;
    touched = 0;
    int cur = -1;
    if (cudaGetDevice(&cur) != cudaSuccess)
        cudaGetLastError();
    if (!mask)
        st = dt__cuda_check(cudaDeviceSynchronize(), "ops (CUDA): cudaDeviceSynchronize");
    for (int d = 0; d < DT__CU_MAX_DEVICES && st == DT_OK && mask; d++) {
        if (!(mask & ((uint64_t)1 << d)))
            continue;
        st = dt__cuda_check(cudaSetDevice(d), "ops (CUDA): cudaSetDevice");
        if (st == DT_OK)
            st = dt__cuda_check(cudaDeviceSynchronize(), "ops (CUDA): cudaDeviceSynchronize");
    }
    if (fault_pending)
        st = read_faults(st);
    if (cur >= 0)
        cudaSetDevice(cur);
    return st;
}

/* ---- elementwise ------------------------------------------------------------------------ */

#define CHECK(op, n, ...)                                                                   \
    const void *ptrs_[] = {__VA_ARGS__};                                                    \
    dt_status st_ = dt__kcheck(op, n, (int)(sizeof ptrs_ / sizeof ptrs_[0]), ptrs_);        \
    if (st_ != DT_OK || n == 0)                                                             \
        return st_;

static dt_status cu_add(int64_t n, const float *a, const float *b, float *out)
{
    CHECK("dt_kernel_add (CUDA)", n, a, b, out)
    return dt__cuda_check(dt__cuda_binary(DT__CU_ADD, n, a, b, out, 0), "dt_kernel_add (CUDA)");
}

static dt_status cu_sub(int64_t n, const float *a, const float *b, float *out)
{
    CHECK("dt_kernel_sub (CUDA)", n, a, b, out)
    return dt__cuda_check(dt__cuda_binary(DT__CU_SUB, n, a, b, out, 0), "dt_kernel_sub (CUDA)");
}

static dt_status cu_mul(int64_t n, const float *a, const float *b, float *out)
{
    CHECK("dt_kernel_mul (CUDA)", n, a, b, out)
    return dt__cuda_check(dt__cuda_binary(DT__CU_MUL, n, a, b, out, 0), "dt_kernel_mul (CUDA)");
}

static dt_status cu_scale(int64_t n, float alpha, const float *x, float *out)
{
    CHECK("dt_kernel_scale (CUDA)", n, x, out)
    return dt__cuda_check(dt__cuda_scale(n, alpha, x, out, 0), "dt_kernel_scale (CUDA)");
}

static dt_status cu_axpy(int64_t n, float alpha, const float *x, float *y)
{
    CHECK("dt_kernel_axpy (CUDA)", n, x, y)
    return dt__cuda_check(dt__cuda_axpy(n, alpha, x, y, 0), "dt_kernel_axpy (CUDA)");
}

static dt_status cu_fill(int64_t n, float value, float *x)
{
    CHECK("dt_kernel_fill (CUDA)", n, x)
    return dt__cuda_check(dt__cuda_fill(n, value, x, 0), "dt_kernel_fill (CUDA)");
}

static dt_status cu_copy(int64_t n, const float *src, float *dst)
{
    CHECK("dt_kernel_copy (CUDA)", n, src, dst)
    if (dst == src)
        return DT_OK;
    return dt__cuda_check(cudaMemcpyAsync(dst, src, (size_t)n * sizeof(float),
                                          cudaMemcpyDeviceToDevice, 0),
                          "dt_kernel_copy (CUDA): cudaMemcpyAsync");
}

static dt_status check_matrix(const char *op, int64_t rows, int64_t cols, const void *p,
                              const void *q)
{
    if (rows < 0 || cols < 0)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "%s: negative size %lld x %lld", op,
                         (long long)rows, (long long)cols);
    if ((cols > 0 && !p) || (rows > 0 && cols > 0 && !q))
        return dt__error(DT_ERR_INVALID_ARGUMENT, "%s: NULL pointer for %lld x %lld", op,
                         (long long)rows, (long long)cols);
    return DT_OK;
}

static dt_status cu_bias_add(int64_t rows, int64_t cols, const float *bias, float *y)
{
    const char *op = "dt_kernel_bias_add (CUDA)";
    dt_status st = check_matrix(op, rows, cols, bias, y);
    if (st != DT_OK || rows == 0 || cols == 0)
        return st;
    return dt__cuda_check(dt__cuda_bias_add(rows, cols, bias, y, 0), op);
}

static dt_status cu_bias_grad(int64_t rows, int64_t cols, const float *dy, float *db)
{
    const char *op = "dt_kernel_bias_grad (CUDA)";
    dt_status st = check_matrix(op, rows, cols, db, dy);
    if (st != DT_OK || cols == 0)
        return st;
    return dt__cuda_check(dt__cuda_bias_grad(rows, cols, dy, db, 0), op);
}

/* ---- activations ------------------------------------------------------------------------ */

static dt_status cu_relu(int64_t n, const float *x, float *y)
{
    CHECK("dt_kernel_relu (CUDA)", n, x, y)
    return dt__cuda_check(dt__cuda_relu(n, x, y, 0), "dt_kernel_relu (CUDA)");
}

static dt_status cu_relu_grad(int64_t n, const float *x, const float *dy, float *dx)
{
    CHECK("dt_kernel_relu_grad (CUDA)", n, x, dy, dx)
    return dt__cuda_check(dt__cuda_relu_grad(n, x, dy, dx, 0), "dt_kernel_relu_grad (CUDA)");
}

static dt_status cu_gelu(int64_t n, const float *x, float *y)
{
    CHECK("dt_kernel_gelu (CUDA)", n, x, y)
    return dt__cuda_check(dt__cuda_gelu(n, x, y, 0), "dt_kernel_gelu (CUDA)");
}

static dt_status cu_gelu_grad(int64_t n, const float *x, const float *dy, float *dx)
{
    CHECK("dt_kernel_gelu_grad (CUDA)", n, x, dy, dx)
    return dt__cuda_check(dt__cuda_gelu_grad(n, x, dy, dx, 0), "dt_kernel_gelu_grad (CUDA)");
}

/* ---- loss ------------------------------------------------------------------------------- */

/* The CPU kernel's checks; the labels are checked on the device before anything is written
 * (this waits for the device). Leaves `scratch` (under the lock on success) with room for
 * `extra` bytes after the flag. */
static dt_status check_xent(const char *op, int64_t rows, int64_t classes, const float *logits,
                            const int32_t *labels, const void *out, size_t extra,
                            void **scratch_out)
{
    if (rows < 0 || classes < 1)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "%s: bad size rows=%lld classes=%lld (rows "
                         ">= 0, classes >= 1)", op, (long long)rows, (long long)classes);
    if ((rows > 0 || extra > 0) && !out)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "%s: NULL pointer", op);
    if (rows > 0 && (!logits || !labels))
        return dt__error(DT_ERR_INVALID_ARGUMENT, "%s: NULL pointer", op);
    void *scratch = NULL;
    unsigned long long bad = ULLONG_MAX;
    dt__cuda_lock();
    dt_status st = dt__cuda_scratch(sizeof(double) + extra, &scratch);
    if (st == DT_OK && rows > 0) {
        st = dt__cuda_check(cudaMemsetAsync(scratch, 0xff, sizeof bad, 0), op);
        if (st == DT_OK)
            st = dt__cuda_check(dt__cuda_xent_check_labels(rows, classes, labels, scratch, 0),
                                op);
        if (st == DT_OK)
            st = dt__cuda_check(cudaMemcpy(&bad, scratch, sizeof bad, cudaMemcpyDeviceToHost),
                                op);
    }
    if (st == DT_OK && bad != ULLONG_MAX) {
        int32_t label = 0;
        st = dt__cuda_check(cudaMemcpy(&label, labels + bad, sizeof label,
                                       cudaMemcpyDeviceToHost), op);
        if (st == DT_OK)
            st = dt__error(DT_ERR_INVALID_ARGUMENT, "%s: label %d of row %llu outside 0..%lld",
                           op, (int)label, bad, (long long)(classes - 1));
    }
    if (st != DT_OK) {
        dt__cuda_unlock();
        return st;
    }
    *scratch_out = scratch;
    return DT_OK;
}

static dt_status cu_softmax_xent(int64_t rows, int64_t classes, const float *logits,
                                 const int32_t *labels, float scale, float *loss_out)
{
    const char *op = "dt_kernel_softmax_xent (CUDA)";
    void *scratch = NULL;
    size_t extra = (size_t)(rows > 0 ? rows : 0) * sizeof(double);
    dt_status st = check_xent(op, rows, classes, logits, labels, loss_out, extra + 1,
                              &scratch);
    if (st != DT_OK)
        return st;
    double *row_loss = (double *)scratch + 1;
    st = dt__cuda_check(dt__cuda_softmax_xent(rows, classes, logits, labels, scale, row_loss,
                                              loss_out, 0), op);
    dt__cuda_unlock();
    return st;
}

static dt_status cu_softmax_xent_grad(int64_t rows, int64_t classes, const float *logits,
                                      const int32_t *labels, float scale, float *dlogits)
{
    const char *op = "dt_kernel_softmax_xent_grad (CUDA)";
    void *scratch = NULL;
    dt_status st = check_xent(op, rows, classes, logits, labels, dlogits, 0, &scratch);
    if (st != DT_OK)
        return st;
    dt__cuda_unlock();
    if (rows == 0)
        return DT_OK;
    return dt__cuda_check(dt__cuda_softmax_xent_grad(rows, classes, logits, labels, scale,
                                                     dlogits, 0), op);
}

/* ---- reductions ------------------------------------------------------------------------- */

/* A full reduction through the per-device partials: `kind` DT__CU_* of x (f32) into the f32
 * *out, or, with format >= 0, the f64 sum of squares of x (that format) into the f64 *out. */
static dt_status reduce_full(const char *op, int kind, int64_t n, const void *x, int format,
                             double div, float empty, void *out)
{
    const void *p[] = {x};
    dt_status st = dt__kcheck(op, n, 1, p);
    if (st == DT_OK && !out)
        st = dt__error(DT_ERR_INVALID_ARGUMENT, "%s: NULL output", op);
    if (st != DT_OK)
        return st;
    void *partials = NULL;
    dt__cuda_lock();
    st = dt__cuda_scratch(DT__CU_REDUCE_BLOCKS * sizeof(double), &partials);
    if (st == DT_OK && format >= 0)
        st = dt__cuda_check(dt__cuda_sq_sum_f64(n, x, format, partials, out, 0), op);
    else if (st == DT_OK)
        st = dt__cuda_check(dt__cuda_reduce_full(kind, n, x, partials, div, empty, out, 0),
                            op);
    dt__cuda_unlock();
    return st;
}

static dt_status cu_sum(int64_t n, const float *x, float *out)
{
    return reduce_full("dt_kernel_sum (CUDA)", DT__CU_SUM, n, x, -1, 1.0, 0.0f, out);
}

static dt_status cu_max(int64_t n, const float *x, float *out)
{
    return reduce_full("dt_kernel_max (CUDA)", DT__CU_MAX, n, x, -1, 1.0, -INFINITY, out);
}

static dt_status cu_mean(int64_t n, const float *x, float *out)
{
    return reduce_full("dt_kernel_mean (CUDA)", DT__CU_SUM, n, x, -1, n > 0 ? (double)n : 1.0,
                       NAN, out);
}

static dt_status cu_sq_norm(int64_t n, const float *x, float *out)
{
    return reduce_full("dt_kernel_sq_norm (CUDA)", DT__CU_SQSUM, n, x, -1, 1.0, 0.0f, out);
}

static dt_status cu_reduce_axis(dt_reduce_op op, int64_t outer, int64_t len, int64_t inner,
                                const float *x, float *y)
{
    if (op != DT_REDUCE_SUM && op != DT_REDUCE_MAX && op != DT_REDUCE_MIN &&
        op != DT_REDUCE_AVG)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "dt_kernel_reduce_axis (CUDA): bad "
                         "reduction %d", (int)op);
    if (outer < 0 || len < 0 || inner < 0)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "dt_kernel_reduce_axis (CUDA): negative size "
                         "[%lld, %lld, %lld]", (long long)outer, (long long)len,
                         (long long)inner);
    if (outer > 0 && inner > 0 && (!y || (len > 0 && !x)))
        return dt__error(DT_ERR_INVALID_ARGUMENT, "dt_kernel_reduce_axis (CUDA): NULL pointer");
    if (outer == 0 || inner == 0)
        return DT_OK;
    return dt__cuda_check(dt__cuda_reduce_axis((int)op, outer, len, inner, x, y, 0),
                          "dt_kernel_reduce_axis (CUDA)");
}

/* dt_dtype -> DT__CU_* float format, -1 for the others. */
static int format_of(dt_dtype t)
{
    switch (t) {
    case DT_DTYPE_F32: return DT__CU_F32;
    case DT_DTYPE_F64: return DT__CU_F64;
    case DT_DTYPE_F16: return DT__CU_F16;
    case DT_DTYPE_BF16: return DT__CU_BF16;
    default: return -1;
    }
}

static dt_status cu_nonfinite(int64_t n, const void *x, dt_dtype dtype, int32_t *found_out)
{
    const char *op = "dt_kernel_nonfinite (CUDA)";
    const void *p[] = {x};
    dt_status st = dt__kcheck(op, n, 1, p);
    if (st != DT_OK)
        return st;
    if (!found_out)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "%s: NULL found_out", op);
    int f = format_of(dtype);
    if (f < 0)
        return dt__error(DT_ERR_UNSUPPORTED, "%s: dtype %s (f32, f64, f16 or bf16 expected)",
                         op, dt_dtype_name(dtype));
    return dt__cuda_check(dt__cuda_nonfinite(n, x, f, found_out, 0), op);
}

static dt_status cu_sq_sum_f64(int64_t n, const void *x, dt_dtype dtype, double *out)
{
    const char *op = "sq_sum_f64 (CUDA)";
    int f = format_of(dtype);
    if (f < 0 || f == DT__CU_F64)
        return dt__error(DT_ERR_UNSUPPORTED, "%s: dtype %s (f32, f16 or bf16 expected)", op,
                         dt_dtype_name(dtype));
    return reduce_full(op, DT__CU_SQSUM, n, x, f, 1.0, 0.0f, out);
}

static dt_status cu_cast(int64_t n, const void *src, dt_dtype src_dtype, void *dst,
                         dt_dtype dst_dtype)
{
    const char *op = "dt_kernel_cast (CUDA)";
    int sf = format_of(src_dtype), df = format_of(dst_dtype);
    if (sf < 0 || df < 0)
        return dt__error(DT_ERR_UNSUPPORTED, "%s: %s -> %s (f32, f64, f16 and bf16 only)", op,
                         dt_dtype_name(src_dtype), dt_dtype_name(dst_dtype));
    const void *p[] = {src, dst};
    dt_status st = dt__kcheck(op, n, 2, p);
    if (st != DT_OK || n == 0)
        return st;
    if (sf == df)
        return dt__cuda_check(cudaMemcpyAsync(dst, src, (size_t)n * dt_dtype_size(src_dtype),
                                              cudaMemcpyDeviceToDevice, 0), op);
    return dt__cuda_check(dt__cuda_cast(n, src, sf, dst, df, 0), op);
}

/* ---- optimizers ------------------------------------------------------------------------- */

static dt_status cu_sgd(int64_t n, const dt_sgd_opts *opts, float *param, const float *grad,
                        float *momentum_buf)
{
    const char *op = "dt_kernel_sgd (CUDA)";
    if (!opts)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "%s: NULL opts", op);
    const void *p[] = {param, grad, opts->momentum != 0.0f ? (const void *)momentum_buf : opts};
    dt_status st = dt__kcheck(op, n, 3, p);
    if (st != DT_OK || n == 0)
        return st;
    return dt__cuda_check(dt__cuda_sgd(n, opts->lr, opts->momentum, opts->dampening,
                                       opts->weight_decay, opts->nesterov, opts->grad_scale,
                                       param, grad, momentum_buf, 0), op);
}

static dt_status cu_adam(int64_t n, const dt_adam_opts *opts, int64_t step, float *param,
                         const float *grad, float *m, float *v)
{
    const char *op = "dt_kernel_adam (CUDA)";
    if (!opts)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "%s: NULL opts", op);
    if (step < 1)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "%s: step %lld (the first update is step 1)",
                         op, (long long)step);
    const void *p[] = {param, grad, m, v};
    dt_status st = dt__kcheck(op, n, 4, p);
    if (st != DT_OK || n == 0)
        return st;
    /* The scalars exactly as ops/optimizer.c computes them. */
    const float lr = opts->lr, wd = opts->weight_decay;
    const double bc1 = 1.0 - pow((double)opts->beta1, (double)step);
    const double bc2 = 1.0 - pow((double)opts->beta2, (double)step);
    const float step_size = (float)(lr / bc1);
    const float inv_sqrt_bc2 = (float)(1.0 / sqrt(bc2));
    const float l2 = opts->decoupled ? 0.0f : wd;
    const float decay = opts->decoupled ? 1.0f - lr * wd : 1.0f;
    return dt__cuda_check(dt__cuda_adam(n, opts->beta1, opts->beta2, opts->eps,
                                        opts->grad_scale, step_size, inv_sqrt_bc2, l2, decay,
                                        param, grad, m, v, 0), op);
}

/* An op definition's kernel: its CUDA kernel, or the CPU kernel on host copies of the blocks
 * (ordered after the default stream's work by the blocking copies). */
static dt_status cuda_run_def(const dt_op_def *def, const dt_op_kernel_args *args)
{
    if (def->cuda)
        return def->cuda(args);
    dt_op_kernel_args *h = malloc(sizeof *h);
    if (!h)
        return dt__error(DT_ERR_NO_MEMORY, "%s (CUDA, staged): no memory", def->name);
    *h = *args;
    dt_status st = DT_OK;
    size_t bytes[DT_OP_MAX_IN + 1];
    for (int i = 0; i <= args->nin; i++) {
        const dt_op_buf *b = i < args->nin ? &args->in[i] : &args->out;
        dt_op_buf *hb = i < args->nin ? &h->in[i] : &h->out;
        size_t n = dt_dtype_size(b->dtype);
        for (int d = 0; d < b->rank; d++)
            n *= (size_t)b->shape[d];
        bytes[i] = n;
        hb->data = NULL;
        if (n && !(hb->data = malloc(n)))
            st = dt__error(DT_ERR_NO_MEMORY, "%s (CUDA, staged): no memory", def->name);
        if (st == DT_OK && n && i < args->nin)
            st = dt__cuda_check(cudaMemcpy(hb->data, b->data, n, cudaMemcpyDeviceToHost),
                                def->name);
    }
    if (st == DT_OK)
        st = def->cpu(h);
    if (st == DT_OK && bytes[args->nin])
        st = dt__cuda_check(cudaMemcpy(args->out.data, h->out.data, bytes[args->nin],
                                       cudaMemcpyHostToDevice), def->name);
    for (int i = 0; i < args->nin; i++)
        free(h->in[i].data);
    free(h->out.data);
    free(h);
    return st;
}

static const dt__ops_backend cuda_backend = {
    .name = "cuda",
    .set_device = cuda_set_device,
    .sync = cuda_sync,
    .run_def = cuda_run_def,
    .gemm = dt__cuda_gemm,
    .add = cu_add,
    .sub = cu_sub,
    .mul = cu_mul,
    .scale = cu_scale,
    .axpy = cu_axpy,
    .fill = cu_fill,
    .copy = cu_copy,
    .bias_add = cu_bias_add,
    .bias_grad = cu_bias_grad,
    .relu = cu_relu,
    .relu_grad = cu_relu_grad,
    .gelu = cu_gelu,
    .gelu_grad = cu_gelu_grad,
    .softmax_xent = cu_softmax_xent,
    .softmax_xent_grad = cu_softmax_xent_grad,
    .sum = cu_sum,
    .max = cu_max,
    .mean = cu_mean,
    .sq_norm = cu_sq_norm,
    .reduce_axis = cu_reduce_axis,
    .nonfinite = cu_nonfinite,
    .cast = cu_cast,
    .sgd = cu_sgd,
    .adam = cu_adam,
    .sq_sum_f64 = cu_sq_sum_f64,
    .layer_norm = dt__cu_layer_norm,
    .layer_norm_grad = dt__cu_layer_norm_grad,
    .softmax = dt__cu_softmax,
    .softmax_grad = dt__cu_softmax_grad,
    .attention = dt__cu_attention,
    .attention_grad = dt__cu_attention_grad,
    .embedding = dt__cu_embedding,
    .embedding_grad = dt__cu_embedding_grad,
    .vocab_xent_stats = dt__cu_vocab_xent_stats,
    .vocab_xent_loss = dt__cu_vocab_xent_loss,
    .vocab_xent_grad = dt__cu_vocab_xent_grad,
    .rms_norm = dt__cu_rms_norm,
    .rms_norm_grad = dt__cu_rms_norm_grad,
    .rope = dt__cu_rope,
    .swiglu = dt__cu_swiglu,
    .swiglu_grad = dt__cu_swiglu_grad,
    .attention_gqa = dt__cu_attention_gqa,
    .attention_gqa_grad = dt__cu_attention_gqa_grad,
};

const dt__ops_backend *dt__ops_cuda_backend(void)
{
    return &cuda_backend;
}
