/* The CPU workers (runtime/cpu_workers.c, dt__ops_each_local): the ops of a training step give
 * the same bits with the workers off and on, on 1x2 and 2x2 meshes in one process and on every
 * device of a multi-process job; a share runs on another thread; a failing share's status and
 * message reach the caller; the BLAS thread count shares the cores among the lanes. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <sched.h>
#include <string.h>
#include <time.h>

#include "harness.h"
#include "ops/ops_impl.h"
#include "ops_test_util.h"
#include "runtime/error.h"
#include "runtime/workers.h"

/* ---- the pool itself ------------------------------------------------------------------- */

typedef struct probe {
    pthread_t caller;
    int n;
    int hold; /* component 0 waits until component 1 is done (on another thread) */
    _Atomic int ran[16];
    _Atomic int done[16];
    pthread_t thread[16];
    int fail_at[2]; /* components that fail (-1: none) */
} probe;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static dt_status probe_fn(int i, void *arg)
{
    probe *p = arg;
    p->thread[i] = pthread_self();
    atomic_fetch_add(&p->ran[i], 1);
    /* Holding component 0 until 1 is done makes another thread take 1 (10 s at most, so that
     * a broken pool fails the test rather than hangs it). */
    for (double t0 = now_s();
         i == 0 && p->hold && !atomic_load(&p->done[1]) && now_s() - t0 < 10.0;)
        sched_yield();
    dt_status st = DT_OK;
    if (i == p->fail_at[0] || i == p->fail_at[1])
        st = dt__error(i == p->fail_at[0] ? DT_ERR_SHAPE : DT_ERR_IO,
                       "component %d failed on purpose", i);
    atomic_store(&p->done[i], 1);
    return st;
}

static void probe_init(probe *p, int n, int hold, int f0, int f1)
{
    memset(p, 0, sizeof *p);
    p->caller = pthread_self();
    p->n = n;
    p->hold = hold;
    p->fail_at[0] = f0;
    p->fail_at[1] = f1;
}

static void test_workers_run_each_component_once_two_at_a_time(void)
{
    DT_ASSERT_OK(dt__workers_configure(2, 0));
    CU_ASSERT_EQUAL_FATAL(dt__workers_lanes(), 2);
    probe p;
    unsigned long long jobs = dt__workers_jobs();
    probe_init(&p, 5, 1, -1, -1);
    DT_ASSERT_OK(dt__workers_run(5, probe_fn, &p));
    CU_ASSERT_EQUAL(dt__workers_jobs(), jobs + 1);
    for (int i = 0; i < 5; i++)
        CU_ASSERT_EQUAL(atomic_load(&p.ran[i]), 1);
    /* 1 finished while 0 was running: on another thread, at the same time. */
    CU_ASSERT(atomic_load(&p.done[1]));
    CU_ASSERT(!pthread_equal(p.thread[0], p.thread[1]));
    /* Many small jobs back to back: every component once. */
    for (int r = 0; r < 2000; r++) {
        probe_init(&p, 3, 0, -1, -1);
        DT_ASSERT_OK(dt__workers_run(3, probe_fn, &p));
        CU_ASSERT_FATAL(p.ran[0] == 1 && p.ran[1] == 1 && p.ran[2] == 1);
    }
    /* Off: everything on the caller, in order. */
    DT_ASSERT_OK(dt__workers_configure(0, 0));
    CU_ASSERT_EQUAL(dt__workers_lanes(), 1);
    jobs = dt__workers_jobs();
    probe_init(&p, 5, 0, -1, -1);
    DT_ASSERT_OK(dt__workers_run(5, probe_fn, &p));
    CU_ASSERT_EQUAL(dt__workers_jobs(), jobs);
    for (int i = 0; i < 5; i++)
        CU_ASSERT(pthread_equal(p.thread[i], p.caller));
    DT_ASSERT_OK(dt__workers_configure(-1, 0));
}

static void test_workers_failure_on_a_worker_reaches_the_caller(void)
{
    DT_ASSERT_OK(dt__workers_configure(2, 0));
    probe p;
    /* Component 1 fails on the thread that is not holding 0: until that is a worker (the
     * caller usually takes 0 first), its status and text must come back. */
    int on_worker = 0;
    for (int tries = 0; tries < 20 && !on_worker; tries++) {
        probe_init(&p, 4, 1, 1, -1);
        dt_clear_error();
        DT_ASSERT_FAILS(dt__workers_run(4, probe_fn, &p), DT_ERR_SHAPE);
        DT_ASSERT_ERROR_MENTIONS("component 1 failed on purpose");
        on_worker = !pthread_equal(p.thread[1], p.caller);
    }
    CU_ASSERT(on_worker);
    /* Two failures: the lowest component's wins, wherever each ran. */
    probe_init(&p, 4, 1, 1, 2);
    dt_clear_error();
    DT_ASSERT_FAILS(dt__workers_run(4, probe_fn, &p), DT_ERR_SHAPE);
    DT_ASSERT_ERROR_MENTIONS("component 1 failed on purpose");
    probe_init(&p, 4, 1, 3, 2);
    DT_ASSERT_FAILS(dt__workers_run(4, probe_fn, &p), DT_ERR_IO);
    DT_ASSERT_ERROR_MENTIONS("component 2 failed on purpose");
    /* After a failure the pool runs the next job normally. */
    probe_init(&p, 4, 1, -1, -1);
    DT_ASSERT_OK(dt__workers_run(4, probe_fn, &p));
    DT_ASSERT_OK(dt__workers_configure(-1, 0));
}

/* ---- ops on and off -------------------------------------------------------------------- */

/* The meshes: 1x2 and 2x2 in one process, every device of the job otherwise. */
static int meshes_of(dt_mesh **out)
{
    const char *names[2] = {"b", "m"};
    int n = 0;
    if (dt_num_clients() == 1) {
        int64_t s12[2] = {1, 2}, s22[2] = {2, 2};
        if (dt_test_num_local_devices() >= 2)
            DT_ASSERT_OK(dt_mesh_create("w12", 2, names, s12, DT_DEVICE_CPU, &out[n++]));
        if (dt_test_num_local_devices() >= 4)
            DT_ASSERT_OK(dt_mesh_create("w22", 2, names, s22, DT_DEVICE_CPU, &out[n++]));
    } else {
        int64_t s[2] = {2, dt_test_num_devices() / 2};
        DT_ASSERT_OK(dt_mesh_create("wall", 2, names, s, DT_DEVICE_CPU, &out[n++]));
    }
    return n;
}

typedef struct vals {
    float *v;
    int64_t n, cap;
} vals;

/* Appends the whole value of t (destroyed). */
static void keep(vals *o, dt_tensor *t)
{
    int64_t n = dt_tensor_numel(t);
    if (o->n + n > o->cap) {
        o->cap = 2 * (o->n + n);
        o->v = realloc(o->v, (size_t)o->cap * sizeof *o->v);
        CU_ASSERT_PTR_NOT_NULL_FATAL(o->v);
    }
    ot_fetch(t, o->v + o->n);
    o->n += n;
    dt_tensor_destroy(t);
}

static dt_layout *lay3(const dt_mesh *m, const char *s0, const char *s1, const char *s2)
{
    const char *s[3] = {s0 ? s0 : DT_UNSHARDED, s1 ? s1 : DT_UNSHARDED, s2 ? s2 : DT_UNSHARDED};
    dt_layout *l = NULL;
    DT_ASSERT_OK(dt_layout_create(m, 3, s, &l));
    return l;
}

static dt_tensor *rand_t(const dt_layout *l, const int64_t *shape, int rank, uint64_t seed)
{
    int64_t n = 1;
    for (int d = 0; d < rank; d++)
        n *= shape[d];
    float *h = malloc((size_t)n * sizeof *h);
    CU_ASSERT_PTR_NOT_NULL_FATAL(h);
    ot_fill_real(h, n, -1.0f, 1.0f, seed);
    dt_tensor *t = ot_tensor(l, DT_DTYPE_F32, shape, h);
    free(h);
    return t;
}

/* A training step's ops on mesh m (dims b, m), every result appended to o. */
static void run_ops(const dt_mesh *m, vals *o)
{
    enum { B = 4, T = 8, C = 16, H = 32, V = 12, HEADS = 4 };
    int64_t sx[3] = {B, T, C}, sw1[2] = {C, H}, sw2[2] = {H, C}, sc[1] = {C};
    dt_layout *lx = lay3(m, "b", NULL, NULL), *lq = lay3(m, "b", NULL, "m");
    dt_layout *lw1 = dt_test_layout(m, 2, NULL, "m", NULL);
    dt_layout *lw2 = dt_test_layout(m, 2, "m", NULL, NULL);
    dt_layout *l1 = NULL;
    DT_ASSERT_OK(dt_layout_replicated(m, 1, &l1));
    dt_tensor *x = rand_t(lx, sx, 3, 1), *dy = rand_t(lx, sx, 3, 2);
    dt_tensor *w1 = rand_t(lw1, sw1, 2, 3), *w2 = rand_t(lw2, sw2, 2, 4);

    /* MLP forward and backward: matmul_nd, gelu, their backward (dw partial, then reduced). */
    dt_tensor *h = NULL, *g = NULL, *y = NULL, *dg = NULL, *dw2 = NULL, *dh = NULL, *dx = NULL,
              *dw1 = NULL;
    DT_ASSERT_OK(dt_matmul_nd(x, w1, 0, 0, NULL, &h));
    DT_ASSERT_OK(dt_gelu(h, &g));
    DT_ASSERT_OK(dt_matmul_nd(g, w2, 0, 0, NULL, &y));
    DT_ASSERT_OK(dt_matmul_nd_backward(g, w2, 0, 0, dy, NULL, NULL, &dg, &dw2));
    DT_ASSERT_OK(dt_gelu_backward(h, dg, &dh));
    DT_ASSERT_OK(dt_matmul_nd_backward(x, w1, 0, 0, dh, NULL, NULL, &dx, &dw1));
    /* AdamW on the row-sharded w2 with its partial gradient (reduce-scattered). */
    float zero[H * C] = {0};
    dt_tensor *mm = ot_tensor(lw2, DT_DTYPE_F32, sw2, zero);
    dt_tensor *vv = ot_tensor(lw2, DT_DTYPE_F32, sw2, zero);
    dt_adam_opts ao = DT_ADAMW_OPTS_INIT;
    DT_ASSERT_OK(dt_adam_step(&ao, 1, w2, dw2, mm, vv));
    keep(o, h), keep(o, g), keep(o, y), keep(o, dg), keep(o, dw2), keep(o, dh), keep(o, dx);
    keep(o, dw1), keep(o, mm), keep(o, vv);

    /* A dropout mask (filled on the host per device, then written). */
    dt_tensor *mask = NULL;
    DT_ASSERT_OK(dt_dropout_mask(lx, sx, 0.25f, 42, 3, &mask));
    keep(o, mask);

    /* Layer norm and its backward. */
    dt_tensor *gam = rand_t(l1, sc, 1, 5), *bet = rand_t(l1, sc, 1, 6);
    dt_tensor *ln = NULL, *dlx = NULL, *dgam = NULL, *dbet = NULL;
    DT_ASSERT_OK(dt_layer_norm(x, gam, bet, 1e-5f, &ln));
    DT_ASSERT_OK(dt_layer_norm_backward(x, gam, dy, 1e-5f, &dlx, &dgam, &dbet));
    keep(o, ln), keep(o, dlx), keep(o, dgam), keep(o, dbet);

    /* Causal attention, heads split over m, and its backward. */
    dt_tensor *q = rand_t(lq, sx, 3, 7), *k = rand_t(lq, sx, 3, 8), *v = rand_t(lq, sx, 3, 9);
    dt_tensor *dya = rand_t(lq, sx, 3, 10);
    dt_tensor *att = NULL, *dq = NULL, *dk = NULL, *dv = NULL;
    DT_ASSERT_OK(dt_attention(q, k, v, HEADS, 1, &att));
    DT_ASSERT_OK(dt_attention_backward(q, k, v, HEADS, 1, dya, &dq, &dk, &dv));
    keep(o, att), keep(o, dq), keep(o, dk), keep(o, dv);

    /* Losses: rows over m (softmax cross-entropy), classes over m (vocab-parallel). */
    int64_t slog[2] = {B * T, V}, slab[1] = {B * T};
    int32_t lab[B * T];
    for (int i = 0; i < B * T; i++)
        lab[i] = (i * 7 + 3) % V;
    dt_layout *lrow = dt_test_layout(m, 2, "m", NULL, NULL);
    dt_layout *lcol = dt_test_layout(m, 2, NULL, "m", NULL);
    dt_layout *llab = dt_test_layout(m, 1, "m", NULL, NULL);
    dt_layout *llab1 = NULL;
    DT_ASSERT_OK(dt_layout_replicated(m, 1, &llab1));
    dt_tensor *logr = rand_t(lrow, slog, 2, 11), *logc = rand_t(lcol, slog, 2, 12);
    dt_tensor *labr = ot_tensor(llab, DT_DTYPE_I32, slab, lab);
    dt_tensor *labc = ot_tensor(llab1, DT_DTYPE_I32, slab, lab);
    dt_tensor *l1s = NULL, *d1 = NULL, *l2s = NULL, *d2 = NULL;
    DT_ASSERT_OK(dt_softmax_xent(logr, labr, NULL, &l1s));
    DT_ASSERT_OK(dt_softmax_xent_backward(logr, labr, 1.0f, &d1));
    DT_ASSERT_OK(dt_vocab_xent(logc, labc, NULL, &l2s));
    DT_ASSERT_OK(dt_vocab_xent_backward(logc, labc, 1.0f, &d2));
    keep(o, l1s), keep(o, d1), keep(o, l2s), keep(o, d2);

    /* Vocabulary-sharded embedding and its backward. */
    int64_t stab[2] = {V, C}, sid[2] = {B, T}, semb[3] = {B, T, C};
    dt_layout *ltab = dt_test_layout(m, 2, "m", NULL, NULL);
    dt_layout *lid = dt_test_layout(m, 2, "b", NULL, NULL);
    dt_tensor *tab = rand_t(ltab, stab, 2, 13), *ids = ot_tensor(lid, DT_DTYPE_I32, sid, lab);
    dt_tensor *demb = rand_t(lx, semb, 3, 14);
    dt_tensor *emb = NULL, *dtab = NULL;
    DT_ASSERT_OK(dt_embedding(tab, ids, NULL, &emb));
    DT_ASSERT_OK(dt_embedding_backward(tab, ids, demb, NULL, &dtab));
    keep(o, emb), keep(o, dtab);

    keep(o, w2);
    dt_tensor *drop[] = {x, dy, w1, gam, bet, q, k, v, dya, logr, logc, labr, labc, tab, ids, demb};
    for (size_t i = 0; i < sizeof drop / sizeof drop[0]; i++)
        dt_tensor_destroy(drop[i]);
    dt_layout *dl[] = {lx, lq, lw1, lw2, l1, lrow, lcol, llab, llab1, ltab, lid};
    for (size_t i = 0; i < sizeof dl / sizeof dl[0]; i++)
        dt_layout_destroy(dl[i]);
}

static void test_ops_give_the_same_bits_with_workers_on_and_off(void)
{
    dt_mesh *meshes[2];
    int nm = meshes_of(meshes);
    CU_ASSERT_FATAL(nm >= 1);
    for (int mi = 0; mi < nm; mi++) {
        int local = dt_mesh_num_local_devices(meshes[mi]);
        vals ref = {0}, got = {0};
        DT_ASSERT_OK(dt__workers_configure(0, 0));
        unsigned long long jobs = dt__workers_jobs();
        run_ops(meshes[mi], &ref);
        CU_ASSERT_EQUAL(dt__workers_jobs(), jobs); /* off: nothing ran on workers */
        /* Each local device on its own lane, two lanes shared round-robin, then two lanes
         * claiming the shares as they come free (what dt_init runs). */
        int cfg[3][2] = {{local, 1}, {2, 1}, {2, 0}};
        for (int ci = local > 2 ? 0 : 1; ci < 3; ci++) {
            DT_ASSERT_OK(dt__workers_configure(cfg[ci][0], cfg[ci][1]));
            CU_ASSERT_EQUAL_FATAL(dt__workers_lanes(), cfg[ci][0]);
            jobs = dt__workers_jobs();
            got.n = 0;
            run_ops(meshes[mi], &got);
            CU_ASSERT(dt__workers_jobs() > jobs + 20); /* the ops did go through the workers */
            CU_ASSERT_EQUAL_FATAL(got.n, ref.n);
            int64_t bad = 0;
            for (int64_t i = 0; i < ref.n; i++)
                bad += memcmp(&got.v[i], &ref.v[i], sizeof(float)) != 0;
            if (bad)
                fprintf(stderr, "[rank %d] %s, %d lanes%s: %lld of %lld values differ\n",
                        dt_client_id(), dt_mesh_name(meshes[mi]), cfg[ci][0],
                        cfg[ci][1] ? " (fixed)" : "", (long long)bad, (long long)ref.n);
            CU_ASSERT_EQUAL(bad, 0);
        }
        free(ref.v);
        free(got.v);
        dt_mesh_destroy(meshes[mi]);
    }
    DT_ASSERT_OK(dt__workers_configure(-1, 0));
}

/* A kernel that fails on device 1 only (a label out of range in its rows): the op returns the
 * kernel's status with its message, with the workers on (device 1 on the worker thread) as
 * off. */
static void test_failing_kernel_on_device_1_returns_its_status_and_message(void)
{
    if (dt_num_clients() != 1 || dt_test_num_local_devices() < 2)
        return; /* device 1 must be this process's second device */
    const char *names[2] = {"b", "m"};
    int64_t s12[2] = {1, 2};
    dt_mesh *m = NULL;
    DT_ASSERT_OK(dt_mesh_create("w12", 2, names, s12, DT_DEVICE_CPU, &m));
    enum { R = 8, V = 5 };
    int64_t slog[2] = {R, V}, slab[1] = {R};
    int32_t lab[R] = {0, 1, 2, 3, 4, 0, 77, 1}; /* row 6: the second half, device 1 */
    dt_layout *lrow = dt_test_layout(m, 2, "m", NULL, NULL);
    dt_layout *llab = dt_test_layout(m, 1, "m", NULL, NULL);
    dt_tensor *logits = rand_t(lrow, slog, 2, 21);
    dt_tensor *labels = ot_tensor(llab, DT_DTYPE_I32, slab, lab);
    for (int lanes = 0; lanes <= 2; lanes += 2) {
        DT_ASSERT_OK(dt__workers_configure(lanes, 1)); /* device 1 on the worker thread */
        dt_tensor *loss = NULL, *d = NULL;
        dt_clear_error();
        DT_ASSERT_FAILS(dt_softmax_xent(logits, labels, NULL, &loss), DT_ERR_INVALID_ARGUMENT);
        DT_ASSERT_ERROR_MENTIONS("label 77");
        CU_ASSERT_PTR_NULL(loss);
        dt_clear_error();
        DT_ASSERT_FAILS(dt_softmax_xent_backward(logits, labels, 1.0f, &d),
                        DT_ERR_INVALID_ARGUMENT);
        DT_ASSERT_ERROR_MENTIONS("label 77");
        CU_ASSERT_PTR_NULL(d);
    }
    DT_ASSERT_OK(dt__workers_configure(-1, 0));
    dt_tensor_destroy(labels);
    dt_tensor_destroy(logits);
    dt_layout_destroy(llab);
    dt_layout_destroy(lrow);
    dt_mesh_destroy(m);
}

/* openblas_get_num_threads (cblas.h is not on the tests' include path). */
int openblas_get_num_threads(void);

/* dt_matmul on w12 (1x2, rows over m: both devices busy) and on w11 (one device). */
static void one_matmul(const char *name, int64_t m_size)
{
    const char *names[2] = {"b", "m"};
    int64_t sizes[2] = {1, m_size}, sa[2] = {8, 8};
    dt_mesh *m = NULL;
    DT_ASSERT_OK(dt_mesh_create(name, 2, names, sizes, DT_DEVICE_CPU, &m));
    dt_layout *l = dt_test_layout(m, 2, "m", NULL, NULL);
    dt_tensor *a = rand_t(l, sa, 2, 31), *c = NULL;
    DT_ASSERT_OK(dt_matmul(a, a, 0, 1, NULL, &c));
    dt_tensor_destroy(c);
    dt_tensor_destroy(a);
    dt_layout_destroy(l);
    dt_mesh_destroy(m);
}

/* While the lanes compute at once OpenBLAS runs cores / (clients x lanes) threads per call,
 * else cores / clients: a 1x1 mesh in a process of several devices keeps all its threads. */
static void test_blas_threads_follow_the_lanes_of_each_op(void)
{
    const char *env = getenv("OPENBLAS_NUM_THREADS"), *omp = getenv("OMP_NUM_THREADS");
    if (dt_num_clients() != 1 || dt_test_num_local_devices() < 2 || (env && *env) || (omp && *omp))
        return; /* one client on the host, the count left to us */
    cpu_set_t set;
    int cores = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 1;
    DT_ASSERT_OK(dt__workers_configure(2, 0));
    one_matmul("w12", 2);
    CU_ASSERT_EQUAL(openblas_get_num_threads(), dt__blas_threads_for(cores, 1, 2));
    one_matmul("w11", 1);
    CU_ASSERT_EQUAL(openblas_get_num_threads(), dt__blas_threads_for(cores, 1, 1));
    DT_ASSERT_OK(dt__workers_configure(0, 0));
    one_matmul("w12", 2);
    CU_ASSERT_EQUAL(openblas_get_num_threads(), dt__blas_threads_for(cores, 1, 1));
    DT_ASSERT_OK(dt__workers_configure(-1, 0));
}

static void test_blas_threads_share_cores_among_clients_and_lanes(void)
{
    CU_ASSERT_EQUAL(dt__blas_threads_for(16, 1, 1), 16);
    CU_ASSERT_EQUAL(dt__blas_threads_for(16, 2, 1), 8);
    CU_ASSERT_EQUAL(dt__blas_threads_for(16, 2, 4), 2);
    CU_ASSERT_EQUAL(dt__blas_threads_for(2, 1, 2), 1);
    CU_ASSERT_EQUAL(dt__blas_threads_for(2, 2, 4), 1);
    CU_ASSERT_EQUAL(dt__blas_threads_for(3, 0, 0), 3);
}

int main(int argc, char **argv)
{
    static const dt_test_case cases[] = {
        DT_TEST(test_workers_run_each_component_once_two_at_a_time),
        DT_TEST(test_workers_failure_on_a_worker_reaches_the_caller),
        DT_TEST(test_ops_give_the_same_bits_with_workers_on_and_off),
        DT_TEST(test_failing_kernel_on_device_1_returns_its_status_and_message),
        DT_TEST(test_blas_threads_share_cores_among_clients_and_lanes),
        DT_TEST(test_blas_threads_follow_the_lanes_of_each_op),
        DT_TEST_END,
    };
    return dt_test_main(argc, argv, "cpu_workers", cases, 1);
}
