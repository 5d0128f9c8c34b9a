/* GPT-2 from a foreign source: its config (llm.c's header, or an HF file's shapes and
 * config.json), and the mapping of HF or llm.c tensors onto our GPT-2's parameter names and
 * [in, out] weights, with q, k and v cut from the fused attention weight (docs/foreign.md). */
#include <inttypes.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "ckpt/ckpt_impl.h"
#include "runtime/error.h"
#include "runtime/util.h"

/* "transformer." or "" for an HF source; NULL when it has no wte. */
static const char *hf_prefix(const dt_foreign *src)
{
    if (dt__foreign_lookup(src, "wte.weight") >= 0)
        return "";
    if (dt__foreign_lookup(src, "transformer.wte.weight") >= 0)
        return "transformer.";
    return NULL;
}

static const ck_ftensor *find(const dt_foreign *src, const char *fmt, const char *p, int64_t l)
{
    char name[256];
    if (l < 0)
        snprintf(name, sizeof name, fmt, p);
    else
        snprintf(name, sizeof name, fmt, p, l);
    int64_t i = dt__foreign_lookup(src, name);
    return i >= 0 ? &src->tensors[i] : NULL;
}

/* config.json beside an HF source, when there is one: its n_head into c->n_head (0 when it
 * has none), and every size it gives (Hugging Face's keys) checked against the tensors' c. */
static dt_status read_config(const dt_foreign *src, dt_foreign_gpt2_config *c)
{
    char p[CK_PATH_MAX];
    struct stat sb;
    if (dt__ckpt_join(p, sizeof p, src->dir, "/", "config.json") != DT_OK || stat(p, &sb) != 0)
        return DT_OK;
    json_error_t jerr;
    json_t *root = json_load_file(p, JSON_REJECT_DUPLICATES, &jerr);
    if (!json_is_object(root)) {
        json_decref(root);
        return root ? dt__error(DT_ERR_PARSE, "%s: not a JSON object", p)
                    : dt__error(DT_ERR_PARSE, "%s:%d:%d: %s", p, jerr.line, jerr.column,
                                jerr.text);
    }
    static const struct {
        const char *key;
        size_t at;                 /* offset of the field in the config */
    } keys[] = {
        {"n_head", offsetof(dt_foreign_gpt2_config, n_head)},
        {"n_layer", offsetof(dt_foreign_gpt2_config, n_layer)},
        {"n_embd", offsetof(dt_foreign_gpt2_config, n_embd)},
        {"n_positions", offsetof(dt_foreign_gpt2_config, n_ctx)},
        {"n_ctx", offsetof(dt_foreign_gpt2_config, n_ctx)},
        {"vocab_size", offsetof(dt_foreign_gpt2_config, vocab)},
    };
    dt_status st = DT_OK;
    for (size_t k = 0; st == DT_OK && k < sizeof keys / sizeof keys[0]; k++) {
        json_t *v = json_object_get(root, keys[k].key);
        int64_t *field = (int64_t *)((char *)c + keys[k].at);
        if (!v || json_is_null(v))
            continue;
        if (!json_is_integer(v) || json_integer_value(v) <= 0)
            st = dt__error(DT_ERR_PARSE, "%s: \"%s\" is not a positive integer", p,
                           keys[k].key);
        else if (k == 0)
            *field = json_integer_value(v);
        else if (json_integer_value(v) != *field)
            st = dt__error(DT_ERR_SHAPE, "%s: \"%s\" is %" PRId64 ", but %s holds %" PRId64,
                           p, keys[k].key, (int64_t)json_integer_value(v), src->shown, *field);
    }
    json_decref(root);
    return st;
}

dt_status dt_foreign_gpt2_config_of(const dt_foreign *src, dt_foreign_gpt2_config *cfg_out)
{
    if (!src || !cfg_out)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "dt_foreign_gpt2_config_of: NULL argument");
    dt_foreign_gpt2_config c = {0};
    if (src->format == DT_FOREIGN_LLMC_GPT2) {
        c.n_ctx = src->llmc[2];
        c.vocab = src->llmc[3];
        c.n_layer = src->llmc[4];
        c.n_head = src->llmc[5];
        c.n_embd = src->llmc[6];
        c.padded_vocab = src->llmc[7];
        *cfg_out = c;
        return DT_OK;
    }
    const char *p = hf_prefix(src);
    const ck_ftensor *wte = p ? find(src, "%swte.weight", p, -1) : NULL;
    const ck_ftensor *wpe = p ? find(src, "%swpe.weight", p, -1) : NULL;
    if (!wte || !wpe)
        return dt__error(DT_ERR_NOT_FOUND, "%s: no GPT-2 'wte.weight' and 'wpe.weight' (with "
                         "or without 'transformer.')", src->shown);
    if (wte->rank != 2 || wpe->rank != 2 || wte->shape[1] != wpe->shape[1] ||
        wte->shape[1] == 0)
        return dt__error(DT_ERR_SHAPE, "%s: GPT-2 wte and wpe are not [V, C] and [T, C]",
                         src->shown);
    c.vocab = c.padded_vocab = wte->shape[0];
    c.n_embd = wte->shape[1];
    c.n_ctx = wpe->shape[0];
    while (find(src, "%sh.%" PRId64 ".ln_1.weight", p, c.n_layer))
        c.n_layer++;
    dt_status st = read_config(src, &c);
    if (st != DT_OK)
        return st;
    *cfg_out = c;
    return DT_OK;
}

void dt_foreign_map_free(dt_foreign_map_entry *map, int count)
{
    if (!map)
        return;
    for (int i = 0; i < count; i++) {
        free(map[i].name);
        free((char *)map[i].view.source);
    }
    free(map);
}

/* One of our parameters per layer: our suffix, HF suffix, llm.c suffix, split part (-1:
 * none; else the third taken of the fused q|k|v), and whether llm.c's is transposed. */
typedef struct gpt2_param {
    const char *ours, *hf, *llmc;
    int part;
    int llmc_t;
    int rows, cols;               /* in units of C; cols 0: a vector */
} gpt2_param;

static const gpt2_param layer_params[16] = {
    {"ln1.g", "ln_1.weight", "ln1w", -1, 0, 1, 0},
    {"ln1.b", "ln_1.bias", "ln1b", -1, 0, 1, 0},
    {"q.w", "attn.c_attn.weight", "qkvw", 0, 1, 1, 1},
    {"q.b", "attn.c_attn.bias", "qkvb", 0, 0, 1, 0},
    {"k.w", "attn.c_attn.weight", "qkvw", 1, 1, 1, 1},
    {"k.b", "attn.c_attn.bias", "qkvb", 1, 0, 1, 0},
    {"v.w", "attn.c_attn.weight", "qkvw", 2, 1, 1, 1},
    {"v.b", "attn.c_attn.bias", "qkvb", 2, 0, 1, 0},
    {"o.w", "attn.c_proj.weight", "attprojw", -1, 1, 1, 1},
    {"o.b", "attn.c_proj.bias", "attprojb", -1, 0, 1, 0},
    {"ln2.g", "ln_2.weight", "ln2w", -1, 0, 1, 0},
    {"ln2.b", "ln_2.bias", "ln2b", -1, 0, 1, 0},
    {"fc.w", "mlp.c_fc.weight", "fcw", -1, 1, 1, 4},
    {"fc.b", "mlp.c_fc.bias", "fcb", -1, 0, 4, 0},
    {"proj.w", "mlp.c_proj.weight", "fcprojw", -1, 1, 4, 1},
    {"proj.b", "mlp.c_proj.bias", "fcprojb", -1, 0, 1, 0},
};

static dt_status add(dt_foreign_map_entry *e, const char *name, const char *source,
                     dt_foreign_view view, int rank, int64_t s0, int64_t s1)
{
    e->name = strdup(name);
    view.source = strdup(source);
    e->view = view;
    e->rank = rank;
    e->shape[0] = s0;
    e->shape[1] = s1;
    if (!e->name || !e->view.source)
        return dt__error(DT_ERR_NO_MEMORY, "dt_foreign_gpt2_map: no memory");
    return DT_OK;
}

dt_status dt_foreign_gpt2_map(const dt_foreign *src, int64_t vocab_rows,
                              dt_foreign_map_entry **map_out, int *count_out,
                              dt_foreign_gpt2_config *cfg_out)
{
    if (!src || !map_out || !count_out)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "dt_foreign_gpt2_map: NULL argument");
    dt_foreign_gpt2_config c;
    dt_status st = dt_foreign_gpt2_config_of(src, &c);
    if (st != DT_OK)
        return st;
    if (vocab_rows == 0)
        vocab_rows = c.vocab;
    if (vocab_rows < c.vocab)
        return dt__error(DT_ERR_SHAPE, "dt_foreign_gpt2_map: %s: vocab_rows %" PRId64 " below "
                         "the vocabulary %" PRId64, src->shown, vocab_rows, c.vocab);
    if (c.n_layer > 100000)
        return dt__error(DT_ERR_SHAPE, "dt_foreign_gpt2_map: %s: %" PRId64 " layers",
                         src->shown, c.n_layer);
    int llmc = src->format == DT_FOREIGN_LLMC_GPT2;
    const char *p = llmc ? "" : hf_prefix(src);
    int count = 2 + 16 * (int)c.n_layer + 2;
    dt_foreign_map_entry *map = calloc((size_t)count, sizeof *map);
    if (!map)
        return dt__error(DT_ERR_NO_MEMORY, "dt_foreign_gpt2_map: no memory");
    int64_t C = c.n_embd;
    int k = 0;
    char src_name[256], name[128];
    dt_foreign_view v = DT_FOREIGN_VIEW_INIT;
    if (llmc)
        v.row_end = c.vocab;
    v.pad_rows = vocab_rows > c.vocab ? vocab_rows : 0;
    snprintf(src_name, sizeof src_name, llmc ? "wte" : "%swte.weight", p);
    st = add(&map[k++], "wte", src_name, v, 2, vocab_rows, C);
    v = (dt_foreign_view)DT_FOREIGN_VIEW_INIT;
    snprintf(src_name, sizeof src_name, llmc ? "wpe" : "%swpe.weight", p);
    if (st == DT_OK)
        st = add(&map[k++], "wpe", src_name, v, 2, c.n_ctx, C);
    for (int64_t l = 0; st == DT_OK && l < c.n_layer; l++)
        for (int j = 0; st == DT_OK && j < 16; j++) {
            const gpt2_param *q = &layer_params[j];
            v = (dt_foreign_view)DT_FOREIGN_VIEW_INIT;
            if (llmc)
                snprintf(src_name, sizeof src_name, "h.%" PRId64 ".%s", l, q->llmc);
            else
                snprintf(src_name, sizeof src_name, "%sh.%" PRId64 ".%s", p, l, q->hf);
            snprintf(name, sizeof name, "h.%" PRId64 ".%s", l, q->ours);
            if (q->part >= 0) {
                v.split_parts = 3;
                v.split_index = q->part;
                /* HF's c_attn weight is [C, 3C] (parts along columns); llm.c's qkvw is
                 * [3C, C] (along rows); both biases are [3C]. */
                v.split_dim = q->cols && !llmc ? 1 : 0;
            }
            v.transpose = llmc && q->llmc_t;
            st = add(&map[k++], name, src_name, v, q->cols ? 2 : 1, q->rows * C, q->cols * C);
        }
    v = (dt_foreign_view)DT_FOREIGN_VIEW_INIT;
    snprintf(src_name, sizeof src_name, llmc ? "lnfw" : "%sln_f.weight", p);
    if (st == DT_OK)
        st = add(&map[k++], "lnf.g", src_name, v, 1, C, 0);
    snprintf(src_name, sizeof src_name, llmc ? "lnfb" : "%sln_f.bias", p);
    if (st == DT_OK)
        st = add(&map[k++], "lnf.b", src_name, v, 1, C, 0);
    /* Every entry's view exists and has the shape the config implies. */
    for (int i = 0; st == DT_OK && i < k; i++) {
        int rank;
        int64_t shape[DT_MAX_RANK];
        if ((st = dt_foreign_view_shape(src, &map[i].view, &rank, shape)) != DT_OK)
            break;
        int ok = rank == map[i].rank;
        for (int d = 0; ok && d < rank; d++)
            ok = shape[d] == map[i].shape[d];
        if (!ok) {
            char a[160], b[160];
            int64_t ti = dt__foreign_lookup(src, map[i].view.source);
            st = dt__error(DT_ERR_SHAPE, "dt_foreign_gpt2_map: %s: tensor '%s' gives %s for "
                           "'%s', GPT-2 with C=%" PRId64 " needs %s",
                           src->files[src->tensors[ti].file].path, map[i].view.source,
                           dt__shape_str(rank, shape, a, sizeof a), map[i].name, C,
                           dt__shape_str(map[i].rank, map[i].shape, b, sizeof b));
        }
    }
    if (st != DT_OK) {
        dt_foreign_map_free(map, count);
        return st;
    }
    *map_out = map;
    *count_out = count;
    if (cfg_out)
        *cfg_out = c;
    return DT_OK;
}
