/* dt_ckpt_export_hf_gpt2: our GPT-2 checkpoint as one Hugging Face GPT-2 safetensors file:
 * HF names, q, k and v fused back into c_attn, Conv1D orientation [in, out] (ours), the tied
 * head written once as wte, __metadata__ {"format": "pt"}; and HF's config.json beside it. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ckpt/ckpt_impl.h"
#include "runtime/error.h"
#include "runtime/util.h"

static const char *const FN = "dt_ckpt_export_hf_gpt2";

/* One output tensor: HF name, our tensor(s) (3 fused along the last dim, or one), its shape
 * and dtype, and the rows of wte kept. */
typedef struct hf_out {
    char name[96];
    int nparts;
    int64_t part[3];              /* our tensor indices */
    int rank;
    int64_t shape[2];
    int64_t rows;                 /* rows read from each part (wte: vocab) */
    dt_dtype dtype;
} hf_out;

static const struct {
    const char *hf;
    const char *ours[3];
    int nparts;
} layer_out[12] = {
    {"ln_1.weight", {"ln1.g"}, 1},           {"ln_1.bias", {"ln1.b"}, 1},
    {"attn.c_attn.weight", {"q.w", "k.w", "v.w"}, 3},
    {"attn.c_attn.bias", {"q.b", "k.b", "v.b"}, 3},
    {"attn.c_proj.weight", {"o.w"}, 1},      {"attn.c_proj.bias", {"o.b"}, 1},
    {"ln_2.weight", {"ln2.g"}, 1},           {"ln_2.bias", {"ln2.b"}, 1},
    {"mlp.c_fc.weight", {"fc.w"}, 1},        {"mlp.c_fc.bias", {"fc.b"}, 1},
    {"mlp.c_proj.weight", {"proj.w"}, 1},    {"mlp.c_proj.bias", {"proj.b"}, 1},
};

/* Our tensor `name` with shape [s0] (s1 == 0) or [s0, s1]. */
static dt_status ours(const dt_ckpt *ck, const char *name, int64_t s0, int64_t s1,
                      int64_t *index_out, dt_ckpt_tensor_info *ti)
{
    if (dt_ckpt_find(ck, name, index_out) != DT_OK)
        return dt__error(DT_ERR_NOT_FOUND, "%s: %s: no GPT-2 parameter '%s'", FN,
                         dt_ckpt_path(ck), name);
    dt_status st = dt_ckpt_tensor(ck, *index_out, ti);
    if (st != DT_OK)
        return st;
    int rank = s1 ? 2 : 1;
    int ok = ti->rank == rank && ti->shape[0] == s0 && (!s1 || ti->shape[1] == s1) &&
             (ti->dtype == DT_DTYPE_F32 || ti->dtype == DT_DTYPE_F16 ||
              ti->dtype == DT_DTYPE_BF16);
    if (!ok) {
        char a[160];
        int64_t want[2] = {s0, s1};
        return dt__error(DT_ERR_SHAPE, "%s: %s: parameter '%s' is %s %s, GPT-2 needs a float "
                         "%s", FN, dt_ckpt_path(ck), name, dt_dtype_name(ti->dtype),
                         dt__shape_str(ti->rank, ti->shape, a, sizeof a),
                         s1 ? (snprintf(a, sizeof a, "[%" PRId64 ",%" PRId64 "]", want[0],
                                        want[1]), a)
                            : (snprintf(a, sizeof a, "[%" PRId64 "]", want[0]), a));
    }
    return DT_OK;
}

/* The output list (HF order). */
static dt_status plan(const dt_ckpt *ck, int64_t vocab, hf_out **out, int *count)
{
    int64_t wi;
    dt_ckpt_tensor_info wte;
    if (dt_ckpt_find(ck, "wte", &wi) != DT_OK)
        return dt__error(DT_ERR_NOT_FOUND, "%s: %s: no GPT-2 parameter 'wte'", FN,
                         dt_ckpt_path(ck));
    dt_status st = dt_ckpt_tensor(ck, wi, &wte);
    if (st != DT_OK)
        return st;
    if (wte.rank != 2 || wte.shape[1] <= 0)
        return dt__error(DT_ERR_SHAPE, "%s: %s: 'wte' is not [V, C]", FN, dt_ckpt_path(ck));
    int64_t C = wte.shape[1], V = vocab ? vocab : wte.shape[0], L = 0, T;
    if (V < 0 || V > wte.shape[0])
        return dt__error(DT_ERR_SHAPE, "%s: %s: vocab %" PRId64 " outside wte's %" PRId64
                         " rows", FN, dt_ckpt_path(ck), vocab, wte.shape[0]);
    int64_t idx;
    char name[128];
    for (;; L++) {
        snprintf(name, sizeof name, "h.%" PRId64 ".ln1.g", L);
        if (dt_ckpt_find(ck, name, &idx) != DT_OK || L > 100000)
            break;
    }
    dt_ckpt_tensor_info ti;
    if (dt_ckpt_find(ck, "wpe", &idx) != DT_OK)
        return dt__error(DT_ERR_NOT_FOUND, "%s: %s: no GPT-2 parameter 'wpe'", FN,
                         dt_ckpt_path(ck));
    if ((st = dt_ckpt_tensor(ck, idx, &ti)) != DT_OK)
        return st;
    T = ti.rank == 2 ? ti.shape[0] : -1;
    int n = 2 + 12 * (int)L + 2;
    hf_out *o = calloc((size_t)n, sizeof *o);
    if (!o)
        return dt__error(DT_ERR_NO_MEMORY, "%s: no memory", FN);
    int k = 0;
    o[k] = (hf_out){.name = "wte.weight", .nparts = 1, .rank = 2, .shape = {V, C}, .rows = V};
    st = ours(ck, "wte", wte.shape[0], C, &o[k].part[0], &ti);
    o[k++].dtype = ti.dtype;
    o[k] = (hf_out){.name = "wpe.weight", .nparts = 1, .rank = 2, .shape = {T, C}, .rows = T};
    if (st == DT_OK)
        st = ours(ck, "wpe", T, C, &o[k].part[0], &ti);
    o[k++].dtype = ti.dtype;
    for (int64_t l = 0; st == DT_OK && l < L; l++)
        for (int j = 0; st == DT_OK && j < 12; j++) {
            hf_out *e = &o[k++];
            snprintf(e->name, sizeof e->name, "h.%" PRId64 ".%s", l, layer_out[j].hf);
            e->nparts = layer_out[j].nparts;
            for (int p = 0; st == DT_OK && p < e->nparts; p++) {
                /* Our shapes: [C] vectors, [C, C] / [C, 4C] / [4C, C] weights. */
                const char *s = layer_out[j].ours[p];
                int64_t s0 = C, s1 = 0;
                if (strcmp(s, "fc.b") == 0)
                    s0 = 4 * C;
                else if (strcmp(s, "fc.w") == 0)
                    s1 = 4 * C;
                else if (strcmp(s, "proj.w") == 0)
                    s0 = 4 * C, s1 = C;
                else if (strstr(s, ".w"))
                    s1 = C;
                snprintf(name, sizeof name, "h.%" PRId64 ".%s", l, s);
                st = ours(ck, name, s0, s1, &e->part[p], &ti);
                if (st == DT_OK && p > 0 && ti.dtype != e->dtype)
                    st = dt__error(DT_ERR_SHAPE, "%s: %s: '%s' is %s, its q is %s: c_attn "
                                   "fuses one dtype", FN, dt_ckpt_path(ck), name,
                                   dt_dtype_name(ti.dtype), dt_dtype_name(e->dtype));
                e->dtype = ti.dtype;
                e->rank = s1 ? 2 : 1;
                e->shape[0] = s1 ? s0 : s0 * e->nparts;
                e->shape[1] = s1 * e->nparts;
                e->rows = s0;
            }
        }
    const char *lnf[2] = {"lnf.g", "lnf.b"}, *hf[2] = {"ln_f.weight", "ln_f.bias"};
    for (int j = 0; st == DT_OK && j < 2; j++) {
        o[k] = (hf_out){.nparts = 1, .rank = 1, .shape = {C, 0}, .rows = C};
        snprintf(o[k].name, sizeof o[k].name, "%s", hf[j]);
        st = ours(ck, lnf[j], C, 0, &o[k].part[0], &ti);
        o[k++].dtype = ti.dtype;
    }
    if (st != DT_OK) {
        free(o);
        return st;
    }
    *out = o;
    *count = n;
    return DT_OK;
}

static uint64_t out_bytes(const hf_out *e)
{
    return (uint64_t)dt__numel(e->rank, e->shape) * dt_dtype_size(e->dtype);
}

/* The header: 8-byte length, then JSON padded with spaces to a multiple of 8. */
static dt_status header(const hf_out *o, int n, char **hdr_out, size_t *len_out)
{
    json_t *root = json_object(), *meta = json_object();
    int bad = !root || !meta;
    bad |= json_object_set_new(meta, "format", json_string("pt"));
    bad |= json_object_set_new(root, "__metadata__", meta);
    uint64_t at = 0;
    for (int i = 0; !bad && i < n; i++) {
        json_t *e = json_object(), *sh = json_array(), *of = json_array();
        bad |= !e || !sh || !of;
        for (int d = 0; !bad && d < o[i].rank; d++)
            bad |= json_array_append_new(sh, json_integer((json_int_t)o[i].shape[d]));
        bad |= json_array_append_new(of, json_integer((json_int_t)at));
        at += out_bytes(&o[i]);
        bad |= json_array_append_new(of, json_integer((json_int_t)at));
        bad |= json_object_set_new(e, "dtype", json_string(dt__ckpt_dtype_str(o[i].dtype)));
        bad |= json_object_set_new(e, "shape", sh);
        bad |= json_object_set_new(e, "data_offsets", of);
        bad |= json_object_set_new(root, o[i].name, e);
    }
    char *text = bad ? NULL : json_dumps(root, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(root);
    size_t jl = text ? strlen(text) : 0, hl = (jl + 7) & ~(size_t)7;
    char *hdr = text ? malloc(8 + hl) : NULL;
    if (!hdr) {
        free(text);
        return dt__error(DT_ERR_NO_MEMORY, "%s: no memory for the header", FN);
    }
    for (int b = 0; b < 8; b++)
        hdr[b] = (char)((uint64_t)hl >> (8 * b));
    memcpy(hdr + 8, text, jl);
    memset(hdr + 8 + jl, ' ', hl - jl);
    free(text);
    *hdr_out = hdr;
    *len_out = 8 + hl;
    return DT_OK;
}

/* Output tensor e into buf: one part read as is (wte: its first rows), or three fused. */
static dt_status gather(const dt_ckpt *ck, const hf_out *e, unsigned char *buf)
{
    size_t es = dt_dtype_size(e->dtype);
    int64_t off[2] = {0, 0};
    if (e->nparts == 1) {
        int64_t sz[2] = {e->rows, e->rank == 2 ? e->shape[1] : 0};
        return dt_ckpt_read_box(ck, e->part[0], off, sz, buf, (size_t)out_bytes(e));
    }
    int64_t rows = e->rank == 2 ? e->shape[0] : 1;
    int64_t w = e->rank == 2 ? e->shape[1] / 3 : e->shape[0] / 3;
    size_t pb = (size_t)(rows * w) * es;
    unsigned char *part = malloc(pb ? pb : 1);
    if (!part)
        return dt__error(DT_ERR_NO_MEMORY, "%s: no memory", FN);
    dt_status st = DT_OK;
    for (int p = 0; st == DT_OK && p < 3; p++) {
        int64_t sz[2] = {e->rank == 2 ? rows : w, w};
        if ((st = dt_ckpt_read_box(ck, e->part[p], off, sz, part, pb)) != DT_OK)
            break;
        for (int64_t r = 0; r < rows; r++)
            memcpy(buf + (size_t)(r * 3 * w + p * w) * es, part + (size_t)(r * w) * es,
                   (size_t)w * es);
    }
    free(part);
    return st;
}

/* The model's heads: opts' (checked against the checkpoint's record when both are there),
 * else the "heads=H" of the checkpoint's "train/config" value; it must divide C. */
static dt_status heads_of(const dt_ckpt *ck, int64_t asked, int64_t C, int64_t *heads_out)
{
    const void *cd = NULL;
    size_t cn = 0;
    int64_t saved = 0;
    if (dt_ckpt_value_bytes(ck, "train/config", &cd, &cn) == DT_OK) {
        char text[512];
        size_t n = cn < sizeof text - 1 ? cn : sizeof text - 1;
        memcpy(text, cd, n);
        text[n] = '\0';
        for (const char *p = strstr(text, "heads="); p; p = strstr(p + 1, "heads="))
            if (p == text || p[-1] == ' ')
                saved = strtoll(p + 6, NULL, 10);
    }
    if (asked > 0 && saved > 0 && asked != saved)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "%s: %s: %" PRId64 " heads asked, but the "
                         "checkpoint was trained with %" PRId64 " (its train/config value)",
                         FN, dt_ckpt_path(ck), asked, saved);
    int64_t h = asked > 0 ? asked : saved;
    if (h <= 0)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "%s: %s does not record its number of "
                         "attention heads (no train/config value with heads=H): give it "
                         "(opts.heads; `dtensor ckpt export --format hf-gpt2 ... --heads H`)",
                         FN, dt_ckpt_path(ck));
    if (C % h != 0)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "%s: %s: %" PRId64 " heads do not divide the "
                         "width %" PRId64, FN, dt_ckpt_path(ck), h, C);
    *heads_out = h;
    return DT_OK;
}

/* Hugging Face's GPT-2 config.json of the planned output (o[0] wte [V, C], o[1] wpe [T, C],
 * 12 entries per layer) into an owned string. */
static dt_status config_text(const hf_out *o, int n, int64_t heads, char **text_out)
{
    static const char *const torch_dtype[] = {[DT_DTYPE_F32] = "float32",
                                              [DT_DTYPE_F16] = "float16",
                                              [DT_DTYPE_BF16] = "bfloat16"};
    json_t *c = json_object(), *arch = json_array();
    int bad = !c || !arch || json_array_append_new(arch, json_string("GPT2LMHeadModel"));
    bad |= json_object_set_new(c, "model_type", json_string("gpt2"));
    bad |= json_object_set_new(c, "architectures", arch);
    bad |= json_object_set_new(c, "vocab_size", json_integer((json_int_t)o[0].shape[0]));
    bad |= json_object_set_new(c, "n_positions", json_integer((json_int_t)o[1].shape[0]));
    bad |= json_object_set_new(c, "n_ctx", json_integer((json_int_t)o[1].shape[0]));
    bad |= json_object_set_new(c, "n_embd", json_integer((json_int_t)o[0].shape[1]));
    bad |= json_object_set_new(c, "n_layer", json_integer((json_int_t)((n - 4) / 12)));
    bad |= json_object_set_new(c, "n_head", json_integer((json_int_t)heads));
    bad |= json_object_set_new(c, "n_inner", json_null());
    bad |= json_object_set_new(c, "activation_function", json_string("gelu_new"));
    bad |= json_object_set_new(c, "layer_norm_epsilon", json_real(1e-5));
    bad |= json_object_set_new(c, "tie_word_embeddings", json_true());
    bad |= json_object_set_new(c, "torch_dtype", json_string(torch_dtype[o[0].dtype]));
    char *text = bad ? NULL : json_dumps(c, JSON_INDENT(2) | JSON_PRESERVE_ORDER |
                                                JSON_REAL_PRECISION(6));
    json_decref(c);
    if (!text)
        return dt__error(DT_ERR_NO_MEMORY, "%s: no memory for config.json", FN);
    *text_out = text;
    return DT_OK;
}

/* "<directory of out_path>/config.json" and its partial name. */
static dt_status config_paths(const char *out_path, char *path, char *partial, size_t len)
{
    const char *slash = strrchr(out_path, '/');
    int dl = slash ? (int)(slash - out_path) : 0;
    if ((size_t)snprintf(path, len, "%.*s%sconfig.json", dl, out_path,
                         slash ? "/" : "") >= len)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "%s: %s: path too long", FN, out_path);
    return dt__ckpt_join(partial, len, path, "", ".partial");
}

dt_status dt_ckpt_export_hf_gpt2(const dt_ckpt *ck, const char *out_path, int64_t vocab,
                                 const dt_ckpt_export_opts *opts)
{
    if (!ck || !out_path || !out_path[0] || vocab < 0)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "%s: NULL checkpoint or path, or vocab < 0",
                         FN);
    int do_fsync = opts ? opts->fsync : 1;
    hf_out *o = NULL;
    int n = 0;
    dt_status st = dt__ckpt_export_target(FN, out_path, 1);
    if (st == DT_OK)
        st = plan(ck, vocab, &o, &n);
    if (st != DT_OK)
        return st;
    int64_t heads = 0;
    char *hdr = NULL, *config = NULL;
    size_t hl = 0;
    char tmp[CK_PATH_MAX], cpath[CK_PATH_MAX], ctmp[CK_PATH_MAX];
    if ((st = heads_of(ck, opts ? opts->heads : 0, o[0].shape[1], &heads)) == DT_OK &&
        (st = config_text(o, n, heads, &config)) == DT_OK &&
        (st = config_paths(out_path, cpath, ctmp, sizeof cpath)) == DT_OK &&
        (st = header(o, n, &hdr, &hl)) == DT_OK)
        st = dt__ckpt_join(tmp, sizeof tmp, out_path, "", ".partial");
    int fd = -1;
    unsigned char *buf = NULL;
    if (st == DT_OK && ((fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644)) < 0 ||
                        dt__ckpt_pwrite(fd, hdr, hl, 0) != 0))
        st = dt__error(DT_ERR_IO, "%s: %s: %s", FN, tmp, strerror(errno));
    uint64_t pos = hl;
    for (int i = 0; st == DT_OK && i < n; i++) {
        uint64_t b = out_bytes(&o[i]);
        if (b == 0)
            continue;
        if (!(buf = malloc((size_t)b))) {
            st = dt__error(DT_ERR_NO_MEMORY, "%s: no memory for '%s'", FN, o[i].name);
            break;
        }
        if ((st = gather(ck, &o[i], buf)) == DT_OK && dt__ckpt_pwrite(fd, buf, (size_t)b, pos))
            st = dt__error(DT_ERR_IO, "%s: %s: %s", FN, tmp, strerror(errno));
        pos += b;
        free(buf);
        buf = NULL;
    }
    if (st == DT_OK && do_fsync && fsync(fd) != 0)
        st = dt__error(DT_ERR_IO, "%s: %s: %s", FN, tmp, strerror(errno));
    if (fd >= 0 && close(fd) != 0 && st == DT_OK)
        st = dt__error(DT_ERR_IO, "%s: %s: %s", FN, tmp, strerror(errno));
    /* config.json as the weights: under a partial name, renamed once both are complete. */
    int cfd = -1;
    if (st == DT_OK &&
        ((cfd = open(ctmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644)) < 0 ||
         dt__ckpt_pwrite(cfd, config, strlen(config), 0) != 0 ||
         dt__ckpt_pwrite(cfd, "\n", 1, strlen(config)) != 0 ||
         (do_fsync && fsync(cfd) != 0)))
        st = dt__error(DT_ERR_IO, "%s: %s: %s", FN, ctmp, strerror(errno));
    if (cfd >= 0 && close(cfd) != 0 && st == DT_OK)
        st = dt__error(DT_ERR_IO, "%s: %s: %s", FN, ctmp, strerror(errno));
    if (st == DT_OK && rename(tmp, out_path) != 0)
        st = dt__error(DT_ERR_IO, "%s: %s: %s", FN, out_path, strerror(errno));
    if (st == DT_OK && rename(ctmp, cpath) != 0)
        st = dt__error(DT_ERR_IO, "%s: %s: %s", FN, cpath, strerror(errno));
    if (st != DT_OK && fd >= 0)
        unlink(tmp);
    if (st != DT_OK && cfd >= 0)
        unlink(ctmp);
    free(config);
    free(hdr);
    free(o);
    return st;
}
