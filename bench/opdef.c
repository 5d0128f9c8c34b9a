/* bench_opdef: the op definitions' generic path against what bounds it, as key=value lines
 * (docs/bench.md, "ops"): one small op through dt_op_call (cached decision) against its kernel
 * called directly; a broadcasting add over 64 MiB against memcpy of the output's bytes; einsum
 * "ij,jk->ik" against the cblas_sgemm it becomes. One process, one CPU device. */
#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_util.h"
#include "dtensor/dtensor.h"

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

#define CHECK(x)                                                                             \
    do {                                                                                     \
        if ((x) != DT_OK) {                                                                  \
            fprintf(stderr, "bench_opdef: %s: %s\n", #x, dt_last_error());                   \
            exit(1);                                                                         \
        }                                                                                    \
    } while (0)

static dt_tensor *tensor(dt_mesh *m, int rank, const int64_t *shape, float fill)
{
    dt_layout *l = NULL;
    dt_tensor *t = NULL;
    CHECK(dt_layout_replicated(m, rank, &l));
    CHECK(dt_tensor_filled(l, DT_DTYPE_F32, shape, &fill, &t));
    dt_layout_destroy(l);
    return t;
}

/* Median seconds of reps runs of n calls of fn. */
typedef void (*bench_fn)(void *arg);
static double timed(bench_fn fn, void *arg, int n, int reps)
{
    double v[64];
    fn(arg); /* warm-up: the decision is cached, buffers touched */
    for (int r = 0; r < reps && r < 64; r++) {
        double t0 = now();
        for (int i = 0; i < n; i++)
            fn(arg);
        v[r] = (now() - t0) / n;
    }
    return bu_median(v, reps < 64 ? reps : 64);
}

typedef struct call_arg {
    const dt_op *op;
    dt_tensor *in[2];
    int nin;
    dt_op_kernel_args k;
} call_arg;

static void via_call(void *p)
{
    call_arg *a = p;
    dt_tensor *out = NULL;
    CHECK(dt_op_call(a->op, (const dt_tensor *const *)a->in, a->nin, NULL, NULL, &out));
    dt_tensor_destroy(out);
}

static void via_kernel(void *p)
{
    call_arg *a = p;
    CHECK(dt_op_definition(a->op)->cpu(&a->k));
}

static void buf_of(const dt_tensor *t, dt_op_buf *b, void *data)
{
    b->data = data;
    b->dtype = dt_tensor_dtype(t);
    b->rank = dt_tensor_rank(t);
    for (int d = 0; d < b->rank; d++)
        b->shape[d] = b->global[d] = dt_tensor_shape(t)[d];
}

static void bcast_add(void *p)
{
    call_arg *a = p;
    dt_tensor *out = NULL;
    CHECK(dt_add(a->in[0], a->in[1], NULL, &out));
    dt_tensor_destroy(out);
}

typedef struct copy_arg {
    void *dst, *src;
    size_t bytes;
} copy_arg;

static void copy(void *p)
{
    copy_arg *a = p;
    memcpy(a->dst, a->src, a->bytes);
}

typedef struct mm_arg {
    int n;
    const float *a, *b;
    float *c;
} mm_arg;

static void sgemm(void *p)
{
    mm_arg *m = p;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m->n, m->n, m->n, 1.0f, m->a, m->n,
                m->b, m->n, 0.0f, m->c, m->n);
}

static void einsum(void *p)
{
    call_arg *a = p;
    dt_tensor *out = NULL;
    CHECK(dt_einsum("ij,jk->ik", (const dt_tensor *const *)a->in, 2, &out));
    dt_tensor_destroy(out);
}

int main(int argc, char **argv)
{
    int quick = argc > 1 && strcmp(argv[1], "--quick") == 0;
    CHECK(dt_init(&argc, &argv, NULL));
    int64_t one = 1;
    dt_mesh *m = NULL;
    CHECK(dt_mesh_create("bench", 1, (const char *[]){"x"}, &one, DT_DEVICE_CPU, &m));
    int reps = quick ? 3 : 9;

    /* 1. One small op (exp of 16 floats): dt_op_call against its kernel. */
    int64_t s16[1] = {16};
    call_arg c;
    memset(&c, 0, sizeof c);
    c.op = dt_op_find("exp");
    c.in[0] = tensor(m, 1, s16, 0.5f);
    c.nin = 1;
    float kin[16], kout[16];
    for (int i = 0; i < 16; i++)
        kin[i] = 0.5f;
    c.k.nin = 1;
    buf_of(c.in[0], &c.k.in[0], kin);
    buf_of(c.in[0], &c.k.out, kout);
    int n = quick ? 2000 : 20000;
    double t_call = timed(via_call, &c, n, reps), t_kernel = timed(via_kernel, &c, n, reps);
    bu_line l;
    bu_line_init(&l);
    bu_line_add(&l, "case", "op_overhead");
    bu_line_add(&l, "op", "exp");
    bu_line_add(&l, "elems", "16");
    bu_line_add(&l, "call_us", "%.3f", t_call * 1e6);
    bu_line_add(&l, "kernel_us", "%.3f", t_kernel * 1e6);
    bu_line_add(&l, "overhead_us", "%.3f", (t_call - t_kernel) * 1e6);
    bu_line_add(&l, "target_us", "2");
    bu_line_print(&l);
    dt_tensor_destroy(c.in[0]);

    /* 2. Broadcasting add: [R, 1024] + [1, 1024] into 64 MiB of f32, against memcpy of the
     * output's bytes. */
    int64_t cols = 1024, rows = (quick ? 4 : 64) * 1024 * 1024 / 4 / cols;
    int64_t sa[2] = {rows, cols}, sb[2] = {1, cols};
    call_arg b;
    memset(&b, 0, sizeof b);
    b.in[0] = tensor(m, 2, sa, 1.0f);
    b.in[1] = tensor(m, 2, sb, 2.0f);
    size_t bytes = (size_t)(rows * cols) * 4;
    copy_arg cp = {malloc(bytes), malloc(bytes), bytes};
    memset(cp.src, 1, bytes);
    memset(cp.dst, 0, bytes);
    int nb = quick ? 2 : 5;
    double t_add = timed(bcast_add, &b, nb, reps), t_copy = timed(copy, &cp, nb, reps);
    bu_line_init(&l);
    bu_line_add(&l, "case", "broadcast_add");
    bu_line_add(&l, "mib", "%.0f", (double)bytes / (1 << 20));
    bu_line_add(&l, "add_gbs", "%.2f", (double)bytes / t_add / 1e9);
    bu_line_add(&l, "memcpy_gbs", "%.2f", (double)bytes / t_copy / 1e9);
    bu_line_add(&l, "ratio", "%.3f", t_copy / t_add);
    bu_line_add(&l, "target", "0.8");
    bu_line_print(&l);
    dt_tensor_destroy(b.in[0]);
    dt_tensor_destroy(b.in[1]);
    free(cp.src);
    free(cp.dst);

    /* 3. einsum "ij,jk->ik" against cblas_sgemm on the same sizes. */
    int64_t mn = quick ? 256 : 512, sm[2] = {mn, mn};
    call_arg e;
    memset(&e, 0, sizeof e);
    e.in[0] = tensor(m, 2, sm, 0.25f);
    e.in[1] = tensor(m, 2, sm, 0.5f);
    mm_arg g = {(int)mn, malloc((size_t)(mn * mn) * 4), malloc((size_t)(mn * mn) * 4),
                malloc((size_t)(mn * mn) * 4)};
    for (int64_t i = 0; i < mn * mn; i++) {
        ((float *)g.a)[i] = 0.25f;
        ((float *)g.b)[i] = 0.5f;
    }
    int ne = quick ? 3 : 10;
    double t_ein = timed(einsum, &e, ne, reps), t_gemm = timed(sgemm, &g, ne, reps);
    double flop = 2.0 * (double)mn * (double)mn * (double)mn;
    bu_line_init(&l);
    bu_line_add(&l, "case", "einsum");
    bu_line_add(&l, "equation", "ij,jk->ik");
    bu_line_add(&l, "n", "%lld", (long long)mn);
    bu_line_add(&l, "einsum_gflops", "%.2f", flop / t_ein / 1e9);
    bu_line_add(&l, "sgemm_gflops", "%.2f", flop / t_gemm / 1e9);
    bu_line_add(&l, "ratio", "%.3f", t_gemm / t_ein);
    bu_line_add(&l, "target", "0.95");
    bu_line_print(&l);
    dt_tensor_destroy(e.in[0]);
    dt_tensor_destroy(e.in[1]);
    free((void *)g.a);
    free((void *)g.b);
    free(g.c);
    dt_mesh_destroy(m);
    dt_finalize();
    return 0;
}
