/* llama/sample: greedy, temperature, top-k and top-p sampling from a seeded splitmix64
 * (sample.h). */
#include "sample.h"

#include <math.h>
#include <stdlib.h>

void sampler_init(sampler *s, double temperature, int64_t top_k, double top_p, uint64_t seed)
{
    s->temperature = temperature;
    s->top_k = top_k;
    s->top_p = top_p;
    s->state = seed;
}

static uint64_t splitmix64(uint64_t *x)
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static const float *sort_keys;

/* Descending logit, then ascending id: a total order, so every client sorts alike. */
static int by_logit(const void *a, const void *b)
{
    int32_t i = *(const int32_t *)a, j = *(const int32_t *)b;
    if (sort_keys[i] != sort_keys[j])
        return sort_keys[i] > sort_keys[j] ? -1 : 1;
    return i < j ? -1 : i > j;
}

int32_t sampler_next(sampler *s, const float *logits, int64_t V)
{
    if (s->temperature <= 0.0) {
        int32_t best = 0;
        for (int64_t i = 1; i < V; i++)
            if (logits[i] > logits[best])
                best = (int32_t)i;
        return best;
    }
    int32_t *order = malloc((size_t)V * sizeof *order);
    double *p = malloc((size_t)V * sizeof *p);
    if (!order || !p) {
        free(order);
        free(p);
        return -1;
    }
    for (int64_t i = 0; i < V; i++)
        order[i] = (int32_t)i;
    sort_keys = logits;
    qsort(order, (size_t)V, sizeof *order, by_logit);
    int64_t keep = s->top_k > 0 && s->top_k < V ? s->top_k : V;
    double mx = logits[order[0]], sum = 0.0;
    for (int64_t i = 0; i < keep; i++) {
        p[i] = exp(((double)logits[order[i]] - mx) / s->temperature);
        sum += p[i];
    }
    if (s->top_p > 0.0 && s->top_p < 1.0) {
        double c = 0.0;
        int64_t n = 0;
        while (n < keep) {
            c += p[n++] / sum;
            if (c >= s->top_p)
                break;
        }
        keep = n;
        sum = 0.0;
        for (int64_t i = 0; i < keep; i++)
            sum += p[i];
    }
    /* A uniform draw in [0, sum) from 53 random bits. */
    double u = (double)(splitmix64(&s->state) >> 11) * (1.0 / 9007199254740992.0) * sum;
    int32_t tok = order[keep - 1];
    for (int64_t i = 0; i < keep; i++) {
        if (u < p[i]) {
            tok = order[i];
            break;
        }
        u -= p[i];
    }
    free(order);
    free(p);
    return tok;
}
