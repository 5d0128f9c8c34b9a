/* The routed mixture-of-experts layer (examples/moe/routed.c) against a host reference in
 * f64 written here (logits, softmax or sigmoid, top-k of scores + bias, capacity by first
 * choices first, SwiGLU experts, gate-weighted sum): the same experts chosen, the same
 * dropped pairs, outputs within f32 rounding; on 4 expert-parallel devices (`batch` = 4, one
 * expert each of 4) the one-device output bit for bit and its gradients to rounding; a member
 * receiving no tokens (every token routed to experts 0 and 1 by the bias); capacity dropping
 * (a token whose choices are all dropped gets 0); the layer inside a recomputed checkpoint
 * segment (the same gradients bit for bit); the bias update; with cfg.shards (the router's GEMM
 * per batch shard, the auxiliary and z-loss means over gathered rows) the auxiliary loss and
 * every gradient, the router's included, are the one-device bits at EP 4. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "../../examples/moe/routed.h"

#define NT 16 /* tokens */
#define C  6
#define E  4
#define F  5
#define K  2

static float hx[NT * C], hg[C * E], h1[E * C * F], h3[E * C * F], h2[E * F * C], hr[NT * C];

static void fill(uint64_t seed)
{
    uint64_t s = seed;
    float *arrs[6] = {hx, hg, h1, h3, h2, hr};
    int n[6] = {NT * C, C * E, E * C * F, E * C * F, E * F * C, NT * C};
    float sc[6] = {1.0f, 1.0f, 0.5f, 0.5f, 0.5f, 1.0f};
    for (int a = 0; a < 6; a++)
        for (int i = 0; i < n[a]; i++) {
            s = s * 6364136223846793005ULL + 1442695040888963407ULL;
            arrs[a][i] = sc[a] * (float)((double)(s >> 11) / 9007199254740992.0 * 2.0 - 1.0);
        }
}

/* The reference: y [NT, C], choices, kept pairs. */
static void reference(const moe_config *cfg, const float *bias, double *y, int64_t *ch, int *kept,
                      int64_t *dropped)
{
    double sc[NT][E], gate[NT][K];
    for (int t = 0; t < NT; t++) {
        double l[E], m = -INFINITY, z = 0;
        for (int e = 0; e < E; e++) {
            l[e] = 0;
            for (int c = 0; c < C; c++)
                l[e] += (double)hx[t * C + c] * hg[c * E + e];
            m = fmax(m, l[e]);
        }
        for (int e = 0; e < E; e++)
            z += exp(l[e] - m);
        for (int e = 0; e < E; e++)
            sc[t][e] = cfg->score == MOE_SCORE_SIGMOID ? 1 / (1 + exp(-l[e])) : exp(l[e] - m) / z;
        int used[E] = {0};
        double gs = 0;
        for (int k = 0; k < K; k++) {
            int best = -1;
            for (int e = 0; e < E; e++)
                if (!used[e] && (best < 0 || sc[t][e] + (bias ? bias[e] : 0) >
                                                 sc[t][best] + (bias ? bias[best] : 0)))
                    best = e;
            used[best] = 1;
            ch[t * K + k] = best;
            gate[t][k] = sc[t][best];
            gs += sc[t][best];
        }
        for (int k = 0; k < K && cfg->norm_topk; k++)
            gate[t][k] /= gs;
    }
    int64_t grp = cfg->group, cap = cfg->capacity_factor > 0
                                        ? (int64_t)ceil((double)grp * K * cfg->capacity_factor / E)
                                        : NT * K;
    *dropped = 0;
    for (int g0 = 0; g0 < NT; g0 += (int)grp) {
        int64_t used[E] = {0};
        for (int k = 0; k < K; k++)
            for (int t = g0; t < g0 + grp; t++) {
                int64_t e = ch[t * K + k];
                kept[t * K + k] = used[e] < cap;
                if (kept[t * K + k])
                    used[e]++;
                else
                    ++*dropped;
            }
    }
    for (int t = 0; t < NT; t++)
        for (int c = 0; c < C; c++)
            y[t * C + c] = 0;
    for (int t = 0; t < NT; t++)
        for (int k = 0; k < K; k++) {
            if (!kept[t * K + k])
                continue;
            int64_t e = ch[t * K + k];
            double u[F];
            for (int f = 0; f < F; f++) {
                double a = 0, b = 0;
                for (int c = 0; c < C; c++) {
                    a += (double)hx[t * C + c] * h1[(e * C + c) * F + f];
                    b += (double)hx[t * C + c] * h3[(e * C + c) * F + f];
                }
                u[f] = a / (1 + exp(-a)) * b;
            }
            for (int c = 0; c < C; c++) {
                double o = 0;
                for (int f = 0; f < F; f++)
                    o += u[f] * h2[(e * F + f) * C + c];
                y[t * C + c] += gate[t][k] * o;
            }
        }
}

typedef struct run_out {
    float y[NT * C];
    float grads[5][E * C * F]; /* x, gate, w1, w3, w2 */
    moe_route_stats st;
    int64_t ch[NT * K];
    int64_t recomputed; /* forward calls the backward re-ran */
    float aux;          /* the auxiliary loss (use_aux) */
} run_out;

static const int64_t shp[6][3] = {{NT, C}, {C, E}, {E, C, F}, {E, C, F}, {E, F, C}, {NT, C}};
static const int rk[6] = {2, 2, 3, 3, 3, 2};

static int use_checkpoint; /* 1: the layer runs inside a recomputed checkpoint segment */
static int use_aux;        /* 1: the auxiliary loss is added to the loss */

/* The layer on `ep` devices of a `batch` dim (1: one device), loss sum(y * R) backward. */
static void run_layer(const moe_config *cfg, const float *bias, int ep, run_out *o)
{
    const char *dn[1] = {"batch"};
    int64_t sz[1] = {ep};
    dt_mesh *mesh = NULL;
    DT_ASSERT_OK(dt_mesh_create(ep > 1 ? "ep" : "one", 1, dn, sz, DT_DEVICE_CPU, &mesh));
    if (dt_mesh_num_local_devices(mesh) == 0) { /* 4 processes of 2 devices: clients 2, 3 */
        dt_mesh_destroy(mesh);
        return;
    }
    /* tokens and experts sharded over batch, the router replicated */
    const char *spec[6] = {"batch", NULL, "batch", "batch", "batch", "batch"};
    float *src[6] = {hx, hg, h1, h3, h2, hr};
    dt_tensor *t[6] = {NULL};
    for (int i = 0; i < 6; i++) {
        const char *s[3] = {spec[i] ? spec[i] : DT_UNSHARDED, DT_UNSHARDED, DT_UNSHARDED};
        dt_layout *l = NULL;
        DT_ASSERT_OK(dt_layout_create(mesh, rk[i], s, &l));
        DT_ASSERT_OK(dt_tensor_from_host(l, DT_DTYPE_F32, shp[i], src[i], &t[i]));
        dt_layout_destroy(l);
    }
    dt_tape *tape = NULL;
    DT_ASSERT_OK(dt_tape_create(NULL, &tape));
    for (int i = 0; i < 5; i++)
        DT_ASSERT_OK(dt_tape_watch(tape, t[i], i));
    DT_ASSERT_OK(dt_tape_begin(tape));
    moe_params p = {t[1], t[2], t[3], t[4]};
    dt_tensor *y = NULL, *yr = NULL, *l = NULL, *aux = NULL;
    if (use_checkpoint)
        DT_ASSERT_OK(dt_tape_checkpoint_begin(tape, NULL));
    DT_ASSERT_OK(moe_routed_forward(cfg, &p, bias, t[0], &y, use_aux ? &aux : NULL, &o->st, o->ch));
    if (use_checkpoint)
        DT_ASSERT_OK(dt_tape_checkpoint_end(tape));
    DT_ASSERT_OK(dt_tensor_to_host(y, -1, o->y, sizeof o->y));
    DT_ASSERT_OK(dt_mul(y, t[5], NULL, &yr));
    DT_ASSERT_OK(dt_sum(yr, NULL, 0, 0, &l));
    if (aux) {
        dt_tensor *la = NULL;
        double av = 0;
        DT_ASSERT_OK(dt_item(aux, &av));
        o->aux = (float)av;
        DT_ASSERT_OK(dt_add(l, aux, NULL, &la));
        dt_tensor_destroy(l);
        dt_tensor_destroy(aux);
        l = la;
    }
    DT_ASSERT_OK(dt_tape_end(tape));
    dt_backward_opts bo = DT_BACKWARD_OPTS_INIT;
    DT_ASSERT_OK(dt_tape_backward(tape, l, NULL, 1.0f, &bo));
    dt_tape_stats ts;
    DT_ASSERT_OK(dt_tape_get_stats(tape, &ts));
    o->recomputed = ts.recomputed;
    for (int i = 0; i < 5; i++) {
        const dt_tensor *g = NULL;
        int64_t n = 1;
        for (int d = 0; d < rk[i]; d++)
            n *= shp[i][d];
        memset(o->grads[i], 0, sizeof o->grads[i]);
        if (dt_tape_grad(tape, i, &g) == DT_OK && g)
            DT_ASSERT_OK(dt_tensor_to_host(g, -1, o->grads[i], (size_t)n * sizeof(float)));
    }
    dt_tape_destroy(tape);
    dt_tensor_destroy(l);
    dt_tensor_destroy(yr);
    dt_tensor_destroy(y);
    for (int i = 0; i < 6; i++)
        dt_tensor_destroy(t[i]);
    dt_mesh_destroy(mesh);
}

static void check_against_reference(const moe_config *cfg, const float *bias, const run_out *o)
{
    double y[NT * C];
    int64_t ch[NT * K], dropped;
    int kept[NT * K];
    reference(cfg, bias, y, ch, kept, &dropped);
    CU_ASSERT_EQUAL(memcmp(ch, o->ch, sizeof ch), 0);
    CU_ASSERT_EQUAL(o->st.dropped, dropped);
    double worst = 0;
    for (int i = 0; i < NT * C; i++)
        worst = fmax(worst, fabs(y[i] - o->y[i]));
    if (!(worst < 1e-5))
        fprintf(stderr, "routed layer differs from the reference by %g\n", worst);
    CU_ASSERT(worst < 1e-5);
}

static void test_one_device_matches_the_reference_softmax_and_sigmoid(void)
{
    fill(7);
    if (dt_client_id() != 0)
        return;
    moe_config cfg = MOE_CONFIG_INIT;
    cfg.experts = E, cfg.topk = K, cfg.hidden = F, cfg.group = 8;
    run_out *o = calloc(1, sizeof *o);
    run_layer(&cfg, NULL, 1, o);
    check_against_reference(&cfg, NULL, o);
    CU_ASSERT_EQUAL(o->st.dropped, 0);
    cfg.score = MOE_SCORE_SIGMOID;
    float bias[E] = {0.05f, -0.02f, 0.1f, 0.0f};
    run_layer(&cfg, bias, 1, o);
    check_against_reference(&cfg, bias, o);
    free(o);
}

static void test_capacity_drops_later_choices_and_a_fully_dropped_token_gets_zero(void)
{
    fill(11);
    if (dt_client_id() != 0)
        return;
    moe_config cfg = MOE_CONFIG_INIT;
    cfg.experts = E, cfg.topk = K, cfg.hidden = F, cfg.group = 8;
    cfg.capacity_factor = 0.5; /* 2 pairs per expert per group of 8 tokens: 16 pairs, 8 kept */
    /* a large bias on experts 0 and 1: every token picks them, capacity 2 each per group */
    float bias[E] = {10.0f, 9.0f, 0.0f, 0.0f};
    run_out *o = calloc(1, sizeof *o);
    run_layer(&cfg, bias, 1, o);
    check_against_reference(&cfg, bias, o);
    CU_ASSERT_EQUAL(o->st.dropped, NT * K - 2 * 2 * (NT / 8));
    CU_ASSERT_EQUAL(o->st.load[0], 2 * (NT / 8));
    CU_ASSERT_EQUAL(o->st.load[2], 0);
    /* token 7 (the last of group 0) lost both choices: its output is 0 */
    for (int c = 0; c < C; c++)
        CU_ASSERT_EQUAL(o->y[7 * C + c], 0.0f);
    free(o);
}

static void ep_against_one(const moe_config *cfg, const float *bias)
{
    run_out *o1 = calloc(1, sizeof *o1), *o4 = calloc(1, sizeof *o4);
    if (dt_client_id() == 0)
        run_layer(cfg, bias, 1, o1);
    run_layer(cfg, bias, 4, o4);
    if (dt_client_id() == 0) {
        check_against_reference(cfg, bias, o4);
        CU_ASSERT_EQUAL(memcmp(o1->y, o4->y, sizeof o1->y), 0);
        CU_ASSERT_EQUAL(memcmp(o1->ch, o4->ch, sizeof o1->ch), 0);
        /* the experts' gradients: the same rows summed in the same order */
        for (int i = 2; i < 5; i++)
            CU_ASSERT_EQUAL(memcmp(o1->grads[i], o4->grads[i], sizeof o1->grads[i]), 0);
        /* x's: each row its own; the router's: the batch summed in another grouping */
        CU_ASSERT_EQUAL(memcmp(o1->grads[0], o4->grads[0], NT * C * sizeof(float)), 0);
        double worst = 0;
        for (int j = 0; j < C * E; j++)
            worst = fmax(worst, fabs((double)o1->grads[1][j] - o4->grads[1][j]));
        CU_ASSERT(worst < 1e-5);
    }
    free(o1);
    free(o4);
}

static void test_four_expert_parallel_devices_give_the_one_device_bits(void)
{
    if (dt_test_num_devices() < 4)
        return;
    fill(3);
    moe_config cfg = MOE_CONFIG_INIT;
    cfg.experts = E, cfg.topk = K, cfg.hidden = F, cfg.group = 4;
    ep_against_one(&cfg, NULL);
    cfg.capacity_factor = 1.0;
    ep_against_one(&cfg, NULL);
}

/* cfg.shards = 4 on the 4 x 4 tokens: the router's gradient and the auxiliary and z losses are
 * summed in the same order at EP 4 as on one device, so every output is the same bits. */
static void test_per_shard_router_and_aux_losses_give_the_one_device_bits(void)
{
    if (dt_test_num_devices() < 4)
        return;
    fill(7);
    moe_config cfg = MOE_CONFIG_INIT;
    cfg.experts = E, cfg.topk = K, cfg.hidden = F, cfg.group = 4, cfg.shards = 4;
    cfg.balance = MOE_BALANCE_AUX, cfg.aux_coeff = 0.1, cfg.z_coeff = 0.01;
    use_aux = 1;
    run_out *o1 = calloc(1, sizeof *o1), *o4 = calloc(1, sizeof *o4);
    if (dt_client_id() == 0)
        run_layer(&cfg, NULL, 1, o1);
    run_layer(&cfg, NULL, 4, o4);
    use_aux = 0;
    if (dt_client_id() == 0) {
        CU_ASSERT(o1->aux > 0.0f);
        CU_ASSERT_EQUAL(memcmp(&o1->aux, &o4->aux, sizeof o1->aux), 0);
        CU_ASSERT_EQUAL(memcmp(o1->y, o4->y, sizeof o1->y), 0);
        CU_ASSERT_EQUAL(memcmp(o1->grads, o4->grads, sizeof o1->grads), 0);
        double gmax = 0; /* the router's gradient is not all zero */
        for (int j = 0; j < C * E; j++)
            gmax = fmax(gmax, fabs((double)o1->grads[1][j]));
        CU_ASSERT(gmax > 0);
    }
    free(o1);
    free(o4);
}

static void test_members_receiving_no_tokens_neither_hang_nor_fail(void)
{
    if (dt_test_num_devices() < 4)
        return;
    fill(5);
    moe_config cfg = MOE_CONFIG_INIT;
    cfg.experts = E, cfg.topk = K, cfg.hidden = F, cfg.group = 4;
    float bias[E] = {10.0f, 9.0f, 0.0f, 0.0f}; /* members 2 and 3 get nothing */
    ep_against_one(&cfg, bias);
    /* every token to one expert (top 1): three members idle */
    cfg.topk = 1;
    run_out *o = calloc(1, sizeof *o);
    run_layer(&cfg, bias, 4, o);
    if (dt_client_id() == 0) {
        CU_ASSERT_EQUAL(o->st.load[0], NT);
        CU_ASSERT_EQUAL(o->st.max_recv, NT);
    }
    free(o);
}

/* Activation checkpointing: the layer's records keep only its inputs and are re-run in the
 * backward pass; the gradients are the plain run's bit for bit, on one device and at EP 4. */
static void test_checkpointed_layer_gives_the_same_gradients(void)
{
    fill(9);
    moe_config cfg = MOE_CONFIG_INIT;
    cfg.experts = E, cfg.topk = K, cfg.hidden = F, cfg.group = 4, cfg.capacity_factor = 1.0;
    for (int ep = 1; ep <= 4; ep *= 4) {
        if (ep > dt_test_num_devices() || (ep == 1 && dt_client_id() != 0))
            continue;
        run_out *a = calloc(1, sizeof *a), *b = calloc(1, sizeof *b);
        run_layer(&cfg, NULL, ep, a);
        use_checkpoint = 1;
        run_layer(&cfg, NULL, ep, b);
        use_checkpoint = 0;
        if (dt_client_id() == 0) {
            CU_ASSERT_EQUAL(a->recomputed, 0);
            CU_ASSERT(b->recomputed > 10);
            CU_ASSERT_EQUAL(memcmp(a->y, b->y, sizeof a->y), 0);
            CU_ASSERT_EQUAL(memcmp(a->grads, b->grads, sizeof a->grads), 0);
        }
        free(a);
        free(b);
    }
}

static void test_bias_update_moves_toward_the_mean_load_and_recentres(void)
{
    moe_config cfg = MOE_CONFIG_INIT;
    cfg.experts = 4;
    cfg.bias_coeff = 1e-3;
    float bias[4] = {0, 0, 0, 0};
    int64_t load[4] = {10, 2, 2, 2}; /* mean 4 */
    moe_bias_update(&cfg, load, bias);
    CU_ASSERT(bias[0] < 0 && bias[1] > 0);
    CU_ASSERT(fabs(bias[0] + bias[1] + bias[2] + bias[3]) < 1e-9);
    CU_ASSERT(fabs(bias[1] - bias[0] - 2e-3) < 1e-9);
}

int main(int argc, char **argv)
{
    static const dt_test_case cases[] = {
        DT_TEST(test_one_device_matches_the_reference_softmax_and_sigmoid),
        DT_TEST(test_capacity_drops_later_choices_and_a_fully_dropped_token_gets_zero),
        DT_TEST(test_four_expert_parallel_devices_give_the_one_device_bits),
        DT_TEST(test_per_shard_router_and_aux_losses_give_the_one_device_bits),
        DT_TEST(test_members_receiving_no_tokens_neither_hang_nor_fail),
        DT_TEST(test_checkpointed_layer_gives_the_same_gradients),
        DT_TEST(test_bias_update_moves_toward_the_mean_load_and_recentres),
        DT_TEST_END,
    };
    return dt_test_main(argc, argv, "moe_routed", cases, 1);
}
