/* The experts' grouped GEMM (dtensor/moe.h): on one device against a naive per-group product
 * computed here (empty groups and padding rows included), bit for bit in f64 and f32; on a
 * mesh whose `batch` dim shards the members and the experts (expert parallelism, 4 devices)
 * the output and the tape's gradients of x and w are the one-device ones bit for bit; counts
 * out of range are refused on every client; the library's validator passes both ops. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

#define P 4 /* members */
#define G 2 /* local experts per member */
#define R 5 /* rows per member */
#define K 3
#define N 4

/* Member 0: both groups, one padding row; 1: an empty first group; 2: no rows at all;
 * 3: every row to its last expert. */
static const int64_t counts[P * G] = {2, 2, 0, 3, 0, 0, 0, 5};

static double xs[P * R * K], ws[P * G * K * N], dys[P * R * N];

static void fill(void)
{
    uint64_t s = 12345;
    double *arrs[3] = {xs, ws, dys};
    int64_t ns[3] = {P * R * K, P * G * K * N, P * R * N};
    for (int a = 0; a < 3; a++)
        for (int64_t i = 0; i < ns[a]; i++) {
            s = s * 6364136223846793005ULL + 1442695040888963407ULL;
            arrs[a][i] = (double)(s >> 11) / 9007199254740992.0 * 2.0 - 1.0;
        }
}

/* y = grouped(x, w) by the definition, f64 sums in k order. */
static void reference(double *y)
{
    memset(y, 0, sizeof(double) * P * R * N);
    for (int p = 0; p < P; p++) {
        int64_t r = 0;
        for (int g = 0; g < G; g++)
            for (int64_t c = 0; c < counts[p * G + g]; c++, r++)
                for (int n = 0; n < N; n++) {
                    double acc = 0;
                    for (int k = 0; k < K; k++)
                        acc += xs[(p * R + r) * K + k] * ws[((p * G + g) * K + k) * N + n];
                    y[(p * R + r) * N + n] = acc;
                }
    }
}

typedef struct setup {
    dt_mesh *mesh;
    dt_layout *l3, *lw, *lc;
} setup;

/* One device (ep 0) or `batch` = P devices sharding dim 0 of x, w and counts (ep 1). */
static void setup_make(setup *s, int ep)
{
    const char *dn[1] = {"batch"};
    int64_t sz[1] = {ep ? P : 1};
    DT_ASSERT_OK(dt_mesh_create(ep ? "ep" : "one", 1, dn, sz, DT_DEVICE_CPU, &s->mesh));
    const char *sp[3] = {ep ? "batch" : DT_UNSHARDED, DT_UNSHARDED, DT_UNSHARDED};
    DT_ASSERT_OK(dt_layout_create(s->mesh, 3, sp, &s->l3));
    DT_ASSERT_OK(dt_layout_create(s->mesh, 3, sp, &s->lw));
    DT_ASSERT_OK(dt_layout_create(s->mesh, 2, sp, &s->lc));
}

static void setup_free(setup *s)
{
    dt_layout_destroy(s->l3);
    dt_layout_destroy(s->lw);
    dt_layout_destroy(s->lc);
    dt_mesh_destroy(s->mesh);
}

/* y, and with grads dx and dw of sum(y * dy) through the tape, on the setup's mesh. */
static void run_on(const setup *s, dt_dtype dt, void *y, void *dx, void *dw)
{
    const int64_t sx[3] = {P, R, K}, sw[3] = {P * G, K, N}, sy[3] = {P, R, N}, sc[2] = {P, G};
    size_t es = dt == DT_DTYPE_F64 ? 8 : 4;
    float fx[P * R * K], fw[P * G * K * N], fdy[P * R * N];
    for (int i = 0; i < P * R * K; i++)
        fx[i] = (float)xs[i];
    for (int i = 0; i < P * G * K * N; i++)
        fw[i] = (float)ws[i];
    for (int i = 0; i < P * R * N; i++)
        fdy[i] = (float)dys[i];
    int f64 = dt == DT_DTYPE_F64;
    dt_tensor *x = NULL, *w = NULL, *c = NULL, *dy = NULL, *out = NULL, *prod = NULL, *l = NULL;
    DT_ASSERT_OK(dt_tensor_from_host(s->l3, dt, sx, f64 ? (void *)xs : (void *)fx, &x));
    DT_ASSERT_OK(dt_tensor_from_host(s->lw, dt, sw, f64 ? (void *)ws : (void *)fw, &w));
    DT_ASSERT_OK(dt_tensor_from_host(s->l3, dt, sy, f64 ? (void *)dys : (void *)fdy, &dy));
    DT_ASSERT_OK(dt_tensor_from_host(s->lc, DT_DTYPE_I64, sc, counts, &c));
    dt_tape *tape = NULL;
    if (dx) {
        DT_ASSERT_OK(dt_tape_create(NULL, &tape));
        DT_ASSERT_OK(dt_tape_watch(tape, x, 0));
        DT_ASSERT_OK(dt_tape_watch(tape, w, 1));
        DT_ASSERT_OK(dt_tape_begin(tape));
    }
    DT_ASSERT_OK(dt_grouped_matmul(x, w, c, 0, &out));
    /* The members stay where they are: no communication, no partial sum. */
    CU_ASSERT_EQUAL(dt_layout_num_partial(dt_tensor_layout(out)), 0);
    DT_ASSERT_OK(dt_tensor_to_host(out, -1, y, es * P * R * N));
    if (dx) {
        DT_ASSERT_OK(dt_mul(out, dy, NULL, &prod));
        DT_ASSERT_OK(dt_sum(prod, NULL, 0, 0, &l));
        DT_ASSERT_OK(dt_tape_end(tape));
        dt_backward_opts bo = DT_BACKWARD_OPTS_INIT;
        bo.require_all = 1;
        DT_ASSERT_OK(dt_tape_backward(tape, l, NULL, 1.0f, &bo));
        const dt_tensor *g = NULL;
        DT_ASSERT_OK(dt_tape_grad(tape, 0, &g));
        DT_ASSERT_OK(dt_tensor_to_host(g, -1, dx, es * P * R * K));
        DT_ASSERT_OK(dt_tape_grad(tape, 1, &g));
        DT_ASSERT_OK(dt_tensor_to_host(g, -1, dw, es * P * G * K * N));
        dt_tape_destroy(tape);
    }
    dt_tensor_destroy(l);
    dt_tensor_destroy(prod);
    dt_tensor_destroy(out);
    dt_tensor_destroy(dy);
    dt_tensor_destroy(c);
    dt_tensor_destroy(w);
    dt_tensor_destroy(x);
}

static void test_one_device_matches_the_per_group_products_bit_for_bit(void)
{
    fill();
    double ref[P * R * N], y[P * R * N];
    float yf[P * R * N];
    reference(ref);
    if (dt_client_id() != 0)
        return;
    setup s;
    setup_make(&s, 0);
    run_on(&s, DT_DTYPE_F64, y, NULL, NULL);
    CU_ASSERT_EQUAL(memcmp(y, ref, sizeof y), 0);
    run_on(&s, DT_DTYPE_F32, yf, NULL, NULL);
    for (int i = 0; i < P * R * N; i++)
        CU_ASSERT(fabs((double)yf[i] - ref[i]) < 1e-6); /* inputs rounded to f32 */
    /* padding rows (member 0's last, all of member 2's) are zero */
    for (int n = 0; n < N; n++) {
        CU_ASSERT_EQUAL(y[(0 * R + 4) * N + n], 0.0);
        CU_ASSERT_EQUAL(y[(2 * R + 0) * N + n], 0.0);
    }
    setup_free(&s);
}

/* The gradients against the definition: dx[r] = dy[r] w_g^T, dw_g = sum_r x[r]^T dy[r]. */
static void test_gradients_match_the_per_group_formulas(void)
{
    fill();
    if (dt_client_id() != 0)
        return;
    setup s;
    setup_make(&s, 0);
    double y[P * R * N], dx[P * R * K], dw[P * G * K * N];
    run_on(&s, DT_DTYPE_F64, y, dx, dw);
    double rdx[P * R * K] = {0}, rdw[P * G * K * N] = {0};
    for (int p = 0; p < P; p++) {
        int64_t r = 0;
        for (int g = 0; g < G; g++)
            for (int64_t c = 0; c < counts[p * G + g]; c++, r++)
                for (int k = 0; k < K; k++)
                    for (int n = 0; n < N; n++) {
                        double wv = ws[((p * G + g) * K + k) * N + n];
                        rdx[(p * R + r) * K + k] += dys[(p * R + r) * N + n] * wv;
                        rdw[((p * G + g) * K + k) * N + n] +=
                            xs[(p * R + r) * K + k] * dys[(p * R + r) * N + n];
                    }
    }
    double worst = 0;
    for (int i = 0; i < P * R * K; i++)
        worst = fmax(worst, fabs(dx[i] - rdx[i]));
    for (int i = 0; i < P * G * K * N; i++)
        worst = fmax(worst, fabs(dw[i] - rdw[i]));
    CU_ASSERT(worst < 1e-14);
    /* padding rows get no gradient; member 2's experts none either */
    for (int k = 0; k < K; k++)
        CU_ASSERT_EQUAL(dx[(0 * R + 4) * K + k], 0.0);
    for (int i = 0; i < K * N; i++)
        CU_ASSERT_EQUAL(dw[(2 * G + 0) * K * N + i], 0.0);
    setup_free(&s);
}

static void test_expert_parallel_mesh_gives_the_one_device_bits(void)
{
    if (dt_test_num_devices() < P)
        return;
    fill();
    double y1[P * R * N], dx1[P * R * K], dw1[P * G * K * N];
    double y4[P * R * N], dx4[P * R * K], dw4[P * G * K * N];
    if (dt_client_id() == 0) {
        setup s;
        setup_make(&s, 0);
        run_on(&s, DT_DTYPE_F64, y1, dx1, dw1);
        setup_free(&s);
    }
    setup s;
    setup_make(&s, 1);
    if (dt_mesh_num_local_devices(s.mesh) > 0) /* 4 processes of 2 devices: clients 0, 1 */
        run_on(&s, DT_DTYPE_F64, y4, dx4, dw4);
    setup_free(&s);
    if (dt_client_id() != 0)
        return;
    CU_ASSERT_EQUAL(memcmp(y1, y4, sizeof y1), 0);
    CU_ASSERT_EQUAL(memcmp(dx1, dx4, sizeof dx1), 0);
    CU_ASSERT_EQUAL(memcmp(dw1, dw4, sizeof dw1), 0);
}

static void test_counts_past_the_rows_are_refused(void)
{
    const char *dn[1] = {"x"};
    int64_t one = 1, sx[3] = {1, 2, 1}, sw[3] = {1, 1, 1}, sc[2] = {1, 1}, bad = 3;
    dt_mesh *mesh = NULL;
    dt_layout *l3 = NULL, *l2 = NULL;
    DT_ASSERT_OK(dt_mesh_create("gmm1", 1, dn, &one, DT_DEVICE_CPU, &mesh));
    DT_ASSERT_OK(dt_layout_replicated(mesh, 3, &l3));
    DT_ASSERT_OK(dt_layout_replicated(mesh, 2, &l2));
    if (dt_client_id() == 0) {
        double xv[2] = {1, 2}, wv[1] = {3};
        dt_tensor *x = NULL, *w = NULL, *c = NULL, *y = NULL;
        DT_ASSERT_OK(dt_tensor_from_host(l3, DT_DTYPE_F64, sx, xv, &x));
        DT_ASSERT_OK(dt_tensor_from_host(l3, DT_DTYPE_F64, sw, wv, &w));
        DT_ASSERT_OK(dt_tensor_from_host(l2, DT_DTYPE_I64, sc, &bad, &c));
        CU_ASSERT_EQUAL(dt_grouped_matmul(x, w, c, 0, &y), DT_ERR_INVALID_ARGUMENT);
        CU_ASSERT_PTR_NULL(y);
        CU_ASSERT(strstr(dt_last_error(), "grouped_matmul") != NULL);
        CU_ASSERT_EQUAL(dt_grouped_matmul(x, w, NULL, 0, &y), DT_ERR_INVALID_ARGUMENT);
        dt_tensor_destroy(c);
        dt_tensor_destroy(w);
        dt_tensor_destroy(x);
    }
    dt_layout_destroy(l2);
    dt_layout_destroy(l3);
    dt_mesh_destroy(mesh);
}

static void report(void *arg, const char *line)
{
    (void)arg;
    fprintf(stderr, "[rank %d] validate: %s\n", dt_client_id(), line);
}

static void test_validator_passes_both_ops(void)
{
    const char *names[2] = {"grouped_matmul", "grouped_matmul_wgrad"};
    for (int i = 0; i < 2; i++) {
        const dt_op *op = dt_op_find(names[i]);
        CU_ASSERT_PTR_NOT_NULL_FATAL(op);
        dt_validate_opts vo = DT_VALIDATE_OPTS_INIT;
        vo.cases = 3;
        vo.report = report;
        dt_validate_result r;
        DT_ASSERT_OK(dt_op_validate(op, &vo, &r));
        CU_ASSERT(r.checks > 0);
        CU_ASSERT_EQUAL(r.failures, 0);
    }
}

int main(int argc, char **argv)
{
    static const dt_test_case cases[] = {
        DT_TEST(test_one_device_matches_the_per_group_products_bit_for_bit),
        DT_TEST(test_gradients_match_the_per_group_formulas),
        DT_TEST(test_expert_parallel_mesh_gives_the_one_device_bits),
        DT_TEST(test_counts_past_the_rows_are_refused),
        DT_TEST(test_validator_passes_both_ops),
        DT_TEST_END,
    };
    return dt_test_main(argc, argv, "grouped_matmul", cases, 1);
}
