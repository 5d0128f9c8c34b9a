/* bench_attention: the local attention kernels on one (batch 1) sequence of T tokens
 * (docs/attention.md): the tiled kernel against the untiled one (forward and backward) and,
 * as the memory reference, a dense forward that materialises the T x T scores (two sgemm
 * and a softmax) where they fit. One key=value line per kernel and T: seq=, ms= (forward),
 * bwd_ms=, peak_mib= (the resident memory the call adds over its inputs and outputs).
 * --dropout P runs the tiled and untiled kernels with dropout of the attention probabilities
 * (dt_kernel_attention_dropout: the mask made inside the kernel), dropout= on each line. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_util.h"
#include "dtensor/dtensor.h"
#include "peak_rss.h"

enum { MAX_SEQ = 16 };

typedef struct opts {
    int seq[MAX_SEQ], nseq;
    int heads, head_dim, reps, causal, backward;
    int dense_max_mib; /* the dense reference only when its scores fit in this */
    float dropout;     /* of the attention probabilities (0: plain attention) */
} opts;

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void fill(float *x, int64_t n, uint64_t seed)
{
    uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
    for (int64_t i = 0; i < n; i++) {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        x[i] = (float)((s >> 11) * 0x1.0p-53) * 2.0f - 1.0f;
    }
}

/* The dense reference: per head S = q k^T / sqrt(d) [T, T] (masked above the diagonal),
 * softmax by rows, y = S v. */
static dt_status dense(int64_t T, int64_t H, int64_t D, int causal, const float *q, const float *k,
                       const float *v, float *y)
{
    float *s = malloc((size_t)(T * T) * sizeof *s);
    if (!s)
        return DT_ERR_NO_MEMORY;
    dt_status st = DT_OK;
    int64_t ld = H * D;
    for (int64_t h = 0; h < H && st == DT_OK; h++) {
        st = dt_kernel_gemm(0, 1, T, T, D, 1.0f / sqrtf((float)D), q + h * D, DT_DTYPE_F32, ld,
                            k + h * D, DT_DTYPE_F32, ld, 0.0f, s, T);
        for (int64_t i = 0; causal && i < T; i++)
            for (int64_t j = i + 1; j < T; j++)
                s[i * T + j] = -INFINITY;
        if (st == DT_OK)
            st = dt_kernel_softmax(T, T, 1, s, s);
        if (st == DT_OK)
            st = dt_kernel_gemm(0, 0, T, D, T, 1.0f, s, DT_DTYPE_F32, T, v + h * D, DT_DTYPE_F32,
                                ld, 0.0f, y + h * D, ld);
    }
    free(s);
    return st;
}

static int run_seq(const opts *o, int64_t T, const char *kernel)
{
    int64_t H = o->heads, D = o->head_dim, n = T * H * D;
    int is_dense = strcmp(kernel, "dense") == 0;
    if (is_dense && (double)T * (double)T * 4.0 > (double)o->dense_max_mib * 1048576.0)
        return 0;
    float *buf = malloc((size_t)(8 * n) * sizeof *buf);
    if (!buf) {
        fprintf(stderr, "bench_attention: out of memory at seq %lld\n", (long long)T);
        return 1;
    }
    float *q = buf, *k = q + n, *v = k + n, *dy = v + n, *y = dy + n, *dq = y + n, *dk = dq + n;
    float *dv = dk + n;
    fill(q, n, 1);
    fill(k, n, 2);
    fill(v, n, 3);
    fill(dy, n, 4);
    memset(y, 0, (size_t)(4 * n) * sizeof *y);
    dt_attention_kernel_set(strcmp(kernel, "tiled") == 0 ? DT_ATTENTION_KERNEL_TILED
                                                         : DT_ATTENTION_KERNEL_UNTILED);
    double fwd[64], bwd[64];
    int reps = o->reps < 64 ? o->reps : 64, ok = 1;
    int64_t base = peak_rss_reset(), peak = base;
    for (int r = 0; r < reps && ok; r++) {
        double t0 = now();
        int drop = o->dropout > 0.0f;
        dt_status st = is_dense ? dense(T, H, D, o->causal, q, k, v, y)
                       : drop   ? dt_kernel_attention_dropout(1, T, H, H, D, o->causal, o->dropout,
                                                              1, 2, q, k, v, y)
                                : dt_kernel_attention(1, T, H, D, o->causal, q, k, v, y);
        fwd[r] = (now() - t0) * 1e3;
        bwd[r] = 0;
        if (st == DT_OK && o->backward && !is_dense) {
            t0 = now();
            st = drop ? dt_kernel_attention_dropout_grad(1, T, H, H, D, o->causal, o->dropout, 1,
                                                         2, q, k, v, dy, dq, dk, dv)
                      : dt_kernel_attention_grad(1, T, H, D, o->causal, q, k, v, dy, dq, dk, dv);
            bwd[r] = (now() - t0) * 1e3;
        }
        if (st != DT_OK) {
            fprintf(stderr, "bench_attention: %s seq %lld: %s: %s\n", kernel, (long long)T,
                    dt_status_name(st), dt_last_error());
            ok = 0;
        }
    }
    int64_t p = peak_rss_bytes();
    peak = p > peak ? p : peak;
    /* A checksum of y, so that the kernels' outputs can be compared across lines. */
    double sum = 0;
    for (int64_t i = 0; i < n; i++)
        sum += y[i];
    bu_line line;
    bu_line_init(&line);
    bu_line_add(&line, "case", "%s", "attention");
    bu_line_add(&line, "kernel", "%s", kernel);
    bu_line_add(&line, "seq", "%lld", (long long)T);
    bu_line_add(&line, "heads", "%lld", (long long)H);
    bu_line_add(&line, "head_dim", "%lld", (long long)D);
    bu_line_add(&line, "causal", "%d", o->causal);
    if (!is_dense)
        bu_line_add(&line, "dropout", "%g", (double)o->dropout);
    bu_line_add(&line, "reps", "%d", reps);
    bu_line_add(&line, "ms", "%.2f", bu_median(fwd, reps));
    if (o->backward && !is_dense)
        bu_line_add(&line, "bwd_ms", "%.2f", bu_median(bwd, reps));
    bu_line_add(&line, "peak_mib", "%.2f", base < 0 ? -1.0 : (double)(peak - base) / 1048576.0);
    bu_line_add(&line, "io_mib", "%.2f", (double)(8 * n) * 4.0 / 1048576.0);
    bu_line_add(&line, "ysum", "%.6g", sum);
    if (!ok)
        bu_line_add(&line, "error", "%s", "failed");
    bu_line_print(&line);
    free(buf);
    return !ok;
}

static void usage(void)
{
    fprintf(stderr, "usage: bench_attention [--seq 1024,4096,16384] [--heads N] [--head-dim N] "
                    "[--reps N] [--kernels tiled,untiled,dense] [--no-causal] [--no-backward] "
                    "[--dense-max-mib N] [--dropout P]\n");
}

int main(int argc, char **argv)
{
    opts o = {.seq = {1024, 4096, 16384},
              .nseq = 3,
              .heads = 1,
              .head_dim = 64,
              .reps = 1,
              .causal = 1,
              .backward = 1,
              .dense_max_mib = 2048};
    const char *kernels = "tiled,untiled,dense";
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *val = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(a, "--seq") == 0 && val) {
            o.nseq = bu_parse_int_list(val, o.seq, MAX_SEQ);
            i++;
        } else if (strcmp(a, "--heads") == 0 && val) {
            o.heads = atoi(val);
            i++;
        } else if (strcmp(a, "--head-dim") == 0 && val) {
            o.head_dim = atoi(val);
            i++;
        } else if (strcmp(a, "--reps") == 0 && val) {
            o.reps = atoi(val);
            i++;
        } else if (strcmp(a, "--kernels") == 0 && val) {
            kernels = val;
            i++;
        } else if (strcmp(a, "--dense-max-mib") == 0 && val) {
            o.dense_max_mib = atoi(val);
            i++;
        } else if (strcmp(a, "--dropout") == 0 && val) {
            o.dropout = (float)atof(val);
            i++;
        } else if (strcmp(a, "--no-causal") == 0) {
            o.causal = 0;
        } else if (strcmp(a, "--no-backward") == 0) {
            o.backward = 0;
        } else {
            usage();
            return strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0 ? 0 : 2;
        }
    }
    if (o.nseq < 1 || o.heads < 1 || o.head_dim < 1 || o.reps < 1 ||
        !(o.dropout >= 0.0f && o.dropout < 1.0f)) {
        usage();
        return 2;
    }
    printf("# bench_attention: one process, one core (the kernels are serial); peak_mib: "
           "resident memory added over the io_mib of inputs and outputs\n");
    int bad = 0;
    static const char *const names[3] = {"tiled", "untiled", "dense"};
    for (int s = 0; s < o.nseq; s++)
        for (int j = 0; j < 3; j++)
            if (bu_list_has(kernels, names[j]))
                bad |= run_seq(&o, o.seq[s], names[j]);
    return bad;
}
