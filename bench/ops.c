/* bench_ops: the local kernels of ops/ against the plain reference moving the same data: GEMM
 * against a direct cblas_sgemm on the same operands, elementwise and cast kernels against
 * memcpy of the same bytes (ratio) and against a vector-register copy of them (vratio).
 * Interleaved, median of repetitions, preallocated buffers. */
#include <cblas.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_util.h"
#include "dtensor/dtensor.h"
#include "dtensor/ops.h"

enum { MAX_REPS = 1000 };

#define ALL_CASES "gemm,gemm_tn,gemm_nt,add,mul,scale,axpy,fill,copy,bias_add,relu,adam," \
                  "cast_f32_f16,cast_f16_f32,cast_f32_bf16,cast_bf16_f32"

typedef struct opts {
    const char *cases;
    int quick;
    int reps;         /* 0: default */
    int64_t sizes[8]; /* elementwise elements per operand (--kib); nsizes 0: default */
    int nsizes;
} opts;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void fill_random(float *x, int64_t n, uint64_t seed)
{
    for (int64_t i = 0; i < n; i++) {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        x[i] = (float)(seed >> 40) * (1.0f / 16777216.0f) * 2.0f - 1.0f;
    }
}

/* One benchmark case: run_ours / run_ref (and run_ref2 when not NULL) each do `inner` calls;
 * all move `bytes` per call (GEMM: do `flops` per call). */
typedef struct bcase {
    const char *name;
    int64_t m, n, k;   /* GEMM sizes; n alone for the others */
    double bytes;      /* memory traffic of one call: read + written */
    double flops;
    int (*run_ours)(struct bcase *c);
    void (*run_ref)(struct bcase *c);
    void (*run_ref2)(struct bcase *c);
    float *x, *y, *z;  /* preallocated operands */
    void *h;           /* half buffer of the casts */
    dt_dtype from, to;
} bcase;

/* ---- GEMM --------------------------------------------------------------------------- */

static int gemm_ours(bcase *c)
{
    int ta = strstr(c->name, "_tn") != NULL, tb = strstr(c->name, "_nt") != NULL;
    int64_t lda = ta ? c->m : c->k, ldb = tb ? c->k : c->n;
    return dt_kernel_gemm(ta, tb, c->m, c->n, c->k, 1.0f, c->x, DT_DTYPE_F32, lda, c->y,
                          DT_DTYPE_F32, ldb, 0.0f, c->z, c->n) == DT_OK ? 0 : -1;
}

static void gemm_ref(bcase *c)
{
    int ta = strstr(c->name, "_tn") != NULL, tb = strstr(c->name, "_nt") != NULL;
    int lda = (int)(ta ? c->m : c->k), ldb = (int)(tb ? c->k : c->n);
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
                (int)c->m, (int)c->n, (int)c->k, 1.0f, c->x, lda, c->y, ldb, 0.0f, c->z,
                (int)c->n);
}

/* ---- elementwise and casts ---------------------------------------------------------- */

static int ew_ours(bcase *c)
{
    const char *s = c->name;
    int64_t n = c->n;
    dt_status st;
    if (!strcmp(s, "add"))
        st = dt_kernel_add(n, c->x, c->y, c->z);
    else if (!strcmp(s, "mul"))
        st = dt_kernel_mul(n, c->x, c->y, c->z);
    else if (!strcmp(s, "scale"))
        st = dt_kernel_scale(n, 1.0001f, c->x, c->z);
    else if (!strcmp(s, "axpy"))
        st = dt_kernel_axpy(n, 1e-7f, c->x, c->z);
    else if (!strcmp(s, "fill"))
        st = dt_kernel_fill(n, 0.5f, c->z);
    else if (!strcmp(s, "copy"))
        st = dt_kernel_copy(n, c->x, c->z);
    else if (!strcmp(s, "bias_add"))
        st = dt_kernel_bias_add(n / 1024, 1024, c->y, c->z);
    else if (!strcmp(s, "relu"))
        st = dt_kernel_relu(n, c->x, c->z);
    else if (!strcmp(s, "adam")) { /* param x, grad y, moments z and z + n */
        dt_adam_opts o = DT_ADAMW_OPTS_INIT;
        st = dt_kernel_adam(n, &o, 1, c->x, c->y, c->z, c->z + n);
    }
    else if (c->from == DT_DTYPE_F32)
        st = dt_kernel_cast(n, c->x, c->from, c->h, c->to);
    else
        st = dt_kernel_cast(n, c->h, c->from, c->z, c->to);
    return st == DT_OK ? 0 : -1;
}

/* memcpy with the same traffic: bytes/2 read and bytes/2 written, from x to z (both hold
 * at least that much). */
static void ew_ref(bcase *c)
{
    memcpy(c->z, c->x, (size_t)(c->bytes / 2));
}

/* The second reference: the same copy through vector registers, 64-byte loads and stores
 * (AVX-512 where the CPU has it), as any kernel that computes on its data must move it.
 * glibc's memcpy uses the CPU's string copy (rep movsb) instead, which at L2/L3-resident
 * sizes moves bytes faster than a load/store loop can (docs/bench.md). */
typedef float vec16 __attribute__((vector_size(64)));

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
__attribute__((target_clones("avx512f", "avx2", "default")))
#endif
static void vector_copy(float *dst, const float *src, size_t bytes)
{
    size_t i = 0, n = bytes / sizeof(float);
    for (; i + 64 <= n; i += 64) {
        vec16 a, b, c, d;
        memcpy(&a, src + i, 64);
        memcpy(&b, src + i + 16, 64);
        memcpy(&c, src + i + 32, 64);
        memcpy(&d, src + i + 48, 64);
        memcpy(dst + i, &a, 64);
        memcpy(dst + i + 16, &b, 64);
        memcpy(dst + i + 32, &c, 64);
        memcpy(dst + i + 48, &d, 64);
        __asm__ volatile("" ::: "memory"); /* a loop of loads and stores, not a memcpy call */
    }
    memcpy(dst + i, src + i, bytes - i * sizeof(float));
}

static void ew_ref2(bcase *c)
{
    vector_copy(c->z, c->x, (size_t)(c->bytes / 2));
}

/* Times samples of `inner` calls (>= 10 ms) of ours and of the reference(s), interleaved (order
 * rotating), and returns the medians in seconds per call (ref2: 0 without one) and the
 * repetitions made. */
static int time_case(bcase *c, int reps, int fixed_reps, double *ours_out, double *ref_out,
                     double *ref2_out, int *reps_out)
{
    static double t[3][MAX_REPS];
    int k = c->run_ref2 ? 3 : 2;
    /* Warm up (first touch, BLAS threads) and pick the inner count: >= 2 ms a sample. */
    if (c->run_ours(c) != 0)
        return -1;
    c->run_ref(c);
    if (c->run_ref2)
        c->run_ref2(c);
    double t0 = now_s();
    c->run_ref(c);
    double one = now_s() - t0;
    int inner = one > 0 ? (int)(10e-3 / one) + 1 : 1000;
    if (inner > 100000)
        inner = 100000;
    /* Long calls (big GEMMs): enough repetitions for a median, about 10 s a case at most. */
    if (!fixed_reps && one * inner * k * reps > 10.0) {
        reps = (int)(10.0 / (one * inner * k));
        reps = reps < 5 ? 5 : reps;
    }
    *reps_out = reps;
    for (int r = 0; r < reps; r++) {
        for (int j = 0; j < k; j++) {
            int who = (j + r) % k; /* 0 ours, 1 ref, 2 ref2 */
            double s = now_s();
            for (int i = 0; i < inner; i++) {
                if (who == 0) {
                    if (c->run_ours(c) != 0)
                        return -1;
                } else if (who == 1) {
                    c->run_ref(c);
                } else {
                    c->run_ref2(c);
                }
            }
            t[who][r] = (now_s() - s) / inner;
        }
    }
    *ours_out = bu_median(t[0], reps);
    *ref_out = bu_median(t[1], reps);
    *ref2_out = k == 3 ? bu_median(t[2], reps) : 0.0;
    return 0;
}

/* ---- checks: ours computed what it should ------------------------------------------ */

static int check_gemm(bcase *c)
{
    size_t bytes = (size_t)(c->m * c->n) * sizeof(float);
    float *mine = malloc(bytes);
    if (!mine)
        return -1;
    gemm_ours(c);
    memcpy(mine, c->z, bytes);
    gemm_ref(c);
    int ok = memcmp(mine, c->z, bytes) == 0; /* the same sgemm on the same data */
    free(mine);
    return ok ? 0 : -1;
}

static int check_ew(bcase *c)
{
    const char *s = c->name;
    int64_t n = c->n, idx[3] = {0, n / 2, n - 1};
    if (!strncmp(s, "cast_", 5)) {
        /* Round trip f32 -> half -> f32 stays within half's precision. */
        if (dt_kernel_cast(n, c->x, DT_DTYPE_F32, c->h, c->from == DT_DTYPE_F32 ? c->to
                           : c->from) != DT_OK)
            return -1;
        if (dt_kernel_cast(n, c->h, c->from == DT_DTYPE_F32 ? c->to : c->from, c->z,
                           DT_DTYPE_F32) != DT_OK)
            return -1;
        for (int i = 0; i < 3; i++)
            if (fabsf(c->z[idx[i]] - c->x[idx[i]]) > 1e-2f * fabsf(c->x[idx[i]]) + 1e-6f)
                return -1;
        return 0;
    }
    if (!strcmp(s, "axpy") || !strcmp(s, "bias_add") || !strcmp(s, "adam"))
        return 0; /* update z in place: checked by the unit tests (adam: tests/ops vmath) */
    if (ew_ours(c) != 0)
        return -1;
    for (int i = 0; i < 3; i++) {
        int64_t j = idx[i];
        float x = c->x[j], y = c->y[j], want;
        if (!strcmp(s, "add"))
            want = x + y;
        else if (!strcmp(s, "mul"))
            want = x * y;
        else if (!strcmp(s, "scale"))
            want = 1.0001f * x;
        else if (!strcmp(s, "fill"))
            want = 0.5f;
        else if (!strcmp(s, "copy"))
            want = x;
        else
            want = x > 0 ? x : 0;
        if (c->z[j] != want)
            return -1;
    }
    return 0;
}

static void usage(void)
{
    fprintf(stderr, "usage: bench_ops [--cases LIST] [--quick] [--reps N] [--kib LIST]\n"
            "  cases: %s\n"
            "  --kib: KiB per f32 operand of the elementwise and cast cases, multiples of 4 up "
            "to 65536 (default 1024,65536)\n", ALL_CASES);
}

static int parse_args(int argc, char **argv, opts *o)
{
    o->cases = ALL_CASES;
    o->quick = 0;
    o->reps = 0;
    o->nsizes = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--cases") && i + 1 < argc) {
            o->cases = argv[++i];
        } else if (!strcmp(argv[i], "--quick")) {
            o->quick = 1;
        } else if (!strcmp(argv[i], "--reps") && i + 1 < argc) {
            o->reps = atoi(argv[++i]);
            if (o->reps < 1 || o->reps > MAX_REPS)
                return -1;
        } else if (!strcmp(argv[i], "--kib") && i + 1 < argc) {
            int v[8];
            o->nsizes = bu_parse_int_list(argv[++i], v, 8);
            if (o->nsizes < 1)
                return -1;
            for (int j = 0; j < o->nsizes; j++) {
                if (v[j] % 4 != 0 || v[j] > 65536) /* bias_add's rows of 1024 */
                    return -1;
                o->sizes[j] = (int64_t)v[j] * 256;
            }
        } else {
            return -1;
        }
    }
    return 0;
}

static int run_one(bcase *c, int reps, int fixed_reps, const char *what)
{
    double ours, ref, ref2;
    int gemm = c->k > 0;
    int check = gemm ? check_gemm(c) : check_ew(c);
    if (time_case(c, reps, fixed_reps, &ours, &ref, &ref2, &reps) != 0) {
        fprintf(stderr, "bench_ops: %s: %s\n", c->name, dt_last_error());
        return -1;
    }
    bu_line line;
    bu_line_init(&line);
    bu_line_add(&line, "case", "%s", c->name);
    if (gemm) {
        bu_line_add(&line, "m", "%lld", (long long)c->m);
        bu_line_add(&line, "n", "%lld", (long long)c->n);
        bu_line_add(&line, "k", "%lld", (long long)c->k);
        bu_line_add(&line, "ours_gflops", "%.2f", c->flops / ours * 1e-9);
        bu_line_add(&line, "ref", "%s", what);
        bu_line_add(&line, "ref_gflops", "%.2f", c->flops / ref * 1e-9);
    } else {
        bu_line_add(&line, "n", "%lld", (long long)c->n);
        bu_line_add(&line, "mib", "%.2f", c->bytes / 1048576.0);
        bu_line_add(&line, "ours_gbs", "%.3f", c->bytes / ours * 1e-9);
        bu_line_add(&line, "ref", "%s", what);
        bu_line_add(&line, "ref_gbs", "%.3f", c->bytes / ref * 1e-9);
    }
    bu_line_add(&line, "ratio", "%.3f", ref / ours);
    if (c->run_ref2) {
        bu_line_add(&line, "vcopy_gbs", "%.3f", c->bytes / ref2 * 1e-9);
        bu_line_add(&line, "vratio", "%.3f", ref2 / ours);
    }
    bu_line_add(&line, "ours_ms", "%.4f", ours * 1e3);
    bu_line_add(&line, "ref_ms", "%.4f", ref * 1e3);
    bu_line_add(&line, "reps", "%d", reps);
    bu_line_add(&line, "check", "%s", check == 0 ? "ok" : "FAILED");
    bu_line_print(&line);
    return check;
}

int main(int argc, char **argv)
{
    opts o;
    if (parse_args(argc, argv, &o) != 0) {
        usage();
        return 2;
    }
    int reps = o.reps ? o.reps : (o.quick ? 5 : 21);
    /* Elementwise sizes: 1 MiB per operand (cache) and 64 MiB per operand (DRAM), or --kib. */
    int64_t ew_sizes[8] = {(int64_t)1 << 18, (int64_t)1 << 24};
    const int64_t gemm_sizes[][3] = {{256, 256, 256}, {1024, 1024, 1024}, {2048, 2048, 2048},
                                     {4096, 1024, 512}};
    int n_ew = o.quick ? 1 : 2, n_gemm = o.quick ? 2 : 4;
    if (o.nsizes > 0) {
        n_ew = o.nsizes;
        memcpy(ew_sizes, o.sizes, sizeof o.sizes);
    }
    int64_t max_ew = 0;
    for (int s = 0; s < n_ew; s++)
        max_ew = ew_sizes[s] > max_ew ? ew_sizes[s] : max_ew;
    size_t max_floats = (size_t)(max_ew > 4096 * 2048 ? max_ew : 4096 * 2048);
    /* x and z also serve the memcpy reference, which moves up to 3.5 floats per element
     * (adam: 4 read, 3 written), and z holds adam's two moments. */
    float *x = malloc(max_floats * 16), *y = malloc(max_floats * 4), *z = malloc(max_floats * 16);
    void *h = malloc(max_floats * 2);
    if (!x || !y || !z || !h) {
        fprintf(stderr, "bench_ops: no memory for %zu floats\n", max_floats);
        return 1;
    }
    fill_random(x, 4 * (int64_t)max_floats, 1);
    fill_random(y, (int64_t)max_floats, 2);
    fill_random(z, 4 * (int64_t)max_floats, 3);
    for (size_t i = 0; i < 4 * max_floats; i++)
        z[i] = fabsf(z[i]); /* adam's second moment is never negative */
    memset(h, 0, max_floats * 2);
    printf("# bench_ops: single process, OpenBLAS threads as configured "
           "(OPENBLAS_NUM_THREADS=%s)\n", getenv("OPENBLAS_NUM_THREADS") ?
           getenv("OPENBLAS_NUM_THREADS") : "default");
    fflush(stdout);

    int status = 0;
    static const char *const gemm_names[] = {"gemm", "gemm_tn", "gemm_nt"};
    for (int g = 0; g < 3; g++) {
        if (!bu_list_has(o.cases, gemm_names[g]))
            continue;
        for (int s = 0; s < n_gemm; s++) {
            bcase c = {gemm_names[g], gemm_sizes[s][0], gemm_sizes[s][1], gemm_sizes[s][2],
                       0, 0, gemm_ours, gemm_ref, NULL, x, y, z, NULL, DT_DTYPE_F32,
                       DT_DTYPE_F32};
            c.flops = 2.0 * (double)c.m * (double)c.n * (double)c.k;
            if (run_one(&c, reps, o.reps > 0, "cblas_sgemm") != 0)
                status = 1;
        }
    }

    /* name, floats read, floats written per element (casts: bytes via the dtypes). */
    static const struct {
        const char *name;
        double rd, wr;
        dt_dtype from, to;
    } ew[] = {
        {"add", 2, 1, DT_DTYPE_F32, DT_DTYPE_F32},
        {"mul", 2, 1, DT_DTYPE_F32, DT_DTYPE_F32},
        {"scale", 1, 1, DT_DTYPE_F32, DT_DTYPE_F32},
        {"axpy", 2, 1, DT_DTYPE_F32, DT_DTYPE_F32},
        {"fill", 0, 1, DT_DTYPE_F32, DT_DTYPE_F32},
        {"copy", 1, 1, DT_DTYPE_F32, DT_DTYPE_F32},
        {"bias_add", 1, 1, DT_DTYPE_F32, DT_DTYPE_F32},
        {"relu", 1, 1, DT_DTYPE_F32, DT_DTYPE_F32},
        {"adam", 4, 3, DT_DTYPE_F32, DT_DTYPE_F32},
        {"cast_f32_f16", 1, 0.5, DT_DTYPE_F32, DT_DTYPE_F16},
        {"cast_f16_f32", 0.5, 1, DT_DTYPE_F16, DT_DTYPE_F32},
        {"cast_f32_bf16", 1, 0.5, DT_DTYPE_F32, DT_DTYPE_BF16},
        {"cast_bf16_f32", 0.5, 1, DT_DTYPE_BF16, DT_DTYPE_F32},
    };
    for (size_t e = 0; e < sizeof ew / sizeof ew[0]; e++) {
        if (!bu_list_has(o.cases, ew[e].name))
            continue;
        for (int s = 0; s < n_ew; s++) {
            int64_t n = ew_sizes[s];
            bcase c = {ew[e].name, 0, n, 0, 0, 0, ew_ours, ew_ref, ew_ref2, x, y, z, h,
                       ew[e].from, ew[e].to};
            c.bytes = (ew[e].rd + ew[e].wr) * 4.0 * (double)n;
            if (run_one(&c, reps, o.reps > 0, "memcpy") != 0)
                status = 1;
        }
    }
    free(x), free(y), free(z), free(h);
    return status;
}
