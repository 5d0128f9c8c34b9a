/* moe/hf: export of train_moe's parameters as a Mixtral-named HF directory, and import. */
#include "hf.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <sys/stat.h>

static int is_expert(const char *name)
{
    const char *d = strchr(name, '.');
    return d && (!strcmp(d, ".w1") || !strcmp(d, ".w2") || !strcmp(d, ".w3"));
}

int moe_hf_name(const char *name, int64_t e, char *buf, size_t len, int *transpose_out)
{
    *transpose_out = 0;
    if (!strcmp(name, "wte"))
        return snprintf(buf, len, "model.embed_tokens.weight") > 0 ? 0 : -1;
    if (!strcmp(name, "wpe")) /* learned positions: not Mixtral's (rotary) */
        return snprintf(buf, len, "model.embed_positions.weight") > 0 ? 0 : -1;
    if (!strcmp(name, "norm"))
        return snprintf(buf, len, "model.norm.weight") > 0 ? 0 : -1;
    if (!strcmp(name, "head")) {
        *transpose_out = 1;
        return snprintf(buf, len, "lm_head.weight") > 0 ? 0 : -1;
    }
    long long l;
    char what[16];
    if (sscanf(name, "l%lld.%15s", &l, what) != 2)
        return -1;
    const char *attn[4][2] = {
        {"wq", "q_proj"}, {"wk", "k_proj"}, {"wv", "v_proj"}, {"wo", "o_proj"}};
    for (int i = 0; i < 4; i++)
        if (!strcmp(what, attn[i][0])) {
            *transpose_out = 1;
            return snprintf(buf, len, "model.layers.%lld.self_attn.%s.weight", l, attn[i][1]) > 0
                       ? 0
                       : -1;
        }
    if (!strcmp(what, "attn_norm"))
        return snprintf(buf, len, "model.layers.%lld.input_layernorm.weight", l) > 0 ? 0 : -1;
    if (!strcmp(what, "mlp_norm"))
        return snprintf(buf, len, "model.layers.%lld.post_attention_layernorm.weight", l) > 0 ? 0
                                                                                              : -1;
    *transpose_out = 1;
    if (!strcmp(what, "gate"))
        return snprintf(buf, len, "model.layers.%lld.block_sparse_moe.gate.weight", l) > 0 ? 0 : -1;
    if (!strcmp(what, "w1") || !strcmp(what, "w2") || !strcmp(what, "w3"))
        return snprintf(buf, len, "model.layers.%lld.block_sparse_moe.experts.%lld.%s.weight", l,
                        (long long)e, what) > 0
                   ? 0
                   : -1;
    return -1;
}

/* One stored tensor of the file being written. */
typedef struct entry {
    char name[128];
    int64_t rows, cols; /* cols 0: 1-D */
    float *data;
} entry;

static dt_status write_config(const char *dir, const moe_hf_shape *s)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/config.json", dir);
    FILE *f = fopen(path, "w");
    if (!f)
        return DT_ERR_IO;
    fprintf(f,
            "{\n  \"architectures\": [\"MixtralForCausalLM\"],\n  \"model_type\": \"mixtral\",\n"
            "  \"vocab_size\": %lld,\n  \"hidden_size\": %lld,\n  \"intermediate_size\": %lld,\n"
            "  \"num_hidden_layers\": %lld,\n  \"num_attention_heads\": %lld,\n"
            "  \"num_key_value_heads\": %lld,\n  \"num_local_experts\": %lld,\n"
            "  \"num_experts_per_tok\": %lld,\n  \"max_position_embeddings\": %lld,\n"
            "  \"rms_norm_eps\": 1e-05,\n  \"hidden_act\": \"silu\",\n"
            "  \"tie_word_embeddings\": false,\n  \"torch_dtype\": \"float32\",\n"
            "  \"position_embedding_type\": \"learned\"\n}\n",
            (long long)s->vocab, (long long)s->width, (long long)s->hidden, (long long)s->layers,
            (long long)s->heads, (long long)s->heads, (long long)s->experts, (long long)s->topk,
            (long long)s->context);
    return fclose(f) == 0 ? DT_OK : DT_ERR_IO;
}

/* safetensors: 8-byte little-endian header length, the JSON header, the data. */
static dt_status write_safetensors(const char *dir, const entry *es, int n)
{
    size_t cap = 256 + (size_t)n * 256, hl = 0;
    char *h = malloc(cap);
    if (!h)
        return DT_ERR_NO_MEMORY;
    uint64_t off = 0;
    hl += (size_t)snprintf(h + hl, cap - hl, "{");
    for (int i = 0; i < n; i++) {
        uint64_t bytes = (uint64_t)(es[i].rows * (es[i].cols ? es[i].cols : 1)) * 4;
        if (es[i].cols)
            hl += (size_t)snprintf(h + hl, cap - hl,
                                   "%s\"%s\":{\"dtype\":\"F32\",\"shape\":[%lld,%lld],"
                                   "\"data_offsets\":[%llu,%llu]}",
                                   i ? "," : "", es[i].name, (long long)es[i].rows,
                                   (long long)es[i].cols, (unsigned long long)off,
                                   (unsigned long long)(off + bytes));
        else
            hl += (size_t)snprintf(h + hl, cap - hl,
                                   "%s\"%s\":{\"dtype\":\"F32\",\"shape\":[%lld],"
                                   "\"data_offsets\":[%llu,%llu]}",
                                   i ? "," : "", es[i].name, (long long)es[i].rows,
                                   (unsigned long long)off, (unsigned long long)(off + bytes));
        off += bytes;
    }
    hl += (size_t)snprintf(h + hl, cap - hl, "}");
    while (hl % 8) /* the data 8-byte aligned, as the safetensors writer pads */
        h[hl++] = ' ';
    char path[1024];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    FILE *f = fopen(path, "wb");
    dt_status st = f ? DT_OK : DT_ERR_IO;
    unsigned char len8[8];
    for (int b = 0; b < 8; b++)
        len8[b] = (unsigned char)((uint64_t)hl >> (8 * b));
    if (st == DT_OK && (fwrite(len8, 1, 8, f) != 8 || fwrite(h, 1, hl, f) != hl))
        st = DT_ERR_IO;
    for (int i = 0; i < n && st == DT_OK; i++) {
        size_t cnt = (size_t)(es[i].rows * (es[i].cols ? es[i].cols : 1));
        if (fwrite(es[i].data, 4, cnt, f) != cnt)
            st = DT_ERR_IO;
    }
    if (f && fclose(f) != 0)
        st = DT_ERR_IO;
    free(h);
    return st;
}

dt_status moe_hf_export(const char *dir, const moe_hf_shape *shape, int n, const char *const *names,
                        dt_tensor *const *params, const float *bias)
{
    int root = dt_client_id() == 0, cnt = 0;
    entry *es =
        calloc((size_t)(n * (shape->experts > 0 ? shape->experts : 1) + shape->layers), sizeof *es);
    dt_status st = es ? DT_OK : DT_ERR_NO_MEMORY;
    for (int i = 0; i < n && st == DT_OK; i++) {
        const dt_tensor *t = params[i];
        int rank = dt_tensor_rank(t);
        const int64_t *sh = dt_tensor_shape(t);
        int64_t numel = dt_tensor_numel(t);
        float *h = malloc((size_t)numel * sizeof *h);
        st = h ? dt_tensor_to_host(t, -1, h, (size_t)numel * 4) : DT_ERR_NO_MEMORY;
        int64_t parts = is_expert(names[i]) ? sh[0] : 1;
        int64_t r = rank == 1 ? sh[0] : sh[rank - 2], c = rank == 1 ? 0 : sh[rank - 1];
        for (int64_t e = 0; e < parts && st == DT_OK && root; e++) {
            entry *en = &es[cnt++];
            int tr = 0;
            if (moe_hf_name(names[i], e, en->name, sizeof en->name, &tr) != 0) {
                st = DT_ERR_INVALID_ARGUMENT;
                break;
            }
            en->data = malloc((size_t)(r * (c ? c : 1)) * sizeof(float));
            if (!en->data) {
                st = DT_ERR_NO_MEMORY;
                break;
            }
            const float *src = h + e * r * (c ? c : 1);
            en->rows = tr ? c : r;
            en->cols = tr ? r : c;
            for (int64_t a = 0; a < r; a++)
                for (int64_t b = 0; b < (c ? c : 1); b++)
                    en->data[tr ? b * r + a : a * (c ? c : 1) + b] = src[a * (c ? c : 1) + b];
        }
        free(h);
    }
    for (int64_t l = 0; l < shape->layers && st == DT_OK && root; l++) {
        entry *en = &es[cnt++];
        snprintf(en->name, sizeof en->name,
                 "model.layers.%lld.block_sparse_moe.gate.e_score_correction_bias", (long long)l);
        en->rows = shape->experts;
        en->data = malloc((size_t)shape->experts * sizeof(float));
        if (!en->data)
            st = DT_ERR_NO_MEMORY;
        else
            memcpy(en->data, bias + l * shape->experts, (size_t)shape->experts * sizeof(float));
    }
    if (st == DT_OK && root && mkdir(dir, 0755) != 0 && errno != EEXIST)
        st = DT_ERR_IO;
    if (st == DT_OK && root)
        st = write_config(dir, shape);
    if (st == DT_OK && root)
        st = write_safetensors(dir, es, cnt);
    for (int i = 0; i < cnt; i++)
        free(es[i].data);
    free(es);
    return st;
}

dt_status moe_hf_import(const char *dir, const moe_hf_shape *shape, int n, const char *const *names,
                        dt_tensor **params, float *bias)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    dt_foreign *src = NULL;
    dt_status st = dt_foreign_open(path, &src);
    for (int i = 0; i < n && st == DT_OK; i++) {
        dt_tensor *t = params[i];
        const int64_t *sh = dt_tensor_shape(t);
        int rank = dt_tensor_rank(t);
        const dt_mesh *mesh = dt_layout_mesh(dt_tensor_layout(t));
        int64_t parts = is_expert(names[i]) ? sh[0] : 1;
        char hname[128];
        dt_foreign_view v = DT_FOREIGN_VIEW_INIT;
        v.source = hname;
        if (parts == 1) {
            int tr = 0;
            if (moe_hf_name(names[i], 0, hname, sizeof hname, &tr) != 0)
                st = DT_ERR_INVALID_ARGUMENT;
            v.transpose = tr;
            if (st == DT_OK)
                st = dt_foreign_restore(src, 1, &v, &t);
            continue;
        }
        /* experts: each [out, in] read transposed into a replicated [in, out], stacked */
        dt_tensor **ex = calloc((size_t)parts, sizeof *ex);
        dt_layout *rep = NULL, *l2 = NULL;
        dt_tensor *stacked = NULL, *moved = NULL;
        st = ex ? dt_layout_replicated(mesh, 2, &rep) : DT_ERR_NO_MEMORY;
        for (int64_t e = 0; e < parts && st == DT_OK; e++) {
            int tr = 0;
            moe_hf_name(names[i], e, hname, sizeof hname, &tr);
            v.transpose = tr;
            st = dt_tensor_zeros(rep, DT_DTYPE_F32, sh + 1, &ex[e]);
            if (st == DT_OK)
                st = dt_foreign_restore(src, 1, &v, &ex[e]);
        }
        if (st == DT_OK)
            st = dt_stack((const dt_tensor *const *)ex, (int)parts, 0, &stacked);
        if (st == DT_OK)
            st = dt_relayout(stacked, dt_tensor_layout(t), &moved);
        if (st == DT_OK && rank == 3) {
            dt_tensor_destroy(params[i]);
            params[i] = moved;
            moved = NULL;
        }
        dt_tensor_destroy(moved);
        dt_tensor_destroy(stacked);
        for (int64_t e = 0; ex && e < parts; e++)
            dt_tensor_destroy(ex[e]);
        free(ex);
        dt_layout_destroy(l2);
        dt_layout_destroy(rep);
    }
    /* the routing biases: read on every client (small) through a replicated tensor */
    for (int64_t l = 0; l < shape->layers && st == DT_OK; l++) {
        char hname[128];
        dt_foreign_view v = DT_FOREIGN_VIEW_INIT;
        dt_layout *rep = NULL;
        dt_tensor *b = NULL;
        snprintf(hname, sizeof hname,
                 "model.layers.%lld.block_sparse_moe.gate.e_score_correction_bias", (long long)l);
        v.source = hname;
        st = dt_layout_replicated(dt_layout_mesh(dt_tensor_layout(params[0])), 1, &rep);
        if (st == DT_OK)
            st = dt_tensor_zeros(rep, DT_DTYPE_F32, &shape->experts, &b);
        if (st == DT_OK)
            st = dt_foreign_restore(src, 1, &v, &b);
        if (st == DT_OK)
            st = dt_tensor_to_host(b, -1, bias + l * shape->experts,
                                   (size_t)shape->experts * sizeof(float));
        dt_tensor_destroy(b);
        dt_layout_destroy(rep);
    }
    dt_foreign_close(src);
    return st;
}
