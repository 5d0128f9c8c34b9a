/* Tests of the tape's mechanics: a transformer block's gradients bit-identical to the
 * hand-written backward (examples/gpt's order), summing order, no-grad, detach, misuse,
 * accumulation, checkpointing, the grad-ready callback and the release of saved tensors (also
 * on a long-lived tape reset after each step). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "../ops/ops_test_util.h"

/* ---- helpers ---------------------------------------------------------------------------- */

static dt_tensor *real_tensor(const dt_layout *l, int rank, const int64_t *shape, float lo,
                              float hi, uint64_t seed)
{
    int64_t n = 1;
    for (int d = 0; d < rank; d++)
        n *= shape[d];
    float *h = malloc((size_t)n * sizeof *h);
    ot_fill_real(h, n, lo, hi, seed);
    dt_tensor *t = ot_tensor(l, DT_DTYPE_F32, shape, h);
    free(h);
    return t;
}

static float *fetch_f32(const dt_tensor *t)
{
    float *h = malloc((size_t)(dt_tensor_numel(t) > 0 ? dt_tensor_numel(t) : 1) * sizeof *h);
    ot_fetch(t, h);
    return h;
}

/* 1 when a and b hold the same values bit for bit (any layouts); else prints the first
 * difference unless quiet. */
static int same_bits_q(const dt_tensor *a, const dt_tensor *b, int quiet)
{
    if (!a || !b || dt_tensor_numel(a) != dt_tensor_numel(b))
        return 0;
    float *ha = fetch_f32(a), *hb = fetch_f32(b);
    int same = memcmp(ha, hb, (size_t)dt_tensor_numel(a) * sizeof *ha) == 0;
    if (!same && !quiet)
        for (int64_t i = 0; i < dt_tensor_numel(a); i++)
            if (memcmp(&ha[i], &hb[i], sizeof *ha) != 0) {
                fprintf(stderr, "[rank %d] element %lld: %.9g vs %.9g\n", dt_client_id(),
                        (long long)i, (double)ha[i], (double)hb[i]);
                break;
            }
    free(ha);
    free(hb);
    return same;
}

static int same_bits(const dt_tensor *a, const dt_tensor *b)
{
    return same_bits_q(a, b, 0);
}

/* ---- a transformer block against its hand-written backward ------------------------------ */

enum {
    P_WTE,
    P_G1,
    P_B1,
    P_WQ,
    P_WK,
    P_WV,
    P_WO,
    P_G2,
    P_B2,
    P_WFC,
    P_WFC2,
    P_GF,
    P_BF,
    P_WLM,
    NP
};

typedef struct block {
    dt_mesh *mesh;
    dt_layout *l_act, *l_col, *l_row, *l_rep1, *l_rep2, *l_ids, *l_vocab;
    dt_tensor *p[NP];
    dt_tensor *ids, *labels;
    int64_t B, T, C, H, V, F;
} block;

static void block_make(block *m)
{
    memset(m, 0, sizeof *m);
    m->mesh = ot_mesh_2d();
    m->B = 2, m->T = 4, m->C = 8, m->H = 2, m->V = 16, m->F = 16;
    const char *act[3] = {"b", DT_UNSHARDED, DT_UNSHARDED};
    DT_ASSERT_OK(dt_layout_create(m->mesh, 3, act, &m->l_act));
    m->l_col = dt_test_layout(m->mesh, 2, NULL, "m", NULL);
    m->l_row = dt_test_layout(m->mesh, 2, "m", NULL, NULL);
    m->l_vocab = dt_test_layout(m->mesh, 2, "m", NULL, NULL);
    DT_ASSERT_OK(dt_layout_replicated(m->mesh, 1, &m->l_rep1));
    m->l_rep2 = dt_test_layout(m->mesh, 2, NULL, NULL, NULL);
    m->l_ids = dt_test_layout(m->mesh, 2, "b", NULL, NULL);
    int64_t C = m->C, V = m->V, F = m->F;
    int64_t s_wte[2] = {V, C}, s_cc[2] = {C, C}, s_cf[2] = {C, F}, s_fc[2] = {F, C},
            s_cv[2] = {C, V}, s_c[1] = {C};
    m->p[P_WTE] = real_tensor(m->l_vocab, 2, s_wte, -1, 1, 1);
    m->p[P_WQ] = real_tensor(m->l_col, 2, s_cc, -0.5f, 0.5f, 2);
    m->p[P_WK] = real_tensor(m->l_col, 2, s_cc, -0.5f, 0.5f, 3);
    m->p[P_WV] = real_tensor(m->l_col, 2, s_cc, -0.5f, 0.5f, 4);
    m->p[P_WO] = real_tensor(m->l_row, 2, s_cc, -0.5f, 0.5f, 5);
    m->p[P_WFC] = real_tensor(m->l_col, 2, s_cf, -0.5f, 0.5f, 6);
    m->p[P_WFC2] = real_tensor(m->l_row, 2, s_fc, -0.5f, 0.5f, 7);
    m->p[P_WLM] = real_tensor(m->l_col, 2, s_cv, -0.5f, 0.5f, 8);
    m->p[P_G1] = real_tensor(m->l_rep1, 1, s_c, 0.5f, 1.5f, 9);
    m->p[P_B1] = real_tensor(m->l_rep1, 1, s_c, -0.5f, 0.5f, 10);
    m->p[P_G2] = real_tensor(m->l_rep1, 1, s_c, 0.5f, 1.5f, 11);
    m->p[P_B2] = real_tensor(m->l_rep1, 1, s_c, -0.5f, 0.5f, 12);
    m->p[P_GF] = real_tensor(m->l_rep1, 1, s_c, 0.5f, 1.5f, 13);
    m->p[P_BF] = real_tensor(m->l_rep1, 1, s_c, -0.5f, 0.5f, 14);
    int64_t s_bt[2] = {m->B, m->T};
    int32_t ids[8], labels[8];
    for (int i = 0; i < 8; i++) {
        ids[i] = (int32_t)((i * 5 + 3) % V);
        labels[i] = (int32_t)((i * 7 + 1) % V);
    }
    m->ids = ot_tensor(m->l_ids, DT_DTYPE_I32, s_bt, ids);
    m->labels = ot_tensor(m->l_ids, DT_DTYPE_I32, s_bt, labels);
}

static void block_free(block *m)
{
    for (int i = 0; i < NP; i++)
        dt_tensor_destroy(m->p[i]);
    dt_tensor_destroy(m->ids);
    dt_tensor_destroy(m->labels);
    dt_layout_destroy(m->l_act);
    dt_layout_destroy(m->l_col);
    dt_layout_destroy(m->l_row);
    dt_layout_destroy(m->l_rep1);
    dt_layout_destroy(m->l_rep2);
    dt_layout_destroy(m->l_ids);
    dt_layout_destroy(m->l_vocab);
    dt_mesh_destroy(m->mesh);
}

/* The forward pass's activations (kept for the hand-written backward). */
typedef struct acts {
    dt_tensor *x0, *a, *q, *k, *v, *y, *o, *x1, *b, *h, *g, *mo, *x2, *f, *logits, *loss;
} acts;

static void acts_free(acts *s)
{
    dt_tensor **t = (dt_tensor **)s;
    for (size_t i = 0; i < sizeof *s / sizeof *t; i++)
        dt_tensor_destroy(t[i]);
    memset(s, 0, sizeof *s);
}

/* The block's forward; with `ckpt`, the attention half and the MLP half are checkpoint
 * segments (opts given), and the intermediates are freed as a tape-based model would. */
static void block_forward(const block *m, acts *s, dt_tape *tape, const dt_checkpoint_opts *ckpt)
{
    dt_tensor *const *p = m->p;
    DT_ASSERT_OK(dt_embedding(p[P_WTE], m->ids, m->l_act, &s->x0));
    if (ckpt)
        DT_ASSERT_OK(dt_tape_checkpoint_begin(tape, ckpt));
    DT_ASSERT_OK(dt_layer_norm(s->x0, p[P_G1], p[P_B1], 1e-5f, &s->a));
    DT_ASSERT_OK(dt_matmul_nd(s->a, p[P_WQ], 0, 0, NULL, &s->q));
    DT_ASSERT_OK(dt_matmul_nd(s->a, p[P_WK], 0, 0, NULL, &s->k));
    DT_ASSERT_OK(dt_matmul_nd(s->a, p[P_WV], 0, 0, NULL, &s->v));
    DT_ASSERT_OK(dt_attention(s->q, s->k, s->v, m->H, 1, &s->y));
    DT_ASSERT_OK(dt_matmul_nd(s->y, p[P_WO], 0, 0, m->l_act, &s->o));
    DT_ASSERT_OK(dt_add(s->x0, s->o, m->l_act, &s->x1));
    if (ckpt) {
        DT_ASSERT_OK(dt_tape_checkpoint_end(tape));
        DT_ASSERT_OK(dt_tape_checkpoint_begin(tape, ckpt));
    }
    DT_ASSERT_OK(dt_layer_norm(s->x1, p[P_G2], p[P_B2], 1e-5f, &s->b));
    DT_ASSERT_OK(dt_matmul_nd(s->b, p[P_WFC], 0, 0, NULL, &s->h));
    DT_ASSERT_OK(dt_gelu(s->h, &s->g));
    DT_ASSERT_OK(dt_matmul_nd(s->g, p[P_WFC2], 0, 0, m->l_act, &s->mo));
    DT_ASSERT_OK(dt_add(s->x1, s->mo, m->l_act, &s->x2));
    if (ckpt)
        DT_ASSERT_OK(dt_tape_checkpoint_end(tape));
    DT_ASSERT_OK(dt_layer_norm(s->x2, p[P_GF], p[P_BF], 1e-5f, &s->f));
    DT_ASSERT_OK(dt_matmul_nd(s->f, p[P_WLM], 0, 0, NULL, &s->logits));
    DT_ASSERT_OK(dt_vocab_xent(s->logits, m->labels, NULL, &s->loss));
}

/* The hand-written backward, in examples/gpt/model.c's order and sums. */
static void block_backward_by_hand(const block *m, const acts *s, float dloss, dt_tensor **g)
{
    dt_tensor *const *p = m->p;
    dt_tensor *dlogits, *df, *dx2, *dg, *dh, *db, *dx1p, *dx1, *dy, *dq, *dk, *dv, *da[3];
    dt_tensor *das, *das2, *dx0p, *dx0;
    DT_ASSERT_OK(dt_vocab_xent_backward(s->logits, m->labels, dloss, &dlogits));
    DT_ASSERT_OK(dt_matmul_nd_backward(s->f, p[P_WLM], 0, 0, dlogits, NULL, NULL, &df, &g[P_WLM]));
    DT_ASSERT_OK(dt_layer_norm_backward(s->x2, p[P_GF], df, 1e-5f, &dx2, &g[P_GF], &g[P_BF]));
    DT_ASSERT_OK(dt_matmul_nd_backward(s->g, p[P_WFC2], 0, 0, dx2, NULL, NULL, &dg, &g[P_WFC2]));
    DT_ASSERT_OK(dt_gelu_backward(s->h, dg, &dh));
    DT_ASSERT_OK(dt_matmul_nd_backward(s->b, p[P_WFC], 0, 0, dh, NULL, NULL, &db, &g[P_WFC]));
    DT_ASSERT_OK(dt_layer_norm_backward(s->x1, p[P_G2], db, 1e-5f, &dx1p, &g[P_G2], &g[P_B2]));
    DT_ASSERT_OK(dt_add(dx2, dx1p, m->l_act, &dx1));
    DT_ASSERT_OK(dt_matmul_nd_backward(s->y, p[P_WO], 0, 0, dx1, NULL, NULL, &dy, &g[P_WO]));
    DT_ASSERT_OK(dt_attention_backward(s->q, s->k, s->v, m->H, 1, dy, &dq, &dk, &dv));
    dt_tensor *dqkv[3] = {dq, dk, dv};
    for (int j = 0; j < 3; j++)
        DT_ASSERT_OK(dt_matmul_nd_backward(s->a, p[P_WQ + j], 0, 0, dqkv[j], NULL, NULL, &da[j],
                                           &g[P_WQ + j]));
    DT_ASSERT_OK(dt_add(da[0], da[1], NULL, &das));
    DT_ASSERT_OK(dt_add(das, da[2], NULL, &das2));
    DT_ASSERT_OK(dt_layer_norm_backward(s->x0, p[P_G1], das2, 1e-5f, &dx0p, &g[P_G1], &g[P_B1]));
    DT_ASSERT_OK(dt_add(dx1, dx0p, m->l_act, &dx0));
    DT_ASSERT_OK(dt_embedding_backward(p[P_WTE], m->ids, dx0, NULL, &g[P_WTE]));
    dt_tensor *tmp[] = {dlogits, df, dx2,   dg,    dh,    db,  dx1p, dx1,  dy, dq,
                        dk,      dv, da[0], da[1], da[2], das, das2, dx0p, dx0};
    for (size_t i = 0; i < sizeof tmp / sizeof *tmp; i++)
        dt_tensor_destroy(tmp[i]);
}

typedef struct order_log {
    int n;
    int idx[64];
} order_log;

static dt_status log_grad(void *arg, int index, const dt_tensor *param, const dt_tensor *grad)
{
    order_log *o = arg;
    CU_ASSERT(param != NULL && grad != NULL);
    if (o->n < 64)
        o->idx[o->n++] = index;
    return DT_OK;
}

/* Records the block on a fresh tape and runs backward (seed 2, a loss scale); grads out. */
static void block_tape_grads(block *m, const dt_checkpoint_opts *ckpt, order_log *log,
                             dt_tensor **g, dt_tape_stats *stats)
{
    dt_tape *tape = NULL;
    DT_ASSERT_OK(dt_tape_create(NULL, &tape));
    for (int i = 0; i < NP; i++)
        DT_ASSERT_OK(dt_tape_watch(tape, m->p[i], i));
    acts s = {0};
    DT_ASSERT_OK(dt_tape_begin(tape));
    block_forward(m, &s, tape, ckpt);
    DT_ASSERT_OK(dt_tape_end(tape));
    dt_tensor *loss = dt_tensor_retain(s.loss);
    acts_free(&s); /* the tape keeps what it needs */
    dt_backward_opts bo = DT_BACKWARD_OPTS_INIT;
    bo.grad_fn = log_grad;
    bo.grad_arg = log;
    bo.require_all = 1;
    DT_ASSERT_OK(dt_tape_backward(tape, loss, NULL, 2.0f, &bo));
    if (stats)
        DT_ASSERT_OK(dt_tape_get_stats(tape, stats));
    for (int i = 0; i < NP; i++)
        DT_ASSERT_OK(dt_tape_take_grad(tape, i, &g[i]));
    dt_tensor_destroy(loss);
    dt_tape_destroy(tape);
}

static void test_block_gradients_match_the_hand_written_backward_bit_for_bit(void)
{
    block m;
    block_make(&m);
    acts s = {0};
    block_forward(&m, &s, NULL, NULL);
    dt_tensor *ref[NP] = {0}, *got[NP] = {0};
    block_backward_by_hand(&m, &s, 2.0f, ref);
    order_log log = {0};
    block_tape_grads(&m, NULL, &log, got, NULL);
    for (int i = 0; i < NP; i++) {
        CU_ASSERT_PTR_NOT_NULL_FATAL(got[i]);
        CU_ASSERT_EQUAL(dt_tensor_dtype(got[i]), DT_DTYPE_F32);
        if (!same_bits(got[i], ref[i]))
            fprintf(stderr, "[rank %d] parameter %d differs\n", dt_client_id(), i);
        CU_ASSERT(same_bits(got[i], ref[i]));
        /* Handed out as the explicit function gives it (e.g. still partial). */
        CU_ASSERT(dt_layout_equal(dt_tensor_layout(got[i]), dt_tensor_layout(ref[i])));
    }
    /* Reported once each, in the order the gradients became final. */
    static const int want[NP] = {P_WLM, P_GF, P_BF, P_WFC2, P_WFC, P_G2, P_B2,
                                 P_WO,  P_WV, P_WK, P_WQ,   P_G1,  P_B1, P_WTE};
    CU_ASSERT_EQUAL(log.n, NP);
    for (int i = 0; i < NP && i < log.n; i++)
        CU_ASSERT_EQUAL(log.idx[i], want[i]);
    for (int i = 0; i < NP; i++) {
        dt_tensor_destroy(ref[i]);
        dt_tensor_destroy(got[i]);
    }
    acts_free(&s);
    block_free(&m);
}

static void test_checkpointed_block_gives_the_same_gradients_and_keeps_less(void)
{
    block m;
    block_make(&m);
    dt_tensor *plain[NP] = {0}, *ck[NP] = {0}, *sel[NP] = {0}, *most[NP] = {0};
    order_log l1 = {0}, l2 = {0}, l3 = {0}, l4 = {0};
    dt_tape_stats s1, s2, s3, s4;
    block_tape_grads(&m, NULL, &l1, plain, &s1);
    dt_checkpoint_opts co = DT_CHECKPOINT_OPTS_INIT;
    block_tape_grads(&m, &co, &l2, ck, &s2);
    co.keep_ops = DT_OP_BIT(DT_OP_MATMUL_ND);
    block_tape_grads(&m, &co, &l3, sel, &s3);
    /* Every kind kept but the layer norms (as train_gpt --sequence-parallel keeps all but its
     * gathers and norms): the segment's end lets go of the kept outputs nothing reads (the
     * output projections', the residual adds'), so the tape holds less than the plain
     * recording, which keeps the layer norms' outputs for the matmuls; only the 2 layer norms
     * re-run. */
    co.keep_ops = ~DT_OP_BIT(DT_OP_LAYER_NORM);
    block_tape_grads(&m, &co, &l4, most, &s4);
    CU_ASSERT_EQUAL(s4.recomputed, 2);
    CU_ASSERT(s4.peak_saved_bytes < s1.peak_saved_bytes);
    for (int i = 0; i < NP; i++) {
        CU_ASSERT(same_bits(ck[i], plain[i]));
        CU_ASSERT(same_bits(sel[i], plain[i]));
        CU_ASSERT(same_bits(most[i], plain[i]));
        dt_tensor_destroy(most[i]);
    }
    /* Full checkpointing re-ran the calls whose outputs the backward reads: of the segments'
     * 7 + 5, not the output projections nor the residual adds (read only by the add, and by
     * nothing in the segment), so 5 + 3. Selective kept the 6 matmuls: the layer norms, the
     * attention and the gelu, 2 + 2. */
    CU_ASSERT_EQUAL(s1.recomputed, 0);
    CU_ASSERT_EQUAL(s2.recomputed, 8);
    CU_ASSERT_EQUAL(s3.recomputed, 4);
    /* Fewer bytes held at the end of the forward pass (the peak before backward). */
    CU_ASSERT(s2.peak_saved_bytes < s1.peak_saved_bytes);
    CU_ASSERT_EQUAL(l2.n, NP);
    CU_ASSERT_EQUAL(s2.saved_bytes, 0);
    for (int i = 0; i < NP; i++) {
        dt_tensor_destroy(plain[i]);
        dt_tensor_destroy(ck[i]);
        dt_tensor_destroy(sel[i]);
    }
    block_free(&m);
}

/* ---- summing ------------------------------------------------------------------------------ */

/* x used by three matmuls: the tape sums (g0 + g1) + g2, bit-identical to the explicit order. */
static void test_three_uses_sum_in_forward_order(void)
{
    dt_mesh *mesh = ot_mesh_1d();
    dt_layout *lb = dt_test_layout(mesh, 2, "x", NULL, NULL);
    dt_layout *lr = dt_test_layout(mesh, 2, NULL, NULL, NULL);
    int64_t sx[2] = {8, 6}, sw[2] = {6, 5};
    dt_tensor *x = real_tensor(lb, 2, sx, -1, 1, 21), *w[3];
    for (int j = 0; j < 3; j++)
        w[j] = real_tensor(lr, 2, sw, -1, 1, (uint64_t)(22 + j));
    dt_tensor *dys[3];
    int64_t sy[2] = {8, 5};
    for (int j = 0; j < 3; j++)
        dys[j] = real_tensor(lb, 2, sy, -1, 1, (uint64_t)(30 + j));
    dt_tape *tape = NULL;
    DT_ASSERT_OK(dt_tape_create(NULL, &tape));
    DT_ASSERT_OK(dt_tape_watch(tape, x, 0));
    DT_ASSERT_OK(dt_tape_begin(tape));
    dt_tensor *y[3], *s01 = NULL, *s = NULL;
    for (int j = 0; j < 3; j++)
        DT_ASSERT_OK(dt_matmul(x, w[j], 0, 0, NULL, &y[j]));
    /* loss-free: the root is y0 + y1 + y2 combined by mul with given gradients: instead, use
     * sum_j <y_j, dy_j> = reduce(sum(mul(y_j, dy_j))). */
    dt_tensor *m[3], *r[3];
    for (int j = 0; j < 3; j++) {
        DT_ASSERT_OK(dt_mul(y[j], dys[j], NULL, &m[j]));
        DT_ASSERT_OK(dt_reduce(m[j], DT_REDUCE_SUM, DT_ALL_AXES, NULL, &r[j]));
    }
    DT_ASSERT_OK(dt_add(r[0], r[1], NULL, &s01));
    DT_ASSERT_OK(dt_add(s01, r[2], NULL, &s));
    DT_ASSERT_OK(dt_tape_end(tape));
    DT_ASSERT_OK(dt_tape_backward(tape, s, NULL, 1.0f, NULL));
    const dt_tensor *g = NULL;
    DT_ASSERT_OK(dt_tape_grad(tape, 0, &g));
    CU_ASSERT_PTR_NOT_NULL_FATAL(g);
    /* By hand: dx_j = dy_j . w_j^T, then (dx0 + dx1) + dx2. */
    dt_tensor *dx[3], *h01 = NULL, *h = NULL, *other = NULL, *t01 = NULL;
    for (int j = 0; j < 3; j++)
        DT_ASSERT_OK(dt_matmul_backward(x, w[j], 0, 0, dys[j], NULL, NULL, &dx[j], NULL));
    DT_ASSERT_OK(dt_add(dx[0], dx[1], NULL, &h01));
    DT_ASSERT_OK(dt_add(h01, dx[2], NULL, &h));
    CU_ASSERT(same_bits(g, h));
    /* The other order rounds differently on these values: the test can tell them apart. */
    DT_ASSERT_OK(dt_add(dx[1], dx[2], NULL, &t01));
    DT_ASSERT_OK(dt_add(dx[0], t01, NULL, &other));
    CU_ASSERT(!same_bits_q(h, other, 1));
    dt_tensor *all[] = {x,     w[0],  w[1],  w[2], dys[0], dys[1], dys[2], y[0], y[1],
                        y[2],  m[0],  m[1],  m[2], r[0],   r[1],   r[2],   s01,  s,
                        dx[0], dx[1], dx[2], h01,  h,      other,  t01};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        dt_tensor_destroy(all[i]);
    dt_tape_destroy(tape);
    dt_layout_destroy(lb);
    dt_layout_destroy(lr);
    dt_mesh_destroy(mesh);
}

/* ---- small fixtures for the rest --------------------------------------------------------- */

typedef struct fix {
    dt_mesh *mesh;
    dt_layout *l;
    dt_tensor *w, *x;
} fix;

static void fix_make(fix *f)
{
    f->mesh = ot_mesh_1d();
    f->l = dt_test_layout(f->mesh, 2, NULL, NULL, NULL);
    int64_t s[2] = {4, 4};
    f->w = real_tensor(f->l, 2, s, -1, 1, 41);
    f->x = real_tensor(f->l, 2, s, -1, 1, 42);
}

static void fix_free(fix *f)
{
    dt_tensor_destroy(f->w);
    dt_tensor_destroy(f->x);
    dt_layout_destroy(f->l);
    dt_mesh_destroy(f->mesh);
}

/* loss = sum(x . w) recorded on tape; returns the loss (owned). */
static dt_tensor *small_loss(const fix *f, const dt_tensor *x, const dt_tensor *w)
{
    dt_tensor *y = NULL, *loss = NULL;
    DT_ASSERT_OK(dt_matmul(x, w, 0, 0, NULL, &y));
    DT_ASSERT_OK(dt_reduce(y, DT_REDUCE_SUM, DT_ALL_AXES, NULL, &loss));
    dt_tensor_destroy(y);
    (void)f;
    return loss;
}

static void test_no_grad_and_detach_stop_the_gradient(void)
{
    fix f;
    fix_make(&f);
    dt_tape *tape = NULL;
    DT_ASSERT_OK(dt_tape_create(NULL, &tape));
    DT_ASSERT_OK(dt_tape_watch(tape, f.w, 0));
    CU_ASSERT_FALSE(dt_grad_enabled());
    DT_ASSERT_OK(dt_tape_begin(tape));
    CU_ASSERT_TRUE(dt_grad_enabled());
    CU_ASSERT_PTR_EQUAL(dt_tape_current(), tape);
    dt_tensor *y = NULL, *z = NULL, *d = NULL, *e = NULL;
    dt_no_grad_begin();
    dt_no_grad_begin();
    DT_ASSERT_OK(dt_scale(f.w, 2.0f, &y));
    dt_no_grad_end();
    CU_ASSERT_FALSE(dt_grad_enabled());
    dt_no_grad_end();
    CU_ASSERT_TRUE(dt_grad_enabled());
    CU_ASSERT_FALSE(dt_tape_requires_grad(tape, y));
    DT_ASSERT_OK(dt_scale(f.w, 3.0f, &z));
    CU_ASSERT_TRUE(dt_tape_requires_grad(tape, z));
    DT_ASSERT_OK(dt_detach(z, &d));
    CU_ASSERT_FALSE(dt_tape_requires_grad(tape, d));
    dt_tape_stats st;
    DT_ASSERT_OK(dt_tape_get_stats(tape, &st));
    CU_ASSERT_EQUAL(st.nodes, 1); /* only the scale by 3 */
    CU_ASSERT(same_bits(d, z));   /* (its fetch records a relayout of z: harmless) */
    /* loss = sum(d * w): the gradient of w is d (through detach nothing flows to z). */
    DT_ASSERT_OK(dt_mul(d, f.w, NULL, &e));
    dt_tensor *loss = NULL;
    DT_ASSERT_OK(dt_reduce(e, DT_REDUCE_SUM, DT_ALL_AXES, NULL, &loss));
    DT_ASSERT_OK(dt_tape_backward(tape, loss, NULL, 1.0f, NULL));
    const dt_tensor *g = NULL;
    DT_ASSERT_OK(dt_tape_grad(tape, 0, &g));
    CU_ASSERT(same_bits(g, d));
    dt_tensor *all[] = {y, z, d, e, loss};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        dt_tensor_destroy(all[i]);
    dt_tape_destroy(tape);
    CU_ASSERT_PTR_NULL(dt_tape_current());
    fix_free(&f);
}

static void test_misuse_gives_clear_statuses(void)
{
    fix f;
    fix_make(&f);
    dt_tape *t1 = NULL, *t2 = NULL;
    DT_ASSERT_OK(dt_tape_create(NULL, &t1));
    DT_ASSERT_OK(dt_tape_create(NULL, &t2));
    DT_ASSERT_FAILS(dt_tape_create(NULL, NULL), DT_ERR_INVALID_ARGUMENT);
    DT_ASSERT_FAILS(dt_tape_watch(t1, f.w, -1), DT_ERR_INVALID_ARGUMENT);
    DT_ASSERT_OK(dt_tape_watch(t1, f.w, 0));
    DT_ASSERT_FAILS(dt_tape_watch(t1, f.w, 1), DT_ERR_INVALID_ARGUMENT);
    DT_ASSERT_OK(dt_tape_watch(t1, f.x, 1));
    DT_ASSERT_FAILS(dt_tape_backward(t1, f.w, NULL, 1, NULL), DT_ERR_STATE); /* no recording */
    DT_ASSERT_FAILS(dt_tape_end(t1), DT_ERR_STATE);
    DT_ASSERT_FAILS(dt_tape_checkpoint_end(t1), DT_ERR_STATE);
    DT_ASSERT_OK(dt_tape_begin(t1));
    DT_ASSERT_FAILS(dt_tape_begin(t2), DT_ERR_STATE);
    DT_ASSERT_FAILS(dt_tape_begin(t1), DT_ERR_STATE);
    DT_ASSERT_FAILS(dt_tape_reset(t1), DT_ERR_STATE);
    dt_tensor *loss = small_loss(&f, f.x, f.w), *y = NULL, *mx = NULL;
    DT_ASSERT_OK(dt_matmul(f.x, f.w, 0, 0, NULL, &y));
    DT_ASSERT_OK(dt_reduce(y, DT_REDUCE_MAX, DT_ALL_AXES, NULL, &mx)); /* no rule: recorded */
    DT_ASSERT_OK(dt_tape_checkpoint_begin(t1, NULL));
    DT_ASSERT_FAILS(dt_tape_checkpoint_begin(t1, NULL), DT_ERR_STATE);
    DT_ASSERT_FAILS(dt_tape_end(t1), DT_ERR_STATE);
    DT_ASSERT_FAILS(dt_tape_backward(t1, loss, NULL, 1, NULL), DT_ERR_STATE);
    DT_ASSERT_OK(dt_tape_checkpoint_end(t1));
    DT_ASSERT_OK(dt_tape_end(t1));
    /* Roots: NULL, non-scalar without grad, a tensor needing no grad, another tape's. */
    DT_ASSERT_FAILS(dt_tape_backward(t1, NULL, NULL, 1, NULL), DT_ERR_INVALID_ARGUMENT);
    DT_ASSERT_FAILS(dt_tape_backward(t1, y, NULL, 1, NULL), DT_ERR_SHAPE);
    dt_tensor *plain = NULL;
    DT_ASSERT_OK(dt_scale(f.x, 1.0f, &plain)); /* not recording now */
    DT_ASSERT_FAILS(dt_tape_backward(t1, plain, plain, 1, NULL), DT_ERR_INVALID_ARGUMENT);
    DT_ASSERT_OK(dt_tape_watch(t2, f.w, 0));
    DT_ASSERT_OK(dt_tape_begin(t2));
    dt_tensor *other = small_loss(&f, f.x, f.w);
    /* An input recorded on t1 used while t2 records. */
    dt_tensor *mixed = NULL;
    DT_ASSERT_FAILS(dt_scale(y, 2.0f, &mixed), DT_ERR_INVALID_ARGUMENT);
    CU_ASSERT_PTR_NULL(mixed);
    DT_ASSERT_OK(dt_tape_end(t2));
    DT_ASSERT_FAILS(dt_tape_backward(t1, other, NULL, 1, NULL), DT_ERR_INVALID_ARGUMENT);
    /* A gradient reaching an op without a rule. */
    DT_ASSERT_FAILS(dt_tape_backward(t1, mx, NULL, 1, NULL), DT_ERR_UNSUPPORTED);
    /* That consumed the recording: backward twice. */
    DT_ASSERT_FAILS(dt_tape_backward(t1, loss, NULL, 1, NULL), DT_ERR_STATE);
    /* require_all: x's gradient is missing when only w is used. */
    DT_ASSERT_OK(dt_tape_begin(t1));
    dt_tensor *wl = NULL;
    DT_ASSERT_OK(dt_reduce(f.w, DT_REDUCE_SUM, DT_ALL_AXES, NULL, &wl));
    DT_ASSERT_OK(dt_tape_end(t1));
    dt_backward_opts bo = DT_BACKWARD_OPTS_INIT;
    bo.require_all = 1;
    DT_ASSERT_FAILS(dt_tape_backward(t1, wl, NULL, 1, &bo), DT_ERR_STATE);
    CU_ASSERT(strstr(dt_last_error(), "index 1") != NULL);
    const dt_tensor *g = NULL;
    DT_ASSERT_FAILS(dt_tape_grad(t1, 7, &g), DT_ERR_INVALID_ARGUMENT);
    DT_ASSERT_OK(dt_tape_grad(t1, 1, &g));
    CU_ASSERT_PTR_NULL(g);
    DT_ASSERT_OK(dt_tape_grad(t1, 0, &g));
    CU_ASSERT_PTR_NOT_NULL(g);
    DT_ASSERT_FAILS(dt_detach(NULL, &mixed), DT_ERR_INVALID_ARGUMENT);
    dt_tensor *all[] = {loss, y, mx, plain, other, wl};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        dt_tensor_destroy(all[i]);
    dt_tape_destroy(t1);
    dt_tape_destroy(t2);
    fix_free(&f);
}

/* Two micro-batches (the halves of a batch) accumulate into the watched gradient: old + new. */
static void test_accumulation_adds_micro_batch_gradients(void)
{
    dt_mesh *mesh = ot_mesh_1d();
    dt_layout *lr = dt_test_layout(mesh, 2, NULL, NULL, NULL);
    int64_t sh[2] = {4, 6}, sw[2] = {6, 3};
    dt_tensor *xa = real_tensor(lr, 2, sh, -1, 1, 51), *xb = real_tensor(lr, 2, sh, -1, 1, 52);
    dt_tensor *w = real_tensor(lr, 2, sw, -1, 1, 53);
    dt_tape *tape = NULL;
    dt_tape_opts to = DT_TAPE_OPTS_INIT;
    to.accumulate = 1;
    DT_ASSERT_OK(dt_tape_create(&to, &tape));
    DT_ASSERT_OK(dt_tape_watch(tape, w, 0));
    dt_tensor *xs[2] = {xa, xb}, *ref[2] = {NULL, NULL};
    int64_t sy[2] = {4, 3};
    dt_tensor *dy = real_tensor(lr, 2, sy, -1, 1, 54);
    for (int k = 0; k < 2; k++) {
        DT_ASSERT_OK(dt_tape_begin(tape));
        dt_tensor *y = NULL;
        DT_ASSERT_OK(dt_matmul(xs[k], w, 0, 0, NULL, &y));
        DT_ASSERT_OK(dt_tape_end(tape));
        DT_ASSERT_OK(dt_tape_backward(tape, y, dy, 0.0f, NULL));
        DT_ASSERT_OK(dt_matmul_backward(xs[k], w, 0, 0, dy, NULL, NULL, NULL, &ref[k]));
        dt_tensor_destroy(y);
    }
    dt_tensor *sum = NULL;
    DT_ASSERT_OK(dt_add(ref[0], ref[1], NULL, &sum));
    const dt_tensor *g = NULL;
    DT_ASSERT_OK(dt_tape_grad(tape, 0, &g));
    CU_ASSERT(same_bits(g, sum));
    /* zero_grad starts again. */
    dt_tape_zero_grad(tape);
    DT_ASSERT_OK(dt_tape_grad(tape, 0, &g));
    CU_ASSERT_PTR_NULL(g);
    dt_tensor_destroy(sum);
    for (int k = 0; k < 2; k++)
        dt_tensor_destroy(ref[k]);
    dt_tensor_destroy(dy);
    dt_tensor_destroy(xa);
    dt_tensor_destroy(xb);
    dt_tensor_destroy(w);
    dt_tape_destroy(tape);
    dt_layout_destroy(lr);
    dt_mesh_destroy(mesh);
}

typedef struct live_log {
    dt_tape *tape;
    int n;
    uint64_t bytes[32];
    int64_t tensors[32];
    int64_t pending[32];
} live_log;

static void log_live(void *arg, int64_t node, dt_op_kind kind)
{
    live_log *l = arg;
    dt_tape_stats s;
    if (dt_tape_get_stats(l->tape, &s) == DT_OK && l->n < 32) {
        l->bytes[l->n] = s.saved_bytes;
        l->tensors[l->n] = s.saved_tensors;
        l->pending[l->n] = s.nodes_pending;
        l->n++;
    }
    (void)node;
    (void)kind;
}

/* relu(relu(x . w1) . w2): after each record's backward its saved tensors are gone. */
static void test_saved_tensors_are_released_after_each_backward(void)
{
    dt_mesh *mesh = ot_mesh_1d();
    dt_layout *lr = dt_test_layout(mesh, 2, NULL, NULL, NULL);
    int64_t s[2] = {4, 4};
    dt_tensor *x = real_tensor(lr, 2, s, -1, 1, 61), *w1 = real_tensor(lr, 2, s, -1, 1, 62);
    dt_tensor *w2 = real_tensor(lr, 2, s, -1, 1, 63), *dy = real_tensor(lr, 2, s, -1, 1, 64);
    dt_tape *tape = NULL;
    DT_ASSERT_OK(dt_tape_create(NULL, &tape));
    DT_ASSERT_OK(dt_tape_watch(tape, w1, 0));
    DT_ASSERT_OK(dt_tape_watch(tape, w2, 1));
    DT_ASSERT_OK(dt_tape_begin(tape));
    dt_tensor *h = NULL, *r = NULL, *o = NULL, *y = NULL;
    DT_ASSERT_OK(dt_matmul(x, w1, 0, 0, NULL, &h));
    DT_ASSERT_OK(dt_relu(h, &r));
    DT_ASSERT_OK(dt_matmul(r, w2, 0, 0, NULL, &o));
    DT_ASSERT_OK(dt_relu(o, &y));
    DT_ASSERT_OK(dt_tape_end(tape));
    dt_tensor_destroy(h);
    dt_tensor_destroy(r);
    dt_tensor_destroy(o);
    dt_tape_stats st;
    DT_ASSERT_OK(dt_tape_get_stats(tape, &st));
    /* x, w1, h, r, w2, o: six distinct tensors of 16 floats on every local device. */
    uint64_t one = 16 * sizeof(float) * (uint64_t)dt_mesh_num_local_devices(mesh);
    CU_ASSERT_EQUAL(st.nodes, 4);
    CU_ASSERT_EQUAL(st.saved_tensors, 6);
    CU_ASSERT_EQUAL(st.saved_bytes, 6 * one);
    live_log l = {tape, 0, {0}, {0}, {0}};
    dt_backward_opts bo = DT_BACKWARD_OPTS_INIT;
    bo.node_fn = log_live;
    bo.node_arg = &l;
    DT_ASSERT_OK(dt_tape_backward(tape, y, dy, 0, &bo));
    CU_ASSERT_EQUAL_FATAL(l.n, 4);
    /* After relu(o): o gone; after matmul(r, w2): r, w2 gone; relu(h): h; matmul: x, w1. */
    const int64_t want_t[4] = {5, 3, 2, 0};
    for (int i = 0; i < 4; i++) {
        CU_ASSERT_EQUAL(l.tensors[i], want_t[i]);
        CU_ASSERT_EQUAL(l.bytes[i], (uint64_t)want_t[i] * one);
        CU_ASSERT_EQUAL(l.pending[i], 3 - i);
    }
    DT_ASSERT_OK(dt_tape_get_stats(tape, &st));
    CU_ASSERT_EQUAL(st.peak_saved_bytes, 6 * one);
    CU_ASSERT_EQUAL(st.grad_tensors, 2); /* only the two watched gradients remain */
    dt_tensor *all[] = {x, w1, w2, dy, y};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        dt_tensor_destroy(all[i]);
    dt_tape_destroy(tape);
    dt_layout_destroy(lr);
    dt_mesh_destroy(mesh);
}

typedef struct unit_log {
    dt_tape *tape;
    dt_tensor *fresh; /* the "gathered again" weight */
    int calls[4];
    int order[8], n;
} unit_log;

static dt_status unit_hook(void *arg, int id, dt_segment_phase phase)
{
    unit_log *u = arg;
    if (u->n < 8)
        u->order[u->n++] = id * 10 + (int)phase;
    /* ZeRO stage 3 style: before the segment's backward, rebind index 0 to a new tensor. */
    if (phase == DT_SEGMENT_PRE && id == 1)
        return dt_tape_watch(u->tape, u->fresh, 0);
    return DT_OK;
}

/* Hooks run PRE then POST around each segment's backward, last segment first; a segment that
 * borrows watched tensors holds none of them and uses the one rebound in its PRE hook. */
static void test_segment_hooks_run_around_backward_and_can_rebind(void)
{
    fix f;
    fix_make(&f);
    dt_tape *tape = NULL;
    DT_ASSERT_OK(dt_tape_create(NULL, &tape));
    unit_log u = {tape, NULL, {0}, {0}, 0};
    DT_ASSERT_OK(dt_scale(f.w, 2.0f, &u.fresh)); /* "gathered again", other values */
    DT_ASSERT_OK(dt_tape_watch(tape, f.w, 0));
    DT_ASSERT_OK(dt_tape_watch(tape, f.x, 1));
    DT_ASSERT_OK(dt_tape_begin(tape));
    dt_checkpoint_opts co = DT_CHECKPOINT_OPTS_INIT;
    co.hook = unit_hook;
    co.hook_arg = &u;
    co.id = 1;
    co.borrow_watched = 1;
    DT_ASSERT_OK(dt_tape_checkpoint_begin(tape, &co));
    dt_tensor *y = NULL, *z = NULL;
    DT_ASSERT_OK(dt_matmul(f.x, f.w, 0, 0, NULL, &y));
    DT_ASSERT_OK(dt_tape_checkpoint_end(tape));
    co.id = 2;
    co.recompute = 0;
    co.borrow_watched = 0;
    DT_ASSERT_OK(dt_tape_checkpoint_begin(tape, &co));
    DT_ASSERT_OK(dt_gelu(y, &z));
    DT_ASSERT_OK(dt_tape_checkpoint_end(tape));
    DT_ASSERT_OK(dt_tape_end(tape));
    dt_tape_stats st;
    DT_ASSERT_OK(dt_tape_get_stats(tape, &st));
    CU_ASSERT_EQUAL(st.saved_tensors, 1); /* y, for gelu; nothing of the borrowed matmul */
    int64_t s[2] = {4, 4};
    dt_tensor *dz = real_tensor(f.l, 2, s, -1, 1, 71);
    DT_ASSERT_OK(dt_tape_backward(tape, z, dz, 0, NULL));
    CU_ASSERT_EQUAL_FATAL(u.n, 4);
    CU_ASSERT_EQUAL(u.order[0], 20);
    CU_ASSERT_EQUAL(u.order[1], 21);
    CU_ASSERT_EQUAL(u.order[2], 10);
    CU_ASSERT_EQUAL(u.order[3], 11);
    /* dx used the rebound weight; both land under their indices. */
    const dt_tensor *gw = NULL, *gx = NULL;
    DT_ASSERT_OK(dt_tape_grad(tape, 0, &gw));
    DT_ASSERT_OK(dt_tape_grad(tape, 1, &gx));
    dt_tensor *dyy = NULL, *rx = NULL, *rw = NULL;
    DT_ASSERT_OK(dt_gelu_backward(y, dz, &dyy));
    DT_ASSERT_OK(dt_matmul_backward(f.x, u.fresh, 0, 0, dyy, NULL, NULL, &rx, &rw));
    CU_ASSERT(same_bits(gx, rx));
    CU_ASSERT(same_bits(gw, rw));
    dt_tensor *all[] = {y, z, dz, dyy, rx, rw, u.fresh};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        dt_tensor_destroy(all[i]);
    dt_tape_destroy(tape);
    fix_free(&f);
}

/* ---- a long-lived tape: each step releases what it recorded ------------------------------- */

/* A zero-copy alias of a tensor whose components count their release: the alias's memory is
 * let go (count += its local components) only when its last reference is dropped. */
typedef struct probe {
    DLManagedTensor self;
    DLManagedTensor *inner;
    int *count;
} probe;

static void probe_delete(DLManagedTensor *self)
{
    probe *p = self->manager_ctx;
    if (p->inner->deleter)
        p->inner->deleter(p->inner);
    (*p->count)++;
    free(p);
}

static dt_tensor *probe_of(const dt_tensor *t, int *count)
{
    int n = dt_tensor_num_local(t);
    DLManagedTensor *inner[8], *outer[8];
    CU_ASSERT_FATAL(n >= 1 && n <= 8);
    DT_ASSERT_OK(dt_tensor_unpack(t, n, inner));
    for (int i = 0; i < n; i++) {
        probe *p = calloc(1, sizeof *p);
        CU_ASSERT_PTR_NOT_NULL_FATAL(p);
        p->inner = inner[i];
        p->count = count;
        p->self.dl_tensor = inner[i]->dl_tensor;
        p->self.manager_ctx = p;
        p->self.deleter = probe_delete;
        outer[i] = &p->self;
    }
    dt_tensor *out = NULL;
    DT_ASSERT_OK(dt_tensor_pack_managed(dt_tensor_layout(t), dt_tensor_shape(t), n, outer, &out));
    return out;
}

/* examples/gpt2's pattern, reduced: a tied table W used by dt_embedding and by the head
 * (dt_matmul_nd, transb), bias_add outputs feeding dt_attention, dt_vocab_xent; one tape for
 * every step, dt_tape_backward without grad_fn, dt_tape_take_grad, dt_tape_reset, then the
 * outputs destroyed. Each step's gradients are the explicit calls' bit for bit, the tape is
 * empty after the reset, and the tensors it saved (ids, labels, v) are released with the
 * caller's last reference; the watched W only when the tape goes. */
static void test_a_long_lived_tape_releases_each_step_after_reset(void)
{
    enum { B = 2, T = 4, C = 8, H = 2, V = 16, STEPS = 3 };
    dt_mesh *mesh = ot_mesh_1d();
    dt_layout *l1 = NULL, *l2 = dt_test_layout(mesh, 2, NULL, NULL, NULL), *l3 = NULL;
    DT_ASSERT_OK(dt_layout_replicated(mesh, 1, &l1));
    DT_ASSERT_OK(dt_layout_replicated(mesh, 3, &l3));
    int64_t s_w[2] = {V, C}, s_c[1] = {C}, s_bt[2] = {B, T}, s_btc[3] = {B, T, C};
    int freed_w = 0, freed = 0;
    dt_tensor *w0 = real_tensor(l2, 2, s_w, -1, 1, 71);
    dt_tensor *w = probe_of(w0, &freed_w);
    dt_tensor_destroy(w0);
    dt_tensor *bq = real_tensor(l1, 1, s_c, -0.5f, 0.5f, 72);
    dt_tensor *bk = real_tensor(l1, 1, s_c, -0.5f, 0.5f, 73);
    dt_tensor *v0 = real_tensor(l3, 3, s_btc, -1, 1, 74);
    int32_t hids[B * T], hlab[B * T];
    for (int i = 0; i < B * T; i++) {
        hids[i] = (int32_t)((i * 5 + 3) % V);
        hlab[i] = (int32_t)((i * 7 + 1) % V);
    }
    dt_tensor *ids0 = ot_tensor(l2, DT_DTYPE_I32, s_bt, hids);
    dt_tensor *lab0 = ot_tensor(l2, DT_DTYPE_I32, s_bt, hlab);
    int nl = dt_tensor_num_local(ids0);

    /* The explicit calls: the reference gradients of W, bq, bk. */
    dt_tensor *ref[3] = {NULL, NULL, NULL};
    {
        dt_tensor *e, *q, *k, *att, *logits, *loss, *dlogits, *datt, *dw1, *dq, *dk, *dv, *de,
            *dw0;
        DT_ASSERT_OK(dt_embedding(w, ids0, l3, &e));
        DT_ASSERT_OK(dt_bias_add(e, bq, &q));
        DT_ASSERT_OK(dt_bias_add(e, bk, &k));
        DT_ASSERT_OK(dt_attention(q, k, v0, H, 1, &att));
        DT_ASSERT_OK(dt_matmul_nd(att, w, 0, 1, NULL, &logits));
        DT_ASSERT_OK(dt_vocab_xent(logits, lab0, NULL, &loss));
        DT_ASSERT_OK(dt_vocab_xent_backward(logits, lab0, 1.0f, &dlogits));
        DT_ASSERT_OK(dt_matmul_nd_backward(att, w, 0, 1, dlogits, NULL, NULL, &datt, &dw1));
        DT_ASSERT_OK(dt_attention_backward(q, k, v0, H, 1, datt, &dq, &dk, &dv));
        DT_ASSERT_OK(dt_bias_grad(dq, NULL, &ref[1]));
        DT_ASSERT_OK(dt_bias_grad(dk, NULL, &ref[2]));
        DT_ASSERT_OK(dt_add(dq, dk, NULL, &de)); /* e's uses in forward order */
        DT_ASSERT_OK(dt_embedding_backward(w, ids0, de, NULL, &dw0));
        DT_ASSERT_OK(dt_add(dw0, dw1, NULL, &ref[0])); /* W: the embedding first */
        dt_tensor *tmp[] = {e,  q,    k,  att, logits, loss, dlogits, datt,
                            dw1, dq, dk, dv, de,     dw0};
        for (size_t i = 0; i < sizeof tmp / sizeof *tmp; i++)
            dt_tensor_destroy(tmp[i]);
    }

    dt_tape_opts to = DT_TAPE_OPTS_INIT;
    to.accumulate = 0;
    dt_tape *tape = NULL;
    DT_ASSERT_OK(dt_tape_create(&to, &tape));
    for (int s = 0; s < STEPS; s++) {
        /* Fresh aliases each step, so that their release can be seen. */
        dt_tensor *ids = probe_of(ids0, &freed), *lab = probe_of(lab0, &freed);
        dt_tensor *v = probe_of(v0, &freed);
        DT_ASSERT_OK(dt_tape_watch(tape, w, 0));
        DT_ASSERT_OK(dt_tape_watch(tape, bq, 1));
        DT_ASSERT_OK(dt_tape_watch(tape, bk, 2));
        DT_ASSERT_OK(dt_tape_begin(tape));
        dt_tensor *e = NULL, *q = NULL, *k = NULL, *att = NULL, *logits = NULL, *loss = NULL;
        DT_ASSERT_OK(dt_embedding(w, ids, l3, &e));
        DT_ASSERT_OK(dt_bias_add(e, bq, &q));
        DT_ASSERT_OK(dt_bias_add(e, bk, &k));
        DT_ASSERT_OK(dt_attention(q, k, v, H, 1, &att));
        DT_ASSERT_OK(dt_matmul_nd(att, w, 0, 1, NULL, &logits));
        DT_ASSERT_OK(dt_vocab_xent(logits, lab, NULL, &loss));
        DT_ASSERT_OK(dt_tape_end(tape));
        DT_ASSERT_OK(dt_tape_backward(tape, loss, NULL, 1.0f, NULL));
        dt_tensor *g[3] = {NULL, NULL, NULL};
        for (int i = 0; i < 3; i++)
            DT_ASSERT_OK(dt_tape_take_grad(tape, i, &g[i]));
        DT_ASSERT_OK(dt_tape_reset(tape));
        dt_tape_stats st;
        DT_ASSERT_OK(dt_tape_get_stats(tape, &st));
        CU_ASSERT_EQUAL(st.nodes, 0);
        CU_ASSERT_EQUAL(st.saved_tensors, 0);
        CU_ASSERT_EQUAL(st.grad_tensors, 0);
        dt_tensor *outs[] = {e, q, k, att, logits, loss, ids, lab, v};
        for (size_t i = 0; i < sizeof outs / sizeof *outs; i++)
            dt_tensor_destroy(outs[i]);
        /* Nothing of this step holds ids, labels or v any more. */
        CU_ASSERT_EQUAL(freed, 3 * nl * (s + 1));
        for (int i = 0; i < 3; i++) {
            CU_ASSERT_PTR_NOT_NULL_FATAL(g[i]);
            CU_ASSERT(same_bits(g[i], ref[i]));
            dt_tensor_destroy(g[i]);
        }
    }
    dt_tensor_destroy(w);
    CU_ASSERT_EQUAL(freed_w, 0); /* still watched */
    dt_tape_destroy(tape);
    CU_ASSERT_EQUAL(freed_w, nl);
    dt_tensor *all[] = {bq, bk, v0, ids0, lab0, ref[0], ref[1], ref[2]};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        dt_tensor_destroy(all[i]);
    dt_layout_destroy(l1);
    dt_layout_destroy(l2);
    dt_layout_destroy(l3);
    dt_mesh_destroy(mesh);
}

int main(int argc, char **argv)
{
    static const dt_test_case cases[] = {
        DT_TEST(test_block_gradients_match_the_hand_written_backward_bit_for_bit),
        DT_TEST(test_checkpointed_block_gives_the_same_gradients_and_keeps_less),
        DT_TEST(test_three_uses_sum_in_forward_order),
        DT_TEST(test_no_grad_and_detach_stop_the_gradient),
        DT_TEST(test_misuse_gives_clear_statuses),
        DT_TEST(test_accumulation_adds_micro_batch_gradients),
        DT_TEST(test_saved_tensors_are_released_after_each_backward),
        DT_TEST(test_segment_hooks_run_around_backward_and_can_rebind),
        DT_TEST(test_a_long_lived_tape_releases_each_step_after_reset),
        DT_TEST_END,
    };
    return dt_test_main_device(argc, argv, "autograd_tape", cases);
}
