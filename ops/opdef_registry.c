/* ops/opdef_registry: (in progress) */
#include "ops/opdef_impl.h"
#include "runtime/error.h"

const dt_op *dt__op_builtin(const dt_op_def *def) { (void)def; return NULL; }
dt_status dt__op_run(const dt_op_def *def, const dt_tensor *const *in, int nin,
                     const dt_op_attrs *attrs, const dt_layout *layout, dt_tensor **out)
{
    (void)def; (void)in; (void)nin; (void)attrs; (void)layout; (void)out;
    return dt__error(DT_ERR_UNSUPPORTED, "op definitions: not built yet");
}
dt_status dt__op_run1(const dt_op_def *def, const dt_tensor *x, const dt_op_attrs *attrs,
                      dt_tensor **out)
{
    const dt_tensor *in[1] = {x};
    return dt__op_run(def, in, 1, attrs, NULL, out);
}
dt_status dt__op_run2(const dt_op_def *def, const dt_tensor *a, const dt_tensor *b,
                      const dt_op_attrs *attrs, dt_tensor **out)
{
    const dt_tensor *in[2] = {a, b};
    return dt__op_run(def, in, 2, attrs, NULL, out);
}
