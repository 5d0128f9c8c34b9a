/* The kernel backend tables: the CPU one (the public dt_kernel_* functions), the lookup by
 * mesh device type, and the argument check the kernels share. */
#include "ops/ops_impl.h"

static const dt__ops_backend cpu_backend = {
    .name = "cpu",
    .set_device = NULL,
    .sync = NULL,
    .gemm = dt_kernel_gemm,
    .add = dt_kernel_add,
    .sub = dt_kernel_sub,
    .mul = dt_kernel_mul,
    .scale = dt_kernel_scale,
    .axpy = dt_kernel_axpy,
    .fill = dt_kernel_fill,
    .copy = dt_kernel_copy,
    .bias_add = dt_kernel_bias_add,
    .bias_grad = dt_kernel_bias_grad,
    .relu = dt_kernel_relu,
    .relu_grad = dt_kernel_relu_grad,
    .gelu = dt_kernel_gelu,
    .gelu_grad = dt_kernel_gelu_grad,
    .softmax_xent = dt_kernel_softmax_xent,
    .softmax_xent_grad = dt_kernel_softmax_xent_grad,
    .sum = dt_kernel_sum,
    .max = dt_kernel_max,
    .mean = dt_kernel_mean,
    .sq_norm = dt_kernel_sq_norm,
    .reduce_axis = dt_kernel_reduce_axis,
    .nonfinite = dt_kernel_nonfinite,
    .cast = dt_kernel_cast,
    .sgd = dt_kernel_sgd,
    .adam = dt_kernel_adam,
};

const dt__ops_backend *dt__ops_cpu_backend(void)
{
    return &cpu_backend;
}

dt_status dt__ops_backend_for(const dt_mesh *mesh, const char *op,
                              const dt__ops_backend **backend_out)
{
    if (dt_mesh_device_type(mesh) == DT_DEVICE_CPU) {
        *backend_out = &cpu_backend;
        return DT_OK;
    }
#if DT_HAVE_CUDA
    if (dt__ops_cuda_backend) {
        *backend_out = dt__ops_cuda_backend();
        if (*backend_out)
            return DT_OK;
    }
#endif
    return dt__error(DT_ERR_UNSUPPORTED, "%s: no GPU kernels in this build (built without CUDA)",
                     op);
}

dt_status dt__kcheck(const char *op, int64_t n, int nptrs, const void *const *ptrs)
{
    if (n < 0)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "%s: negative size %lld", op, (long long)n);
    if (n == 0)
        return DT_OK;
    for (int i = 0; i < nptrs; i++)
        if (!ptrs[i])
            return dt__error(DT_ERR_INVALID_ARGUMENT, "%s: pointer argument %d is NULL for %lld "
                             "elements", op, i + 1, (long long)n);
    return DT_OK;
}
