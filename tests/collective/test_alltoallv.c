/* dt_alltoallv (include/dtensor/collective.h) against a reference computed here from the
 * global counts: random counts with zeros, a device that sends nothing, one that receives
 * nothing, every row to one device, 1-D and 2-D meshes (the other dim sharding x or
 * replicating it), several dtypes, the received counts, the tape's backward (the reverse
 * exchange) and the errors. Runs on whatever devices the job has (CPU or simulated GPU, one
 * process or several, any transport: tests/collective/meson.build). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "runtime/transport.h"

/* A case: mesh dims, the exchange dim, what shards x's dim 1 (NULL: unsharded). */
typedef struct a2a_case {
    dt_mesh *mesh;
    const char *dim;  /* exchange dim */
    const char *col;  /* mesh dim of x's dim 1, NULL */
    int64_t P, L;     /* members per line, lines */
    int64_t rows, cols; /* x's global shape */
    dt_dtype dtype;
    int64_t *counts;  /* [P*L][P] */
    int shared;       /* send_counts given as [P, P] */
} a2a_case;

static uint64_t rng = 88172645463325252ull;
static uint64_t next_rand(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

/* Element (r, c) of x in the dtype's bytes: distinct patterns (f32: a float, for the
 * backward). */
static void x_value(dt_dtype t, int64_t r, int64_t c, void *out)
{
    size_t s = dt_dtype_size(t);
    if (t == DT_DTYPE_F32) {
        float f = (float)(r * 100 + c) + 0.25f;
        memcpy(out, &f, sizeof f);
        return;
    }
    uint64_t h = (uint64_t)(r + 1) * 0x9E3779B97F4A7C15ull ^ (uint64_t)(c + 7) * 0xC2B2AE35ull;
    memcpy(out, &h, s);
}

static dt_mesh *make_mesh(int nd, const char *const *names, const int64_t *sizes)
{
    dt_mesh *m = NULL;
    DT_ASSERT_OK(dt_mesh_create("a2a", nd, names, sizes, dt_test_device_type(), &m));
    return m;
}

/* A tensor on layout l of global shape [rows, cols] whose element (r, c) is fn(r, c). */
static dt_tensor *make_tensor(const dt_layout *l, dt_dtype t, int64_t rows, int64_t cols,
                              void (*fn)(dt_dtype, int64_t, int64_t, void *))
{
    int64_t shape[2] = {rows, cols};
    dt_tensor *x = NULL;
    DT_ASSERT_OK(dt_tensor_zeros(l, t, shape, &x));
    size_t s = dt_dtype_size(t);
    for (int i = 0; i < dt_tensor_num_local(x); i++) {
        const DLTensor *dl = dt_tensor_local(x, i);
        const int64_t *off = dt_tensor_local_offset(x, i);
        char *buf = malloc((size_t)(dl->shape[0] * dl->shape[1]) * s + 1);
        for (int64_t r = 0; r < dl->shape[0]; r++)
            for (int64_t c = 0; c < dl->shape[1]; c++)
                fn(t, off[0] + r, off[1] + c, buf + (size_t)(r * dl->shape[1] + c) * s);
        dt_test_local_set(x, i, buf);
        free(buf);
    }
    return x;
}

/* send_counts from the case's host counts, dim 0 sharded over the exchange dim. */
static dt_tensor *make_counts(const a2a_case *k, const int64_t *host, int shared)
{
    int64_t rows = shared ? k->P : k->P * k->L, shape[2] = {rows, k->P};
    dt_layout *l = dt_test_layout(k->mesh, 2, k->dim, NULL, NULL);
    dt_tensor *t = NULL;
    DT_ASSERT_OK(dt_tensor_zeros(l, DT_DTYPE_I64, shape, &t));
    for (int i = 0; i < dt_tensor_num_local(t); i++) {
        const DLTensor *dl = dt_tensor_local(t, i);
        const int64_t *off = dt_tensor_local_offset(t, i);
        int64_t *buf = malloc((size_t)(dl->shape[0] * k->P) * sizeof *buf + 8);
        for (int64_t r = 0; r < dl->shape[0]; r++) {
            int64_t g = off[0] + r; /* global row: m*L + l, or m when shared */
            memcpy(&buf[r * k->P], &host[(shared ? g * k->L : g) * k->P],
                   (size_t)k->P * sizeof *buf);
        }
        dt_test_local_set(t, i, buf);
        free(buf);
    }
    dt_layout_destroy(l);
    return t;
}

static int64_t C(const a2a_case *k, int64_t m, int64_t l, int64_t j)
{
    return k->counts[(m * k->L + l) * k->P + j];
}

/* The line holding global column c of x: its shard over the col dim (lines = that dim's
 * coordinate), line 0 when x is replicated there. */
static int64_t line_of_col(const a2a_case *k, int64_t c)
{
    if (!k->col)
        return 0;
    for (int64_t l = 0; l < k->L; l++) {
        int64_t off, len;
        dt_shard_range(k->cols, k->L, l, &off, &len);
        if (c >= off && c < off + len)
            return l;
    }
    return 0;
}

/* The whole tensor on the host (relaid out to replicated, component 0). */
static void *whole(const dt_tensor *t)
{
    dt_layout *rep = NULL;
    dt_tensor *r = NULL;
    DT_ASSERT_OK(dt_layout_replicated(dt_layout_mesh(dt_tensor_layout(t)), dt_tensor_rank(t),
                                      &rep));
    DT_ASSERT_OK(dt_relayout(t, rep, &r));
    void *h = dt_test_local_get(r, 0);
    dt_tensor_destroy(r);
    dt_layout_destroy(rep);
    return h;
}

/* Runs the case with out_rows and checks y and the received counts element for element. */
static void check_case(a2a_case *k, int64_t out_rows)
{
    dt_layout *xl = dt_test_layout(k->mesh, 2, k->dim, k->col, NULL);
    dt_tensor *x = make_tensor(xl, k->dtype, k->rows, k->cols, x_value);
    dt_tensor *sc = make_counts(k, k->counts, k->shared), *y = NULL, *rc = NULL;
    DT_ASSERT_OK(dt_alltoallv(x, sc, k->dim, out_rows, &y, &rc));
    int64_t maxr = 0, P = k->P, L = k->L;
    for (int64_t m = 0; m < P; m++)
        for (int64_t l = 0; l < L; l++) {
            int64_t r = 0;
            for (int64_t j = 0; j < P; j++)
                r += C(k, j, l, m);
            maxr = r > maxr ? r : maxr;
        }
    int64_t R = out_rows ? out_rows : (maxr ? maxr : 1);
    CU_ASSERT_EQUAL(dt_tensor_shape(y)[0], P * R);
    CU_ASSERT_EQUAL(dt_tensor_shape(y)[1], k->cols);
    CU_ASSERT_TRUE(dt_layout_equal(dt_tensor_layout(y), xl));
    size_t s = dt_dtype_size(k->dtype);
    char *got = whole(y);
    char *want = calloc((size_t)(P * R * k->cols), s);
    for (int64_t row = 0; row < P * R; row++)
        for (int64_t c = 0; c < k->cols; c++) {
            int64_t m = row / R, r = row % R, l = line_of_col(k, c), acc = 0;
            for (int64_t j = 0; j < P; j++) {
                int64_t n = C(k, j, l, m);
                if (r < acc + n) {
                    int64_t off, len, srow = r - acc;
                    for (int64_t q = 0; q < m; q++)
                        srow += C(k, j, l, q);
                    dt_shard_range(k->rows, P, j, &off, &len);
                    x_value(k->dtype, off + srow, c, want + (size_t)(row * k->cols + c) * s);
                    break;
                }
                acc += n;
            }
        }
    int bad = memcmp(got, want, (size_t)(P * R * k->cols) * s) != 0;
    if (bad)
        fprintf(stderr, "[client %d] alltoallv over %s (%s, %lldx%lld, out_rows %lld): y differs\n",
                dt_client_id(), k->dim, dt_dtype_name(k->dtype), (long long)k->rows,
                (long long)k->cols, (long long)out_rows);
    CU_ASSERT_FALSE(bad);
    int64_t *rcv = whole(rc);
    int64_t rows = k->shared ? P : P * L;
    CU_ASSERT_EQUAL(dt_tensor_shape(rc)[0], rows);
    for (int64_t r = 0; r < rows; r++)
        for (int64_t j = 0; j < P; j++) {
            int64_t m = k->shared ? r : r / L, l = k->shared ? 0 : r % L;
            CU_ASSERT_EQUAL(rcv[r * P + j], C(k, j, l, m));
        }
    free(rcv);
    free(got);
    free(want);
    dt_tensor_destroy(rc);
    dt_tensor_destroy(y);
    dt_tensor_destroy(sc);
    dt_tensor_destroy(x);
    dt_layout_destroy(xl);
}

/* Counts for every device: random in [0, cap] (some zeros), scaled into its shard. */
static void random_counts(a2a_case *k, int zero_pct)
{
    for (int64_t m = 0; m < k->P; m++)
        for (int64_t l = 0; l < k->L; l++) {
            int64_t off, len, sum = 0, *row = &k->counts[(m * k->L + l) * k->P];
            dt_shard_range(k->rows, k->P, m, &off, &len);
            for (int64_t j = 0; j < k->P; j++) {
                row[j] = (int64_t)(next_rand() % 100) < zero_pct
                             ? 0 : (int64_t)(next_rand() % (uint64_t)(len / 2 + 2));
                sum += row[j];
            }
            for (int64_t j = k->P - 1; sum > len; j = (j + k->P - 1) % k->P)
                if (row[j] > 0) {
                    row[j]--;
                    sum--;
                }
        }
    if (!k->col) /* x replicated over the other dims: every line sends alike */
        for (int64_t m = 0; m < k->P; m++)
            for (int64_t l = 1; l < k->L; l++)
                memcpy(&k->counts[(m * k->L + l) * k->P], &k->counts[(m * k->L) * k->P],
                       (size_t)k->P * sizeof(int64_t));
}

static a2a_case case_1d(int64_t rows, int64_t cols, dt_dtype t)
{
    static const char *names[] = {"ep"};
    int64_t n = dt_test_num_devices();
    a2a_case k = {make_mesh(1, names, &n), "ep", NULL, n, 1, rows, cols, t, NULL, 0};
    k.counts = calloc((size_t)(n * n), sizeof *k.counts);
    return k;
}

static void case_free(a2a_case *k)
{
    free(k->counts);
    dt_mesh_destroy(k->mesh);
}

static void test_alltoallv_random_counts_with_zeros(void)
{
    static const dt_dtype ts[] = {DT_DTYPE_F32, DT_DTYPE_F64, DT_DTYPE_BF16, DT_DTYPE_I32};
    for (int i = 0; i < 4; i++) {
        a2a_case k = case_1d(5 * dt_test_num_devices() + 3, 3, ts[i]); /* uneven shards */
        random_counts(&k, 30);
        check_case(&k, 0);
        check_case(&k, 5 * k.P); /* explicit out_rows, zero rows after */
        case_free(&k);
    }
}

static void test_alltoallv_device_sends_nothing_and_another_receives_nothing(void)
{
    a2a_case k = case_1d(4 * dt_test_num_devices(), 2, DT_DTYPE_F32);
    random_counts(&k, 0);
    for (int64_t j = 0; j < k.P; j++)
        k.counts[j] = 0; /* member 0 sends nothing */
    for (int64_t m = 0; m < k.P; m++)
        k.counts[m * k.P + k.P - 1] = 0; /* the last member receives nothing */
    check_case(&k, 0);
    case_free(&k);
}

static void test_alltoallv_all_rows_to_one_device(void)
{
    a2a_case k = case_1d(3 * dt_test_num_devices(), 2, DT_DTYPE_F32);
    for (int64_t m = 0; m < k.P; m++)
        k.counts[m * k.P + (k.P > 1 ? 1 : 0)] = 3;
    check_case(&k, 0);
    /* nothing at all moves: one zero row per device */
    memset(k.counts, 0, (size_t)(k.P * k.P) * sizeof *k.counts);
    check_case(&k, 0);
    case_free(&k);
}

/* 2-D meshes: over the second dim with x's columns sharded over the first (each line its own
 * counts), and over the first with x replicated over the second (counts [P, P] shared). */
static void test_alltoallv_on_2d_meshes(void)
{
    int64_t n = dt_test_num_devices();
    if (n < 4 || n % 2)
        return;
    static const char *names[] = {"dp", "ep"};
    int64_t sizes[2] = {2, n / 2};
    dt_mesh *mesh = make_mesh(2, names, sizes);
    a2a_case k = {mesh, "ep", "dp", n / 2, 2, 4 * (n / 2) + 1, 5, DT_DTYPE_F32, NULL, 0};
    k.counts = calloc((size_t)(n * n), sizeof *k.counts);
    random_counts(&k, 25);
    check_case(&k, 0);
    /* over dp: its lines cross processes when each holds one row of the mesh (np 2, 2
     * devices each); every pair moves rows */
    a2a_case k2 = {mesh, "dp", NULL, 2, n / 2, 7, 3, DT_DTYPE_F64, k.counts, 1};
    for (int64_t m = 0; m < 2; m++)
        for (int64_t l = 0; l < k2.L; l++)
            for (int64_t j = 0; j < 2; j++)
                k2.counts[(m * k2.L + l) * 2 + j] = m == 0 ? 1 + j : 2 - j;
    check_case(&k2, 0);
    k2.shared = 0; /* the same counts, one row per device */
    check_case(&k2, 0);
    case_free(&k);
}

/* Backward through a tape: dx is dy's rows sent back where they came from, zeros in the
 * rows x did not send. */
static void dy_value(dt_dtype t, int64_t r, int64_t c, void *out)
{
    (void)t;
    float f = (float)(r * 10 + c) * 0.5f - 3.0f;
    memcpy(out, &f, sizeof f);
}

static void backward_case(int checkpoint)
{
    a2a_case k = case_1d(4 * dt_test_num_devices() + 1, 3, DT_DTYPE_F32);
    random_counts(&k, 20);
    dt_layout *xl = dt_test_layout(k.mesh, 2, "ep", NULL, NULL);
    dt_tensor *x = make_tensor(xl, DT_DTYPE_F32, k.rows, k.cols, x_value);
    dt_tensor *sc = make_counts(&k, k.counts, 0), *y = NULL;
    dt_tape *tape = NULL;
    DT_ASSERT_OK(dt_tape_create(NULL, &tape));
    DT_ASSERT_OK(dt_tape_begin(tape));
    DT_ASSERT_OK(dt_tape_watch(tape, x, 0));
    if (checkpoint) /* recomputed at backward: a replay through the op definition */
        DT_ASSERT_OK(dt_tape_checkpoint_begin(tape, NULL));
    DT_ASSERT_OK(dt_alltoallv(x, sc, "ep", 0, &y, NULL));
    if (checkpoint)
        DT_ASSERT_OK(dt_tape_checkpoint_end(tape));
    DT_ASSERT_OK(dt_tape_end(tape));
    int64_t Y = dt_tensor_shape(y)[0], R = Y / k.P;
    /* dy replicated: the backward lays it out as y first */
    dt_layout *rep = NULL;
    DT_ASSERT_OK(dt_layout_replicated(k.mesh, 2, &rep));
    dt_tensor *dy = make_tensor(checkpoint ? xl : rep, DT_DTYPE_F32, Y, k.cols, dy_value);
    dt_layout_destroy(rep);
    DT_ASSERT_OK(dt_tape_backward(tape, y, dy, 1.0f, NULL));
    const dt_tensor *gx = NULL;
    DT_ASSERT_OK(dt_tape_grad(tape, 0, &gx));
    CU_ASSERT_FATAL(gx != NULL);
    CU_ASSERT_EQUAL(dt_tensor_shape(gx)[0], k.rows);
    float *got = whole(gx);
    int bad = 0;
    for (int64_t m = 0; m < k.P; m++) {
        int64_t off, len, s = 0;
        dt_shard_range(k.rows, k.P, m, &off, &len);
        for (int64_t j = 0; j < k.P; j++)
            for (int64_t q = 0; q < C(&k, m, 0, j); q++, s++) {
                int64_t yrow = j * R + q; /* where row s went */
                for (int64_t i = 0; i < m; i++)
                    yrow += C(&k, i, 0, j);
                for (int64_t c = 0; c < k.cols; c++) {
                    float want;
                    dy_value(DT_DTYPE_F32, yrow, c, &want);
                    bad += got[(off + s) * k.cols + c] != want;
                }
            }
        for (; s < len; s++)
            for (int64_t c = 0; c < k.cols; c++)
                bad += got[(off + s) * k.cols + c] != 0.0f;
    }
    CU_ASSERT_EQUAL(bad, 0);
    free(got);
    dt_tensor_destroy(dy);
    dt_tensor_destroy(y);
    dt_tape_destroy(tape);
    dt_tensor_destroy(sc);
    dt_tensor_destroy(x);
    dt_layout_destroy(xl);
    case_free(&k);
}

static void test_alltoallv_backward_is_the_reverse_exchange(void)
{
    backward_case(0);
}

static void test_alltoallv_backward_under_activation_checkpointing(void)
{
    backward_case(1);
}

static void expect_error(a2a_case *k, int64_t out_rows, dt_status want, const char *text)
{
    dt_layout *xl = dt_test_layout(k->mesh, 2, k->dim, k->col, NULL);
    dt_tensor *x = make_tensor(xl, k->dtype, k->rows, k->cols, x_value);
    dt_tensor *sc = make_counts(k, k->counts, k->shared), *y = NULL;
    dt_status st = dt_alltoallv(x, sc, k->dim, out_rows, &y, NULL);
    CU_ASSERT_EQUAL(st, want);
    CU_ASSERT_PTR_NULL(y);
    if (st != want || !strstr(dt_last_error(), text))
        fprintf(stderr, "[client %d] expected %s with '%s', got %s: %s\n", dt_client_id(),
                dt_status_name(want), text, dt_status_name(st), dt_last_error());
    CU_ASSERT_PTR_NOT_NULL(strstr(dt_last_error(), text));
    dt_tensor_destroy(sc);
    dt_tensor_destroy(x);
    dt_layout_destroy(xl);
}

static void test_alltoallv_rejects_bad_counts_on_every_client(void)
{
    a2a_case k = case_1d(2 * dt_test_num_devices(), 2, DT_DTYPE_F32);
    int64_t last = k.P - 1;
    k.counts[last * k.P] = -1;
    expect_error(&k, 0, DT_ERR_INVALID_ARGUMENT, "negative counts");
    k.counts[last * k.P] = 3; /* 3 rows from a shard of 2 */
    expect_error(&k, 0, DT_ERR_INVALID_ARGUMENT, "summing past the 2 rows");
    memset(k.counts, 0, (size_t)(k.P * k.P) * sizeof *k.counts);
    for (int64_t m = 0; m < k.P; m++)
        k.counts[m * k.P] = 2; /* 2P rows to member 0, out_rows 1 */
    expect_error(&k, 1, DT_ERR_INVALID_ARGUMENT, "more than out_rows");
    dt_tensor *y = NULL;
    CU_ASSERT_EQUAL(dt_alltoallv(NULL, NULL, "ep", 0, &y, NULL), DT_ERR_INVALID_ARGUMENT);
    case_free(&k);
}

/* Under DT_CHECK_COLLECTIVES=1: lines holding the same rows of x (replicated over the other
 * dim) must send the same counts. */
static void test_alltoallv_check_names_disagreeing_replicas(void)
{
    const char *chk = getenv("DT_CHECK_COLLECTIVES");
    int64_t n = dt_test_num_devices();
    if (!chk || strcmp(chk, "1") != 0 || n < 4 || n % 2)
        return;
    static const char *names[] = {"dp", "ep"};
    int64_t sizes[2] = {2, n / 2};
    a2a_case k = {make_mesh(2, names, sizes), "ep", NULL, n / 2, 2, 2 * (n / 2), 2,
                  DT_DTYPE_F32, NULL, 0};
    k.counts = calloc((size_t)(n * n), sizeof *k.counts);
    k.counts[1 * k.P] = 1; /* member 0 of line 1 sends a row its replica on line 0 does not */
    expect_error(&k, 0, DT_ERR_STATE, "which holds the same rows");
    case_free(&k);
}

/* The flight recorder keeps the call: its name, dim, dtype and shape. */
static void test_alltoallv_is_in_the_flight_record(void)
{
    a2a_case k = case_1d(2 * dt_test_num_devices(), 2, DT_DTYPE_F32);
    random_counts(&k, 0);
    long long before = dt_trace_count();
    check_case(&k, 0);
    CU_ASSERT_TRUE(dt_trace_count() > before);
    char dir[512], path[600];
    dt_test_scratch_dir(dir, sizeof dir);
    DT_ASSERT_OK(dt_trace_dump(dir, "test"));
    snprintf(path, sizeof path, "%s/rank-%d.json", dir, dt_client_id());
    FILE *f = fopen(path, "rb");
    CU_ASSERT_PTR_NOT_NULL_FATAL(f);
    static char text[1 << 20];
    size_t n = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[n] = 0;
    char want[128];
    snprintf(want, sizeof want, "dim ep, f32 [%lld,2]", (long long)k.rows);
    CU_ASSERT_PTR_NOT_NULL(strstr(text, "alltoallv"));
    CU_ASSERT_PTR_NOT_NULL(strstr(text, want));
    dt_test_scratch_remove(dir);
    case_free(&k);
}

/* Through the shm transport with one device per process (every line's members on distinct
 * clients: its native ragged all-to-all), the rows from other processes are copied straight
 * out of their segments, none by MPI. */
static void test_alltoallv_shm_copies_rows_straight_between_processes(void)
{
    const char *tr = getenv("DT_TRANSPORT");
    if (!tr || strcmp(tr, "shm") != 0 || dt_num_clients() < 2 ||
        dt_test_num_devices() != dt_num_clients())
        return;
    a2a_case k = case_1d(6 * dt_test_num_devices(), 4, DT_DTYPE_F32);
    random_counts(&k, 20);
    for (int64_t j = 0; j < k.P; j++) /* member 0 sends member 1 rows, and itself one */
        k.counts[j] = j == 0 ? 1 : j == 1 ? 2 : 0;
    uint64_t d0, v0, m0, d1, v1, m1;
    dt__transport_shm_bytes(&d0, &v0, &m0);
    check_case(&k, 0);
    dt__transport_shm_bytes(&d1, &v1, &m1);
    int64_t me = dt_client_id(), from_others = 0;
    for (int64_t j = 0; j < k.P; j++)
        if (j != me)
            from_others += k.counts[j * k.P + me];
    /* y's rows: 4 f32 each (the received counts' relayout adds its own bytes) */
    CU_ASSERT_TRUE(d1 - d0 >= (uint64_t)from_others * 16);
    CU_ASSERT_EQUAL(m1, m0);
    case_free(&k);
}

int main(int argc, char **argv)
{
    static const dt_test_case cases[] = {
        DT_TEST(test_alltoallv_random_counts_with_zeros),
        DT_TEST(test_alltoallv_device_sends_nothing_and_another_receives_nothing),
        DT_TEST(test_alltoallv_all_rows_to_one_device),
        DT_TEST(test_alltoallv_on_2d_meshes),
        DT_TEST(test_alltoallv_backward_is_the_reverse_exchange),
        DT_TEST(test_alltoallv_backward_under_activation_checkpointing),
        DT_TEST(test_alltoallv_rejects_bad_counts_on_every_client),
        DT_TEST(test_alltoallv_check_names_disagreeing_replicas),
        DT_TEST(test_alltoallv_is_in_the_flight_record),
        DT_TEST(test_alltoallv_shm_copies_rows_straight_between_processes),
        DT_TEST_END,
    };
    return dt_test_main_device(argc, argv, "alltoallv", cases);
}
