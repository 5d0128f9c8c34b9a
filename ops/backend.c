/* The kernel backend tables: the CPU one (the public dt_kernel_* functions) and the lookup
 * through the device registry. */
#include "ops/ops_impl.h"
#include "runtime/device.h"
#include "runtime/error.h"

static dt_status cpu_run_def(const dt_op_def *def, const dt_op_kernel_args *args)
{
    return def->cpu(args);
}

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
    .sq_sum_f64 = dt__kernel_sq_sum_f64,
    .layer_norm = dt_kernel_layer_norm,
    .layer_norm_grad = dt_kernel_layer_norm_grad,
    .softmax = dt_kernel_softmax,
    .softmax_grad = dt_kernel_softmax_grad,
    .attention = dt_kernel_attention,
    .attention_grad = dt_kernel_attention_grad,
    .embedding = dt_kernel_embedding,
    .embedding_grad = dt_kernel_embedding_grad,
    .vocab_xent_stats = dt_kernel_vocab_xent_stats,
    .vocab_xent_loss = dt_kernel_vocab_xent_loss,
    .vocab_xent_grad = dt_kernel_vocab_xent_grad,
    .vocab_xent_rows_stats = dt__kernel_vocab_xent_rows_stats,
    .vocab_xent_rows_grad = dt__kernel_vocab_xent_rows_grad,
    .rms_norm = dt_kernel_rms_norm,
    .rms_norm_grad = dt_kernel_rms_norm_grad,
    .rope = dt_kernel_rope,
    .swiglu = dt_kernel_swiglu,
    .swiglu_grad = dt_kernel_swiglu_grad,
    .attention_gqa = dt_kernel_attention_gqa,
    .attention_gqa_grad = dt_kernel_attention_gqa_grad,
    .attention_drop = dt__kernel_attention_drop,
    .attention_drop_grad = dt__kernel_attention_drop_grad,
    .run_def = cpu_run_def,
};

const dt__ops_backend *dt__ops_cpu_backend(void)
{
    return &cpu_backend;
}

dt_status dt__ops_backend_for(const dt_mesh *mesh, const char *op,
                              const dt__ops_backend **backend_out)
{
    dt_device_type type = dt_mesh_device_type(mesh);
    const dt__device *dev = dt__device_local(type, 0);
    const dt__ops_backend *be = dev ? dev->kind->ops() : NULL;
    if (!be)
        return dt__error(DT_ERR_UNSUPPORTED, "%s: no %s kernels here (%s devices of this client: "
                         "%s)", op, dt_device_type_name(type), dt_device_type_name(type),
                         dt_device_kind_name(type));
    *backend_out = be;
    return DT_OK;
}
