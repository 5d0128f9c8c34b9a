/* The validator: every registered op (the built-ins and ops defined here) passes a fixed-seed
 * run at small sizes on every mesh the devices allow; an op whose kernel ignores its block's
 * offset is caught, and the report names the op, the shapes and the layouts. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

/* y[i, j] = x[i, j] * (global row index + 1): right only when the kernel uses its offset. */
#define ROWSCALE(T)                                                                       \
    static void rowscale_##T(const dt_op_kernel_args *a, int use_offset)                  \
    {                                                                                     \
        const dt_op_buf *x = &a->in[0];                                                   \
        const T *xs = x->data;                                                            \
        T *y = a->out.data;                                                               \
        for (int64_t i = 0; i < x->shape[0]; i++)                                         \
            for (int64_t j = 0; j < x->shape[1]; j++)                                     \
                y[i * x->shape[1] + j] =                                                  \
                    xs[i * x->shape[1] + j] * (T)(i + (use_offset ? x->offset[0] : 0) + 1); \
    }
ROWSCALE(float)
ROWSCALE(double)

static dt_status rowscale_kernel(const dt_op_kernel_args *a, int use_offset)
{
    if (a->in[0].dtype == DT_DTYPE_F32)
        rowscale_float(a, use_offset);
    else if (a->in[0].dtype == DT_DTYPE_F64)
        rowscale_double(a, use_offset);
    else
        return DT_ERR_UNSUPPORTED;
    return DT_OK;
}

static dt_status good_cpu(const dt_op_kernel_args *a) { return rowscale_kernel(a, 1); }
static dt_status bad_cpu(const dt_op_kernel_args *a) { return rowscale_kernel(a, 0); }

static dt_status rowscale_infer(const dt_op_sig *sig, dt_op_shape *out)
{
    if (sig->in[0].rank != 2 || (sig->in[0].dtype != DT_DTYPE_F32 &&
                                 sig->in[0].dtype != DT_DTYPE_F64))
        return DT_ERR_SHAPE;
    *out = sig->in[0];
    return DT_OK;
}

static dt_status rowscale_sample(uint64_t seed, int max_dim, dt_op_sig *sig, dt_op_attrs *attrs)
{
    (void)attrs;
    sig->nin = 1;
    sig->in[0].dtype = DT_DTYPE_F32;
    sig->in[0].rank = 2;
    sig->in[0].dim[0] = 1 + (int64_t)(seed % (uint64_t)max_dim);
    sig->in[0].dim[1] = 1 + (int64_t)((seed / 7) % (uint64_t)max_dim);
    return DT_OK;
}

/* dx = dy * (row + 1), as the op itself computes: the op is its own backward. */
static const dt_op *good_op;
static dt_status rowscale_backward(const dt_op_grad *g)
{
    if (!g->needs[0])
        return DT_OK;
    return dt_op_call(g->op, &g->dy, 1, g->attrs, NULL, &g->dx[0]);
}

static const dt_op_def good_def = {
    .name = "test.rowscale", .nin = 1, .rule = "ij->ij", .infer = rowscale_infer,
    .cpu = good_cpu, .backward = rowscale_backward, .linearity = DT_OP_LINEAR_MULTI,
    .linear_in = 1, .reduce = DT_REDUCE_SUM, .family = "test", .sample = rowscale_sample};

static char first_report[1400];
static int nreports;
static void on_report(void *arg, const char *line)
{
    (void)arg;
    if (nreports++ == 0)
        snprintf(first_report, sizeof first_report, "%s", line);
}

static void print_report(void *arg, const char *line)
{
    (void)arg;
    printf("    validator: %s\n", line);
}

static void test_every_registered_op_passes_the_validator(void)
{
    if (!good_op)
        DT_ASSERT_OK(dt_op_register(&good_def, &good_op));
    dt_validate_opts o = DT_VALIDATE_OPTS_INIT;
    o.device_type = dt_test_device_type();
    o.report = print_report;
    int64_t failures = 0, cases = 0, ops = 0;
    for (int i = 0; i < dt_op_count(); i++) {
        const dt_op *op = dt_op_at(i);
        const char *only = getenv("DT_VALIDATE_OP");
        if (only && *only && strcmp(only, dt_op_definition(op)->name) != 0)
            continue;
        dt_validate_result r;
        DT_ASSERT_OK(dt_op_validate(op, &o, &r));
        failures += r.failures;
        cases += r.cases;
        ops += r.cases > 0;
    }
    CU_ASSERT_EQUAL(failures, 0);
    CU_ASSERT(cases >= 1);
    CU_ASSERT(ops >= 1);
}

static void test_validator_names_an_op_that_ignores_its_offset(void)
{
    if (dt_test_num_devices() < 2)
        return; /* one device: nothing is sharded, nothing to catch */
    dt_op_def bad = good_def;
    bad.name = "test.rowscale_bad";
    bad.cpu = bad_cpu;
    bad.backward = NULL;
    static const dt_op *bad_op;
    if (!bad_op)
        DT_ASSERT_OK(dt_op_register(&bad, &bad_op));
    dt_validate_opts o = DT_VALIDATE_OPTS_INIT;
    o.device_type = dt_test_device_type();
    o.cases = 4;
    o.layouts = 4;
    o.report = on_report;
    dt_validate_result r;
    DT_ASSERT_OK(dt_op_validate(bad_op, &o, &r));
    CU_ASSERT(r.failures > 0);
    CU_ASSERT_PTR_NOT_NULL(strstr(first_report, "test.rowscale_bad"));
    CU_ASSERT_PTR_NOT_NULL(strstr(first_report, "mesh"));
    CU_ASSERT_PTR_NOT_NULL(strstr(first_report, "shapes"));
    CU_ASSERT_PTR_NOT_NULL(strstr(first_report, "sharding_specs"));
}

int main(int argc, char **argv)
{
    static const dt_test_case cases[] = {
        {"every_registered_op_passes_the_validator",
         test_every_registered_op_passes_the_validator},
        {"validator_names_an_op_that_ignores_its_offset",
         test_validator_names_an_op_that_ignores_its_offset},
        {NULL, NULL},
    };
    return dt_test_main_device(argc, argv, "opdef_validate", cases);
}
