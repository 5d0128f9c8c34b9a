/* Loading tokenizers: GPT-2's vocab.json + merges.txt, and Hugging Face tokenizer.json (BPE
 * model, byte-level), parsed with jansson; anything not understood is refused by key. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/error.h"
#include "text/text_impl.h"

static dt_status load_json(const char *path, json_t **root_out)
{
    json_error_t jerr;
    FILE *f = fopen(path, "rb");
    if (!f)
        return dt__error(DT_ERR_IO, "%s: cannot open", path);
    json_t *root = json_loadf(f, JSON_REJECT_DUPLICATES, &jerr);
    fclose(f);
    if (!root)
        return dt__error(DT_ERR_PARSE, "%s:%d:%d: %s", path, jerr.line, jerr.column, jerr.text);
    if (!json_is_object(root)) {
        json_decref(root);
        return dt__error(DT_ERR_PARSE, "%s: not a JSON object", path);
    }
    *root_out = root;
    return DT_OK;
}

/* One more than the largest id of a vocabulary object (and of added tokens). */
static dt_status vocab_extent(const json_t *vocab, const char *what, int32_t *n_out)
{
    const char *key;
    json_t *v;
    json_int_t max = -1;
    json_object_foreach((json_t *)vocab, key, v)
    {
        if (!json_is_integer(v) || json_integer_value(v) < 0 ||
            json_integer_value(v) >= INT32_MAX - 1)
            return dt__error(DT_ERR_PARSE, "%s: token \"%s\": id is not an integer in range", what,
                             key);
        if (json_integer_value(v) > max)
            max = json_integer_value(v);
    }
    *n_out = (int32_t)(max + 1);
    return DT_OK;
}

static dt_status add_vocab(dt_tokenizer *t, const json_t *vocab, const char *what)
{
    const char *key;
    json_t *v;
    char stack[512];
    json_object_foreach((json_t *)vocab, key, v)
    {
        size_t klen = strlen(key);
        char *raw = klen <= sizeof stack ? stack : malloc(klen);
        if (!raw)
            return dt__error(DT_ERR_NO_MEMORY, "%s", what);
        long n = dt__tk_unbyte(key, klen, raw);
        dt_status st =
            n <= 0 ? dt__error(DT_ERR_CORRUPT, "%s: token \"%s\" is not byte-level text", what, key)
                   : dt__tk_set(t, (int32_t)json_integer_value(v), raw, (size_t)n, 0, what);
        if (raw != stack)
            free(raw);
        if (st != DT_OK)
            return st;
    }
    return DT_OK;
}

/* A merge "a b" (byte-level text) of rank `line`. */
static dt_status add_merge_text(dt_tokenizer *t, const char *a, size_t alen, const char *b,
                                size_t blen, const char *what, long line)
{
    char *ra = malloc(alen + 1), *rb = malloc(blen + 1);
    dt_status st;
    if (!ra || !rb) {
        st = dt__error(DT_ERR_NO_MEMORY, "%s", what);
        goto out;
    }
    long na = dt__tk_unbyte(a, alen, ra), nb = dt__tk_unbyte(b, blen, rb);
    if (na <= 0 || nb <= 0)
        st = dt__error(DT_ERR_CORRUPT, "%s: merge %ld is not two byte-level tokens", what, line);
    else
        st = dt__tk_add_merge(t, ra, (size_t)na, rb, (size_t)nb, what, line);
out:
    free(ra);
    free(rb);
    return st;
}

static dt_status read_merges_txt(dt_tokenizer *t, const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return dt__error(DT_ERR_IO, "%s: cannot open", path);
    char *line = NULL;
    size_t cap = 0;
    ssize_t n;
    long lineno = 0;
    dt_status st = DT_OK;
    while (st == DT_OK && (n = getline(&line, &cap, f)) >= 0) {
        lineno++;
        while (n > 0 && (line[n - 1] == '\n' || line[n - 1] == '\r'))
            line[--n] = '\0';
        if (n == 0 || (lineno == 1 && strncmp(line, "#version", 8) == 0))
            continue;
        char *sp = memchr(line, ' ', (size_t)n);
        if (!sp || sp == line || sp + 1 == line + n ||
            memchr(sp + 1, ' ', (size_t)(line + n - sp - 1)))
            st = dt__error(DT_ERR_PARSE, "%s:%ld: not two tokens separated by one space", path,
                           lineno);
        else
            st = add_merge_text(t, line, (size_t)(sp - line), sp + 1, (size_t)(line + n - sp - 1),
                                path, lineno);
    }
    if (st == DT_OK && ferror(f))
        st = dt__error(DT_ERR_IO, "%s: read error", path);
    free(line);
    fclose(f);
    return st;
}

dt_status dt_tokenizer_from_files(const char *vocab_json, const char *merges_txt,
                                  dt_tokenizer **tok_out)
{
    if (!vocab_json || !merges_txt || !tok_out)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "dt_tokenizer_from_files: NULL argument");
    json_t *root;
    dt_status st = load_json(vocab_json, &root);
    if (st != DT_OK)
        return st;
    int32_t n_ids;
    st = vocab_extent(root, vocab_json, &n_ids);
    if (st != DT_OK)
        goto err_json;
    dt_tokenizer *t = dt__tk_new(n_ids);
    if (!t) {
        st = dt__error(DT_ERR_NO_MEMORY, "%s", vocab_json);
        goto err_json;
    }
    st = add_vocab(t, root, vocab_json);
    if (st != DT_OK)
        goto err_tok;
    /* GPT-2's end of text is a vocabulary entry that HF and tiktoken match as special. */
    json_t *eot = json_object_get(root, "<|endoftext|>");
    if (eot)
        t->is_special[json_integer_value(eot)] = 1;
    st = dt__tk_index(t, vocab_json);
    if (st == DT_OK)
        st = read_merges_txt(t, merges_txt);
    if (st == DT_OK)
        st = dt__tk_finish_special(t);
    if (st == DT_OK)
        st = dt__tk_set_pattern(t, dt__tk_gpt2_pattern, "GPT-2 pattern");
    if (st != DT_OK)
        goto err_tok;
    json_decref(root);
    *tok_out = t;
    return DT_OK;
err_tok:
    dt_tokenizer_destroy(t);
err_json:
    json_decref(root);
    return st;
}

/* ---- tokenizer.json ------------------------------------------------------------------ */

/* Refuses a key whose value is set to something other than null / false / "" / 0. */
static dt_status must_be_unset(const json_t *obj, const char *key, const char *path,
                               const char *where)
{
    json_t *v = json_object_get(obj, key);
    if (!v || json_is_null(v) || json_is_false(v) ||
        (json_is_string(v) && json_string_length(v) == 0) ||
        (json_is_number(v) && json_number_value(v) == 0))
        return DT_OK;
    return dt__error(DT_ERR_UNSUPPORTED, "%s: %s.%s is set: not supported", path, where, key);
}

static dt_status check_byte_level(const json_t *bl, const char *path, const char *where,
                                  int want_regex)
{
    json_t *aps = json_object_get(bl, "add_prefix_space");
    if (aps && json_is_true(aps))
        return dt__error(DT_ERR_UNSUPPORTED, "%s: %s.add_prefix_space true: not supported", path,
                         where);
    json_t *ur = json_object_get(bl, "use_regex");
    int use_regex = !ur || json_is_true(ur); /* HF's default is true */
    if (use_regex != want_regex)
        return dt__error(DT_ERR_UNSUPPORTED, "%s: %s.use_regex %s: not supported here", path, where,
                         use_regex ? "true" : "false");
    return DT_OK;
}

/* The pattern the pre_tokenizer asks for, GPT-2's when it is a plain ByteLevel. Borrowed
 * from root or static. */
static dt_status pre_tokenizer_pattern(const json_t *root, const char *path,
                                       const char **pattern_out)
{
    json_t *pre = json_object_get(root, "pre_tokenizer");
    if (!pre || !json_is_object(pre))
        return dt__error(DT_ERR_UNSUPPORTED,
                         "%s: pre_tokenizer missing: a byte-level BPE "
                         "needs one",
                         path);
    const char *type = json_string_value(json_object_get(pre, "type"));
    if (type && strcmp(type, "ByteLevel") == 0) {
        dt_status st = check_byte_level(pre, path, "pre_tokenizer", 1);
        if (st == DT_OK)
            *pattern_out = dt__tk_gpt2_pattern;
        return st;
    }
    if (!type || strcmp(type, "Sequence") != 0)
        return dt__error(DT_ERR_UNSUPPORTED, "%s: pre_tokenizer.type \"%s\": not supported", path,
                         type ? type : "(none)");
    json_t *seq = json_object_get(pre, "pretokenizers");
    if (!json_is_array(seq) || json_array_size(seq) != 2)
        return dt__error(DT_ERR_UNSUPPORTED,
                         "%s: pre_tokenizer.pretokenizers: only [Split, "
                         "ByteLevel] is supported",
                         path);
    json_t *split = json_array_get(seq, 0), *bl = json_array_get(seq, 1);
    const char *t0 = json_string_value(json_object_get(split, "type"));
    const char *t1 = json_string_value(json_object_get(bl, "type"));
    if (!t0 || strcmp(t0, "Split") != 0 || !t1 || strcmp(t1, "ByteLevel") != 0)
        return dt__error(DT_ERR_UNSUPPORTED,
                         "%s: pre_tokenizer.pretokenizers: [%s, %s]: only "
                         "[Split, ByteLevel] is supported",
                         path, t0 ? t0 : "?", t1 ? t1 : "?");
    const char *regex =
        json_string_value(json_object_get(json_object_get(split, "pattern"), "Regex"));
    if (!regex)
        return dt__error(DT_ERR_UNSUPPORTED,
                         "%s: pre_tokenizer.pretokenizers[0].pattern: "
                         "only {\"Regex\": ...} is supported",
                         path);
    const char *behavior = json_string_value(json_object_get(split, "behavior"));
    if (behavior && strcmp(behavior, "Isolated") != 0)
        return dt__error(DT_ERR_UNSUPPORTED,
                         "%s: pre_tokenizer.pretokenizers[0].behavior "
                         "\"%s\": only Isolated is supported",
                         path, behavior);
    json_t *inv = json_object_get(split, "invert");
    if (inv && json_is_true(inv))
        return dt__error(DT_ERR_UNSUPPORTED,
                         "%s: pre_tokenizer.pretokenizers[0].invert true: "
                         "not supported",
                         path);
    dt_status st = check_byte_level(bl, path, "pre_tokenizer.pretokenizers[1]", 0);
    if (st == DT_OK)
        *pattern_out = regex;
    return st;
}

static dt_status check_model(const json_t *root, const char *path, const json_t **model_out)
{
    json_t *model = json_object_get(root, "model");
    if (!json_is_object(model))
        return dt__error(DT_ERR_PARSE, "%s: model: missing or not an object", path);
    const char *type = json_string_value(json_object_get(model, "type"));
    if (type && strcmp(type, "BPE") != 0)
        return dt__error(DT_ERR_UNSUPPORTED, "%s: model.type \"%s\": only BPE is supported", path,
                         type);
    if (!json_is_object(json_object_get(model, "vocab")))
        return dt__error(DT_ERR_PARSE, "%s: model.vocab: missing or not an object", path);
    if (!json_is_array(json_object_get(model, "merges")))
        return dt__error(DT_ERR_PARSE, "%s: model.merges: missing or not an array", path);
    static const char *const unset[] = {"dropout", "byte_fallback", "continuing_subword_prefix",
                                        "end_of_word_suffix"};
    for (size_t i = 0; i < sizeof unset / sizeof *unset; i++) {
        dt_status st = must_be_unset(model, unset[i], path, "model");
        if (st != DT_OK)
            return st;
    }
    json_t *norm = json_object_get(root, "normalizer");
    const char *ntype = json_string_value(json_object_get(norm, "type"));
    if (norm && !json_is_null(norm) && (!ntype || strcmp(ntype, "NFC") != 0))
        return dt__error(DT_ERR_UNSUPPORTED, "%s: normalizer.type \"%s\": only NFC is supported",
                         path, ntype ? ntype : "(none)");
    json_t *dec = json_object_get(root, "decoder");
    const char *dtype = json_string_value(json_object_get(dec, "type"));
    if (dec && !json_is_null(dec) && (!dtype || strcmp(dtype, "ByteLevel") != 0))
        return dt__error(DT_ERR_UNSUPPORTED,
                         "%s: decoder.type \"%s\": only ByteLevel is "
                         "supported",
                         path, dtype ? dtype : "(none)");
    *model_out = model;
    return DT_OK;
}

static dt_status add_json_merges(dt_tokenizer *t, const json_t *merges, const char *path)
{
    size_t i;
    json_t *m;
    json_array_foreach((json_t *)merges, i, m)
    {
        dt_status st;
        if (json_is_string(m)) {
            const char *s = json_string_value(m);
            size_t len = json_string_length(m);
            const char *sp = memchr(s, ' ', len);
            if (!sp || sp == s || sp + 1 == s + len ||
                memchr(sp + 1, ' ', (size_t)(s + len - sp - 1)))
                return dt__error(DT_ERR_PARSE, "%s: model.merges[%zu]: not \"a b\"", path, i);
            st = add_merge_text(t, s, (size_t)(sp - s), sp + 1, (size_t)(s + len - sp - 1), path,
                                (long)i);
        } else if (json_is_array(m) && json_array_size(m) == 2 &&
                   json_is_string(json_array_get(m, 0)) && json_is_string(json_array_get(m, 1))) {
            json_t *a = json_array_get(m, 0), *b = json_array_get(m, 1);
            st = add_merge_text(t, json_string_value(a), json_string_length(a),
                                json_string_value(b), json_string_length(b), path, (long)i);
        } else {
            return dt__error(DT_ERR_PARSE, "%s: model.merges[%zu]: neither \"a b\" nor [a, b]",
                             path, i);
        }
        if (st != DT_OK)
            return st;
    }
    return DT_OK;
}

static dt_status add_added_tokens(dt_tokenizer *t, const json_t *added, const char *path)
{
    size_t i;
    json_t *a;
    json_array_foreach((json_t *)added, i, a)
    {
        json_t *id = json_object_get(a, "id"), *content = json_object_get(a, "content");
        if (!json_is_integer(id) || !json_is_string(content))
            return dt__error(DT_ERR_PARSE, "%s: added_tokens[%zu]: id or content missing", path, i);
        dt_status st = dt__tk_set(t, (int32_t)json_integer_value(id), json_string_value(content),
                                  json_string_length(content), 1, path);
        if (st != DT_OK)
            return st;
    }
    return DT_OK;
}

dt_status dt_tokenizer_from_json(const char *tokenizer_json, dt_tokenizer **tok_out)
{
    if (!tokenizer_json || !tok_out)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "dt_tokenizer_from_json: NULL argument");
    const char *path = tokenizer_json;
    json_t *root;
    dt_status st = load_json(path, &root);
    if (st != DT_OK)
        return st;
    const json_t *model = NULL;
    const char *pattern = NULL;
    st = check_model(root, path, &model);
    if (st == DT_OK)
        st = pre_tokenizer_pattern(root, path, &pattern);
    json_t *added = json_object_get(root, "added_tokens");
    if (st == DT_OK && added && !json_is_array(added))
        st = dt__error(DT_ERR_PARSE, "%s: added_tokens: not an array", path);
    int32_t n_ids = 0;
    if (st == DT_OK)
        st = vocab_extent(json_object_get(model, "vocab"), path, &n_ids);
    if (st != DT_OK)
        goto err_json;
    size_t i;
    json_t *a;
    json_array_foreach(added, i, a)
    {
        json_int_t id = json_integer_value(json_object_get(a, "id"));
        if (id >= INT32_MAX - 1) {
            st = dt__error(DT_ERR_PARSE, "%s: added_tokens[%zu].id out of range", path, i);
            goto err_json;
        }
        if (id + 1 > n_ids)
            n_ids = (int32_t)(id + 1);
    }
    dt_tokenizer *t = dt__tk_new(n_ids);
    if (!t) {
        st = dt__error(DT_ERR_NO_MEMORY, "%s", path);
        goto err_json;
    }
    json_t *im = json_object_get(model, "ignore_merges");
    t->ignore_merges = im && json_is_true(im);
    t->nfc =
        json_string_value(json_object_get(json_object_get(root, "normalizer"), "type")) != NULL;
    st = add_vocab(t, json_object_get(model, "vocab"), path);
    if (st == DT_OK && added)
        st = add_added_tokens(t, added, path);
    if (st == DT_OK)
        st = dt__tk_index(t, path);
    if (st == DT_OK)
        st = add_json_merges(t, json_object_get(model, "merges"), path);
    if (st == DT_OK)
        st = dt__tk_finish_special(t);
    if (st == DT_OK)
        st = dt__tk_set_pattern(t, pattern, path);
    if (st != DT_OK)
        goto err_tok;
    json_decref(root);
    *tok_out = t;
    return DT_OK;
err_tok:
    dt_tokenizer_destroy(t);
err_json:
    json_decref(root);
    return st;
}
