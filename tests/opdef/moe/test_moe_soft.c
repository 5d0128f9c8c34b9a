/* The soft-gated mixture of experts of examples/moe/layer.c: its user-defined op
 * moe.gate_combine registers once, gives the naive sum on a 2x2 mesh (a partial sum with the
 * experts sharded), refuses operands that do not fit and passes the library's validator; the
 * layer's gradients (gate weights, both expert projections and the input; all experts and
 * the top 2 of 4) match central finite differences in f64 on one device, and the 2x2 mesh
 * (batch over `batch`, experts over `model`) gives the one-device loss and gradients. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "../../../examples/moe/layer.h"

#define B  4 /* rows */
#define D  3 /* width */
#define E  4 /* experts */
#define F  3 /* expert hidden width */
#define NP 4 /* differentiated tensors: x, gate, w1, w2 */

/* Central differences in f64 with step H: the truncation error is H^2/6 |L'''| (about 2e-11
 * here, |L'''| being O(10) for these O(1) values) and the rounding error about
 * 1e-16 |L| / H (1e-11); FD_TOL leaves a factor of 100 over their sum. Gradients of the 2x2
 * mesh differ from one device's by sums taken in another order: a few ulps of f64. */
#define H        1e-5
#define FD_TOL   2e-9
#define MESH_TOL 1e-13

static const int64_t shapes[NP + 1][3] = {{B, D}, {D, E}, {E, D, F}, {E, F, D}, {B, D}};
static const int ranks[NP + 1] = {2, 2, 3, 3, 2};
static const char *const names[NP] = {"x", "gate", "w1", "w2"};

static int64_t numel(int i)
{
    int64_t n = 1;
    for (int d = 0; d < ranks[i]; d++)
        n *= shapes[i][d];
    return n;
}

/* x, the three weights and R (the loss is sum(y * R)), uniform in [-1, 1) scaled by 1/sqrt
 * of the fan-in for the experts. */
static double host[NP + 1][E * D * F];

static void fill(uint64_t seed)
{
    uint64_t s = seed;
    const double scale[NP + 1] = {1.0, 1.0, 1.0 / sqrt((double)D), 1.0 / sqrt((double)F), 1.0};
    for (int i = 0; i <= NP; i++)
        for (int64_t k = 0; k < numel(i); k++) {
            s = s * 6364136223846793005ULL + 1442695040888963407ULL;
            host[i][k] = scale[i] * ((double)(s >> 11) / 9007199254740992.0 * 2.0 - 1.0);
        }
}

/* The smallest gap, over the rows, between the k-th and the (k+1)-th largest logit of x Wg:
 * finite differences are meaningful only away from a change of the chosen experts. */
static double topk_margin(int k)
{
    double worst = INFINITY;
    for (int b = 0; b < B; b++) {
        double l[E];
        for (int e = 0; e < E; e++) {
            l[e] = 0;
            for (int d = 0; d < D; d++)
                l[e] += host[0][b * D + d] * host[1][d * E + e];
        }
        for (int i = 0; i < E; i++) /* sort descending */
            for (int j = i + 1; j < E; j++)
                if (l[j] > l[i]) {
                    double t = l[i];
                    l[i] = l[j];
                    l[j] = t;
                }
        if (l[k - 1] - l[k] < worst)
            worst = l[k - 1] - l[k];
    }
    return worst;
}

/* The layouts of x, gate, w1, w2 and R on a mesh: replicated (specs NULL) or the 2x2 plan. */
typedef struct plan {
    dt_mesh *mesh;
    dt_layout *l[NP + 1];
} plan;

static void plan_make(plan *p, int two_by_two)
{
    const char *dn1[1] = {"x"}, *dn2[2] = {"batch", "model"};
    int64_t s1[1] = {1}, s2[2] = {2, 2};
    DT_ASSERT_OK(two_by_two ? dt_mesh_create("moe2x2", 2, dn2, s2, DT_DEVICE_CPU, &p->mesh)
                            : dt_mesh_create("moe1", 1, dn1, s1, DT_DEVICE_CPU, &p->mesh));
    /* Rows over batch; the experts (and the gate's expert columns) over model. */
    const char *sp[NP + 1][3] = {{"batch", NULL, NULL},
                                 {NULL, "model", NULL},
                                 {"model", NULL, NULL},
                                 {"model", NULL, NULL},
                                 {"batch", NULL, NULL}};
    for (int i = 0; i <= NP; i++) {
        const char *specs[3];
        for (int d = 0; d < ranks[i]; d++)
            specs[d] = two_by_two && sp[i][d] ? sp[i][d] : DT_UNSHARDED;
        DT_ASSERT_OK(dt_layout_create(p->mesh, ranks[i], specs, &p->l[i]));
    }
}

static void plan_free(plan *p)
{
    for (int i = 0; i <= NP; i++)
        dt_layout_destroy(p->l[i]);
    dt_mesh_destroy(p->mesh);
}

/* L = sum(moe(x) * R) on the plan's mesh from the host values; with grads, also dL/d(x, gate,
 * w1, w2) through the tape, gathered to every client. */
static void loss_on(const plan *p, int64_t k, double *loss, double (*grads)[E * D * F])
{
    dt_tensor *t[NP + 1] = {NULL}, *y = NULL, *yr = NULL, *l = NULL;
    for (int i = 0; i <= NP; i++)
        DT_ASSERT_OK(dt_tensor_from_host(p->l[i], DT_DTYPE_F64, shapes[i], host[i], &t[i]));
    dt_tape *tape = NULL;
    if (grads) {
        DT_ASSERT_OK(dt_tape_create(NULL, &tape));
        for (int i = 0; i < NP; i++)
            DT_ASSERT_OK(dt_tape_watch(tape, t[i], i));
        DT_ASSERT_OK(dt_tape_begin(tape));
    }
    moe_weights w = {t[1], t[2], t[3]};
    DT_ASSERT_OK(moe_forward(t[0], &w, k, &y));
    DT_ASSERT_OK(dt_mul(y, t[NP], NULL, &yr));
    DT_ASSERT_OK(dt_sum(yr, NULL, 0, 0, &l));
    DT_ASSERT_OK(dt_item(l, loss));
    if (grads) {
        DT_ASSERT_OK(dt_tape_end(tape));
        dt_backward_opts bo = DT_BACKWARD_OPTS_INIT;
        bo.require_all = 1;
        DT_ASSERT_OK(dt_tape_backward(tape, l, NULL, 1.0f, &bo));
        for (int i = 0; i < NP; i++) {
            const dt_tensor *g = NULL;
            DT_ASSERT_OK(dt_tape_grad(tape, i, &g));
            CU_ASSERT_EQUAL_FATAL(dt_tensor_dtype(g), DT_DTYPE_F64);
            DT_ASSERT_OK(dt_tensor_to_host(g, -1, grads[i], (size_t)numel(i) * sizeof(double)));
        }
        dt_tape_destroy(tape);
    }
    dt_tensor_destroy(l);
    dt_tensor_destroy(yr);
    dt_tensor_destroy(y);
    for (int i = 0; i <= NP; i++)
        dt_tensor_destroy(t[i]);
}

/* ---- the user-defined op --------------------------------------------------------------------- */

static void test_combine_registers_once_and_sums_the_experts_on_a_2x2_mesh(void)
{
    const dt_op *op = NULL, *again = NULL;
    DT_ASSERT_OK(moe_combine_op(&op));
    DT_ASSERT_OK(moe_combine_op(&again));
    CU_ASSERT_PTR_EQUAL(op, again);
    CU_ASSERT_PTR_EQUAL(dt_op_find(MOE_COMBINE_OP), op);
    CU_ASSERT_STRING_EQUAL(dt_op_definition(op)->rule, "be,bed->bd");
    if (dt_test_num_devices() < 4)
        return;
    plan p;
    plan_make(&p, 1);
    /* Small integers: every order of the sums is exact. */
    double g[B * E], h[B * E * D], ref[B * D], got[B * D];
    for (int i = 0; i < B * E; i++)
        g[i] = (double)(i % 5) - 2;
    for (int i = 0; i < B * E * D; i++)
        h[i] = (double)(i % 7) - 3;
    for (int b = 0; b < B; b++)
        for (int d = 0; d < D; d++) {
            ref[b * D + d] = 0;
            for (int e = 0; e < E; e++)
                ref[b * D + d] += g[b * E + e] * h[(b * E + e) * D + d];
        }
    const char *sg[2] = {"batch", DT_UNSHARDED}, *sh[3] = {"batch", "model", DT_UNSHARDED};
    dt_layout *lg = NULL, *lh = NULL;
    DT_ASSERT_OK(dt_layout_create(p.mesh, 2, sg, &lg));
    DT_ASSERT_OK(dt_layout_create(p.mesh, 3, sh, &lh));
    int64_t sgs[2] = {B, E}, shs[3] = {B, E, D};
    dt_tensor *tg = NULL, *th = NULL, *y = NULL;
    DT_ASSERT_OK(dt_tensor_from_host(lg, DT_DTYPE_F64, sgs, g, &tg));
    DT_ASSERT_OK(dt_tensor_from_host(lh, DT_DTYPE_F64, shs, h, &th));
    DT_ASSERT_OK(moe_combine(tg, th, &y));
    /* The experts stay where they are: each device sums its own, the rest is pending. */
    CU_ASSERT_EQUAL(dt_layout_num_partial(dt_tensor_layout(y)), 1);
    DT_ASSERT_OK(dt_tensor_to_host(y, -1, got, sizeof got));
    CU_ASSERT_EQUAL(memcmp(got, ref, sizeof got), 0);
    dt_tensor_destroy(y);
    dt_tensor_destroy(th);
    dt_tensor_destroy(tg);
    dt_layout_destroy(lg);
    dt_layout_destroy(lh);
    plan_free(&p);
}

static void test_combine_refuses_operands_that_do_not_fit(void)
{
    const char *dn[1] = {"x"};
    int64_t one = 1, sg[2] = {B, E}, sh[3] = {B, E + 1, D};
    dt_mesh *mesh = NULL;
    dt_layout *lg = NULL, *lh = NULL;
    dt_tensor *g = NULL, *h = NULL, *y = NULL;
    DT_ASSERT_OK(dt_mesh_create("moe1", 1, dn, &one, DT_DEVICE_CPU, &mesh));
    DT_ASSERT_OK(dt_layout_replicated(mesh, 2, &lg));
    DT_ASSERT_OK(dt_layout_replicated(mesh, 3, &lh));
    if (dt_client_id() == 0) {
        DT_ASSERT_OK(dt_tensor_zeros(lg, DT_DTYPE_F64, sg, &g));
        DT_ASSERT_OK(dt_tensor_zeros(lh, DT_DTYPE_F64, sh, &h));
        /* E + 1 experts in h. (The op's shape function has no public way to word the
         * message: dt_last_error() stays empty.) */
        CU_ASSERT_EQUAL(moe_combine(g, h, &y), DT_ERR_SHAPE);
        CU_ASSERT_PTR_NULL(y);
    }
    dt_tensor_destroy(g);
    dt_tensor_destroy(h);
    dt_layout_destroy(lg);
    dt_layout_destroy(lh);
    dt_mesh_destroy(mesh);
}

static void report(void *arg, const char *line)
{
    (void)arg;
    fprintf(stderr, "[rank %d] validate: %s\n", dt_client_id(), line);
}

static void test_validator_passes_the_user_op(void)
{
    const dt_op *op = NULL;
    DT_ASSERT_OK(moe_combine_op(&op));
    dt_validate_opts vo = DT_VALIDATE_OPTS_INIT;
    vo.cases = 3;
    vo.report = report;
    dt_validate_result r;
    DT_ASSERT_OK(dt_op_validate(op, &vo, &r));
    CU_ASSERT(r.cases >= 3);
    CU_ASSERT(r.checks > 0);
    CU_ASSERT_EQUAL(r.failures, 0);
}

/* ---- the layer's gradients ---------------------------------------------------------------------
 */

/* Every element of x, gate, w1 and w2 by central differences against the tape, on one device
 * (client 0: the others hold no device of that mesh). */
static void check_fd(int64_t k)
{
    fill(0x5eed + (uint64_t)k);
    if (k < E)
        CU_ASSERT(topk_margin((int)k) > 1e-3);
    if (dt_client_id() != 0)
        return;
    plan p;
    plan_make(&p, 0);
    double loss, grads[NP][E * D * F];
    loss_on(&p, k, &loss, grads);
    for (int i = 0; i < NP; i++) {
        double worst = 0, big = 1;
        int64_t at = -1;
        for (int64_t j = 0; j < numel(i); j++) {
            double keep = host[i][j], lp, lm;
            host[i][j] = keep + H;
            loss_on(&p, k, &lp, NULL);
            host[i][j] = keep - H;
            loss_on(&p, k, &lm, NULL);
            host[i][j] = keep;
            double fd = (lp - lm) / (2 * H), e = fabs(fd - grads[i][j]);
            if (fabs(grads[i][j]) > big)
                big = fabs(grads[i][j]);
            if (e > worst) {
                worst = e;
                at = j;
            }
        }
        if (!(worst <= FD_TOL * big))
            fprintf(stderr, "k %lld: d%s[%lld] differs from central differences by %g (> %g)\n",
                    (long long)k, names[i], (long long)at, worst, FD_TOL * big);
        CU_ASSERT(worst <= FD_TOL * big);
    }
    plan_free(&p);
}

static void test_gradients_match_central_differences_in_f64_with_all_experts(void)
{
    check_fd(E);
}

static void test_gradients_match_central_differences_in_f64_with_the_top_2(void)
{
    check_fd(2);
}

/* The 2x2 mesh against one device: the loss and every gradient within a few f64 ulps. */
static void check_mesh(int64_t k)
{
    if (dt_test_num_devices() < 4)
        return;
    fill(0xfeed + (uint64_t)k);
    double loss1 = 0, loss4 = 0, g1[NP][E * D * F], g4[NP][E * D * F];
    if (dt_client_id() == 0) {
        plan p;
        plan_make(&p, 0);
        loss_on(&p, k, &loss1, g1);
        plan_free(&p);
    }
    plan p;
    plan_make(&p, 1);
    loss_on(&p, k, &loss4, g4);
    plan_free(&p);
    if (dt_client_id() != 0)
        return;
    CU_ASSERT(fabs(loss4 - loss1) <= MESH_TOL * (1 + fabs(loss1)));
    for (int i = 0; i < NP; i++) {
        double big = 1, worst = 0;
        for (int64_t j = 0; j < numel(i); j++) {
            big = fabs(g1[i][j]) > big ? fabs(g1[i][j]) : big;
            worst = fabs(g4[i][j] - g1[i][j]) > worst ? fabs(g4[i][j] - g1[i][j]) : worst;
        }
        if (!(worst <= MESH_TOL * big))
            fprintf(stderr, "k %lld: d%s on 2x2 differs from one device by %g\n", (long long)k,
                    names[i], worst);
        CU_ASSERT(worst <= MESH_TOL * big);
    }
}

static void test_2x2_mesh_gives_the_one_device_gradients_with_all_experts(void)
{
    check_mesh(E);
}

static void test_2x2_mesh_gives_the_one_device_gradients_with_the_top_2(void)
{
    check_mesh(2);
}

int main(int argc, char **argv)
{
    static const dt_test_case cases[] = {
        DT_TEST(test_combine_registers_once_and_sums_the_experts_on_a_2x2_mesh),
        DT_TEST(test_combine_refuses_operands_that_do_not_fit),
        DT_TEST(test_validator_passes_the_user_op),
        DT_TEST(test_gradients_match_central_differences_in_f64_with_all_experts),
        DT_TEST(test_gradients_match_central_differences_in_f64_with_the_top_2),
        DT_TEST(test_2x2_mesh_gives_the_one_device_gradients_with_all_experts),
        DT_TEST(test_2x2_mesh_gives_the_one_device_gradients_with_the_top_2),
        DT_TEST_END,
    };
    return dt_test_main(argc, argv, "moe_soft", cases, 1);
}
