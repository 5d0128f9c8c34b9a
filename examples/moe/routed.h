/* moe/routed: a routed mixture-of-experts layer (Mixtral / DeepSeek style) written with public
 * ops, the experts' grouped GEMM (dtensor/moe.h) and the ragged all-to-all
 * (dtensor/collective.h) over an expert-parallel mesh dim (docs/moe.md):
 *
 *   logits = x Wg [N, E];  scores = softmax(logits) or sigmoid(logits)
 *   experts of a token: top-k of scores + bias (bias: a non-grad buffer, DeepSeek-V3's
 *       auxiliary-loss-free balancing, updated by moe_bias_update after each step)
 *   gates = the chosen scores (unbiased), divided by their sum (norm_topk)
 *   capacity: per group of `group` consecutive tokens (a sequence), each expert takes at most
 *       ceil(group * topk * capacity_factor / E) of the group's choices, first choices of every
 *       token first, then second choices, ... in token order; the rest are dropped before the
 *       exchange (capacity_factor <= 0: dropless)
 *   dispatch: each member of the `ep_dim` line gathers its kept (token, choice) rows sorted by
 *       expert (experts are contiguous blocks of E / P per member), dt_alltoallv sends them to
 *       their experts' members, a gather puts the received rows expert-major
 *   experts: SwiGLU h = (silu(x W1[e]) * (x W3[e])) W2[e] by dt_grouped_matmul over the local
 *       experts (W1, W3 [E, C, F], W2 [E, F, C], dim 0 sharded over ep_dim)
 *   combine: the reverse gather and all-to-all, then y[t] = sum_k gate[t, k] h[t, k] in k order
 *   aux (balance MOE_BALANCE_AUX): aux_coeff * E * sum_e f_e p_e, f_e the fraction of the
 *       choices made for e, p_e the mean over tokens of the normalised scores of e (Switch);
 *       plus z_coeff * mean(logsumexp(logits)^2) (ST-MoE's z-loss) when z_coeff > 0.
 * Every token's output is computed by the same operations in the same order whichever member
 * holds it, so the layer's forward is bit-identical at every expert-parallel degree. The
 * routing decisions (small integer arrays) are made on the host of every client from the
 * gathered expert choices. */
#ifndef MOE_ROUTED_H
#define MOE_ROUTED_H

#include <stdint.h>

#include <dtensor/dtensor.h>

typedef enum moe_score { MOE_SCORE_SOFTMAX = 0, MOE_SCORE_SIGMOID = 1 } moe_score;
typedef enum moe_balance {
    MOE_BALANCE_NONE = 0,
    MOE_BALANCE_BIAS = 1, /* the bias buffer (auxiliary-loss-free) */
    MOE_BALANCE_AUX = 2,  /* the auxiliary load-balancing loss */
} moe_balance;

typedef struct moe_config {
    int64_t experts, topk, hidden; /* E, K, F */
    moe_score score;
    moe_balance balance;
    int norm_topk;          /* 1: gates divided by their sum over the k chosen */
    double capacity_factor; /* <= 0: dropless */
    int64_t group;          /* tokens per capacity group (a sequence); must divide N / P */
    double aux_coeff, z_coeff, bias_coeff;
    const char *ep_dim; /* the mesh dim sharding the experts ("batch"); absent: P = 1 */
    int64_t shards;     /* S > 0: the router's GEMM per batch shard, x as [S, N/S, C] and Wg
                         * entering by moe_per_shard (the same bits at every EP); 0: one GEMM */
} moe_config;
#define MOE_CONFIG_INIT                                                                            \
    {                                                                                              \
        4, 2, 0, MOE_SCORE_SOFTMAX, MOE_BALANCE_NONE, 1, 0.0, 0, 1e-2, 0.0, 1e-3, "batch", 0       \
    }

typedef struct moe_params {
    const dt_tensor *gate; /* Wg [C, E] (replicated) */
    const dt_tensor *w1;   /* [E, C, F] */
    const dt_tensor *w3;   /* [E, C, F] */
    const dt_tensor *w2;   /* [E, F, C] */
} moe_params;

/* What one call routed (the same on every client). */
typedef struct moe_route_stats {
    int64_t load[64];   /* kept (token, choice) pairs per expert (E <= 64) */
    int64_t chosen[64]; /* choices per expert before the capacity */
    int64_t assigned;   /* N * K */
    int64_t dropped;    /* pairs over capacity */
    int64_t max_recv;   /* the most rows a member received */
} moe_route_stats;

/* y [N, C] for x [N, C] (f32, dim 0 sharded over cfg->ep_dim, or replicated when P = 1);
 * bias [E] on the host (the same on every client; NULL: zeros); *aux_out (may be NULL) the
 * scalar auxiliary loss (NULL result when the balance is not MOE_BALANCE_AUX and z_coeff is
 * 0); stats (may be NULL) what was routed; choices (may be NULL) [N * K] i64 the experts
 * chosen. Recorded by a recording tape (every call is a public op). Collective. */
dt_status moe_routed_forward(const moe_config *cfg, const moe_params *p, const float *bias,
                             const dt_tensor *x, dt_tensor **y_out, dt_tensor **aux_out,
                             moe_route_stats *stats, int64_t *choices);

/* w as one copy per batch shard: out [S, 1 ..., w's shape] of rank `rank` (size-1 dims between
 * S and w's dims), dim 0 sharded over mesh dim `dim` (replicated when the mesh has no such
 * dim). Made by dt_expand to a replicated [S, ...] and dt_relayout to the sharded layout, so
 * the backward all-gathers the S copies' gradients and expand's backward sums all S of them in
 * f64 on every device, in S order, rounded once: the same function of the same S values on
 * every mesh (docs/moe.md, "The same bits at every EP degree"). Collective. */
dt_status moe_per_shard(const dt_tensor *w, int64_t S, const char *dim, int rank, dt_tensor **out);

/* Seconds spent by this process's moe_routed_forward calls in their phases (forward only):
 * routing (router, top-k, the host plan), dispatch (the gathers and the all-to-all before the
 * experts), experts, combine (back to the tokens, the weighted sum); reset != 0 zeroes them
 * after reading. Not thread-safe (bench/run moe). */
void moe_routed_timers(double *route, double *dispatch, double *experts_s, double *combine,
                       int reset);

/* DeepSeek-V3's update after a step: bias[e] += bias_coeff * sign(mean load - load[e]), then
 * the mean of bias subtracted (re-centred), in f32. Local. */
void moe_bias_update(const moe_config *cfg, const int64_t *load, float *bias);

#endif
