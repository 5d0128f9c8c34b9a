/* The save plan, computed identically on every client: which device owns each block (one
 * holder per block, replicas spread by bytes), the slices of tensors given as pieces, the data
 * files, where each slice lies in its file and under which key, and each file's safetensors
 * header (docs/ckpt-format.md). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt/ckpt_impl.h"
#include "runtime/error.h"

static int cmp_box(const ck_plan_slice *a, const ck_plan_slice *b)
{
    for (int d = 0; d < DT_MAX_RANK; d++)
        if (a->off[d] != b->off[d])
            return a->off[d] < b->off[d] ? -1 : 1;
    return 0;
}

static int cmp_slice(const void *pa, const void *pb)
{
    const ck_plan_slice *a = pa, *b = pb;
    if (a->tensor != b->tensor)
        return a->tensor < b->tensor ? -1 : 1;
    return cmp_box(a, b);
}

/* File data order: larger items first (keeps every slice aligned), then tensor order, then
 * box order (several pieces of one tensor on one device). */
static int cmp_in_file(const void *pa, const void *pb, void *arg)
{
    const ck_plan *sort_plan = arg;
    const ck_plan_slice *a = &sort_plan->slices[*(const int64_t *)pa];
    const ck_plan_slice *b = &sort_plan->slices[*(const int64_t *)pb];
    size_t ea = dt_dtype_size(sort_plan->dtypes[a->tensor]);
    size_t eb = dt_dtype_size(sort_plan->dtypes[b->tensor]);
    if (ea != eb)
        return ea > eb ? -1 : 1;
    if (a->tensor != b->tensor)
        return a->tensor < b->tensor ? -1 : 1;
    return cmp_box(a, b);
}

/* DCP_SHARDING_INFO's text: {key: {"saved_offsets": [...], "tensor": name?}, ...}. */
static char *sharding_info(const ck_plan *plan, const ck_plan_file *f)
{
    ck_jw w;
    dt__jw_init(&w, 0);
    dt__jw_open(&w, '{');
    for (int64_t i = 0; i < f->nslices; i++) {
        const ck_plan_slice *s = &plan->slices[f->slices[i]];
        dt__jw_key(&w, s->key ? s->key : plan->names[s->tensor]);
        dt__jw_open(&w, '{');
        dt__jw_key(&w, "saved_offsets");
        dt__jw_int_array(&w, plan->ranks[s->tensor], s->off);
        if (s->key) { /* a second slice of one tensor in this file: say whose it is */
            dt__jw_key(&w, "tensor");
            dt__jw_str(&w, plan->names[s->tensor]);
        }
        dt__jw_close(&w, '}');
    }
    dt__jw_close(&w, '}');
    return dt__jw_take(&w);
}

/* Builds file f's header: 8-byte length, JSON, space padding to a multiple of 8. Written
 * straight into one buffer (json_out.c: jansson's compact text, with no tree per file). */
static dt_status build_header(ck_plan *plan, ck_plan_file *f)
{
    char devbuf[24], version[16], *info = sharding_info(plan, f), *text = NULL;
    ck_jw w;
    snprintf(version, sizeof version, "%d", DT_CKPT_FORMAT_VERSION);
    snprintf(devbuf, sizeof devbuf, "%d", f->device_id);
    dt__jw_init(&w, 0);
    dt__jw_open(&w, '{');
    /* __metadata__ first: readers that print the header show it on top. */
    dt__jw_key(&w, "__metadata__");
    dt__jw_open(&w, '{');
    dt__jw_key(&w, "format");
    dt__jw_str(&w, "pt");
    dt__jw_key(&w, "DCP_VERSION");
    dt__jw_str(&w, "1.0");
    dt__jw_key(&w, "DCP_SHARDING_INFO");
    dt__jw_str(&w, info);   /* NULL (no memory) marks the writer bad */
    dt__jw_key(&w, "dtensor.format_version");
    dt__jw_str(&w, version);
    dt__jw_key(&w, "dtensor.device_id");
    dt__jw_str(&w, devbuf);
    dt__jw_close(&w, '}');
    for (int64_t i = 0; i < f->nslices; i++) {
        const ck_plan_slice *s = &plan->slices[f->slices[i]];
        int64_t dof[2] = {(int64_t)s->begin, (int64_t)(s->begin + s->bytes)};
        dt__jw_key(&w, s->key ? s->key : plan->names[s->tensor]);
        dt__jw_open(&w, '{');
        dt__jw_key(&w, "dtype");
        dt__jw_str(&w, dt__ckpt_dtype_str(plan->dtypes[s->tensor]));
        dt__jw_key(&w, "shape");
        dt__jw_int_array(&w, plan->ranks[s->tensor], s->size);
        dt__jw_key(&w, "data_offsets");
        dt__jw_int_array(&w, 2, dof);
        dt__jw_close(&w, '}');
    }
    dt__jw_close(&w, '}');
    free(info);
    size_t jlen = w.len;
    text = dt__jw_take(&w);
    size_t hlen = (jlen + 7) & ~(size_t)7;
    f->header_bytes = 8 + hlen;
    f->header = text ? malloc(f->header_bytes) : NULL;
    if (!f->header) {
        free(text);
        return dt__error(DT_ERR_NO_MEMORY, "dt_save: no memory for a safetensors header");
    }
    for (int b = 0; b < 8; b++)
        f->header[b] = (char)((uint64_t)hlen >> (8 * b));
    memcpy(f->header + 8, text, jlen);
    memset(f->header + 8 + jlen, ' ', hlen - jlen);
    free(text);
    return DT_OK;
}

void dt__ckpt_plan_free(ck_plan *plan)
{
    if (!plan)
        return;
    for (int64_t f = 0; f < plan->nfiles; f++) {
        free(plan->files[f].slices);
        free(plan->files[f].header);
    }
    free(plan->files);
    for (int64_t i = 0; plan->slices && i < plan->nslices; i++)
        free(plan->slices[i].key);
    free(plan->slices);
    free(plan->file_of_position);
    memset(plan, 0, sizeof *plan);
}

static int cmp_name(const void *pa, const void *pb)
{
    return strcmp(*(const char *const *)pa, *(const char *const *)pb);
}

/* Keys of file f's slices: the tensor name, and for the further slices of one tensor in the
 * file (pieces) name#k with the smallest k >= 1 above the previous one that is no tensor's
 * name. Such keys never collide: the text after the last '#' is digits only. */
static dt_status assign_keys(ck_plan *plan, const ck_plan_file *f, const char *const *sorted)
{
    int64_t k = 0;
    for (int64_t i = 1; i < f->nslices; i++) {
        ck_plan_slice *s = &plan->slices[f->slices[i]];
        if (s->tensor != plan->slices[f->slices[i - 1]].tensor) {
            k = 0;
            continue;
        }
        const char *name = plan->names[s->tensor];
        size_t len = strlen(name) + 24;
        if (!(s->key = malloc(len)))
            return DT_ERR_NO_MEMORY;
        do
            snprintf(s->key, len, "%s#%lld", name, (long long)++k);
        while (bsearch(&s->key, sorted, (size_t)plan->n, sizeof *sorted, cmp_name));
    }
    return DT_OK;
}

static dt_status push_slice(ck_plan *plan, int64_t *cap, const ck_plan_slice *s)
{
    if (plan->nslices == *cap) {
        ck_plan_slice *ns = realloc(plan->slices, (size_t)*cap * 2 * sizeof *ns);
        if (!ns)
            return DT_ERR_NO_MEMORY;
        plan->slices = ns;
        *cap *= 2;
    }
    plan->slices[plan->nslices++] = *s;
    return DT_OK;
}

/* Elements of a box, or UINT64_MAX past 2^64; bytes into *bytes_out (0 on overflow). */
static int box_bytes(int rank, const int64_t *size, size_t elem, uint64_t *numel_out,
                     uint64_t *bytes_out)
{
    uint64_t numel = 1;
    for (int d = 0; d < rank; d++)
        if (__builtin_mul_overflow(numel, (uint64_t)size[d], &numel))
            return -1;
    *numel_out = numel;
    return __builtin_mul_overflow(numel, elem, bytes_out) ? -1 : 0;
}

dt_status dt__ckpt_plan(const dt_mesh *mesh, const ck_plan_input *in, uint64_t chunk_bytes,
                        ck_plan *plan_out)
{
    int n = in->n;
    ck_plan plan = {.n = n, .names = in->names, .layouts = in->layouts, .ranks = in->ranks,
                    .shapes = in->shapes, .dtypes = in->dtypes, .pieces = in->pieces,
                    .chunk_bytes = chunk_bytes};
    int64_t size = dt_mesh_size(mesh);
    uint64_t *load = calloc((size_t)size, sizeof *load);
    unsigned char *seen = malloc((size_t)size);
    int64_t *reps = malloc((size_t)size * sizeof *reps);
    int64_t *count = calloc((size_t)size, sizeof *count);
    const char **sorted = malloc(((size_t)n + 1) * sizeof *sorted);
    int64_t cap = 16;
    plan.slices = malloc((size_t)cap * sizeof *plan.slices);
    plan.file_of_position = malloc((size_t)size * sizeof *plan.file_of_position);
    dt_status st = DT_ERR_NO_MEMORY;
    if (!load || !seen || !reps || !count || !sorted || !plan.slices || !plan.file_of_position)
        goto err;
    for (int t = 0; t < n; t++) {
        const dt_layout *l = in->layouts[t];
        if (!l)
            continue;
        int rank = in->ranks[t];
        size_t elem = dt_dtype_size(in->dtypes[t]);
        memset(seen, 0, (size_t)size);
        for (int64_t p = 0; p < size; p++) {
            int64_t b = dt_layout_block_index(l, p);
            if (b < 0 || b >= size || seen[b])
                continue;
            seen[b] = 1;
            ck_plan_slice s;
            memset(&s, 0, sizeof s);
            s.tensor = t;
            s.piece = -1;
            if ((st = dt_layout_shard(l, in->shapes[t], p, s.off, s.size)) != DT_OK)
                goto err;
            uint64_t numel = 0;
            if (box_bytes(rank, s.size, elem, &numel, &s.bytes) != 0) {
                st = dt__error(DT_ERR_INVALID_ARGUMENT, "dt_save: tensor '%s' is too large",
                               in->names[t]);
                goto err;
            }
            if (numel == 0)
                continue;
            int64_t nrep = 0;
            if ((st = dt_layout_replicas(l, p, size, reps, &nrep)) != DT_OK)
                goto err;
            int64_t owner = reps[0];
            for (int64_t r = 1; r < nrep; r++)
                if (load[reps[r]] < load[owner])
                    owner = reps[r];
            load[owner] += s.bytes;
            count[owner]++;
            s.position = owner;
            s.nchunks = (int64_t)((s.bytes + chunk_bytes - 1) / chunk_bytes);
            if ((st = push_slice(&plan, &cap, &s)) != DT_OK)
                goto err;
        }
    }
    /* Pieces: placed by the caller (checked in pieces.c: inside, tiling, sizes bounded). */
    for (int64_t i = 0; i < in->npieces; i++) {
        const ck_plan_piece *pc = &in->pieces[i];
        ck_plan_slice s;
        memset(&s, 0, sizeof s);
        s.tensor = pc->tensor;
        s.piece = i;
        s.position = pc->position;
        memcpy(s.off, pc->off, sizeof s.off);
        memcpy(s.size, pc->size, sizeof s.size);
        uint64_t numel = 0;
        if (box_bytes(in->ranks[pc->tensor], s.size, dt_dtype_size(in->dtypes[pc->tensor]),
                      &numel, &s.bytes) != 0 || numel == 0)
            continue;
        load[s.position] += s.bytes;
        count[s.position]++;
        s.nchunks = (int64_t)((s.bytes + chunk_bytes - 1) / chunk_bytes);
        if ((st = push_slice(&plan, &cap, &s)) != DT_OK)
            goto err;
    }
    qsort(plan.slices, (size_t)plan.nslices, sizeof *plan.slices, cmp_slice);
    for (int64_t p = 0; p < size; p++)
        plan.nfiles += count[p] > 0;
    plan.files = calloc((size_t)(plan.nfiles ? plan.nfiles : 1), sizeof *plan.files);
    if (!plan.files) {
        st = DT_ERR_NO_MEMORY;
        goto err;
    }
    for (int64_t p = 0, f = 0; p < size; p++) {
        plan.file_of_position[p] = count[p] > 0 ? f : -1;
        if (count[p] == 0)
            continue;
        plan.files[f].position = p;
        plan.files[f].device_id = dt_mesh_device_id(mesh, p);
        plan.files[f].slices = malloc((size_t)count[p] * sizeof(int64_t));
        if (!plan.files[f].slices) {
            st = DT_ERR_NO_MEMORY;
            goto err;
        }
        f++;
    }
    for (int64_t i = 0; i < plan.nslices; i++) {
        ck_plan_file *f = &plan.files[plan.file_of_position[plan.slices[i].position]];
        f->slices[f->nslices++] = i;
    }
    for (int t = 0; t < n; t++)
        sorted[t] = in->names[t];
    qsort(sorted, (size_t)n, sizeof *sorted, cmp_name);
    for (int64_t f = 0; f < plan.nfiles; f++) {
        ck_plan_file *pf = &plan.files[f];
        qsort_r(pf->slices, (size_t)pf->nslices, sizeof *pf->slices, cmp_in_file, &plan);
        for (int64_t i = 0; i < pf->nslices; i++) {
            ck_plan_slice *s = &plan.slices[pf->slices[i]];
            s->begin = pf->data_bytes;
            pf->data_bytes += s->bytes;
        }
        if (in->npieces > 0 && (st = assign_keys(&plan, pf, sorted)) != DT_OK)
            goto err;
        if ((st = build_header(&plan, pf)) != DT_OK)
            goto err;
    }
    free(load);
    free(seen);
    free(reps);
    free(count);
    free(sorted);
    *plan_out = plan;
    return DT_OK;
err:
    if (st == DT_ERR_NO_MEMORY)
        dt__error(st, "dt_save: no memory for the save plan");
    free(load);
    free(seen);
    free(reps);
    free(count);
    free(sorted);
    dt__ckpt_plan_free(&plan);
    return st;
}
