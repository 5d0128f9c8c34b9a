/* moe/layer: a soft-gated mixture-of-experts layer written with public ops and one op defined
 * here through dt_op_register (opdef.h): "moe.gate_combine", y[b, d] = sum_e g[b, e] h[b, e, d],
 * the gates' weighted sum of the experts' outputs, with its own CPU kernel, factor rule
 * ("be,bed->bd": a sharded expert dim leaves a partial sum) and backward (two einsums).
 *
 * The layer, for x [B, D], gate weights Wg [D, E], experts W1 [E, D, F] and W2 [E, F, D]:
 *   logits = x Wg                                   dt_einsum("bd,de->be")
 *   gates  = softmax(logits) over all E experts      dt_log_softmax, dt_exp
 *         or softmax over the k largest logits, 0 elsewhere (dt_topk, dt_one_hot, dt_einsum)
 *   h      = silu(x W1[e]) W2[e] for every expert    dt_einsum("bd,edf->bef"), dt_silu,
 *                                                    dt_einsum("bef,efd->bed")
 *   y      = moe.gate_combine(gates, h)              [B, D]
 * Every op takes f32 or f64. The experts are one [E, ...] parameter per projection, so
 * sharding E over a mesh dim is expert parallelism with no code of its own (docs/vit.md). */
#ifndef MOE_LAYER_H
#define MOE_LAYER_H

#include <stdint.h>

#include <dtensor/dtensor.h>

#define MOE_COMBINE_OP "moe.gate_combine"

/* Registers moe.gate_combine the first time (later calls, from any thread, find it) and hands
 * back its handle (lives until the process ends). dt_op_register's errors. Local. */
dt_status moe_combine_op(const dt_op **op_out);

/* y [B, D] = sum_e gates[b, e] h[b, e, d] (gates [B, E], h [B, E, D], f32 or f64 alike) by
 * dt_op_call of moe.gate_combine (recorded by a recording tape). The output layout is the
 * propagator's: partial (sum) over the mesh dim sharding E. Collective. */
dt_status moe_combine(const dt_tensor *gates, const dt_tensor *h, dt_tensor **y_out);

typedef struct moe_weights {
    const dt_tensor *gate; /* Wg [D, E] */
    const dt_tensor *w1;   /* [E, D, F] */
    const dt_tensor *w2;   /* [E, F, D] */
} moe_weights;

/* The gates [B, E] of x [B, D]: softmax of x Wg over all experts (k == E), or over the k
 * largest logits of each row with 0 for the other experts (1 <= k < E). Collective. */
dt_status moe_gates(const dt_tensor *x, const dt_tensor *gate, int64_t k, dt_tensor **gates_out);

/* The layer's output y [B, D] for x [B, D] with each row's k experts (k == E: all, soft).
 * Every call is a public op or moe.gate_combine, so a recording tape differentiates it.
 * Collective. */
dt_status moe_forward(const dt_tensor *x, const moe_weights *w, int64_t k, dt_tensor **y_out);

#endif
