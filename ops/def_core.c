/* ops/def_core: the definitions of the transformer ops that keep their own distributed
 * implementations (ops/spmd_*.c, with their fast kernels and present bits): one entry each
 * for the registry, the docs' table and the validator; dt_op_call reaches the public function
 * through the entry's spmd adapter, which records the call with its kind's rule (ops/rules*.c).
 * Attribute slots per op are listed in each adapter. add, sub and mul are the elem family's
 * (ops/def_elem*.c), which routes equal shapes to the same functions. */
#include <string.h>

#include "ops/opdef_impl.h"
#include "runtime/error.h"

/* Marks an op as differentiable for the validator: the op records itself with its kind, so
 * the tape never calls this. */
static dt_status self_recorded(const dt_op_grad *g)
{
    (void)g;
    return dt__error(DT_ERR_STATE, "internal: a self-recording op's backward was called");
}

static int64_t pick(uint64_t *s, int64_t lo, int64_t hi)
{
    *s = *s * UINT64_C(6364136223846793005) + UINT64_C(1442695040888963407);
    return lo + (int64_t)((*s >> 33) % (uint64_t)(hi - lo + 1));
}

static void shape(dt_op_shape *s, dt_dtype t, int rank, const int64_t *dims)
{
    s->dtype = t;
    s->rank = rank;
    for (int d = 0; d < rank; d++)
        s->dim[d] = dims[d];
}

/* Integer inputs (ids, labels) in 0..bound-1, where bound is input 0's first (embedding's
 * vocabulary) or last dim (the classes of a loss). */
static dt_status fill_ids(const dt_op_sig *sig, int i, uint64_t seed, void *host, int64_t n)
{
    if (sig->in[i].dtype != DT_DTYPE_I32)
        return DT_ERR_UNSUPPORTED;
    const dt_op_shape *s0 = &sig->in[0];
    int64_t bound = strcmp(dt_op_definition(sig->op)->name, "embedding") == 0
                        ? s0->dim[0] : s0->dim[s0->rank - 1];
    for (int64_t k = 0; k < n; k++)
        ((int32_t *)host)[k] = (int32_t)pick(&seed, 0, bound - 1);
    return DT_OK;
}

#define IN(k) in[k]
#define A(slot) (attrs->i[slot])
#define F(slot) ((float)attrs->f[slot])

/* ---- linear: matmul (i0 transa, i1 transb), matmul_nd (same), scale (f0 alpha), bias_add -- */

static dt_status matmul_spmd(const dt_tensor *const *in, int nin, const dt_op_attrs *attrs,
                             const dt_layout *layout, dt_tensor **out)
{
    (void)nin;
    return dt_matmul(IN(0), IN(1), (int)A(0), (int)A(1), layout, out);
}

static dt_status matmul_sample(uint64_t seed, int mx, dt_op_sig *sig, dt_op_attrs *attrs)
{
    (void)attrs;
    int64_t m = pick(&seed, 1, mx), k = pick(&seed, 1, mx), n = pick(&seed, 1, mx);
    sig->nin = 2;
    shape(&sig->in[0], DT_DTYPE_F32, 2, (int64_t[]){m, k});
    shape(&sig->in[1], DT_DTYPE_F32, 2, (int64_t[]){k, n});
    return DT_OK;
}

static dt_status matmul_nd_spmd(const dt_tensor *const *in, int nin, const dt_op_attrs *attrs,
                                const dt_layout *layout, dt_tensor **out)
{
    (void)nin;
    return dt_matmul_nd(IN(0), IN(1), (int)A(0), (int)A(1), layout, out);
}

static dt_status matmul_nd_sample(uint64_t seed, int mx, dt_op_sig *sig, dt_op_attrs *attrs)
{
    (void)attrs;
    int64_t b = pick(&seed, 1, mx), t = pick(&seed, 1, mx), k = pick(&seed, 1, mx),
            n = pick(&seed, 1, mx);
    sig->nin = 2;
    shape(&sig->in[0], DT_DTYPE_F32, 3, (int64_t[]){b, t, k});
    shape(&sig->in[1], DT_DTYPE_F32, 2, (int64_t[]){k, n});
    return DT_OK;
}

static dt_status scale_spmd(const dt_tensor *const *in, int nin, const dt_op_attrs *attrs,
                            const dt_layout *layout, dt_tensor **out)
{
    (void)nin;
    (void)layout;
    return dt_scale(IN(0), F(0), out);
}

/* One f32 input of rank 2 (rows, cols), attributes as given. */
static dt_status rows_sample(uint64_t seed, int mx, dt_op_sig *sig, dt_op_attrs *attrs)
{
    int64_t r = pick(&seed, 1, mx), c = pick(&seed, 1, mx);
    sig->nin = 1;
    shape(&sig->in[0], DT_DTYPE_F32, 2, (int64_t[]){r, c});
    attrs->f[0] = 1.5;
    return DT_OK;
}

static dt_status bias_add_spmd(const dt_tensor *const *in, int nin, const dt_op_attrs *attrs,
                               const dt_layout *layout, dt_tensor **out)
{
    (void)nin, (void)attrs, (void)layout;
    return dt_bias_add(IN(0), IN(1), out);
}

/* x [r, c] and nin - 1 vectors [c]. */
static dt_status rows_vec_sample(uint64_t seed, int mx, dt_op_sig *sig, dt_op_attrs *attrs,
                                 int nin)
{
    int64_t r = pick(&seed, 1, mx), c = pick(&seed, 1, mx);
    sig->nin = nin;
    shape(&sig->in[0], DT_DTYPE_F32, 2, (int64_t[]){r, c});
    for (int i = 1; i < nin; i++)
        shape(&sig->in[i], DT_DTYPE_F32, 1, (int64_t[]){c});
    attrs->f[0] = 1e-5;
    return DT_OK;
}

static dt_status bias_add_sample(uint64_t seed, int mx, dt_op_sig *sig, dt_op_attrs *attrs)
{
    return rows_vec_sample(seed, mx, sig, attrs, 2);
}

/* ---- normalisation, activations: layer_norm, rms_norm (f0 eps), softmax (i0 axis), gelu,
 * relu, swiglu, reduce (i0 op, i1 axis) ------------------------------------------------------ */

static dt_status layer_norm_spmd(const dt_tensor *const *in, int nin, const dt_op_attrs *attrs,
                                 const dt_layout *layout, dt_tensor **out)
{
    (void)nin, (void)layout;
    return dt_layer_norm(IN(0), IN(1), IN(2), F(0), out);
}

static dt_status layer_norm_sample(uint64_t seed, int mx, dt_op_sig *sig, dt_op_attrs *attrs)
{
    return rows_vec_sample(seed, mx, sig, attrs, 3);
}

static dt_status rms_norm_spmd(const dt_tensor *const *in, int nin, const dt_op_attrs *attrs,
                               const dt_layout *layout, dt_tensor **out)
{
    (void)nin, (void)layout;
    return dt_rms_norm(IN(0), IN(1), F(0), out);
}

static dt_status softmax_spmd(const dt_tensor *const *in, int nin, const dt_op_attrs *attrs,
                              const dt_layout *layout, dt_tensor **out)
{
    (void)nin, (void)layout;
    return dt_softmax(IN(0), (int)A(0), out);
}

static dt_status softmax_sample(uint64_t seed, int mx, dt_op_sig *sig, dt_op_attrs *attrs)
{
    rows_sample(seed, mx, sig, attrs);
    attrs->i[0] = pick(&seed, 0, 1) ? -1 : 0;
    return DT_OK;
}

static dt_status gelu_spmd(const dt_tensor *const *in, int nin, const dt_op_attrs *attrs,
                           const dt_layout *layout, dt_tensor **out)
{
    (void)nin, (void)attrs, (void)layout;
    return dt_gelu(IN(0), out);
}

static dt_status relu_spmd(const dt_tensor *const *in, int nin, const dt_op_attrs *attrs,
                           const dt_layout *layout, dt_tensor **out)
{
    (void)nin, (void)attrs, (void)layout;
    return dt_relu(IN(0), out);
}

/* relu's kink at 0 is avoided: |x| >= 0.05. */
static dt_status fill_away(const dt_op_sig *sig, int i, uint64_t seed, void *host, int64_t n)
{
    if (sig->in[i].dtype != DT_DTYPE_F32)
        return DT_ERR_UNSUPPORTED;
    for (int64_t k = 0; k < n; k++) {
        float v = (float)pick(&seed, 5, 100) / 100.0f;
        ((float *)host)[k] = pick(&seed, 0, 1) ? v : -v;
    }
    return DT_OK;
}

static dt_status swiglu_spmd(const dt_tensor *const *in, int nin, const dt_op_attrs *attrs,
                             const dt_layout *layout, dt_tensor **out)
{
    (void)nin, (void)attrs, (void)layout;
    return dt_swiglu(IN(0), IN(1), out);
}

static dt_status swiglu_sample(uint64_t seed, int mx, dt_op_sig *sig, dt_op_attrs *attrs)
{
    rows_sample(seed, mx, sig, attrs);
    sig->nin = 2;
    sig->in[1] = sig->in[0];
    return DT_OK;
}

static dt_status reduce_spmd(const dt_tensor *const *in, int nin, const dt_op_attrs *attrs,
                             const dt_layout *layout, dt_tensor **out)
{
    (void)nin;
    return dt_reduce(IN(0), (dt_reduce_op)A(0), (int)A(1), layout, out);
}

static dt_status reduce_sample(uint64_t seed, int mx, dt_op_sig *sig, dt_op_attrs *attrs)
{
    rows_sample(seed, mx, sig, attrs);
    attrs->i[0] = pick(&seed, 0, 1) ? DT_REDUCE_SUM : DT_REDUCE_AVG;
    attrs->i[1] = pick(&seed, 0, 2) == 2 ? DT_ALL_AXES : pick(&seed, 0, 1);
    return DT_OK;
}

/* ---- attention (i0 heads, i1 causal), attention_gqa (i0 heads, i1 kv_heads, i2 causal), rope
 * (i0 heads, i1 pos_offset) ------------------------------------------------------------------ */

static dt_status attention_spmd(const dt_tensor *const *in, int nin, const dt_op_attrs *attrs,
                                const dt_layout *layout, dt_tensor **out)
{
    (void)nin, (void)layout;
    return dt_attention(IN(0), IN(1), IN(2), A(0), (int)A(1), out);
}

static dt_status attention_gqa_spmd(const dt_tensor *const *in, int nin,
                                    const dt_op_attrs *attrs, const dt_layout *layout,
                                    dt_tensor **out)
{
    (void)nin, (void)layout;
    return dt_attention_gqa(IN(0), IN(1), IN(2), A(0), A(1), (int)A(2), out);
}

static dt_status attn_sample(uint64_t seed, int mx, dt_op_sig *sig, dt_op_attrs *attrs,
                             int gqa)
{
    int64_t b = pick(&seed, 1, 2), t = pick(&seed, 1, mx), h = 2, kvh = gqa ? 1 : 2,
            d = pick(&seed, 1, 3);
    sig->nin = 3;
    shape(&sig->in[0], DT_DTYPE_F32, 3, (int64_t[]){b, t, h * d});
    shape(&sig->in[1], DT_DTYPE_F32, 3, (int64_t[]){b, t, kvh * d});
    sig->in[2] = sig->in[1];
    attrs->i[0] = h;
    if (gqa) {
        attrs->i[1] = kvh;
        attrs->i[2] = pick(&seed, 0, 1);
    } else {
        attrs->i[1] = pick(&seed, 0, 1);
    }
    return DT_OK;
}

static dt_status attention_sample(uint64_t seed, int mx, dt_op_sig *sig, dt_op_attrs *attrs)
{
    return attn_sample(seed, mx, sig, attrs, 0);
}

static dt_status attention_gqa_sample(uint64_t seed, int mx, dt_op_sig *sig, dt_op_attrs *attrs)
{
    return attn_sample(seed, mx, sig, attrs, 1);
}

static dt_status rope_spmd(const dt_tensor *const *in, int nin, const dt_op_attrs *attrs,
                           const dt_layout *layout, dt_tensor **out)
{
    (void)nin, (void)layout;
    return dt_rope(IN(0), A(0), A(1), out);
}

static dt_status rope_sample(uint64_t seed, int mx, dt_op_sig *sig, dt_op_attrs *attrs)
{
    int64_t b = pick(&seed, 1, 2), t = pick(&seed, 1, mx), d = 2 * pick(&seed, 1, 2);
    sig->nin = 1;
    shape(&sig->in[0], DT_DTYPE_F32, 3, (int64_t[]){b, t, 2 * d});
    attrs->i[0] = 2;
    attrs->i[1] = pick(&seed, 0, 3);
    return DT_OK;
}

/* ---- embedding, losses (the layout argument passes through) -------------------------------- */

static dt_status embedding_spmd(const dt_tensor *const *in, int nin, const dt_op_attrs *attrs,
                                const dt_layout *layout, dt_tensor **out)
{
    (void)nin, (void)attrs;
    return dt_embedding(IN(0), IN(1), layout, out);
}

static dt_status embedding_sample(uint64_t seed, int mx, dt_op_sig *sig, dt_op_attrs *attrs)
{
    (void)attrs;
    int64_t v = pick(&seed, 1, mx), c = pick(&seed, 1, mx), b = pick(&seed, 1, mx),
            t = pick(&seed, 1, mx);
    sig->nin = 2;
    shape(&sig->in[0], DT_DTYPE_F32, 2, (int64_t[]){v, c});
    shape(&sig->in[1], DT_DTYPE_I32, 2, (int64_t[]){b, t});
    return DT_OK;
}

static dt_status vocab_xent_spmd(const dt_tensor *const *in, int nin, const dt_op_attrs *attrs,
                                 const dt_layout *layout, dt_tensor **out)
{
    (void)nin, (void)attrs;
    return dt_vocab_xent(IN(0), IN(1), layout, out);
}

static dt_status softmax_xent_spmd(const dt_tensor *const *in, int nin,
                                   const dt_op_attrs *attrs, const dt_layout *layout,
                                   dt_tensor **out)
{
    (void)nin, (void)attrs;
    return dt_softmax_xent(IN(0), IN(1), layout, out);
}

static dt_status xent_sample(uint64_t seed, int mx, dt_op_sig *sig, dt_op_attrs *attrs)
{
    (void)attrs;
    int64_t r = pick(&seed, 1, mx), c = pick(&seed, 1, mx);
    sig->nin = 2;
    shape(&sig->in[0], DT_DTYPE_F32, 2, (int64_t[]){r, c});
    shape(&sig->in[1], DT_DTYPE_I32, 1, (int64_t[]){r});
    return DT_OK;
}

/* ---- cast (i0 dtype), relayout (the layout argument): no sample (no single-device
 * reference to compare other than themselves) ------------------------------------------------ */

static dt_status cast_spmd(const dt_tensor *const *in, int nin, const dt_op_attrs *attrs,
                           const dt_layout *layout, dt_tensor **out)
{
    (void)nin, (void)layout;
    return dt_cast(IN(0), (dt_dtype)A(0), out);
}

static dt_status relayout_spmd(const dt_tensor *const *in, int nin, const dt_op_attrs *attrs,
                               const dt_layout *layout, dt_tensor **out)
{
    (void)nin, (void)attrs;
    if (!layout)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "relayout: dt_op_call needs the layout");
    return dt_relayout(IN(0), layout, out);
}

#define CORE(nm, n, r, fam, dc, fn, smp, fl, bw)                                             \
    static const dt_op_def def_##nm = {.name = #nm, .nin = n, .rule = r, .spmd = fn,         \
                                       .backward = bw, .reduce = DT_REDUCE_SUM,              \
                                       .family = fam, .doc = dc, .sample = smp, .fill = fl};

CORE(matmul, 2, "mk,kn->mn", "linear", "2-D product (transposes as attributes); row parallel "
     "leaves a partial output", matmul_spmd, matmul_sample, NULL, self_recorded)
CORE(matmul_nd, 2, "...k,kn->...n", "linear", "projection of [..., k] by [k, n], or batched "
     "products", matmul_nd_spmd, matmul_nd_sample, NULL, self_recorded)
CORE(scale, 1, "...->...", "unary", "alpha * x", scale_spmd, rows_sample, NULL, self_recorded)
CORE(bias_add, 2, "...c,c->...c", "binary", "x + bias over the last dim", bias_add_spmd,
     bias_add_sample, NULL, self_recorded)
CORE(layer_norm, 3, "...C,C,C->...C", "normalisation", "layer normalisation over the last dim",
     layer_norm_spmd, layer_norm_sample, NULL, self_recorded)
CORE(rms_norm, 2, "...C,C->...C", "normalisation", "RMS normalisation over the last dim",
     rms_norm_spmd, bias_add_sample, NULL, self_recorded)
CORE(softmax, 1, "...A->...A", "normalisation", "softmax along an axis (A: that axis, whole)",
     softmax_spmd, softmax_sample, NULL, self_recorded)
CORE(gelu, 1, "...->...", "unary", "GELU, tanh form", gelu_spmd, rows_sample, NULL,
     self_recorded)
CORE(relu, 1, "...->...", "unary", "max(x, 0)", relu_spmd, rows_sample, fill_away,
     self_recorded)
CORE(swiglu, 2, "...,...->...", "binary", "silu(gate) * up", swiglu_spmd, swiglu_sample, NULL,
     self_recorded)
CORE(reduce, 1, "...i->...", "reduction", "sum, max, min or mean over one axis or all",
     reduce_spmd, reduce_sample, NULL, self_recorded)
CORE(attention, 3, "bTh,bTh,bTh->bTh", "transformer", "causal or full self-attention, heads "
     "sharded; the sequence-sharded ring on CPU meshes", attention_spmd, attention_sample, NULL,
     self_recorded)
CORE(attention_gqa, 3, "bTh,bTg,bTg->bTh", "transformer", "grouped-query attention",
     attention_gqa_spmd, attention_gqa_sample, NULL, self_recorded)
CORE(rope, 1, "bth->bth", "transformer", "rotary position embeddings at global positions",
     rope_spmd, rope_sample, NULL, self_recorded)
CORE(embedding, 2, "vC,...->...C", "index", "table lookup; a vocabulary-sharded table gives "
     "a partial output", embedding_spmd, embedding_sample, fill_ids, self_recorded)
CORE(vocab_xent, 2, "...v,...->", "loss", "vocabulary-parallel cross-entropy (Megatron)",
     vocab_xent_spmd, xent_sample, fill_ids, self_recorded)
CORE(softmax_xent, 2, "...C,...->", "loss", "mean softmax cross-entropy, classes gathered",
     softmax_xent_spmd, xent_sample, fill_ids, self_recorded)
CORE(cast, 1, "...->...", "unary", "to another dtype", cast_spmd, NULL, NULL, self_recorded)
CORE(relayout, 1, "...->...", "layout", "to any layout (the layout argument)", relayout_spmd,
     NULL, NULL, self_recorded)

const dt_op_def *const dt__defs_core[] = {
    &def_matmul, &def_matmul_nd, &def_scale, &def_bias_add, &def_layer_norm, &def_rms_norm,
    &def_softmax, &def_gelu, &def_relu, &def_swiglu, &def_reduce, &def_attention,
    &def_attention_gqa, &def_rope, &def_embedding, &def_vocab_xent, &def_softmax_xent,
    &def_cast, &def_relayout, NULL};
