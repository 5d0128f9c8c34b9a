/* Distributed optimizer steps: the gradient is relaid out to the parameter's layout (a
 * reduce-scatter for a partial gradient and a sharded parameter), then the flat update runs on
 * every local component in place. */
#include "ops/ops_impl.h"
#include "runtime/device.h"
#include "runtime/error.h"

static dt_status check_state(const char *op, const char *what, const dt_tensor *t,
                             const dt_tensor *param)
{
    dt_status st = dt__check_f32(op, what, t);
    if (st != DT_OK)
        return st;
    if (!dt_layout_equal(dt_tensor_layout(t), dt_tensor_layout(param)))
        return dt__error(DT_ERR_SHAPE, "%s: %s must have the parameter's layout", op, what);
    return dt__check_same_shape(op, param, t);
}

typedef struct step_args {
    const dt_sgd_opts *sgd;
    const dt_adam_opts *adam;
    int64_t step;
} step_args;

/* The update of local component i, in place (dt__ops_each_local). */
typedef struct step_local {
    const dt__ops_backend *be;
    const step_args *args;
    const dt_tensor *param, *grad, *s1, *s2;
} step_local;

static dt_status step_one(int i, void *arg)
{
    const step_local *a = arg;
    int64_t n = dt__local_numel(a->param, i);
    if (n == 0)
        return DT_OK;
    float *p = dt__local_data(a->param, i);
    const float *gp = dt__local_data(a->grad, i);
    if (a->args->adam)
        return a->be->adam(n, a->args->adam, a->args->step, p, gp, dt__local_data(a->s1, i),
                           dt__local_data(a->s2, i));
    return a->be->sgd(n, a->args->sgd, p, gp, a->s1 ? dt__local_data(a->s1, i) : NULL);
}

static dt_status step(const char *op, const step_args *args, dt_tensor *param,
                      const dt_tensor *grad, dt_tensor *s1, dt_tensor *s2)
{
    dt_status st = dt__check_f32(op, "param", param);
    if (st == DT_OK)
        st = dt__check_like(op, "grad", grad, param);
    if (st == DT_OK && s1)
        st = check_state(op, args->adam ? "m" : "momentum_buf", s1, param);
    if (st == DT_OK && s2)
        st = check_state(op, "v", s2, param);
    if (st != DT_OK)
        return st;
    if (dt_layout_num_partial(dt_tensor_layout(param)) > 0)
        return dt__error(DT_ERR_SHAPE, "%s: the parameter's layout is partial", op);
    const dt__ops_backend *be = NULL;
    st = dt__ops_backend_for(dt_layout_mesh(dt_tensor_layout(param)), op, &be);
    if (st != DT_OK)
        return st;
    dt_tensor *g = NULL;
    st = dt__ensure_layout_l(grad, dt_tensor_layout(param), &g);
    step_local sl = {be, args, param, g, s1, s2};
    if (st == DT_OK)
        st = dt__ops_each_local(be, param, step_one, &sl);
    if (st == DT_OK && be->sync)
        st = be->sync();
    dt_tensor_destroy(g);
    return st;
}

dt_status dt_sgd_step(const dt_sgd_opts *opts, dt_tensor *param, const dt_tensor *grad,
                      dt_tensor *momentum_buf)
{
    if (!opts)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "dt_sgd_step: opts is NULL");
    if (opts->momentum != 0.0f && !momentum_buf)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "dt_sgd_step: momentum %g needs a momentum "
                         "buffer", (double)opts->momentum);
    step_args a = {opts, NULL, 0};
    return step("dt_sgd_step", &a, param, grad, opts->momentum != 0.0f ? momentum_buf : NULL,
                NULL);
}

dt_status dt_adam_step(const dt_adam_opts *opts, int64_t step_count, dt_tensor *param,
                       const dt_tensor *grad, dt_tensor *m, dt_tensor *v)
{
    if (!opts || !m || !v)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "dt_adam_step: opts, m and v are required");
    if (step_count < 1)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "dt_adam_step: step %lld (the first update "
                         "is step 1)", (long long)step_count);
    step_args a = {NULL, opts, step_count};
    return step("dt_adam_step", &a, param, grad, m, v);
}
