/* bench_generate: incremental decoding of a Llama-family model (examples/llama, random
 * weights, f32) on one device, against the bounds measured in the same run (docs/bench.md):
 *  - decode tokens/s at batch 1 and 8 against the rate at which every weight can be read
 *    once per token: memcpy bandwidth (best of 5 copies of a buffer the weights' size, bytes
 *    read + written counted once as read) over the weights' bytes;
 *  - prefill tokens/s of one prompt against the GEMM rate (dt_kernel_gemm of the prompt's
 *    [tokens, hidden] x [hidden, intermediate], best of 5): achieved GFLOP/s as 2 x (the
 *    blocks' matmul weights x tokens + the head's once: only the last position's logits are
 *    computed; attention excluded) over the time, against that rate.
 *   bench_generate [--quick] [--layers L] [--hidden C] [--vocab V] [--prompt P] [--steps N]
 * Prints key=value lines. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <dtensor/dtensor.h>

#include "../examples/llama/lm.h"

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static double memcpy_gbs(size_t bytes)
{
    char *a = malloc(bytes), *b = malloc(bytes);
    double best = 1e30;
    if (!a || !b) {
        free(a);
        free(b);
        return 0;
    }
    memset(a, 1, bytes);
    memset(b, 2, bytes);
    for (int r = 0; r < 5; r++) {
        double t0 = now();
        memcpy(b, a, bytes);
        double t = now() - t0;
        best = t < best ? t : best;
        a[r] = b[bytes - 1 - (size_t)r]; /* keep the copies */
    }
    free(a);
    free(b);
    return (double)bytes / best / 1e9;
}

static double gemm_gflops(int64_t m, int64_t n, int64_t k)
{
    float *a = malloc((size_t)(m * k) * 4), *b = malloc((size_t)(k * n) * 4);
    float *c = malloc((size_t)(m * n) * 4);
    double best = 1e30;
    for (int64_t i = 0; a && i < m * k; i++)
        a[i] = (float)(i % 7) * 0.1f;
    for (int64_t i = 0; b && i < k * n; i++)
        b[i] = (float)(i % 5) * 0.1f;
    for (int r = 0; a && b && c && r < 5; r++) {
        double t0 = now();
        dt_kernel_gemm(0, 0, m, n, k, 1.0f, a, DT_DTYPE_F32, k, b, DT_DTYPE_F32, n, 0.0f, c, n);
        double t = now() - t0;
        best = t < best ? t : best;
    }
    free(a);
    free(b);
    free(c);
    return 2.0 * (double)(m * n * k) / best / 1e9;
}

/* Decode tokens/s of `rows` rows: a prompt of 16, then `steps` one-token steps timed. */
static int decode(lm *m, int64_t rows, int64_t steps, double *tps)
{
    const dt_hf_config *c = lm_config(m);
    int64_t P = 16;
    lm_cache *cache = NULL;
    int32_t *ids = malloc((size_t)(rows * P) * sizeof *ids);
    float *logits = malloc((size_t)(rows * c->vocab) * sizeof *logits);
    dt_status st = ids && logits ? lm_cache_create(m, rows, P + steps, &cache) : DT_ERR_NO_MEMORY;
    for (int64_t i = 0; ids && i < rows * P; i++)
        ids[i] = (int32_t)((i * 7919) % c->vocab);
    if (st == DT_OK)
        st = lm_forward(m, cache, P, ids, 0, logits);
    double t0 = now();
    for (int64_t s = 0; st == DT_OK && s < steps; s++) {
        for (int64_t r = 0; r < rows; r++) {
            int32_t best = 0;
            for (int64_t v = 1; v < c->vocab; v++)
                if (logits[r * c->vocab + v] > logits[r * c->vocab + best])
                    best = (int32_t)v;
            ids[r] = best;
        }
        st = lm_forward(m, cache, 1, ids, 0, logits);
    }
    *tps = (double)(rows * steps) / (now() - t0);
    lm_cache_destroy(cache);
    free(ids);
    free(logits);
    if (st != DT_OK)
        fprintf(stderr, "bench_generate: %s: %s\n", dt_status_name(st), lm_last_error());
    return st == DT_OK ? 0 : 1;
}

int main(int argc, char **argv)
{
    int64_t layers = 8, hidden = 512, vocab = 32000, prompt = 128, steps = 32;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : "0";
        if (!strcmp(a, "--quick")) {
            layers = 4;
            hidden = 256;
            vocab = 8000;
            prompt = 64;
            steps = 16;
            continue;
        }
        i++;
        if (!strcmp(a, "--layers"))
            layers = atoll(v);
        else if (!strcmp(a, "--hidden"))
            hidden = atoll(v);
        else if (!strcmp(a, "--vocab"))
            vocab = atoll(v);
        else if (!strcmp(a, "--prompt"))
            prompt = atoll(v);
        else if (!strcmp(a, "--steps"))
            steps = atoll(v);
        else {
            fprintf(stderr, "usage: bench_generate [--quick] [--layers L] [--hidden C] "
                            "[--vocab V] [--prompt P] [--steps N]\n");
            return 2;
        }
    }
    dt_init_opts io = DT_INIT_OPTS_INIT;
    io.cpu_devices = 1;
    dt_status st = dt_init(&argc, &argv, &io);
    if (st != DT_OK) {
        fprintf(stderr, "bench_generate: dt_init: %s\n", dt_last_error());
        return 1;
    }
    const char *names[2] = {"batch", "model"};
    int64_t sizes[2] = {1, 1};
    dt_mesh *mesh = NULL;
    lm *m = NULL;
    dt_hf_config c;
    memset(&c, 0, sizeof c);
    c.arch = DT_HF_LLAMA;
    snprintf(c.model_type, sizeof c.model_type, "llama");
    c.vocab = vocab;
    c.hidden = hidden;
    c.intermediate = 3 * hidden;
    c.layers = layers;
    c.heads = hidden / 64;
    c.kv_heads = c.heads / 2 > 0 ? c.heads / 2 : 1;
    c.head_dim = 64;
    c.max_positions = 4096;
    c.norm_eps = 1e-5;
    c.rope_theta = 500000.0;
    c.tie_word_embeddings = 1;
    c.bos_token_id = c.eos_token_id = -1;
    int rc = 1;
    if ((st = dt_mesh_create("bench", 2, names, sizes, DT_DEVICE_CPU, &mesh)) != DT_OK ||
        (st = lm_create_random(mesh, &c, 1, &m)) != DT_OK) {
        fprintf(stderr, "bench_generate: %s: %s\n", dt_status_name(st), lm_last_error());
        goto out;
    }
    double wbytes = (double)lm_weight_bytes(m);
    double bw =
        memcpy_gbs((size_t)wbytes > ((size_t)64 << 20) ? (size_t)wbytes : ((size_t)64 << 20));
    double bound = bw * 1e9 / wbytes;
    double t1 = 0, t8 = 0;
    if (decode(m, 1, steps, &t1) != 0 || decode(m, 8, steps, &t8) != 0)
        goto out;
    printf("case=decode model=llama layers=%lld hidden=%lld vocab=%lld weight_mb=%.1f "
           "memcpy_gbs=%.2f bound_tokens_per_s=%.1f batch=1 tokens_per_s=%.1f ratio=%.3f\n",
           (long long)layers, (long long)hidden, (long long)vocab, wbytes / 1e6, bw, bound, t1,
           t1 / bound);
    printf("case=decode model=llama batch=8 tokens_per_s=%.1f ratio=%.3f\n", t8, t8 / bound);
    /* Prefill: one prompt, timed once after a warm-up. */
    lm_cache *cache = NULL;
    int32_t *ids = malloc((size_t)prompt * sizeof *ids);
    float *logits = malloc((size_t)vocab * sizeof *logits);
    for (int64_t i = 0; ids && i < prompt; i++)
        ids[i] = (int32_t)((i * 7919) % vocab);
    double tp = 0;
    st = ids && logits ? lm_cache_create(m, 1, prompt, &cache) : DT_ERR_NO_MEMORY;
    for (int r = 0; st == DT_OK && r < 2; r++) {
        lm_cache_reset(cache);
        double t0 = now();
        st = lm_forward(m, cache, prompt, ids, 0, logits);
        tp = (double)prompt / (now() - t0);
    }
    lm_cache_destroy(cache);
    free(ids);
    free(logits);
    if (st != DT_OK) {
        fprintf(stderr, "bench_generate: prefill: %s: %s\n", dt_status_name(st), lm_last_error());
        goto out;
    }
    double g = gemm_gflops(prompt, c.intermediate, hidden);
    /* Every block's matmul weights once per prompt token, the (tied) head once per prompt:
     * lm_forward computes only the last position's logits. */
    double head = (double)vocab * (double)hidden, blocks = wbytes / 4.0 - head;
    double achieved = 2.0 * (blocks * (double)prompt + head) / ((double)prompt / tp) / 1e9;
    printf("case=prefill model=llama prompt=%lld tokens_per_s=%.1f achieved_gflops=%.2f "
           "gemm_gflops=%.2f gemm_ratio=%.3f\n",
           (long long)prompt, tp, achieved, g, achieved / g);
    rc = 0;
out:
    lm_destroy(m);
    dt_mesh_destroy(mesh);
    dt_finalize();
    return rc;
}
