/* Local softmax cross-entropy: the loss (log-sum-exp with the row max subtracted) and its
 * gradient softmax - one_hot, both scaled. */
#include <math.h>

#include "ops/ops_impl.h"
#include "runtime/error.h"

static dt_status check_xent(const char *op, int64_t rows, int64_t classes, const float *logits,
                            const int32_t *labels, const void *out)
{
    if (rows < 0 || classes < 1)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "%s: bad size rows=%lld classes=%lld (rows "
                         ">= 0, classes >= 1)", op, (long long)rows, (long long)classes);
    if (rows > 0 && (!out || !logits || !labels))
        return dt__error(DT_ERR_INVALID_ARGUMENT, "%s: NULL pointer", op);
    for (int64_t i = 0; i < rows; i++)
        if (labels[i] < 0 || labels[i] >= classes)
            return dt__error(DT_ERR_INVALID_ARGUMENT, "%s: label %d of row %lld outside "
                             "0..%lld", op, (int)labels[i], (long long)i,
                             (long long)(classes - 1));
    return DT_OK;
}

/* Row max and log(sum(exp(x - max))), the exps in f32 (ops/vmath.c) summed in f64. */
static void row_stats(int64_t classes, const float *x, float *max_out, double *lse_out)
{
    float mx = x[0];
    for (int64_t j = 1; j < classes; j++)
        mx = x[j] > mx ? x[j] : mx;
    double s = dt__vexp_sum(classes, x, mx, NULL);
    *max_out = mx;
    *lse_out = log(s);
}

dt_status dt_kernel_softmax_xent(int64_t rows, int64_t classes, const float *logits,
                                 const int32_t *labels, float scale, float *loss_out)
{
    dt_status st = check_xent("dt_kernel_softmax_xent", rows, classes, logits, labels,
                              loss_out);
    if (st != DT_OK)
        return st;
    if (!loss_out)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "dt_kernel_softmax_xent: NULL loss_out");
    double total = 0.0;
    for (int64_t i = 0; i < rows; i++) {
        const float *x = logits + i * classes;
        float mx;
        double lse;
        row_stats(classes, x, &mx, &lse);
        total += lse - (double)(x[labels[i]] - mx);
    }
    *loss_out = (float)(total * scale);
    return DT_OK;
}

dt_status dt_kernel_softmax_xent_grad(int64_t rows, int64_t classes, const float *logits,
                                      const int32_t *labels, float scale, float *dlogits)
{
    dt_status st = check_xent("dt_kernel_softmax_xent_grad", rows, classes, logits, labels,
                              dlogits);
    if (st != DT_OK)
        return st;
    for (int64_t i = 0; i < rows; i++) {
        const float *x = logits + i * classes;
        float *d = dlogits + i * classes;
        float mx;
        double lse;
        row_stats(classes, x, &mx, &lse);
        /* softmax = exp(x - max) / sum, the sum being exp(lse). */
        float inv = (float)exp(-lse);
        dt__vexp_scale(classes, x, mx, inv, scale, d);
        float pl;
        dt__vexp_scale(1, x + labels[i], mx, inv, 1.0f, &pl);
        d[labels[i]] = scale * (pl - 1.0f);
    }
    return DT_OK;
}
