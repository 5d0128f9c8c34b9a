/* dt_ckpt_export_hf: a checkpoint of our HF-family parameters (dt_foreign_llama_map's or
 * dt_foreign_gpt2_map's names) written back as a Hugging Face model directory: config.json,
 * safetensors with HF names (nn.Linear weights [out, in]), sharded with
 * model.safetensors.index.json above a size, and the tokenizer files copied. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt/ckpt_impl.h"
#include "runtime/error.h"
#include "runtime/util.h"

static const char *const FN = "dt_ckpt_export_hf";

typedef struct out_tensor {
    char hf[128];
    int64_t index; /* ours in the checkpoint */
    int transpose;
    int rank;
    int64_t shape[2]; /* HF's */
    dt_dtype dtype;
    int file;
} out_tensor;

static uint64_t bytes_of(const out_tensor *t)
{
    return (uint64_t)dt__numel(t->rank, t->shape) * dt_dtype_size(t->dtype);
}

/* The Llama family's output list from the checkpoint, HF order. */
static dt_status plan_llama(const dt_ckpt *ck, const dt_hf_config *c, out_tensor **out, int *n)
{
    int per = 12, count = 2 + per * (int)c->layers + 1;
    out_tensor *o = calloc((size_t)count, sizeof *o);
    if (!o)
        return dt__error(DT_ERR_NO_MEMORY, "%s: no memory", FN);
    static const struct {
        const char *ours, *hf;
        int t;
    } w[12] = {
        {"attn_norm", "input_layernorm.weight", 0},
        {"q.w", "self_attn.q_proj.weight", 1},
        {"q.b", "self_attn.q_proj.bias", 0},
        {"k.w", "self_attn.k_proj.weight", 1},
        {"k.b", "self_attn.k_proj.bias", 0},
        {"v.w", "self_attn.v_proj.weight", 1},
        {"v.b", "self_attn.v_proj.bias", 0},
        {"o.w", "self_attn.o_proj.weight", 1},
        {"mlp_norm", "post_attention_layernorm.weight", 0},
        {"gate.w", "mlp.gate_proj.weight", 1},
        {"up.w", "mlp.up_proj.weight", 1},
        {"down.w", "mlp.down_proj.weight", 1},
    };
    int k = 0;
    dt_status st = DT_OK;
    char ours[128];
    for (int64_t l = -1; st == DT_OK && l <= c->layers; l++) {
        int nj = l < 0 || l == c->layers ? 1 : per;
        for (int j = 0; st == DT_OK && j < nj; j++) {
            out_tensor *e = &o[k];
            int t = 0;
            if (l < 0) {
                snprintf(ours, sizeof ours, "embed");
                snprintf(e->hf, sizeof e->hf, "model.embed_tokens.weight");
            } else if (l == c->layers) {
                snprintf(ours, sizeof ours, "norm");
                snprintf(e->hf, sizeof e->hf, "model.norm.weight");
            } else {
                if (!c->attention_bias && strstr(w[j].ours, ".b"))
                    continue;
                snprintf(ours, sizeof ours, "layers.%" PRId64 ".%s", l, w[j].ours);
                snprintf(e->hf, sizeof e->hf, "model.layers.%" PRId64 ".%s", l, w[j].hf);
                t = w[j].t;
            }
            dt_ckpt_tensor_info ti;
            if (dt_ckpt_find(ck, ours, &e->index) != DT_OK) {
                st = dt__error(DT_ERR_NOT_FOUND, "%s: %s: no parameter '%s' (%s)", FN,
                               dt_ckpt_path(ck), ours, c->model_type);
                break;
            }
            if ((st = dt_ckpt_tensor(ck, e->index, &ti)) != DT_OK)
                break;
            int rank = l < 0 || t ? 2 : 1;
            if (ti.rank != rank || (ti.dtype != DT_DTYPE_F32 && ti.dtype != DT_DTYPE_F16 &&
                                    ti.dtype != DT_DTYPE_BF16)) {
                st = dt__error(DT_ERR_SHAPE, "%s: %s: '%s' is not a float tensor of rank %d", FN,
                               dt_ckpt_path(ck), ours, rank);
                break;
            }
            e->transpose = t;
            e->rank = ti.rank;
            e->dtype = ti.dtype;
            e->shape[0] = t ? ti.shape[1] : ti.shape[0];
            e->shape[1] = t ? ti.shape[0] : (ti.rank == 2 ? ti.shape[1] : 0);
            k++;
        }
    }
    if (st == DT_OK && !c->tie_word_embeddings) {
        out_tensor *e = &o[k];
        dt_ckpt_tensor_info ti;
        snprintf(e->hf, sizeof e->hf, "lm_head.weight");
        if (dt_ckpt_find(ck, "head", &e->index) != DT_OK)
            st = dt__error(DT_ERR_NOT_FOUND, "%s: %s: no parameter 'head' (the untied head)", FN,
                           dt_ckpt_path(ck));
        else if ((st = dt_ckpt_tensor(ck, e->index, &ti)) == DT_OK) {
            e->rank = 2;
            e->dtype = ti.dtype;
            e->shape[0] = ti.shape[0];
            e->shape[1] = ti.shape[1];
            k++;
        }
    }
    if (st != DT_OK) {
        free(o);
        return st;
    }
    *out = o;
    *n = k;
    return DT_OK;
}

static dt_status read_one(const dt_ckpt *ck, const out_tensor *e, unsigned char *buf)
{
    int64_t off[2] = {0, 0}, sz[2];
    size_t es = dt_dtype_size(e->dtype), b = (size_t)bytes_of(e);
    if (!e->transpose) {
        sz[0] = e->shape[0];
        sz[1] = e->shape[1];
        return dt_ckpt_read_box(ck, e->index, off, sz, buf, b);
    }
    sz[0] = e->shape[1]; /* ours [in, out] */
    sz[1] = e->shape[0];
    unsigned char *t = malloc(b ? b : 1);
    if (!t)
        return dt__error(DT_ERR_NO_MEMORY, "%s: no memory for '%s'", FN, e->hf);
    dt_status st = dt_ckpt_read_box(ck, e->index, off, sz, t, b);
    for (int64_t i = 0; st == DT_OK && i < sz[0]; i++)
        for (int64_t j = 0; j < sz[1]; j++)
            memcpy(buf + (size_t)(j * sz[0] + i) * es, t + (size_t)(i * sz[1] + j) * es, es);
    free(t);
    return st;
}

/* Writes the tensors of file f as one safetensors file at path. */
static dt_status write_file(const dt_ckpt *ck, const out_tensor *o, int n, int f, const char *path,
                            int do_fsync)
{
    json_t *root = json_object(), *meta = json_object();
    int bad = !root || !meta;
    bad |= json_object_set_new(meta, "format", json_string("pt"));
    bad |= json_object_set_new(root, "__metadata__", meta);
    uint64_t at = 0;
    for (int i = 0; !bad && i < n; i++) {
        if (o[i].file != f)
            continue;
        json_t *e = json_object(), *sh = json_array(), *of = json_array();
        bad |= !e || !sh || !of;
        for (int d = 0; !bad && d < o[i].rank; d++)
            bad |= json_array_append_new(sh, json_integer((json_int_t)o[i].shape[d]));
        bad |= json_array_append_new(of, json_integer((json_int_t)at));
        at += bytes_of(&o[i]);
        bad |= json_array_append_new(of, json_integer((json_int_t)at));
        bad |= json_object_set_new(e, "dtype", json_string(dt__ckpt_dtype_str(o[i].dtype)));
        bad |= json_object_set_new(e, "shape", sh);
        bad |= json_object_set_new(e, "data_offsets", of);
        bad |= json_object_set_new(root, o[i].hf, e);
    }
    char *text = bad ? NULL : json_dumps(root, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(root);
    if (!text)
        return dt__error(DT_ERR_NO_MEMORY, "%s: no memory for a header", FN);
    size_t jl = strlen(text), hl = (jl + 7) & ~(size_t)7;
    char tmp[CK_PATH_MAX];
    dt_status st = dt__ckpt_join(tmp, sizeof tmp, path, "", ".partial");
    int fd = st == DT_OK ? open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644) : -1;
    unsigned char len8[8];
    for (int b = 0; b < 8; b++)
        len8[b] = (unsigned char)((uint64_t)hl >> (8 * b));
    char *pad = malloc(hl);
    if (pad) {
        memcpy(pad, text, jl);
        memset(pad + jl, ' ', hl - jl);
    }
    if (st == DT_OK && (fd < 0 || !pad || dt__ckpt_pwrite(fd, len8, 8, 0) != 0 ||
                        dt__ckpt_pwrite(fd, pad, hl, 8) != 0))
        st = dt__error(DT_ERR_IO, "%s: %s: %s", FN, tmp, strerror(errno));
    free(pad);
    free(text);
    uint64_t pos = 8 + hl;
    for (int i = 0; st == DT_OK && i < n; i++) {
        if (o[i].file != f)
            continue;
        uint64_t b = bytes_of(&o[i]);
        unsigned char *buf = malloc(b ? (size_t)b : 1);
        if (!buf)
            st = dt__error(DT_ERR_NO_MEMORY, "%s: no memory for '%s'", FN, o[i].hf);
        else if ((st = read_one(ck, &o[i], buf)) == DT_OK &&
                 dt__ckpt_pwrite(fd, buf, (size_t)b, pos) != 0)
            st = dt__error(DT_ERR_IO, "%s: %s: %s", FN, tmp, strerror(errno));
        pos += b;
        free(buf);
    }
    if (st == DT_OK && do_fsync && fsync(fd) != 0)
        st = dt__error(DT_ERR_IO, "%s: %s: %s", FN, tmp, strerror(errno));
    if (fd >= 0 && close(fd) != 0 && st == DT_OK)
        st = dt__error(DT_ERR_IO, "%s: %s: %s", FN, tmp, strerror(errno));
    if (st == DT_OK && rename(tmp, path) != 0)
        st = dt__error(DT_ERR_IO, "%s: %s: %s", FN, path, strerror(errno));
    if (st != DT_OK && fd >= 0)
        unlink(tmp);
    return st;
}

static dt_status write_index(const out_tensor *o, int n, int nfiles, const char *dir)
{
    json_t *root = json_object(), *meta = json_object(), *map = json_object();
    int bad = !root || !meta || !map;
    uint64_t total = 0;
    char fn[64], path[CK_PATH_MAX];
    for (int i = 0; !bad && i < n; i++) {
        total += bytes_of(&o[i]);
        snprintf(fn, sizeof fn, "model-%05d-of-%05d.safetensors", o[i].file + 1, nfiles);
        bad |= json_object_set_new(map, o[i].hf, json_string(fn));
    }
    bad |= json_object_set_new(meta, "total_size", json_integer((json_int_t)total));
    bad |= json_object_set_new(root, "metadata", meta);
    bad |= json_object_set_new(root, "weight_map", map);
    dt_status st = bad ? dt__error(DT_ERR_NO_MEMORY, "%s: no memory", FN) : DT_OK;
    if (st == DT_OK)
        st = dt__ckpt_join(path, sizeof path, dir, "/", "model.safetensors.index.json");
    if (st == DT_OK && json_dump_file(root, path, JSON_INDENT(2) | JSON_PRESERVE_ORDER) != 0)
        st = dt__error(DT_ERR_IO, "%s: %s: cannot write", FN, path);
    json_decref(root);
    return st;
}

/* Copies the tokenizer files of `from` (those present) into dir. */
static dt_status copy_tokenizer(const char *from, const char *dir)
{
    static const char *const files[] = {
        "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json",
        "merges.txt",     "generation_config.json"};
    dt_status st = DT_OK;
    for (size_t i = 0; st == DT_OK && i < sizeof files / sizeof files[0]; i++) {
        char a[CK_PATH_MAX], b[CK_PATH_MAX];
        if (dt__ckpt_join(a, sizeof a, from, "/", files[i]) != DT_OK ||
            dt__ckpt_join(b, sizeof b, dir, "/", files[i]) != DT_OK)
            return dt__error(DT_ERR_INVALID_ARGUMENT, "%s: path too long", FN);
        FILE *in = fopen(a, "rb");
        if (!in)
            continue;
        FILE *out = fopen(b, "wb");
        char buf[65536];
        size_t got;
        while (out && (got = fread(buf, 1, sizeof buf, in)) > 0)
            if (fwrite(buf, 1, got, out) != got)
                break;
        if (!out || ferror(in) || fclose(out) != 0)
            st = dt__error(DT_ERR_IO, "%s: cannot copy %s to %s", FN, a, b);
        fclose(in);
    }
    return st;
}

dt_status dt_ckpt_export_hf(const dt_ckpt *ck, const char *out_dir, const dt_hf_config *cfg,
                            const char *tokenizer_from, const dt_ckpt_export_opts *opts)
{
    if (!ck || !out_dir || !out_dir[0] || !cfg)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "%s: NULL checkpoint, directory or config", FN);
    dt_status st = dt__ckpt_export_target(FN, out_dir, 0);
    if (st != DT_OK)
        return st;
    if (mkdir(out_dir, 0755) != 0 && errno != EEXIST)
        return dt__error(DT_ERR_IO, "%s: %s: %s", FN, out_dir, strerror(errno));
    char path[CK_PATH_MAX];
    dt_ckpt_export_opts eo = DT_CKPT_EXPORT_OPTS_INIT;
    if (opts)
        eo = *opts;
    if (cfg->arch == DT_HF_GPT2) {
        eo.heads = cfg->heads;
        st = dt__ckpt_join(path, sizeof path, out_dir, "/", "model.safetensors");
        if (st == DT_OK)
            st = dt_ckpt_export_hf_gpt2(ck, path, cfg->vocab, &eo);
    } else {
        out_tensor *o = NULL;
        int n = 0, nfiles = 1;
        st = plan_llama(ck, cfg, &o, &n);
        /* Files in order, a new one when the next tensor would pass the size. */
        uint64_t in_file = 0;
        for (int i = 0; st == DT_OK && i < n; i++) {
            uint64_t b = bytes_of(&o[i]);
            if (eo.max_file_bytes && in_file > 0 && in_file + b > eo.max_file_bytes) {
                nfiles++;
                in_file = 0;
            }
            o[i].file = nfiles - 1;
            in_file += b;
        }
        for (int f = 0; st == DT_OK && f < nfiles; f++) {
            char fn[64];
            if (nfiles == 1)
                snprintf(fn, sizeof fn, "model.safetensors");
            else
                snprintf(fn, sizeof fn, "model-%05d-of-%05d.safetensors", f + 1, nfiles);
            st = dt__ckpt_join(path, sizeof path, out_dir, "/", fn);
            if (st == DT_OK)
                st = write_file(ck, o, n, f, path, eo.fsync);
        }
        if (st == DT_OK && nfiles > 1)
            st = write_index(o, n, nfiles, out_dir);
        free(o);
    }
    if (st == DT_OK)
        st = dt__ckpt_join(path, sizeof path, out_dir, "/", "config.json");
    if (st == DT_OK)
        st = dt_hf_config_write(cfg, path);
    if (st == DT_OK && tokenizer_from)
        st = copy_tokenizer(tokenizer_from, out_dir);
    return st;
}
