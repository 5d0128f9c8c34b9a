/* Hugging Face model directories: config.json read (GPT-2 and the Llama family: Llama, Qwen2,
 * Mistral) and written, with errors naming the key; the Llama family's tensor mapping onto our
 * names and [in, out] weights (docs/foreign.md). */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt/ckpt_impl.h"
#include "runtime/error.h"
#include "runtime/util.h"

/* ---- reading config.json -------------------------------------------------------------------- */

typedef struct cfg_reader {
    json_t *root;
    const char *path;
} cfg_reader;

/* An integer key into *out: absent or null leaves *out (DT_ERR_NOT_FOUND when `required`);
 * anything but a positive integer is DT_ERR_PARSE naming the key. */
static dt_status get_int(const cfg_reader *r, const char *key, int required, int64_t *out)
{
    json_t *v = json_object_get(r->root, key);
    if (!v || json_is_null(v))
        return required ? dt__error(DT_ERR_NOT_FOUND, "%s: no \"%s\"", r->path, key) : DT_OK;
    if (!json_is_integer(v) || json_integer_value(v) <= 0)
        return dt__error(DT_ERR_PARSE, "%s: \"%s\" is not a positive integer", r->path, key);
    *out = (int64_t)json_integer_value(v);
    return DT_OK;
}

/* A number key of obj (the root, or rope_scaling: prefix "rope_scaling.") into *out. */
static dt_status get_real(const cfg_reader *r, json_t *obj, const char *key, int required,
                          double *out)
{
    json_t *v = json_object_get(obj, key);
    const char *pre = obj == r->root ? "" : "rope_scaling.";
    if (!v || json_is_null(v))
        return required ? dt__error(DT_ERR_NOT_FOUND, "%s: no \"%s%s\"", r->path, pre, key) : DT_OK;
    if (!json_is_number(v) || json_number_value(v) <= 0)
        return dt__error(DT_ERR_PARSE, "%s: \"%s%s\" is not a positive number", r->path, pre, key);
    *out = json_number_value(v);
    return DT_OK;
}

static dt_status get_bool(const cfg_reader *r, const char *key, int *out)
{
    json_t *v = json_object_get(r->root, key);
    if (!v || json_is_null(v))
        return DT_OK;
    if (!json_is_boolean(v))
        return dt__error(DT_ERR_PARSE, "%s: \"%s\" is not true or false", r->path, key);
    *out = json_is_true(v);
    return DT_OK;
}

/* bos_token_id / eos_token_id: an integer, a list of them (the first), or absent (-1). */
static dt_status get_token(const cfg_reader *r, const char *key, int64_t *out)
{
    json_t *v = json_object_get(r->root, key);
    *out = -1;
    if (json_is_array(v))
        v = json_array_get(v, 0);
    if (!v || json_is_null(v))
        return DT_OK;
    if (!json_is_integer(v) || json_integer_value(v) < 0)
        return dt__error(DT_ERR_PARSE, "%s: \"%s\" is not a token id", r->path, key);
    *out = (int64_t)json_integer_value(v);
    return DT_OK;
}

static dt_status read_gpt2(const cfg_reader *r, dt_hf_config *c)
{
    dt_status st;
    int64_t inner = 0;
    c->norm_eps = 1e-5;
    c->tie_word_embeddings = 1;
    c->attention_bias = 1;
    c->max_positions = 1024;
    if ((st = get_int(r, "vocab_size", 1, &c->vocab)) != DT_OK ||
        (st = get_int(r, "n_embd", 1, &c->hidden)) != DT_OK ||
        (st = get_int(r, "n_layer", 1, &c->layers)) != DT_OK ||
        (st = get_int(r, "n_head", 1, &c->heads)) != DT_OK ||
        (st = get_int(r, "n_positions", 0, &c->max_positions)) != DT_OK ||
        (st = get_int(r, "n_inner", 0, &inner)) != DT_OK ||
        (st = get_real(r, r->root, "layer_norm_epsilon", 0, &c->norm_eps)) != DT_OK ||
        (st = get_bool(r, "tie_word_embeddings", &c->tie_word_embeddings)) != DT_OK)
        return st;
    json_t *act = json_object_get(r->root, "activation_function");
    if (act && !json_is_null(act) &&
        (!json_is_string(act) || (strcmp(json_string_value(act), "gelu_new") != 0 &&
                                  strcmp(json_string_value(act), "gelu_pytorch_tanh") != 0)))
        return dt__error(DT_ERR_UNSUPPORTED,
                         "%s: \"activation_function\" %s is not supported "
                         "(gelu_new)",
                         r->path, json_is_string(act) ? json_string_value(act) : "(not a string)");
    if (!c->tie_word_embeddings)
        return dt__error(DT_ERR_UNSUPPORTED,
                         "%s: \"tie_word_embeddings\" false is not "
                         "supported for gpt2",
                         r->path);
    if (c->hidden % c->heads != 0)
        return dt__error(DT_ERR_PARSE,
                         "%s: \"n_head\" %" PRId64 " does not divide \"n_embd\" "
                         "%" PRId64,
                         r->path, c->heads, c->hidden);
    c->kv_heads = c->heads;
    c->head_dim = c->hidden / c->heads;
    c->intermediate = inner ? inner : 4 * c->hidden;
    return DT_OK;
}

static dt_status read_rope_scaling(const cfg_reader *r, dt_hf_config *c)
{
    json_t *s = json_object_get(r->root, "rope_scaling");
    if (!s || json_is_null(s))
        return DT_OK;
    if (!json_is_object(s))
        return dt__error(DT_ERR_PARSE, "%s: \"rope_scaling\" is not an object", r->path);
    json_t *t = json_object_get(s, "rope_type");
    if (!t)
        t = json_object_get(s, "type");
    const char *type = json_is_string(t) ? json_string_value(t) : NULL;
    if (!type)
        return dt__error(DT_ERR_PARSE, "%s: \"rope_scaling.rope_type\" is not a string", r->path);
    if (!strcmp(type, "default"))
        return DT_OK;
    if (strcmp(type, "llama3") != 0)
        return dt__error(DT_ERR_UNSUPPORTED,
                         "%s: \"rope_scaling.rope_type\" \"%s\" is not "
                         "supported (llama3, default)",
                         r->path, type);
    double omax = 0;
    dt_status st;
    if ((st = get_real(r, s, "factor", 1, &c->rope_factor)) != DT_OK ||
        (st = get_real(r, s, "low_freq_factor", 1, &c->rope_low_freq_factor)) != DT_OK ||
        (st = get_real(r, s, "high_freq_factor", 1, &c->rope_high_freq_factor)) != DT_OK ||
        (st = get_real(r, s, "original_max_position_embeddings", 1, &omax)) != DT_OK)
        return st;
    if (c->rope_high_freq_factor <= c->rope_low_freq_factor)
        return dt__error(DT_ERR_PARSE,
                         "%s: \"rope_scaling.high_freq_factor\" must exceed "
                         "\"low_freq_factor\"",
                         r->path);
    c->rope_llama3 = 1;
    c->rope_original_max = (int64_t)omax;
    return DT_OK;
}

static dt_status read_llama(const cfg_reader *r, dt_hf_config *c)
{
    dt_status st;
    int mlp_bias = 0;
    c->norm_eps = 1e-6;
    c->rope_theta = 10000.0;
    c->max_positions = 2048;
    c->head_dim = 0;
    /* Qwen2's attention has q, k, v biases without a key saying so. */
    c->attention_bias = !strcmp(c->model_type, "qwen2");
    if ((st = get_int(r, "vocab_size", 1, &c->vocab)) != DT_OK ||
        (st = get_int(r, "hidden_size", 1, &c->hidden)) != DT_OK ||
        (st = get_int(r, "intermediate_size", 1, &c->intermediate)) != DT_OK ||
        (st = get_int(r, "num_hidden_layers", 1, &c->layers)) != DT_OK ||
        (st = get_int(r, "num_attention_heads", 1, &c->heads)) != DT_OK ||
        (st = get_int(r, "num_key_value_heads", 0, &c->kv_heads)) != DT_OK ||
        (st = get_int(r, "head_dim", 0, &c->head_dim)) != DT_OK ||
        (st = get_int(r, "max_position_embeddings", 0, &c->max_positions)) != DT_OK ||
        (st = get_real(r, r->root, "rms_norm_eps", 0, &c->norm_eps)) != DT_OK ||
        (st = get_real(r, r->root, "rope_theta", 0, &c->rope_theta)) != DT_OK ||
        (st = get_bool(r, "tie_word_embeddings", &c->tie_word_embeddings)) != DT_OK ||
        (st = get_bool(r, "attention_bias", &c->attention_bias)) != DT_OK ||
        (st = get_bool(r, "mlp_bias", &mlp_bias)) != DT_OK ||
        (st = read_rope_scaling(r, c)) != DT_OK)
        return st;
    if (!strcmp(c->model_type, "qwen2"))
        c->attention_bias = 1;
    if (mlp_bias)
        return dt__error(DT_ERR_UNSUPPORTED, "%s: \"mlp_bias\" true is not supported", r->path);
    json_t *act = json_object_get(r->root, "hidden_act");
    if (act && !json_is_null(act) &&
        (!json_is_string(act) || strcmp(json_string_value(act), "silu") != 0))
        return dt__error(DT_ERR_UNSUPPORTED, "%s: \"hidden_act\" %s is not supported (silu)",
                         r->path, json_is_string(act) ? json_string_value(act) : "(not a string)");
    json_t *sw = json_object_get(r->root, "sliding_window");
    json_t *usw = json_object_get(r->root, "use_sliding_window");
    if (json_is_integer(sw) && !json_is_false(usw) && json_integer_value(sw) < c->max_positions &&
        strcmp(c->model_type, "qwen2") != 0)
        return dt__error(DT_ERR_UNSUPPORTED,
                         "%s: \"sliding_window\" %" PRId64 " below "
                         "\"max_position_embeddings\" is not supported",
                         r->path, (int64_t)json_integer_value(sw));
    if (c->kv_heads == 0)
        c->kv_heads = c->heads;
    if (c->heads % c->kv_heads != 0)
        return dt__error(DT_ERR_PARSE,
                         "%s: \"num_key_value_heads\" %" PRId64 " does not "
                         "divide \"num_attention_heads\" %" PRId64,
                         r->path, c->kv_heads, c->heads);
    if (c->head_dim == 0) {
        if (c->hidden % c->heads != 0)
            return dt__error(DT_ERR_PARSE,
                             "%s: \"num_attention_heads\" %" PRId64 " does not "
                             "divide \"hidden_size\" %" PRId64,
                             r->path, c->heads, c->hidden);
        c->head_dim = c->hidden / c->heads;
    }
    if (c->head_dim % 2 != 0)
        return dt__error(DT_ERR_PARSE, "%s: \"head_dim\" %" PRId64 " is odd (rotary pairs)",
                         r->path, c->head_dim);
    return DT_OK;
}

dt_status dt_hf_config_read(const char *path, dt_hf_config *cfg_out)
{
    if (!path || !cfg_out)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "dt_hf_config_read: NULL argument");
    char p[CK_PATH_MAX];
    struct stat sb;
    if (stat(path, &sb) == 0 && S_ISDIR(sb.st_mode)) {
        if (dt__ckpt_join(p, sizeof p, path, "/", "config.json") != DT_OK)
            return dt__error(DT_ERR_INVALID_ARGUMENT, "%s: path too long", path);
    } else if (snprintf(p, sizeof p, "%s", path) >= (int)sizeof p) {
        return dt__error(DT_ERR_INVALID_ARGUMENT, "%s: path too long", path);
    }
    if (stat(p, &sb) != 0)
        return dt__error(DT_ERR_NOT_FOUND,
                         "%s: no such file (an HF model directory holds "
                         "config.json)",
                         p);
    json_error_t jerr;
    json_t *root = json_load_file(p, JSON_REJECT_DUPLICATES, &jerr);
    if (!json_is_object(root)) {
        json_decref(root);
        return root ? dt__error(DT_ERR_PARSE, "%s: not a JSON object", p)
                    : dt__error(DT_ERR_PARSE, "%s:%d:%d: %s", p, jerr.line, jerr.column, jerr.text);
    }
    cfg_reader r = {root, p};
    dt_hf_config c;
    memset(&c, 0, sizeof c);
    dt_status st = DT_OK;
    json_t *mt = json_object_get(root, "model_type");
    if (!mt)
        st = dt__error(DT_ERR_NOT_FOUND, "%s: no \"model_type\"", p);
    else if (!json_is_string(mt) || strlen(json_string_value(mt)) >= sizeof c.model_type)
        st = dt__error(DT_ERR_PARSE, "%s: \"model_type\" is not a short string", p);
    if (st == DT_OK) {
        snprintf(c.model_type, sizeof c.model_type, "%s", json_string_value(mt));
        if (!strcmp(c.model_type, "gpt2")) {
            c.arch = DT_HF_GPT2;
            st = read_gpt2(&r, &c);
        } else if (!strcmp(c.model_type, "llama") || !strcmp(c.model_type, "qwen2") ||
                   !strcmp(c.model_type, "mistral")) {
            c.arch = DT_HF_LLAMA;
            st = read_llama(&r, &c);
        } else {
            st = dt__error(DT_ERR_UNSUPPORTED,
                           "%s: \"model_type\" \"%s\" is not supported "
                           "(gpt2, llama, qwen2, mistral)",
                           p, c.model_type);
        }
    }
    if (st == DT_OK && (st = get_token(&r, "bos_token_id", &c.bos_token_id)) == DT_OK)
        st = get_token(&r, "eos_token_id", &c.eos_token_id);
    json_decref(root);
    if (st == DT_OK)
        *cfg_out = c;
    return st;
}

/* ---- writing config.json -------------------------------------------------------------------- */

static int set_int(json_t *o, const char *key, int64_t v)
{
    return json_object_set_new(o, key, json_integer((json_int_t)v));
}

dt_status dt_hf_config_write(const dt_hf_config *c, const char *path)
{
    if (!c || !path)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "dt_hf_config_write: NULL argument");
    json_t *o = json_object();
    int bad = !o;
    int gpt2 = c->arch == DT_HF_GPT2;
    const char *arch = gpt2                                ? "GPT2LMHeadModel"
                       : !strcmp(c->model_type, "qwen2")   ? "Qwen2ForCausalLM"
                       : !strcmp(c->model_type, "mistral") ? "MistralForCausalLM"
                                                           : "LlamaForCausalLM";
    if (!bad) {
        json_t *a = json_array();
        bad |= json_array_append_new(a, json_string(arch));
        bad |= json_object_set_new(o, "architectures", a);
        bad |= json_object_set_new(o, "model_type",
                                   json_string(c->model_type[0] ? c->model_type
                                               : gpt2           ? "gpt2"
                                                                : "llama"));
        bad |= set_int(o, "vocab_size", c->vocab);
        bad |= json_object_set_new(o, "tie_word_embeddings", json_boolean(c->tie_word_embeddings));
        bad |= json_object_set_new(o, "torch_dtype", json_string("float32"));
    }
    if (!bad && gpt2) {
        bad |= set_int(o, "n_embd", c->hidden);
        bad |= set_int(o, "n_layer", c->layers);
        bad |= set_int(o, "n_head", c->heads);
        bad |= set_int(o, "n_positions", c->max_positions);
        bad |= set_int(o, "n_ctx", c->max_positions);
        bad |= c->intermediate == 4 * c->hidden ? json_object_set_new(o, "n_inner", json_null())
                                                : set_int(o, "n_inner", c->intermediate);
        bad |= json_object_set_new(o, "layer_norm_epsilon", json_real(c->norm_eps));
        bad |= json_object_set_new(o, "activation_function", json_string("gelu_new"));
    } else if (!bad) {
        bad |= set_int(o, "hidden_size", c->hidden);
        bad |= set_int(o, "intermediate_size", c->intermediate);
        bad |= set_int(o, "num_hidden_layers", c->layers);
        bad |= set_int(o, "num_attention_heads", c->heads);
        bad |= set_int(o, "num_key_value_heads", c->kv_heads);
        bad |= set_int(o, "head_dim", c->head_dim);
        bad |= set_int(o, "max_position_embeddings", c->max_positions);
        bad |= json_object_set_new(o, "rms_norm_eps", json_real(c->norm_eps));
        bad |= json_object_set_new(o, "rope_theta", json_real(c->rope_theta));
        bad |= json_object_set_new(o, "hidden_act", json_string("silu"));
        bad |= json_object_set_new(o, "attention_bias", json_boolean(c->attention_bias));
        bad |= json_object_set_new(o, "mlp_bias", json_false());
        if (c->rope_llama3) {
            json_t *s = json_object();
            bad |= json_object_set_new(s, "rope_type", json_string("llama3"));
            bad |= json_object_set_new(s, "factor", json_real(c->rope_factor));
            bad |= json_object_set_new(s, "low_freq_factor", json_real(c->rope_low_freq_factor));
            bad |= json_object_set_new(s, "high_freq_factor", json_real(c->rope_high_freq_factor));
            bad |= set_int(s, "original_max_position_embeddings", c->rope_original_max);
            bad |= json_object_set_new(o, "rope_scaling", s);
        } else {
            bad |= json_object_set_new(o, "rope_scaling", json_null());
        }
    }
    if (!bad && c->bos_token_id >= 0)
        bad |= set_int(o, "bos_token_id", c->bos_token_id);
    if (!bad && c->eos_token_id >= 0)
        bad |= set_int(o, "eos_token_id", c->eos_token_id);
    if (bad) {
        json_decref(o);
        return dt__error(DT_ERR_NO_MEMORY, "dt_hf_config_write: no memory");
    }
    char tmp[CK_PATH_MAX];
    dt_status st = DT_OK;
    if (snprintf(tmp, sizeof tmp, "%s.partial", path) >= (int)sizeof tmp)
        st = dt__error(DT_ERR_INVALID_ARGUMENT, "%s: path too long", path);
    else if (json_dump_file(o, tmp, JSON_INDENT(2) | JSON_SORT_KEYS) != 0)
        st = dt__error(DT_ERR_IO, "%s: cannot write", tmp);
    else if (rename(tmp, path) != 0)
        st = dt__error(DT_ERR_IO, "%s: cannot rename into place", path);
    if (st != DT_OK)
        unlink(tmp);
    json_decref(o);
    return st;
}

/* ---- the Llama family's tensors ------------------------------------------------------------- */

static dt_status add_entry(dt_foreign_map_entry *e, const char *name, const char *source,
                           int transpose, int rank, int64_t s0, int64_t s1)
{
    dt_foreign_view v = DT_FOREIGN_VIEW_INIT;
    v.transpose = transpose;
    e->name = strdup(name);
    v.source = strdup(source);
    e->view = v;
    e->rank = rank;
    e->shape[0] = s0;
    e->shape[1] = s1;
    if (!e->name || !e->view.source)
        return dt__error(DT_ERR_NO_MEMORY, "dt_foreign_llama_map: no memory");
    return DT_OK;
}

dt_status dt_foreign_llama_map(const dt_foreign *src, const dt_hf_config *cfg,
                               dt_foreign_map_entry **map_out, int *count_out)
{
    if (!src || !cfg || !map_out || !count_out || cfg->arch != DT_HF_LLAMA)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "dt_foreign_llama_map: NULL argument or a "
                                                  "config not of the Llama family");
    if (cfg->layers > 100000)
        return dt__error(DT_ERR_SHAPE, "dt_foreign_llama_map: %" PRId64 " layers", cfg->layers);
    int64_t C = cfg->hidden, V = cfg->vocab, F = cfg->intermediate;
    int64_t Q = cfg->heads * cfg->head_dim, KV = cfg->kv_heads * cfg->head_dim;
    int bias = cfg->attention_bias;
    int per = 9 + (bias ? 3 : 0);
    int count = 1 + per * (int)cfg->layers + 1 + (cfg->tie_word_embeddings ? 0 : 1);
    dt_foreign_map_entry *map = calloc((size_t)count, sizeof *map);
    if (!map)
        return dt__error(DT_ERR_NO_MEMORY, "dt_foreign_llama_map: no memory");
    char s[256], n[128];
    int k = 0;
    dt_status st = add_entry(&map[k++], "embed", "model.embed_tokens.weight", 0, 2, V, C);
    for (int64_t l = 0; st == DT_OK && l < cfg->layers; l++) {
        static const struct {
            const char *ours, *hf;
            int kind;    /* 0 norm [C], 1 linear [in, out] from [out, in], 2 bias [out] */
            int in, out; /* 0 C, 1 Q, 2 KV, 3 F */
        } w[12] = {
            {"attn_norm", "input_layernorm.weight", 0, 0, 0},
            {"q.w", "self_attn.q_proj.weight", 1, 0, 1},
            {"q.b", "self_attn.q_proj.bias", 2, 0, 1},
            {"k.w", "self_attn.k_proj.weight", 1, 0, 2},
            {"k.b", "self_attn.k_proj.bias", 2, 0, 2},
            {"v.w", "self_attn.v_proj.weight", 1, 0, 2},
            {"v.b", "self_attn.v_proj.bias", 2, 0, 2},
            {"o.w", "self_attn.o_proj.weight", 1, 1, 0},
            {"mlp_norm", "post_attention_layernorm.weight", 0, 0, 0},
            {"gate.w", "mlp.gate_proj.weight", 1, 0, 3},
            {"up.w", "mlp.up_proj.weight", 1, 0, 3},
            {"down.w", "mlp.down_proj.weight", 1, 3, 0},
        };
        const int64_t dims[4] = {C, Q, KV, F};
        for (int j = 0; st == DT_OK && j < 12; j++) {
            if (w[j].kind == 2 && !bias)
                continue;
            snprintf(s, sizeof s, "model.layers.%" PRId64 ".%s", l, w[j].hf);
            snprintf(n, sizeof n, "layers.%" PRId64 ".%s", l, w[j].ours);
            if (w[j].kind == 1)
                st = add_entry(&map[k++], n, s, 1, 2, dims[w[j].in], dims[w[j].out]);
            else
                st = add_entry(&map[k++], n, s, 0, 1, dims[w[j].kind == 2 ? w[j].out : 0], 0);
        }
    }
    if (st == DT_OK)
        st = add_entry(&map[k++], "norm", "model.norm.weight", 0, 1, C, 0);
    if (st == DT_OK && !cfg->tie_word_embeddings)
        st = add_entry(&map[k++], "head", "lm_head.weight", 0, 2, V, C);
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
            st = dt__error(DT_ERR_SHAPE,
                           "dt_foreign_llama_map: %s: tensor '%s' gives %s for "
                           "'%s', config.json (%s, hidden %" PRId64 ") needs %s",
                           src->shown, map[i].view.source, dt__shape_str(rank, shape, a, sizeof a),
                           map[i].name, cfg->model_type, C,
                           dt__shape_str(map[i].rank, map[i].shape, b, sizeof b));
        }
    }
    if (st != DT_OK) {
        dt_foreign_map_free(map, count);
        return st;
    }
    *map_out = map;
    *count_out = k;
    return DT_OK;
}
