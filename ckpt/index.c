/* The merged index (dtensor-index.json): writing it from a save plan and its CRCs (json_out.c's
 * streaming writer), parsing it through jansson and validating it into a dt_ckpt, and freeing
 * a dt_ckpt (dt_ckpt_close) (docs/ckpt-format.md). */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt/ckpt_impl.h"
#include "runtime/error.h"

/* ---- writing ------------------------------------------------------------------------------ */

static const char hexd[] = "0123456789abcdef";

static void value_json(ck_jw *w, const dt_ckpt_value *v)
{
    dt__jw_open(w, '{');
    dt__jw_key(w, "name");
    dt__jw_str(w, v->name);
    dt__jw_key(w, "type");
    if (v->type == DT_CKPT_VALUE_I64) {
        dt__jw_str(w, "i64");
        dt__jw_key(w, "value");
        dt__jw_int(w, v->i64);
    } else if (v->type == DT_CKPT_VALUE_F64) {
        uint64_t bits;
        char hex[17];
        memcpy(&bits, &v->f64, 8);
        snprintf(hex, sizeof hex, "%016" PRIx64, bits);
        dt__jw_str(w, "f64");
        if (isfinite(v->f64)) {
            dt__jw_key(w, "value");
            dt__jw_real(w, v->f64);
        }
        dt__jw_key(w, "bits");
        dt__jw_str(w, hex);
    } else {
        char *hex = malloc(2 * v->nbytes + 1);
        for (size_t i = 0; hex && i < v->nbytes; i++) {
            unsigned char c = ((const unsigned char *)v->bytes)[i];
            hex[2 * i] = hexd[c >> 4];
            hex[2 * i + 1] = hexd[c & 15];
        }
        if (hex)
            hex[2 * v->nbytes] = '\0';
        dt__jw_str(w, "bytes");
        dt__jw_key(w, "hex");
        dt__jw_str(w, hex);   /* NULL: out of memory, marks the writer bad */
        free(hex);
    }
    dt__jw_close(w, '}');
}

/* One slice's member object of a tensor's "slices". */
static void slice_json(ck_jw *w, const ck_plan *plan, int64_t si, uint32_t crc,
                       const uint32_t *chunk_crcs)
{
    const ck_plan_slice *s = &plan->slices[si];
    int64_t f = plan->file_of_position[s->position];
    int rank = plan->ranks[s->tensor];
    char name[64];
    dt__ckpt_file_name(name, sizeof name, f, plan->nfiles);
    dt__jw_elem(w);
    dt__jw_open(w, '{');
    dt__jw_key(w, "file");
    dt__jw_str(w, name);
    dt__jw_key(w, "key");
    dt__jw_str(w, s->key ? s->key : plan->names[s->tensor]);
    dt__jw_key(w, "offsets");
    dt__jw_int_array(w, rank, s->off);
    dt__jw_key(w, "sizes");
    dt__jw_int_array(w, rank, s->size);
    int64_t dof[2] = {(int64_t)s->begin, (int64_t)(s->begin + s->bytes)};
    dt__jw_key(w, "data_offsets");
    dt__jw_int_array(w, 2, dof);
    dt__jw_key(w, "file_offset");
    dt__jw_int(w, (int64_t)(plan->files[f].header_bytes + s->begin));
    dt__jw_key(w, "bytes");
    dt__jw_int(w, (int64_t)s->bytes);
    dt__jw_key(w, "crc32c");
    dt__jw_int(w, crc);
    dt__jw_key(w, "chunk_crc32c");
    dt__jw_open(w, '[');
    for (int64_t c = 0; c < s->nchunks; c++) {
        dt__jw_elem(w);
        dt__jw_int(w, chunk_crcs[c]);
    }
    dt__jw_close(w, ']');
    dt__jw_close(w, '}');
}

/* The text of a tensor's mesh, formatted once per distinct mesh in a row (a mesh of N devices
 * formats to O(N) characters, and most tensors of a save share one mesh). */
typedef struct mesh_text {
    const dt_mesh *mesh;
    char *text;
} mesh_text;

static const char *mesh_text_of(mesh_text *mt, const dt_mesh *mesh)
{
    if (mt->mesh == mesh && mt->text)
        return mt->text;
    free(mt->text);
    size_t mlen = dt_mesh_format(mesh, NULL, 0) + 1;
    mt->mesh = mesh;
    mt->text = malloc(mlen);
    if (mt->text)
        dt_mesh_format(mesh, mt->text, mlen);
    return mt->text;
}

/* A tensor's member object, its slices [*si, ...) included (*si advanced past them). */
static void tensor_json(ck_jw *w, const ck_plan *plan, int t, const char *mesh_str,
                        mesh_text *mt, const uint32_t *crcs, const uint32_t *const *chunk_crcs,
                        int64_t *si)
{
    /* A tensor saved as pieces has no layout: "" and the saving (host) mesh. */
    const dt_layout *l = plan->layouts[t];
    size_t llen = l ? dt_layout_format(l, NULL, 0) + 1 : 1;
    char *ls = malloc(llen);
    const char *ms = l ? mesh_text_of(mt, dt_layout_mesh(l)) : mesh_str;
    if (ls && l)
        dt_layout_format(l, ls, llen);
    else if (ls)
        ls[0] = '\0';
    dt__jw_elem(w);
    dt__jw_open(w, '{');
    dt__jw_key(w, "name");
    dt__jw_str(w, plan->names[t]);
    dt__jw_key(w, "dtype");
    dt__jw_str(w, dt__ckpt_dtype_str(plan->dtypes[t]));
    dt__jw_key(w, "shape");
    dt__jw_int_array(w, plan->ranks[t], plan->shapes[t]);
    dt__jw_key(w, "layout");
    dt__jw_str(w, ls);
    dt__jw_key(w, "mesh");
    dt__jw_str(w, ms);   /* NULL (no memory) marks the writer bad */
    free(ls);
    dt__jw_key(w, "slices");
    dt__jw_open(w, '[');
    for (; !w->bad && *si < plan->nslices && plan->slices[*si].tensor == t; ++*si)
        slice_json(w, plan, *si, crcs[*si], chunk_crcs[*si]);
    dt__jw_close(w, ']');
    dt__jw_close(w, '}');
}

/* Written straight into one buffer (json_out.c): the same text as jansson's JSON_INDENT(1)
 * dump of the document, several times cheaper for thousands of devices (docs/ckpt-format.md,
 * "Writing the index"). */
dt_status dt__ckpt_index_text(const ck_plan *plan, const char *mesh_str,
                              int64_t num_devices, const uint32_t *crcs,
                              const uint32_t *const *chunk_crcs, int nvalues,
                              const dt_ckpt_value *values, char **text_out)
{
    ck_jw w;
    char name[64];
    dt__jw_init(&w, 1);
    /* About 330 bytes a slice and 150 a file: one buffer, rarely grown. */
    dt__jw_reserve(&w, 512 * (size_t)plan->nslices + 256 * (size_t)plan->nfiles + 4096);
    dt__jw_open(&w, '{');
    dt__jw_key(&w, "format");
    dt__jw_str(&w, CK_FORMAT_NAME);
    dt__jw_key(&w, "format_version");
    dt__jw_int(&w, DT_CKPT_FORMAT_VERSION);
    dt__jw_key(&w, "checksum");
    dt__jw_str(&w, "crc32c");
    dt__jw_key(&w, "chunk_bytes");
    dt__jw_int(&w, (int64_t)plan->chunk_bytes);
    dt__jw_key(&w, "mesh");
    dt__jw_str(&w, mesh_str);
    dt__jw_key(&w, "num_devices");
    dt__jw_int(&w, num_devices);
    dt__jw_key(&w, "files");
    dt__jw_open(&w, '[');
    for (int64_t f = 0; !w.bad && f < plan->nfiles; f++) {
        const ck_plan_file *pf = &plan->files[f];
        dt__ckpt_file_name(name, sizeof name, f, plan->nfiles);
        dt__jw_elem(&w);
        dt__jw_open(&w, '{');
        dt__jw_key(&w, "name");
        dt__jw_str(&w, name);
        dt__jw_key(&w, "device_id");
        dt__jw_int(&w, pf->device_id);
        dt__jw_key(&w, "bytes");
        dt__jw_int(&w, (int64_t)(pf->header_bytes + pf->data_bytes));
        dt__jw_key(&w, "header_bytes");
        dt__jw_int(&w, (int64_t)pf->header_bytes);
        dt__jw_key(&w, "header_crc32c");
        dt__jw_int(&w, dt_crc32c(0, pf->header, pf->header_bytes));
        dt__jw_close(&w, '}');
    }
    dt__jw_close(&w, ']');
    dt__jw_key(&w, "tensors");
    dt__jw_open(&w, '[');
    int64_t si = 0;
    mesh_text mt = {NULL, NULL};
    for (int t = 0; !w.bad && t < plan->n; t++)
        tensor_json(&w, plan, t, mesh_str, &mt, crcs, chunk_crcs, &si);
    free(mt.text);
    dt__jw_close(&w, ']');
    dt__jw_key(&w, "values");
    dt__jw_open(&w, '[');
    for (int v = 0; !w.bad && v < nvalues; v++) {
        dt__jw_elem(&w);
        value_json(&w, &values[v]);
    }
    dt__jw_close(&w, ']');
    dt__jw_close(&w, '}');
    char *text = dt__jw_take(&w);
    if (!text)
        return dt__error(DT_ERR_NO_MEMORY, "dt_save: no memory for the index");
    dt_status st = dt__ckpt_index_seal(text, text_out);
    free(text);
    return st;
}

/* ---- the parsed checkpoint's teardown ------------------------------------------------------ */

void dt_ckpt_close(dt_ckpt *ck)
{
    if (!ck)
        return;
    for (int64_t f = 0; ck->files && f < ck->nfiles; f++) {
        free(ck->files[f].name);
        free(ck->files[f].slice_tensor);
        free(ck->files[f].slice_index);
    }
    for (int64_t t = 0; ck->tensors && t < ck->ntensors; t++) {
        ck_tensor *ct = &ck->tensors[t];
        free(ct->order);
        free(ct->reach);
        for (int64_t s = 0; ct->slices && s < ct->nslices; s++) {
            free(ct->slices[s].chunk_crc);
            free(ct->slices[s].key);
        }
        free(ct->slices);
        free(ct->name);
        free(ct->layout);
        free(ct->mesh);
    }
    for (int64_t v = 0; ck->values && v < ck->nvalues; v++) {
        free(ck->values[v].name);
        free(ck->values[v].bytes);
    }
    free(ck->files);
    free(ck->tensors);
    free(ck->by_name);
    free(ck->values);
    free(ck->mesh);
    free(ck->path);
    free(ck);
}

/* ---- parsing ------------------------------------------------------------------------------ */

typedef struct pctx {
    const char *index_path;
    char where[DT_CKPT_NAME_MAX + 96];   /* "tensor 'w' slice 2: " etc. */
} pctx;

#define CORRUPT(c, ...) corrupt_msg((c), __VA_ARGS__)

#if defined(__GNUC__)
__attribute__((format(printf, 2, 3)))
#endif
static dt_status corrupt_msg(const pctx *c, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return dt__error(DT_ERR_CORRUPT, "%s: %s%s", c->index_path, c->where, msg);
}

static dt_status get_int(const pctx *c, const json_t *o, const char *key, int64_t lo, int64_t hi,
                         int64_t *out)
{
    json_t *v = json_object_get(o, key);
    if (!json_is_integer(v))
        return CORRUPT(c, "'%s' missing or not an integer", key);
    int64_t x = json_integer_value(v);
    if (x < lo || x > hi)
        return CORRUPT(c, "'%s' = %" PRId64 " out of range [%" PRId64 ", %" PRId64 "]", key, x,
                       lo, hi);
    *out = x;
    return DT_OK;
}

static dt_status get_str(const pctx *c, const json_t *o, const char *key, char **out)
{
    json_t *v = json_object_get(o, key);
    if (!json_is_string(v))
        return CORRUPT(c, "'%s' missing or not a string", key);
    *out = strdup(json_string_value(v));
    if (!*out)
        return dt__error(DT_ERR_NO_MEMORY, "no memory reading %s", c->index_path);
    return DT_OK;
}

static dt_status get_dims(const pctx *c, const json_t *o, const char *key, int rank,
                          int64_t *out)
{
    json_t *a = json_object_get(o, key);
    if (!json_is_array(a) || (rank >= 0 && (int)json_array_size(a) != rank) ||
        json_array_size(a) > DT_MAX_RANK)
        return CORRUPT(c, "'%s' missing, not an array or of the wrong length", key);
    for (size_t d = 0; d < json_array_size(a); d++) {
        json_t *v = json_array_get(a, d);
        if (!json_is_integer(v) || json_integer_value(v) < 0 ||
            json_integer_value(v) > ((int64_t)1 << 50))
            return CORRUPT(c, "'%s'[%zu] is not an integer in [0, 2^50]", key, d);
        out[d] = json_integer_value(v);
    }
    return DT_OK;
}

static int hexval(int ch)
{
    return ch >= '0' && ch <= '9' ? ch - '0' : ch >= 'a' && ch <= 'f' ? ch - 'a' + 10 : -1;
}

static dt_status parse_value(pctx *c, const json_t *o, ck_value *v)
{
    char *type = NULL;
    dt_status st = get_str(c, o, "type", &type);
    if (st != DT_OK)
        return st;
    if (strcmp(type, "i64") == 0) {
        v->type = DT_CKPT_VALUE_I64;
        st = get_int(c, o, "value", INT64_MIN, INT64_MAX, &v->i64);
    } else if (strcmp(type, "f64") == 0) {
        v->type = DT_CKPT_VALUE_F64;
        json_t *b = json_object_get(o, "bits");
        const char *s = json_string_value(b);
        uint64_t bits = 0;
        if (!s || strlen(s) != 16)
            st = CORRUPT(c, "'bits' missing or not 16 hex digits");
        for (int i = 0; st == DT_OK && i < 16; i++) {
            int h = hexval(s[i]);
            if (h < 0)
                st = CORRUPT(c, "'bits' is not lowercase hex");
            bits = bits << 4 | (uint64_t)(h < 0 ? 0 : h);
        }
        memcpy(&v->f64, &bits, 8);
    } else if (strcmp(type, "bytes") == 0) {
        v->type = DT_CKPT_VALUE_BYTES;
        const char *s = json_string_value(json_object_get(o, "hex"));
        size_t n = s ? strlen(s) : 1;
        if (!s || n % 2)
            st = CORRUPT(c, "'hex' missing or of odd length");
        else if (!(v->bytes = malloc(n / 2 + 1)))
            st = dt__error(DT_ERR_NO_MEMORY, "no memory reading %s", c->index_path);
        v->nbytes = n / 2;
        for (size_t i = 0; st == DT_OK && i < n / 2; i++) {
            int hi = hexval(s[2 * i]), lo = hexval(s[2 * i + 1]);
            if (hi < 0 || lo < 0)
                st = CORRUPT(c, "'hex' is not lowercase hex");
            v->bytes[i] = (unsigned char)(hi << 4 | (lo & 15));
        }
    } else {
        st = CORRUPT(c, "unknown value type '%s'", type);
    }
    free(type);
    return st;
}

static dt_status parse_slice(pctx *c, dt_ckpt *ck, const ck_tensor *t, const json_t *o,
                             ck_slice *s)
{
    dt_status st;
    char *file = NULL, *key = NULL;
    int64_t v;
    if ((st = get_str(c, o, "file", &file)) != DT_OK)
        return st;
    /* parse_file admitted only our own names, data-K-of-N, so K says which file. */
    long long fk = -1;
    s->file = -1;
    if (sscanf(file, "data-%lld-of-", &fk) == 1 && fk >= 0 && fk < ck->nfiles &&
        strcmp(ck->files[fk].name, file) == 0)
        s->file = fk;
    if (s->file < 0)
        st = CORRUPT(c, "file '%s' is not listed in 'files'", file);
    free(file);
    if (st == DT_OK && (st = get_str(c, o, "key", &key)) == DT_OK && !dt__ckpt_key_of(key, t->name))
        st = CORRUPT(c, "key is neither the tensor name nor the name and #digits");
    if (st == DT_OK && strcmp(key, t->name) != 0) {
        s->key = key;   /* a further slice of this tensor in one file */
        key = NULL;
    }
    free(key);
    if (st != DT_OK)
        return st;
    if ((st = get_dims(c, o, "offsets", t->rank, s->off)) != DT_OK ||
        (st = get_dims(c, o, "sizes", t->rank, s->size)) != DT_OK)
        return st;
    uint64_t numel = 1;
    for (int d = 0; d < t->rank; d++) {
        if (s->off[d] + s->size[d] > t->shape[d] || s->size[d] == 0)
            return CORRUPT(c, "box outside the tensor or empty in dim %d", d);
        numel *= (uint64_t)s->size[d];   /* <= prod(shape) <= 2^50 checked by the caller */
    }
    const ck_file *f = &ck->files[s->file];
    json_t *dof = json_object_get(o, "data_offsets");
    if (!json_is_array(dof) || json_array_size(dof) != 2 ||
        !json_is_integer(json_array_get(dof, 0)) || !json_is_integer(json_array_get(dof, 1)))
        return CORRUPT(c, "'data_offsets' is not [begin, end]");
    int64_t b = json_integer_value(json_array_get(dof, 0));
    int64_t e = json_integer_value(json_array_get(dof, 1));
    uint64_t want = numel * dt_dtype_size(t->dtype);
    if (b < 0 || e < b || (uint64_t)(e - b) != want ||
        (uint64_t)e > f->bytes - f->header_bytes)
        return CORRUPT(c, "'data_offsets' [%" PRId64 ", %" PRId64 "] do not hold %" PRIu64
                       " bytes inside file %s", b, e, want, f->name);
    s->begin = (uint64_t)b;
    s->bytes = want;
    s->file_offset = f->header_bytes + s->begin;
    if ((st = get_int(c, o, "file_offset", 0, INT64_MAX, &v)) != DT_OK)
        return st;
    if ((uint64_t)v != s->file_offset)
        return CORRUPT(c, "'file_offset' %" PRId64 " != header_bytes + data_offsets[0]", v);
    if ((st = get_int(c, o, "bytes", 0, INT64_MAX, &v)) != DT_OK)
        return st;
    if ((uint64_t)v != s->bytes)
        return CORRUPT(c, "'bytes' %" PRId64 " != %" PRIu64, v, s->bytes);
    if ((st = get_int(c, o, "crc32c", 0, UINT32_MAX, &v)) != DT_OK)
        return st;
    s->crc = (uint32_t)v;
    json_t *cc = json_object_get(o, "chunk_crc32c");
    s->nchunks = (int64_t)((s->bytes + ck->chunk_bytes - 1) / ck->chunk_bytes);
    if (!json_is_array(cc) || (int64_t)json_array_size(cc) != s->nchunks)
        return CORRUPT(c, "'chunk_crc32c' is not an array of %" PRId64 " CRCs", s->nchunks);
    s->chunk_crc = malloc((size_t)(s->nchunks ? s->nchunks : 1) * sizeof *s->chunk_crc);
    if (!s->chunk_crc)
        return dt__error(DT_ERR_NO_MEMORY, "no memory reading %s", c->index_path);
    uint32_t whole = 0;
    uint64_t left = s->bytes;
    for (int64_t k = 0; k < s->nchunks; k++) {
        json_t *x = json_array_get(cc, (size_t)k);
        if (!json_is_integer(x) || json_integer_value(x) < 0 ||
            json_integer_value(x) > UINT32_MAX)
            return CORRUPT(c, "'chunk_crc32c'[%" PRId64 "] is not a CRC", k);
        s->chunk_crc[k] = (uint32_t)json_integer_value(x);
        uint64_t len = left < ck->chunk_bytes ? left : ck->chunk_bytes;
        whole = k ? dt__crc32c_combine(whole, s->chunk_crc[k], len) : s->chunk_crc[k];
        left -= len;
    }
    if (whole != s->crc)
        return CORRUPT(c, "'crc32c' disagrees with 'chunk_crc32c'");
    return DT_OK;
}

static dt_status parse_tensor(pctx *c, dt_ckpt *ck, const json_t *o, ck_tensor *t)
{
    dt_status st;
    char *dtype = NULL;
    if ((st = get_str(c, o, "name", &t->name)) != DT_OK)
        return st;
    if (dt__ckpt_check_name("index", "tensor", t->name) != DT_OK)
        return CORRUPT(c, "bad tensor name: %s", dt_last_error());
    snprintf(c->where, sizeof c->where, "tensor '%s': ", t->name);
    if ((st = get_str(c, o, "dtype", &dtype)) != DT_OK)
        return st;
    if (dt__ckpt_dtype_from_str(dtype, &t->dtype) != 0)
        st = CORRUPT(c, "unknown dtype '%s'", dtype);
    free(dtype);
    if (st != DT_OK)
        return st;
    json_t *shape = json_object_get(o, "shape");
    if (!json_is_array(shape) || json_array_size(shape) > DT_MAX_RANK)
        return CORRUPT(c, "'shape' missing or of rank above %d", DT_MAX_RANK);
    t->rank = (int)json_array_size(shape);
    if ((st = get_dims(c, o, "shape", t->rank, t->shape)) != DT_OK)
        return st;
    uint64_t numel = 1;
    for (int d = 0; d < t->rank; d++)
        if (__builtin_mul_overflow(numel, (uint64_t)t->shape[d], &numel) ||
            numel > ((uint64_t)1 << 50))
            return CORRUPT(c, "'shape' has more than 2^50 elements");
    if ((st = get_str(c, o, "layout", &t->layout)) != DT_OK ||
        (st = get_str(c, o, "mesh", &t->mesh)) != DT_OK)
        return st;
    json_t *sl = json_object_get(o, "slices");
    if (!json_is_array(sl))
        return CORRUPT(c, "'slices' missing");
    t->nslices = (int64_t)json_array_size(sl);
    t->slices = calloc((size_t)(t->nslices ? t->nslices : 1), sizeof *t->slices);
    if (!t->slices)
        return dt__error(DT_ERR_NO_MEMORY, "no memory reading %s", c->index_path);
    uint64_t covered = 0;
    for (int64_t s = 0; s < t->nslices; s++) {
        snprintf(c->where, sizeof c->where, "tensor '%s' slice %" PRId64 ": ", t->name, s);
        if ((st = parse_slice(c, ck, t, json_array_get(sl, (size_t)s), &t->slices[s])) != DT_OK)
            return st;
        covered += t->slices[s].bytes / dt_dtype_size(t->dtype);
    }
    snprintf(c->where, sizeof c->where, "tensor '%s': ", t->name);
    if (covered != numel)
        return CORRUPT(c, "slices hold %" PRIu64 " of its %" PRIu64 " elements", covered,
                       numel);
    /* Volumes add up; with no overlap the slices tile the tensor. */
    ck_box *boxes = malloc((size_t)(t->nslices ? t->nslices : 1) * sizeof *boxes);
    if (!boxes)
        return dt__error(DT_ERR_NO_MEMORY, "no memory reading %s", c->index_path);
    for (int64_t s = 0; s < t->nslices; s++) {
        memcpy(boxes[s].off, t->slices[s].off, sizeof boxes[s].off);
        memcpy(boxes[s].size, t->slices[s].size, sizeof boxes[s].size);
        boxes[s].id = s;
    }
    int64_t a = 0, b = 0;
    int overlap = dt__ckpt_find_overlap(t->rank, boxes, t->nslices, &a, &b);
    free(boxes);
    if (overlap)
        return CORRUPT(c, "slice %" PRId64 " overlaps slice %" PRId64, b, a);
    return dt__ckpt_slice_index(t);
}

static dt_status parse_file(pctx *c, int64_t k, int64_t n, const json_t *o, ck_file *f)
{
    dt_status st;
    int64_t v;
    char want[64];
    if ((st = get_str(c, o, "name", &f->name)) != DT_OK)
        return st;
    dt__ckpt_file_name(want, sizeof want, k, n);
    /* Only our own names: an edited index can never point outside the directory. */
    if (strcmp(f->name, want) != 0)
        return CORRUPT(c, "file %" PRId64 " is named '%s', expected '%s'", k, f->name, want);
    if ((st = get_int(c, o, "bytes", 8, INT64_MAX, &v)) != DT_OK)
        return st;
    f->bytes = (uint64_t)v;
    if ((st = get_int(c, o, "header_bytes", 8, v, &v)) != DT_OK)
        return st;
    if (v % 8)
        return CORRUPT(c, "file '%s': header_bytes %" PRId64 " is not a multiple of 8",
                       f->name, v);
    f->header_bytes = (uint64_t)v;
    if ((st = get_int(c, o, "header_crc32c", 0, UINT32_MAX, &v)) != DT_OK)
        return st;
    f->header_crc = (uint32_t)v;
    if ((st = get_int(c, o, "device_id", 0, INT32_MAX, &v)) != DT_OK)
        return st;
    f->device_id = (int)v;
    return DT_OK;
}

static const char *slice_key(const dt_ckpt *ck, int64_t t, int64_t s)
{
    const ck_slice *sl = &ck->tensors[t].slices[s];
    return sl->key ? sl->key : ck->tensors[t].name;
}

static int cmp_str(const void *pa, const void *pb)
{
    return strcmp(*(const char *const *)pa, *(const char *const *)pb);
}

static dt_status link_files(pctx *c, dt_ckpt *ck)
{
    for (int64_t t = 0; t < ck->ntensors; t++)
        for (int64_t s = 0; s < ck->tensors[t].nslices; s++)
            ck->files[ck->tensors[t].slices[s].file].nslices++;
    int64_t most = 1;
    for (int64_t f = 0; f < ck->nfiles; f++) {
        ck_file *cf = &ck->files[f];
        size_t n = (size_t)(cf->nslices ? cf->nslices : 1);
        most = cf->nslices > most ? cf->nslices : most;
        cf->slice_tensor = malloc(n * sizeof(int64_t));
        cf->slice_index = malloc(n * sizeof(int64_t));
        if (!cf->slice_tensor || !cf->slice_index)
            return dt__error(DT_ERR_NO_MEMORY, "no memory reading %s", c->index_path);
        cf->nslices = 0;
    }
    for (int64_t t = 0; t < ck->ntensors; t++)
        for (int64_t s = 0; s < ck->tensors[t].nslices; s++) {
            ck_file *cf = &ck->files[ck->tensors[t].slices[s].file];
            cf->slice_tensor[cf->nslices] = t;
            cf->slice_index[cf->nslices++] = s;
        }
    /* Keys are unique inside a file (sorted, then neighbours compared). */
    const char **keys = malloc((size_t)most * sizeof *keys);
    if (!keys)
        return dt__error(DT_ERR_NO_MEMORY, "no memory reading %s", c->index_path);
    dt_status st = DT_OK;
    for (int64_t f = 0; st == DT_OK && f < ck->nfiles; f++) {
        const ck_file *cf = &ck->files[f];
        for (int64_t i = 0; i < cf->nslices; i++)
            keys[i] = slice_key(ck, cf->slice_tensor[i], cf->slice_index[i]);
        qsort(keys, (size_t)cf->nslices, sizeof *keys, cmp_str);
        for (int64_t i = 1; st == DT_OK && i < cf->nslices; i++)
            if (strcmp(keys[i - 1], keys[i]) == 0)
                st = CORRUPT(c, "key '%s' used twice in file '%s'", keys[i], cf->name);
    }
    free(keys);
    return st;
}

static int cmp_by_name(const void *pa, const void *pb, void *arg)
{
    const dt_ckpt *ck = arg;
    return strcmp(ck->tensors[*(const int64_t *)pa].name, ck->tensors[*(const int64_t *)pb].name);
}

dt_status dt__ckpt_parse_index(const char *path, const char *index_path, const char *text,
                               size_t len, dt_ckpt **ckpt_out)
{
    pctx c = {.index_path = index_path, .where = ""};
    int sealed = 0;
    dt_status sst = dt__ckpt_index_check_seal(index_path, text, len, &sealed);
    if (sst != DT_OK)
        return sst;
    json_error_t jerr;
    json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &jerr);
    if (!root)
        return dt__error(DT_ERR_CORRUPT, "%s:%d:%d: %s", index_path, jerr.line, jerr.column,
                         jerr.text);
    dt_status st = DT_ERR_NO_MEMORY;
    dt_ckpt *ck = calloc(1, sizeof *ck);
    char *fmt = NULL;
    int64_t v = 0;
    if (!ck || !(ck->path = strdup(path))) {
        st = dt__error(DT_ERR_NO_MEMORY, "no memory reading %s", index_path);
        goto err;
    }
    if (!json_is_object(root)) {
        st = CORRUPT(&c, "not a JSON object");
        goto err;
    }
    if ((st = get_str(&c, root, "format", &fmt)) != DT_OK)
        goto err;
    if (strcmp(fmt, CK_FORMAT_NAME) != 0) {
        st = CORRUPT(&c, "'format' is '%s', not '%s'", fmt, CK_FORMAT_NAME);
        goto err;
    }
    if ((st = get_int(&c, root, "format_version", 1, INT32_MAX, &v)) != DT_OK)
        goto err;
    if (v > DT_CKPT_FORMAT_VERSION) {
        st = dt__error(DT_ERR_UNSUPPORTED, "%s: format_version %" PRId64
                       " is newer than this library's %d", index_path, v,
                       DT_CKPT_FORMAT_VERSION);
        goto err;
    }
    ck->version = (int)v;
    if (!sealed && v >= 2) {
        st = CORRUPT(&c, "field 'index_crc32c' missing or not the index's last member "
                     "(index altered)");
        goto err;
    }
    json_t *cs = json_object_get(root, "checksum");
    if (!json_is_string(cs) || strcmp(json_string_value(cs), "crc32c") != 0) {
        st = CORRUPT(&c, "'checksum' is not \"crc32c\"");
        goto err;
    }
    if ((st = get_int(&c, root, "chunk_bytes", 4096, (int64_t)1 << 30, &v)) != DT_OK)
        goto err;
    ck->chunk_bytes = (uint64_t)v;
    if ((st = get_int(&c, root, "num_devices", 0, INT32_MAX, &ck->num_devices)) != DT_OK ||
        (st = get_str(&c, root, "mesh", &ck->mesh)) != DT_OK)
        goto err;
    json_t *files = json_object_get(root, "files"), *tensors = json_object_get(root, "tensors");
    json_t *values = json_object_get(root, "values");
    if (!json_is_array(files) || !json_is_array(tensors) || !json_is_array(values)) {
        st = CORRUPT(&c, "'files', 'tensors' or 'values' missing or not an array");
        goto err;
    }
    ck->nfiles = (int64_t)json_array_size(files);
    ck->ntensors = (int64_t)json_array_size(tensors);
    ck->nvalues = (int64_t)json_array_size(values);
    ck->files = calloc((size_t)ck->nfiles + 1, sizeof *ck->files);
    ck->tensors = calloc((size_t)ck->ntensors + 1, sizeof *ck->tensors);
    ck->values = calloc((size_t)ck->nvalues + 1, sizeof *ck->values);
    if (!ck->files || !ck->tensors || !ck->values) {
        st = dt__error(DT_ERR_NO_MEMORY, "no memory reading %s", index_path);
        goto err;
    }
    for (int64_t f = 0; f < ck->nfiles; f++)
        if ((st = parse_file(&c, f, ck->nfiles, json_array_get(files, (size_t)f),
                             &ck->files[f])) != DT_OK)
            goto err;
    for (int64_t t = 0; t < ck->ntensors; t++) {
        if ((st = parse_tensor(&c, ck, json_array_get(tensors, (size_t)t),
                               &ck->tensors[t])) != DT_OK)
            goto err;
    }
    /* Tensors by name (dt_ckpt_find's bsearch); neighbours equal means listed twice. */
    c.where[0] = '\0';
    ck->by_name = malloc(((size_t)ck->ntensors + 1) * sizeof *ck->by_name);
    if (!ck->by_name) {
        st = dt__error(DT_ERR_NO_MEMORY, "no memory reading %s", index_path);
        goto err;
    }
    for (int64_t t = 0; t < ck->ntensors; t++)
        ck->by_name[t] = t;
    qsort_r(ck->by_name, (size_t)ck->ntensors, sizeof *ck->by_name, cmp_by_name, ck);
    for (int64_t i = 1; i < ck->ntensors; i++)
        if (cmp_by_name(&ck->by_name[i - 1], &ck->by_name[i], ck) == 0) {
            st = CORRUPT(&c, "tensor '%s' listed twice", ck->tensors[ck->by_name[i]].name);
            goto err;
        }
    for (int64_t i = 0; i < ck->nvalues; i++) {
        json_t *o = json_array_get(values, (size_t)i);
        c.where[0] = '\0';
        if ((st = get_str(&c, o, "name", &ck->values[i].name)) != DT_OK)
            goto err;
        snprintf(c.where, sizeof c.where, "value '%s': ", ck->values[i].name);
        if ((st = parse_value(&c, o, &ck->values[i])) != DT_OK)
            goto err;
        for (int64_t u = 0; u < i; u++)
            if (strcmp(ck->values[u].name, ck->values[i].name) == 0) {
                st = CORRUPT(&c, "listed twice");
                goto err;
            }
    }
    c.where[0] = '\0';
    if ((st = link_files(&c, ck)) != DT_OK)
        goto err;
    free(fmt);
    json_decref(root);
    *ckpt_out = ck;
    return DT_OK;
err:
    free(fmt);
    json_decref(root);
    dt_ckpt_close(ck);
    return st;
}
