/* A user-defined op from outside the library: softplus(x) = log(1 + exp(x)) with its CPU
 * kernel, factor rule and backward, called on a sharded tensor, differentiated through the
 * tape and checked by the validator (docs/ops.md, "Ops users define"). */
#include <math.h>
#include <stdio.h>

#include <dtensor/dtensor.h>

/* ---- the op: kernel, backward, shape rule, validator cases, definition ---- */
static dt_status softplus_cpu(const dt_op_kernel_args *a)
{
    int64_t n = 1;
    for (int d = 0; d < a->out.rank; d++)
        n *= a->out.shape[d];
    if (a->in[0].dtype == DT_DTYPE_F64) {
        const double *x = a->in[0].data;
        double *y = a->out.data;
        for (int64_t i = 0; i < n; i++)
            y[i] = x[i] > 20 ? x[i] : log1p(exp(x[i]));
    } else {
        const float *x = a->in[0].data;
        float *y = a->out.data;
        for (int64_t i = 0; i < n; i++)
            y[i] = x[i] > 20 ? x[i] : log1pf(expf(x[i]));
    }
    return DT_OK;
}

/* snippet backward */
static dt_status softplus_backward(const dt_op_grad *g) /* dx = dy * sigmoid(x) */
{
    dt_tensor *s = NULL;
    dt_status st = dt_sigmoid(g->in[0], &s);
    if (st == DT_OK)
        st = dt_mul(g->dy, s, NULL, &g->dx[0]);
    dt_tensor_destroy(s);
    return st;
}
/* end snippet */

static dt_status softplus_infer(const dt_op_sig *sig, dt_op_shape *out)
{
    if (sig->in[0].dtype != DT_DTYPE_F32 && sig->in[0].dtype != DT_DTYPE_F64)
        return dt_op_error(DT_ERR_SHAPE, "softplus: x is %s, f32 or f64 expected",
                           dt_dtype_name(sig->in[0].dtype));
    *out = sig->in[0];
    return DT_OK;
}

static dt_status softplus_sample(uint64_t seed, int max_dim, dt_op_sig *sig, dt_op_attrs *at)
{
    (void)at;
    sig->nin = 1;
    sig->in[0] = (dt_op_shape){DT_DTYPE_F32, 2, {1 + (int64_t)(seed % (uint64_t)max_dim),
                                                 1 + (int64_t)(seed / 5 % (uint64_t)max_dim)}};
    return DT_OK;
}

/* snippet definition */
static const dt_op_def softplus_def = {
    .name = "example.softplus", .nin = 1, .rule = "...->...", .infer = softplus_infer,
    .cpu = softplus_cpu, .backward = softplus_backward, .reduce = DT_REDUCE_SUM,
    .doc = "log(1 + exp(x))", .family = "unary", .sample = softplus_sample};
/* end snippet */

/* ---- using it ---- */
#define CHECK(call)                                                                        \
    do {                                                                                   \
        dt_status st_ = (call);                                                            \
        if (st_ != DT_OK) {                                                                \
            fprintf(stderr, "%s: %s\n", #call, dt_last_error());                           \
            return 1;                                                                      \
        }                                                                                  \
    } while (0)

int main(int argc, char **argv)
{
    CHECK(dt_init(&argc, &argv, NULL));
    const dt_op *softplus = NULL;
/* snippet use */
    CHECK(dt_op_register(&softplus_def, &softplus));
    int64_t n = dt_num_global_devices(DT_DEVICE_CPU), shape[2] = {4, 3};
    dt_mesh *mesh = NULL;
    dt_layout *rows = NULL;
    CHECK(dt_mesh_create("m", 1, (const char *[]){"x"}, &n, DT_DEVICE_CPU, &mesh));
    CHECK(dt_layout_create(mesh, 2, (const char *[]){"x", DT_UNSHARDED}, &rows));
    double host[12], grad[12];
    for (int i = 0; i < 12; i++)
        host[i] = (i - 6) * 0.5;
    dt_tensor *x = NULL, *y = NULL, *loss = NULL;
    CHECK(dt_tensor_from_host(rows, DT_DTYPE_F64, shape, host, &x));
    dt_tape *tape = NULL;
    CHECK(dt_tape_create(NULL, &tape));
    CHECK(dt_tape_watch(tape, x, 0));
    CHECK(dt_tape_begin(tape));
    CHECK(dt_op_call(softplus, (const dt_tensor *[]){x}, 1, NULL, NULL, &y));
    CHECK(dt_sum(y, NULL, 0, 0, &loss));
    CHECK(dt_tape_end(tape));
    CHECK(dt_tape_backward(tape, loss, NULL, 1.0f, NULL));
    const dt_tensor *g = NULL;
    CHECK(dt_tape_grad(tape, 0, &g));
    CHECK(dt_tensor_to_host(g, -1, grad, sizeof grad));
/* end snippet */
    double worst = 0;
    for (int i = 0; i < 12; i++) /* d softplus / dx = sigmoid(x) */
        worst = fmax(worst, fabs(grad[i] - 1 / (1 + exp(-host[i]))));
    dt_validate_result r;
    CHECK(dt_op_validate(softplus, NULL, &r));
    if (dt_client_id() == 0)
        printf("softplus on %lld devices: gradient error %.3g; validator cases=%lld "
               "checks=%lld failures=%lld\n", (long long)n, worst, (long long)r.cases,
               (long long)r.checks, (long long)r.failures);
    int bad = worst > 1e-12 || r.failures > 0 || r.cases == 0;
    dt_tape_destroy(tape);
    dt_tensor_destroy(loss);
    dt_tensor_destroy(y);
    dt_tensor_destroy(x);
    dt_layout_destroy(rows);
    dt_mesh_destroy(mesh);
    dt_finalize();
    return bad;
}
