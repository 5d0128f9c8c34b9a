/* ops/rules: the table of backward rules, one entry per op kind (docs/autograd.md,
 * "Adding an op"), and the kinds' names. */
#include "ops/opdef_impl.h"
#include "runtime/error.h"

static const struct {
    const char *name;
    const dt__ag_rule *rule;
} table[DT_OP_KIND_MAX_] = {
    [DT_OP_MATMUL] = {"matmul", &dt__ag_rule_matmul},
    [DT_OP_MATMUL_ND] = {"matmul_nd", &dt__ag_rule_matmul_nd},
    [DT_OP_ADD] = {"add", &dt__ag_rule_add},
    [DT_OP_SUB] = {"sub", &dt__ag_rule_sub},
    [DT_OP_MUL] = {"mul", &dt__ag_rule_mul},
    [DT_OP_SCALE] = {"scale", &dt__ag_rule_scale},
    [DT_OP_BIAS_ADD] = {"bias_add", &dt__ag_rule_bias_add},
    [DT_OP_LAYER_NORM] = {"layer_norm", &dt__ag_rule_layer_norm},
    [DT_OP_SOFTMAX] = {"softmax", &dt__ag_rule_softmax},
    [DT_OP_ATTENTION] = {"attention", &dt__ag_rule_attention},
    [DT_OP_EMBEDDING] = {"embedding", &dt__ag_rule_embedding},
    [DT_OP_VOCAB_XENT] = {"vocab_xent", &dt__ag_rule_vocab_xent},
    [DT_OP_SOFTMAX_XENT] = {"softmax_xent", &dt__ag_rule_softmax_xent},
    [DT_OP_GELU] = {"gelu", &dt__ag_rule_gelu},
    [DT_OP_RELU] = {"relu", &dt__ag_rule_relu},
    [DT_OP_CAST] = {"cast", &dt__ag_rule_cast},
    [DT_OP_RELAYOUT] = {"relayout", &dt__ag_rule_relayout},
    [DT_OP_REDUCE] = {"reduce", &dt__ag_rule_reduce},
    [DT_OP_RMS_NORM] = {"rms_norm", &dt__ag_rule_rms_norm},
    [DT_OP_ROPE] = {"rope", &dt__ag_rule_rope},
    [DT_OP_SWIGLU] = {"swiglu", &dt__ag_rule_swiglu},
    [DT_OP_ATTENTION_GQA] = {"attention_gqa", &dt__ag_rule_attention_gqa},
    [DT_OP_DEFINED] = {"defined", NULL}, /* each call hands its definition's rule */
};

const dt__ag_rule *dt__ag_rule_of(dt_op_kind kind)
{
    return (int)kind >= 0 && kind < DT_OP_KIND_MAX_ ? table[kind].rule : NULL;
}

const char *dt_op_kind_name(dt_op_kind kind)
{
    return (int)kind >= 0 && kind < DT_OP_KIND_MAX_ && table[kind].name ? table[kind].name
                                                                        : "unknown";
}

dt_status dt__ag_dy_scalar(const dt__ag_ctx *c, float *value_out)
{
    if (c->dy_is_seed) {
        *value_out = c->seed;
        return DT_OK;
    }
    /* A client holding none of the mesh has no local work: the value is never used. */
    if (dt_tensor_num_local(c->dy) == 0 &&
        dt_mesh_num_local_devices(dt_layout_mesh(dt_tensor_layout(c->dy))) == 0) {
        *value_out = 0.0f;
        return DT_OK;
    }
    if (dt_tensor_rank(c->dy) != 0)
        return dt__error(DT_ERR_SHAPE, "dt_tape_backward: the gradient of a loss must be rank 0");
    double v = 0;
    dt_status st = dt_item(c->dy, &v);
    if (st == DT_OK)
        *value_out = (float)v;
    return st;
}

dt_status dt__ag_dy_tensor(const dt__ag_ctx *c, const dt_tensor *like, const dt_tensor **dy_out,
                           dt_tensor **owned_out)
{
    *owned_out = NULL;
    if (!c->dy_is_seed) {
        *dy_out = c->dy;
        return DT_OK;
    }
    dt_layout *l = NULL;
    dt_status st = dt_layout_replicated(dt_layout_mesh(dt_tensor_layout(like)), 0, &l);
    if (st != DT_OK)
        return st;
    /* The seed in the root's dtype (an f64 loss gets an f64 seed). */
    dt_dtype t = dt_tensor_dtype(like);
    double seed64 = c->seed;
    if (t == DT_DTYPE_F64)
        st = dt_tensor_filled(l, t, NULL, &seed64, owned_out);
    else
        st = dt_tensor_filled(l, DT_DTYPE_F32, NULL, &c->seed, owned_out);
    dt_layout_destroy(l);
    if (st == DT_OK)
        *dy_out = *owned_out;
    return st;
}
