/* The loss scaler: none, static, or dynamic with DeepSpeed's DynamicLossScaler rules
 * (hysteresis, growth window, minimum scale); never raises at the minimum, it stays there. */
#include <math.h>

#include "optim/optim_impl.h"
#include "runtime/error.h"

dt_status dt__scaler_check(const char *fn, const dt_loss_scaler_opts *o)
{
    if (o->mode != DT_LOSS_SCALE_NONE && o->mode != DT_LOSS_SCALE_STATIC &&
        o->mode != DT_LOSS_SCALE_DYNAMIC)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "%s: scaler.mode %d is not a "
                         "dt_loss_scale_mode", fn, (int)o->mode);
    if (o->mode == DT_LOSS_SCALE_NONE)
        return DT_OK;
    if (!(o->init_scale > 0.0) || !isfinite(o->init_scale))
        return dt__error(DT_ERR_INVALID_ARGUMENT, "%s: scaler.init_scale %g must be positive "
                         "and finite", fn, o->init_scale);
    if (o->mode == DT_LOSS_SCALE_STATIC)
        return DT_OK;
    if (o->window < 1)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "%s: scaler.window %lld must be >= 1", fn,
                         (long long)o->window);
    if (o->hysteresis < 1)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "%s: scaler.hysteresis %d must be >= 1", fn,
                         o->hysteresis);
    if (!(o->min_scale > 0.0) || !isfinite(o->min_scale))
        return dt__error(DT_ERR_INVALID_ARGUMENT, "%s: scaler.min_scale %g must be positive "
                         "and finite", fn, o->min_scale);
    if (!(o->factor > 1.0) || !isfinite(o->factor))
        return dt__error(DT_ERR_INVALID_ARGUMENT, "%s: scaler.factor %g must be > 1 and "
                         "finite", fn, o->factor);
    return DT_OK;
}

void dt__scaler_init(dt__scaler *s, const dt_loss_scaler_opts *o)
{
    s->opts = *o;
    s->scale = o->mode == DT_LOSS_SCALE_NONE ? 1.0 : o->init_scale;
    s->iteration = 0;
    s->last_overflow = -1;
    s->hysteresis_left = o->mode == DT_LOSS_SCALE_DYNAMIC ? o->hysteresis : 1;
}

double dt__scaler_scale(const dt__scaler *s)
{
    return s->scale;
}

void dt__scaler_update(dt__scaler *s, int overflow)
{
    const dt_loss_scaler_opts *o = &s->opts;
    if (o->mode == DT_LOSS_SCALE_DYNAMIC) {
        if (overflow) {
            if (o->hysteresis == 1 || s->hysteresis_left == 1) {
                double next = s->scale / o->factor;
                s->scale = next > o->min_scale ? next : o->min_scale;
            } else {
                s->hysteresis_left -= 1;
            }
        } else {
            if (o->consecutive_hysteresis)
                s->hysteresis_left = o->hysteresis;
            if ((s->iteration - s->last_overflow) % o->window == 0) {
                if (!o->consecutive_hysteresis)
                    s->hysteresis_left = o->hysteresis;
                /* Never to infinity: an infinite scale would overflow forever. */
                if (isfinite(s->scale * o->factor))
                    s->scale *= o->factor;
            }
        }
    }
    if (overflow)
        s->last_overflow = s->iteration;
    s->iteration += 1;
}
