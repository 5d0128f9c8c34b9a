/* llama/lm_sample: one sample as text from the model (what the trainers print every N steps):
 * the end-of-text token (and a prompt) continued through the cache (lm.h). */
#include <stdlib.h>
#include <string.h>

#include "lm.h"
#include "sample.h"

dt_status lm_sample_text(lm *m, const dt_tokenizer *tok, int32_t eot, const char *prompt,
                         int64_t tokens, double temperature, int64_t top_k, uint64_t seed,
                         char **text_out, size_t *len_out)
{
    const dt_hf_config *cf = lm_config(m);
    int64_t K = tokens, n = 1, V = cf->vocab;
    size_t plen = prompt ? strlen(prompt) : 0;
    int32_t *ids = malloc((plen + 2 + (size_t)K) * sizeof *ids);
    float *logits = malloc((size_t)V * sizeof *logits);
    lm_cache *c = NULL;
    dt_status st = ids && logits ? DT_OK : DT_ERR_NO_MEMORY;
    size_t got = 0;
    if (st == DT_OK) {
        ids[0] = eot >= 0 ? eot : (int32_t)(cf->bos_token_id >= 0 ? cf->bos_token_id : 0);
        if (prompt)
            st = dt_tokenizer_encode(tok, prompt, plen, 0, ids + 1, plen + 1, &got);
        n = 1 + (int64_t)got;
    }
    if (st == DT_OK)
        st = lm_cache_create(m, 1, n + K, &c);
    sampler s;
    sampler_init(&s, temperature, top_k, 1.0, seed);
    if (st == DT_OK)
        st = lm_forward(m, c, n, ids, 0, logits);
    int64_t made = 0;
    while (st == DT_OK && made < K) {
        int32_t t = sampler_next(&s, logits, V);
        if (t < 0) {
            st = DT_ERR_NO_MEMORY;
            break;
        }
        ids[n + made++] = t;
        if (t == eot || made == K)
            break;
        st = lm_forward(m, c, 1, &t, 0, logits);
    }
    /* Everything after the leading end-of-text token, up to the next one. */
    int64_t upto = n + made;
    for (int64_t i = 1; i < upto; i++)
        if (ids[i] == eot) {
            upto = i;
            break;
        }
    size_t len = 0;
    char *text = NULL;
    if (st == DT_OK)
        st = dt_tokenizer_decode(tok, ids + 1, (size_t)(upto - 1), NULL, 0, &len);
    if (st == DT_OK && !(text = malloc(len + 1)))
        st = DT_ERR_NO_MEMORY;
    if (st == DT_OK)
        st = dt_tokenizer_decode(tok, ids + 1, (size_t)(upto - 1), text, len, &len);
    if (st == DT_OK) {
        text[len] = '\0';
        *text_out = text;
        *len_out = len;
    } else {
        free(text);
    }
    lm_cache_destroy(c);
    free(ids);
    free(logits);
    return st;
}
