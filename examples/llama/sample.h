/* llama/sample: the next token from a row of logits: greedy, or drawn at a temperature after
 * top-k and top-p (nucleus) filtering, from a seeded generator (the same draws on every
 * client for the same logits). */
#ifndef LLAMA_SAMPLE_H
#define LLAMA_SAMPLE_H

#include <stdint.h>

typedef struct sampler {
    double temperature; /* 0: greedy (the first largest logit) */
    int64_t top_k;      /* 0: all tokens */
    double top_p;       /* 1: all tokens; else the smallest set whose probability >= top_p */
    uint64_t state;     /* splitmix64 state, from the seed */
} sampler;

void sampler_init(sampler *s, double temperature, int64_t top_k, double top_p, uint64_t seed);

/* The token drawn from logits[0..V). Not thread safe (one sampler at a time). Returns -1
 * when out of memory. */
int32_t sampler_next(sampler *s, const float *logits, int64_t V);

#endif
