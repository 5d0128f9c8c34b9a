/* Every recorded op's gradient through the tape: bit for bit against its explicit backward
 * function (or the identity it reduces to) and against central finite differences of
 * L = sum(out * w) (or seed * loss) computed in f64 on the host from f32 forward passes, on
 * replicated, sharded (data, column, row parallel) and partial layouts. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "../ops/ops_test_util.h"

#define MAXIN 3

/* One case: inputs (shape, layout spec per dim, partial or not, dtype, needs grad), the
 * forward call, and optionally the explicit reference gradients given dy (or the seed). */
typedef struct in_spec {
    int rank;
    int64_t shape[3];
    const char *spec[3]; /* mesh dim name or NULL */
    int partial;
    int ints; /* i32 data (ids, labels) from idata: no gradient */
    int grad;
    int away; /* keep values away from 0 (relu's kink) */
} in_spec;

typedef struct op_case {
    const char *name;
    int nin;
    in_spec in[MAXIN];
    dt_status (*fwd)(dt_tensor *const *in, dt_tensor **out);
    /* Reference gradients into ref[i] (owned; NULL to skip) from dy (NULL for a loss:
     * seed). */
    dt_status (*ref)(dt_tensor *const *in, const dt_tensor *dy, float seed, dt_tensor **ref);
    int nofd; /* piecewise or integer-valued: skip finite differences */
} op_case;

static int32_t idata[16] = {3, 0, 7, 15, 2, 9, 11, 4, 5, 1, 14, 8, 6, 13, 10, 12};
static int32_t labels5[8] = {0, 4, 2, 1, 3, 3, 0, 2};

static dt_mesh *mesh;

static dt_layout *layout_of(const in_spec *s)
{
    const char *sp[3];
    for (int d = 0; d < s->rank; d++)
        sp[d] = s->spec[d] ? s->spec[d] : DT_UNSHARDED;
    dt_layout *l = NULL;
    if (s->partial) {
        const char *pd[1] = {"x"};
        dt_reduce_op po[1] = {DT_REDUCE_SUM};
        DT_ASSERT_OK(dt_layout_create_partial(mesh, s->rank, sp, 1, pd, po, &l));
    } else {
        DT_ASSERT_OK(dt_layout_create(mesh, s->rank, sp, &l));
    }
    return l;
}

static int64_t numel_of(const in_spec *s)
{
    int64_t n = 1;
    for (int d = 0; d < s->rank; d++)
        n *= s->shape[d];
    return n;
}

static dt_tensor *make_input(const in_spec *s, const float *h)
{
    dt_layout *l = layout_of(s);
    dt_tensor *t;
    if (s->ints) {
        int32_t buf[16];
        int64_t n = numel_of(s);
        CU_ASSERT_FATAL(n <= 16);
        for (int64_t i = 0; i < n; i++)
            buf[i] = s->away ? labels5[i % 8] : idata[i]; /* away: labels of 5 classes */
        t = ot_tensor(l, DT_DTYPE_I32, s->shape, buf);
    } else {
        t = ot_tensor(l, DT_DTYPE_F32, s->shape, h);
    }
    dt_layout_destroy(l);
    return t;
}

static float *fetch(const dt_tensor *t)
{
    int64_t n = dt_tensor_numel(t);
    float *h = malloc((size_t)(n > 0 ? n : 1) * sizeof *h);
    ot_fetch(t, h);
    return h;
}

/* L = sum(out * w) in f64, or seed * out for a rank-0 out. */
static double host_loss(const op_case *c, float *const *h, const float *w, float seed)
{
    dt_tensor *in[MAXIN] = {0}, *out = NULL;
    for (int i = 0; i < c->nin; i++)
        in[i] = make_input(&c->in[i], h[i]);
    DT_ASSERT_OK(c->fwd(in, &out));
    float *ho = fetch(out);
    double L = 0;
    if (dt_tensor_rank(out) == 0)
        L = (double)seed * ho[0];
    else
        for (int64_t k = 0; k < dt_tensor_numel(out); k++)
            L += (double)ho[k] * w[k];
    free(ho);
    dt_tensor_destroy(out);
    for (int i = 0; i < c->nin; i++)
        dt_tensor_destroy(in[i]);
    return L;
}

static int bits_equal(const dt_tensor *a, const dt_tensor *b, const char *what)
{
    if (dt_tensor_numel(a) != dt_tensor_numel(b))
        return 0;
    float *ha = fetch(a), *hb = fetch(b);
    int64_t n = dt_tensor_numel(a);
    int same = memcmp(ha, hb, (size_t)n * sizeof *ha) == 0;
    for (int64_t k = 0; !same && k < n; k++)
        if (memcmp(&ha[k], &hb[k], sizeof *ha) != 0) {
            fprintf(stderr, "[rank %d] %s: element %lld %.9g vs explicit %.9g\n", dt_client_id(),
                    what, (long long)k, (double)ha[k], (double)hb[k]);
            break;
        }
    free(ha);
    free(hb);
    return same;
}

static void run_case(const op_case *c)
{
    float *h[MAXIN] = {0};
    dt_tensor *in[MAXIN] = {0};
    for (int i = 0; i < c->nin; i++) {
        int64_t n = numel_of(&c->in[i]);
        h[i] = malloc((size_t)n * sizeof *h[i]);
        ot_fill_real(h[i], n, -1, 1, (uint64_t)(100 + i * 7 + (int)strlen(c->name)));
        if (c->in[i].away)
            for (int64_t k = 0; k < n; k++)
                h[i][k] = h[i][k] < 0 ? h[i][k] - 0.2f : h[i][k] + 0.2f;
        in[i] = make_input(&c->in[i], h[i]);
    }
    dt_tape *tape = NULL;
    DT_ASSERT_OK(dt_tape_create(NULL, &tape));
    for (int i = 0; i < c->nin; i++)
        if (c->in[i].grad)
            DT_ASSERT_OK(dt_tape_watch(tape, in[i], i));
    DT_ASSERT_OK(dt_tape_begin(tape));
    dt_tensor *out = NULL;
    DT_ASSERT_OK(c->fwd(in, &out));
    DT_ASSERT_OK(dt_tape_end(tape));
    const float seed = 1.5f;
    int loss = dt_tensor_rank(out) == 0;
    float *w = NULL;
    dt_tensor *dy = NULL;
    if (!loss) {
        int64_t n = dt_tensor_numel(out);
        w = malloc((size_t)n * sizeof *w);
        ot_fill_real(w, n, -1, 1, 77);
        dt_layout *lr = NULL;
        DT_ASSERT_OK(dt_layout_replicated(mesh, dt_tensor_rank(out), &lr));
        dy = ot_tensor(lr, DT_DTYPE_F32, dt_tensor_shape(out), w);
        dt_layout_destroy(lr);
    }
    DT_ASSERT_OK(dt_tape_backward(tape, out, dy, seed, NULL));
    /* Bit for bit against the explicit backward. */
    if (c->ref) {
        dt_tensor *ref[MAXIN] = {0};
        DT_ASSERT_OK(c->ref(in, dy, seed, ref));
        for (int i = 0; i < c->nin; i++) {
            if (!ref[i])
                continue;
            const dt_tensor *g = NULL;
            DT_ASSERT_OK(dt_tape_grad(tape, i, &g));
            CU_ASSERT_PTR_NOT_NULL_FATAL(g);
            char what[96];
            snprintf(what, sizeof what, "%s input %d", c->name, i);
            CU_ASSERT(bits_equal(g, ref[i], what));
            dt_tensor_destroy(ref[i]);
        }
    }
    /* Central finite differences at a few elements of each input needing grad. */
    for (int i = 0; i < c->nin && !c->nofd; i++) {
        if (!c->in[i].grad)
            continue;
        const dt_tensor *g = NULL;
        DT_ASSERT_OK(dt_tape_grad(tape, i, &g));
        CU_ASSERT_PTR_NOT_NULL_FATAL(g);
        CU_ASSERT_EQUAL(dt_tensor_dtype(g), DT_DTYPE_F32);
        float *hg = fetch(g);
        int64_t n = numel_of(&c->in[i]);
        const float step = 1e-2f;
        for (int s = 0; s < 4; s++) {
            int64_t k = (n * s) / 4 + (s % 2);
            if (k >= n)
                k = n - 1;
            float keep = h[i][k];
            h[i][k] = keep + step;
            double lp = host_loss(c, h, w, seed);
            h[i][k] = keep - step;
            double lm = host_loss(c, h, w, seed);
            h[i][k] = keep;
            double fd = (lp - lm) / (2.0 * (double)step);
            double tol = 2e-3 + 1e-2 * fabs(fd);
            if (!(fabs(fd - hg[k]) <= tol))
                fprintf(stderr, "[rank %d] %s: d/d input %d [%lld]: tape %.7g, fd %.7g\n",
                        dt_client_id(), c->name, i, (long long)k, (double)hg[k], fd);
            CU_ASSERT(fabs(fd - hg[k]) <= tol);
        }
        free(hg);
    }
    free(w);
    dt_tensor_destroy(dy);
    dt_tensor_destroy(out);
    dt_tape_destroy(tape);
    for (int i = 0; i < c->nin; i++) {
        dt_tensor_destroy(in[i]);
        free(h[i]);
    }
}

/* ---- forward calls -------------------------------------------------------------------- */

static dt_status f_matmul(dt_tensor *const *in, dt_tensor **out)
{
    return dt_matmul(in[0], in[1], 0, 0, NULL, out);
}
static dt_status f_matmul_tt(dt_tensor *const *in, dt_tensor **out)
{
    return dt_matmul(in[0], in[1], 1, 1, NULL, out);
}
static dt_status r_matmul(dt_tensor *const *in, const dt_tensor *dy, float seed, dt_tensor **r)
{
    (void)seed;
    return dt_matmul_backward(in[0], in[1], 0, 0, dy, NULL, NULL, &r[0], &r[1]);
}
static dt_status r_matmul_tt(dt_tensor *const *in, const dt_tensor *dy, float seed, dt_tensor **r)
{
    (void)seed;
    return dt_matmul_backward(in[0], in[1], 1, 1, dy, NULL, NULL, &r[0], &r[1]);
}
static dt_status f_matmul_nd(dt_tensor *const *in, dt_tensor **out)
{
    return dt_matmul_nd(in[0], in[1], 0, 0, NULL, out);
}
static dt_status r_matmul_nd(dt_tensor *const *in, const dt_tensor *dy, float seed, dt_tensor **r)
{
    (void)seed;
    return dt_matmul_nd_backward(in[0], in[1], 0, 0, dy, NULL, NULL, &r[0], &r[1]);
}
static dt_status f_add(dt_tensor *const *in, dt_tensor **out)
{
    return dt_add(in[0], in[1], NULL, out);
}
static dt_status r_add(dt_tensor *const *in, const dt_tensor *dy, float seed, dt_tensor **r)
{
    (void)in, (void)seed;
    r[0] = dt_tensor_retain(dy);
    r[1] = dt_tensor_retain(dy);
    return DT_OK;
}
static dt_status f_sub(dt_tensor *const *in, dt_tensor **out)
{
    return dt_sub(in[0], in[1], NULL, out);
}
static dt_status r_sub(dt_tensor *const *in, const dt_tensor *dy, float seed, dt_tensor **r)
{
    (void)in, (void)seed;
    r[0] = dt_tensor_retain(dy);
    return dt_scale(dy, -1.0f, &r[1]);
}
static dt_status f_mul(dt_tensor *const *in, dt_tensor **out)
{
    return dt_mul(in[0], in[1], NULL, out);
}
static dt_status r_mul(dt_tensor *const *in, const dt_tensor *dy, float seed, dt_tensor **r)
{
    (void)seed;
    dt_status st = dt_mul(dy, in[1], NULL, &r[0]);
    return st == DT_OK ? dt_mul(dy, in[0], NULL, &r[1]) : st;
}
static dt_status f_scale(dt_tensor *const *in, dt_tensor **out)
{
    return dt_scale(in[0], -0.75f, out);
}
static dt_status r_scale(dt_tensor *const *in, const dt_tensor *dy, float seed, dt_tensor **r)
{
    (void)in, (void)seed;
    return dt_scale(dy, -0.75f, &r[0]);
}
static dt_status f_bias_add(dt_tensor *const *in, dt_tensor **out)
{
    return dt_bias_add(in[0], in[1], out);
}
static dt_status r_bias_add(dt_tensor *const *in, const dt_tensor *dy, float seed, dt_tensor **r)
{
    (void)in, (void)seed;
    r[0] = dt_tensor_retain(dy);
    return dt_bias_grad(dy, NULL, &r[1]);
}
static dt_status f_layer_norm(dt_tensor *const *in, dt_tensor **out)
{
    return dt_layer_norm(in[0], in[1], in[2], 1e-5f, out);
}
static dt_status r_layer_norm(dt_tensor *const *in, const dt_tensor *dy, float seed, dt_tensor **r)
{
    (void)seed;
    return dt_layer_norm_backward(in[0], in[1], dy, 1e-5f, &r[0], &r[1], &r[2]);
}
static dt_status f_softmax(dt_tensor *const *in, dt_tensor **out)
{
    return dt_softmax(in[0], -1, out);
}
static dt_status r_softmax(dt_tensor *const *in, const dt_tensor *dy, float seed, dt_tensor **r)
{
    (void)seed;
    dt_tensor *y = NULL;
    dt_status st = dt_softmax(in[0], -1, &y);
    if (st == DT_OK)
        st = dt_softmax_backward(y, dy, -1, &r[0]);
    dt_tensor_destroy(y);
    return st;
}
static dt_status f_softmax0(dt_tensor *const *in, dt_tensor **out)
{
    return dt_softmax(in[0], 0, out);
}
static dt_status f_attention(dt_tensor *const *in, dt_tensor **out)
{
    return dt_attention(in[0], in[1], in[2], 2, 1, out);
}
static dt_status r_attention(dt_tensor *const *in, const dt_tensor *dy, float seed, dt_tensor **r)
{
    (void)seed;
    return dt_attention_backward(in[0], in[1], in[2], 2, 1, dy, &r[0], &r[1], &r[2]);
}
static dt_status f_embedding(dt_tensor *const *in, dt_tensor **out)
{
    return dt_embedding(in[0], in[1], NULL, out);
}
static dt_status r_embedding(dt_tensor *const *in, const dt_tensor *dy, float seed, dt_tensor **r)
{
    (void)seed;
    return dt_embedding_backward(in[0], in[1], dy, NULL, &r[0]);
}
static dt_status f_vocab_xent(dt_tensor *const *in, dt_tensor **out)
{
    return dt_vocab_xent(in[0], in[1], NULL, out);
}
static dt_status r_vocab_xent(dt_tensor *const *in, const dt_tensor *dy, float seed, dt_tensor **r)
{
    (void)dy;
    return dt_vocab_xent_backward(in[0], in[1], seed, &r[0]);
}
static dt_status f_softmax_xent(dt_tensor *const *in, dt_tensor **out)
{
    return dt_softmax_xent(in[0], in[1], NULL, out);
}
static dt_status r_softmax_xent(dt_tensor *const *in, const dt_tensor *dy, float seed,
                                dt_tensor **r)
{
    (void)dy;
    return dt_softmax_xent_backward(in[0], in[1], seed, &r[0]);
}
static dt_status f_gelu(dt_tensor *const *in, dt_tensor **out)
{
    return dt_gelu(in[0], out);
}
static dt_status r_gelu(dt_tensor *const *in, const dt_tensor *dy, float seed, dt_tensor **r)
{
    (void)seed;
    return dt_gelu_backward(in[0], dy, &r[0]);
}
static dt_status f_relu(dt_tensor *const *in, dt_tensor **out)
{
    return dt_relu(in[0], out);
}
static dt_status r_relu(dt_tensor *const *in, const dt_tensor *dy, float seed, dt_tensor **r)
{
    (void)seed;
    return dt_relu_backward(in[0], dy, &r[0]);
}
/* cast f32 -> f64 -> f32: the gradient passes as it is. */
static dt_status f_cast(dt_tensor *const *in, dt_tensor **out)
{
    dt_tensor *d = NULL;
    dt_status st = dt_cast(in[0], DT_DTYPE_F64, &d);
    if (st == DT_OK)
        st = dt_cast(d, DT_DTYPE_F32, out);
    dt_tensor_destroy(d);
    return st;
}
static dt_status r_identity(dt_tensor *const *in, const dt_tensor *dy, float seed, dt_tensor **r)
{
    (void)in, (void)seed;
    r[0] = dt_tensor_retain(dy);
    return DT_OK;
}
static dt_status f_relayout_rep(dt_tensor *const *in, dt_tensor **out)
{
    dt_layout *l = NULL;
    dt_status st = dt_layout_replicated(mesh, dt_tensor_rank(in[0]), &l);
    if (st == DT_OK)
        st = dt_relayout(in[0], l, out);
    dt_layout_destroy(l);
    return st;
}
static dt_status f_relayout_shard1(dt_tensor *const *in, dt_tensor **out)
{
    const char *sp[2] = {DT_UNSHARDED, "x"};
    dt_layout *l = NULL;
    dt_status st = dt_layout_create(mesh, 2, sp, &l);
    if (st == DT_OK)
        st = dt_relayout(in[0], l, out);
    dt_layout_destroy(l);
    return st;
}
static dt_status f_reduce_sum0(dt_tensor *const *in, dt_tensor **out)
{
    return dt_reduce(in[0], DT_REDUCE_SUM, 0, NULL, out);
}
static dt_status f_reduce_avg1(dt_tensor *const *in, dt_tensor **out)
{
    return dt_reduce(in[0], DT_REDUCE_AVG, -1, NULL, out);
}
/* A scalar chain: mean of all, then a loss-like root with the seed. */
static dt_status f_reduce_all(dt_tensor *const *in, dt_tensor **out)
{
    return dt_reduce(in[0], DT_REDUCE_AVG, DT_ALL_AXES, NULL, out);
}

/* ---- the cases --------------------------------------------------------------------------- */

#define M2(a, b, s0, s1, g)                                                                        \
    {                                                                                              \
        2, {a, b, 0}, {s0, s1, NULL}, 0, 0, g, 0                                                   \
    }
#define M2P(a, b, g)                                                                               \
    {                                                                                              \
        2, {a, b, 0}, {NULL, NULL, NULL}, 1, 0, g, 0                                               \
    }
#define M1(a, s0, g)                                                                               \
    {                                                                                              \
        1, {a, 0, 0}, {s0, NULL, NULL}, 0, 0, g, 0                                                 \
    }

static const op_case cases[] = {
    {"matmul replicated",
     2,
     {M2(8, 6, NULL, NULL, 1), M2(6, 5, NULL, NULL, 1)},
     f_matmul,
     r_matmul,
     0},
    {"matmul data parallel",
     2,
     {M2(8, 6, "x", NULL, 1), M2(6, 5, NULL, NULL, 1)},
     f_matmul,
     r_matmul,
     0},
    {"matmul column parallel",
     2,
     {M2(4, 6, NULL, NULL, 1), M2(6, 8, NULL, "x", 1)},
     f_matmul,
     r_matmul,
     0},
    {"matmul row parallel",
     2,
     {M2(4, 8, NULL, "x", 1), M2(8, 5, "x", NULL, 1)},
     f_matmul,
     r_matmul,
     0},
    {"matmul transposed, partial a",
     2,
     {M2P(6, 4, 1), M2(5, 6, NULL, NULL, 1)},
     f_matmul_tt,
     r_matmul_tt,
     0},
    {"matmul_nd projection, sharded rows",
     2,
     {{3, {8, 2, 6}, {"x", NULL, NULL}, 0, 0, 1, 0}, M2(6, 4, NULL, NULL, 1)},
     f_matmul_nd,
     r_matmul_nd,
     0},
    {"add, one operand sharded",
     2,
     {M2(8, 4, "x", NULL, 1), M2(8, 4, NULL, NULL, 1)},
     f_add,
     r_add,
     0},
    {"sub, partial operand", 2, {M2P(8, 4, 1), M2(8, 4, "x", NULL, 1)}, f_sub, r_sub, 0},
    {"mul, sharded and partial", 2, {M2(8, 4, "x", NULL, 1), M2P(8, 4, 1)}, f_mul, r_mul, 0},
    {"scale, sharded", 1, {M2(8, 4, "x", NULL, 1)}, f_scale, r_scale, 0},
    {"bias_add, rows sharded",
     2,
     {M2(8, 6, "x", NULL, 1), M1(6, NULL, 1)},
     f_bias_add,
     r_bias_add,
     0},
    {"bias_add, columns sharded",
     2,
     {M2(4, 8, NULL, "x", 1), M1(8, "x", 1)},
     f_bias_add,
     r_bias_add,
     0},
    {"layer_norm, rows sharded",
     3,
     {M2(8, 6, "x", NULL, 1), M1(6, NULL, 1), M1(6, NULL, 1)},
     f_layer_norm,
     r_layer_norm,
     0},
    {"softmax last dim, rows sharded", 1, {M2(8, 6, "x", NULL, 1)}, f_softmax, r_softmax, 0},
    {"softmax dim 0, columns sharded", 1, {M2(6, 8, NULL, "x", 1)}, f_softmax0, NULL, 0},
    {"attention, width sharded",
     3,
     {{3, {2, 4, 8}, {NULL, NULL, "x"}, 0, 0, 1, 0},
      {3, {2, 4, 8}, {NULL, NULL, NULL}, 0, 0, 1, 0},
      {3, {2, 4, 8}, {NULL, NULL, "x"}, 0, 0, 1, 0}},
     f_attention,
     r_attention,
     0},
    {"embedding, vocabulary sharded",
     2,
     {M2(16, 4, "x", NULL, 1), {1, {8, 0, 0}, {"x", NULL, NULL}, 0, 1, 0, 0}},
     f_embedding,
     r_embedding,
     0},
    {"vocab_xent, vocabulary sharded",
     2,
     {M2(8, 16, NULL, "x", 1), {1, {8, 0, 0}, {NULL, NULL, NULL}, 0, 1, 0, 0}},
     f_vocab_xent,
     r_vocab_xent,
     0},
    {"softmax_xent, rows sharded",
     2,
     {M2(8, 5, "x", NULL, 1), {1, {8, 0, 0}, {"x", NULL, NULL}, 0, 1, 0, 1}},
     f_softmax_xent,
     r_softmax_xent,
     0},
    {"gelu, sharded", 1, {M2(8, 4, "x", NULL, 1)}, f_gelu, r_gelu, 0},
    {"relu, partial", 1, {{2, {8, 4, 0}, {NULL, NULL, NULL}, 1, 0, 1, 1}}, f_relu, r_relu, 0},
    {"cast there and back", 1, {M2(8, 4, "x", NULL, 1)}, f_cast, r_identity, 0},
    {"relayout sharded to replicated", 1, {M2(8, 4, "x", NULL, 1)}, f_relayout_rep, NULL, 0},
    {"relayout partial to sharded", 1, {M2P(4, 8, 1)}, f_relayout_shard1, NULL, 0},
    {"reduce sum over sharded dim 0", 1, {M2(8, 4, "x", NULL, 1)}, f_reduce_sum0, NULL, 0},
    {"reduce mean over dim 1", 1, {M2(8, 4, "x", NULL, 1)}, f_reduce_avg1, NULL, 0},
    {"reduce mean of all, seeded", 1, {M2(8, 4, NULL, "x", 1)}, f_reduce_all, NULL, 0},
};

static void test_every_op_gradient_matches_explicit_backward_and_finite_differences(void)
{
    mesh = ot_mesh_1d();
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        int before = (int)CU_get_number_of_failures();
        run_case(&cases[i]);
        if ((int)CU_get_number_of_failures() != before)
            fprintf(stderr, "[rank %d] case '%s' failed\n", dt_client_id(), cases[i].name);
    }
    dt_mesh_destroy(mesh);
    mesh = NULL;
}

/* The gradient of a relayout from a partial tensor stays partial where the layouts allow:
 * dy partial over x for x replicated -> sharded on nothing: kept as it came. */
static void test_relayout_keeps_a_partial_gradient_partial(void)
{
    mesh = ot_mesh_1d();
    in_spec s = M2(4, 8, NULL, NULL, 1);
    float h[32];
    ot_fill_real(h, 32, -1, 1, 5);
    dt_tensor *x = make_input(&s, h);
    dt_tape *tape = NULL;
    DT_ASSERT_OK(dt_tape_create(NULL, &tape));
    DT_ASSERT_OK(dt_tape_watch(tape, x, 0));
    DT_ASSERT_OK(dt_tape_begin(tape));
    dt_tensor *y = NULL;
    DT_ASSERT_OK(f_relayout_shard1(&x, &y));
    DT_ASSERT_OK(dt_tape_end(tape));
    in_spec sp = M2P(4, 8, 0);
    dt_tensor *dy = make_input(&sp, h);
    DT_ASSERT_OK(dt_tape_backward(tape, y, dy, 0, NULL));
    const dt_tensor *g = NULL;
    DT_ASSERT_OK(dt_tape_grad(tape, 0, &g));
    CU_ASSERT(ot_is_partial(g));
    float got[32];
    ot_fetch(g, got);
    CU_ASSERT_EQUAL(ot_mismatches("relayout grad", got, h, 32, 0, 0), 0);
    dt_tensor_destroy(x);
    dt_tensor_destroy(y);
    dt_tensor_destroy(dy);
    dt_tape_destroy(tape);
    dt_mesh_destroy(mesh);
    mesh = NULL;
}

int main(int argc, char **argv)
{
    static const dt_test_case tcases[] = {
        DT_TEST(test_every_op_gradient_matches_explicit_backward_and_finite_differences),
        DT_TEST(test_relayout_keeps_a_partial_gradient_partial),
        DT_TEST_END,
    };
    return dt_test_main_device(argc, argv, "autograd_ops", tcases);
}
