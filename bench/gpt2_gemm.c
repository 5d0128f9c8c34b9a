/* bench_gpt2_gemm: the GEMM rate of this machine on GPT-2's own matmul shapes (cblas_sgemm,
 * the forward and both backward products of every projection and of the tied head, for
 * rows = B*T), the reference of bench/gpt2.sh's gemm_ratio; and its peak rate on a large
 * square product (the reference of bench/gpt2.sh's peak_ratio). OpenBLAS runs as many threads
 * as OPENBLAS_NUM_THREADS says (bench/gpt2.sh sets the trainer's count).
 *   bench_gpt2_gemm ROWS WIDTH VOCAB [REPS]  ->  gemm_gflops=<rate> (best of REPS after one)
 *   bench_gpt2_gemm --square N [REPS]         ->  peak_gflops=<rate> (N x N x N, best)
 *   bench_gpt2_gemm --core                    ->  OpenBLAS's kernel and version */
#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* C[m, n] = op(A) op(B), row-major; returns the FLOPs. */
static double gemm(int ta, int tb, int m, int n, int k, const float *a, const float *b, float *c)
{
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
                m, n, k, 1.0f, a, ta ? m : k, b, tb ? k : n, 0.0f, c, n);
    return 2.0 * m * n * k;
}

/* The best rate of reps products C = A B of n x n after one untimed. */
static int square(int n, int reps)
{
    size_t e = (size_t)n * (size_t)n;
    float *a = malloc(e * sizeof *a), *b = malloc(e * sizeof *b), *c = malloc(e * sizeof *c);
    if (!a || !b || !c || n < 1 || reps < 1) {
        free(a);
        free(b);
        free(c);
        return 1;
    }
    for (size_t i = 0; i < e; i++) {
        a[i] = (float)(i % 7) * 0.01f;
        b[i] = (float)(i % 5) * 0.01f;
    }
    double best = 0.0;
    for (int r = 0; r < reps + 1; r++) {
        double t0 = now();
        double flops = gemm(0, 0, n, n, n, a, b, c);
        double t = now() - t0;
        if (r > 0 && flops / t > best)
            best = flops / t;
    }
    printf("peak_gflops=%.3f\n", best * 1e-9);
    free(a);
    free(b);
    free(c);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc >= 2 && !strcmp(argv[1], "--core")) {
        printf("blas_core=%s blas_config=%s\n", openblas_get_corename(), openblas_get_config());
        return 0;
    }
    if (argc >= 3 && !strcmp(argv[1], "--square"))
        return square(atoi(argv[2]), argc > 3 ? atoi(argv[3]) : 3);
    if (argc < 4) {
        fprintf(stderr, "usage: bench_gpt2_gemm ROWS WIDTH VOCAB [REPS] | --square N [REPS]\n");
        return 2;
    }
    int N = atoi(argv[1]), C = atoi(argv[2]), V = atoi(argv[3]), reps = argc > 4 ? atoi(argv[4]) : 3;
    size_t big = (size_t)(V > 4 * C ? V : 4 * C);
    float *x = calloc((size_t)N * big, sizeof *x), *w = calloc((size_t)C * big, sizeof *w);
    float *y = calloc((size_t)N * big, sizeof *y), *dw = calloc((size_t)C * big, sizeof *dw);
    if (!x || !w || !y || !dw)
        return 1;
    for (size_t i = 0; i < (size_t)N * big; i++)
        x[i] = (float)(i % 7) * 0.01f;
    for (size_t i = 0; i < (size_t)C * big; i++)
        w[i] = (float)(i % 5) * 0.01f;
    /* (in, out) of each projection of a block, then the head (C -> V, weight [V, C]). */
    const int shapes[6][2] = {{C, C}, {C, C}, {C, C}, {C, C}, {C, 4 * C}, {4 * C, C}};
    double best = 0.0;
    for (int r = 0; r < reps + 1; r++) {
        double flops = 0.0, t0 = now();
        for (int s = 0; s < 6; s++) {
            int in = shapes[s][0], out = shapes[s][1];
            flops += gemm(0, 0, N, out, in, x, w, y);       /* y = x W */
            flops += gemm(0, 1, N, in, out, y, w, x);       /* dx = dy W^T */
            flops += gemm(1, 0, in, out, N, x, y, dw);      /* dW = x^T dy */
        }
        flops += gemm(0, 1, N, V, C, x, w, y);              /* logits = x wte^T */
        flops += gemm(0, 0, N, C, V, y, w, x);              /* dx = dlogits wte */
        flops += gemm(1, 0, V, C, N, y, x, dw);             /* dwte = dlogits^T x */
        double t = now() - t0;
        if (r > 0 && flops / t > best)
            best = flops / t;
    }
    printf("gemm_gflops=%.3f\n", best * 1e-9);
    free(x);
    free(w);
    free(y);
    free(dw);
    return 0;
}
