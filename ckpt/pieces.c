/* The explicitly placed pieces of a save (dt_save_opts.pieces): each client's own checks, the
 * gather of every client's piece descriptors over the mesh's clients, and the checks made on
 * the whole list (dtypes and shapes agree, boxes inside, exact tiling), identical everywhere. */
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt/ckpt_impl.h"
#include "runtime/error.h"
#include "runtime/group.h"
#include "runtime/util.h"

#define DIM_MAX ((int64_t)1 << 50)

/* One gathered descriptor, pointing into the receive buffer. */
typedef struct desc {
    const char *name;
    dt_dtype dtype;
    int rank;
    int64_t position;
    int client; /* group rank */
    int local;
    const int64_t *shape, *off, *size;
} desc;

dt_status dt__ckpt_pieces_check_local(const dt_mesh *mesh, int np, const dt_ckpt_piece *pc)
{
    if (np < 0 || (np > 0 && !pc))
        return dt__error(DT_ERR_INVALID_ARGUMENT, "dt_save: npieces %d with pieces %s", np,
                         pc ? "set" : "NULL");
    int nlocal = dt_mesh_num_local_devices(mesh);
    for (int i = 0; i < np; i++) {
        const dt_ckpt_piece *p = &pc[i];
        dt_status st = dt__ckpt_check_name("dt_save", "tensor", p->name);
        if (st != DT_OK)
            return st;
        if (p->rank < 0 || p->rank > DT_MAX_RANK)
            return dt__error(DT_ERR_INVALID_ARGUMENT,
                             "dt_save: piece %d of tensor '%s': rank %d outside [0, %d]", i,
                             p->name, p->rank, DT_MAX_RANK);
        if ((unsigned)p->dtype >= DT_DTYPE_COUNT_)
            return dt__error(DT_ERR_INVALID_ARGUMENT,
                             "dt_save: piece %d of tensor '%s': bad dtype %d", i, p->name,
                             (int)p->dtype);
        if (p->rank > 0 && (!p->shape || !p->offsets || !p->sizes))
            return dt__error(DT_ERR_INVALID_ARGUMENT,
                             "dt_save: piece %d of tensor '%s': NULL shape, offsets or sizes", i,
                             p->name);
        if (p->device < 0 || p->device >= nlocal)
            return dt__error(DT_ERR_INVALID_ARGUMENT,
                             "dt_save: piece %d of tensor '%s': device %d is not one of this "
                             "client's %d devices of the mesh",
                             i, p->name, p->device, nlocal);
        int empty = 0;
        for (int d = 0; d < p->rank; d++) {
            if (p->shape[d] < 0 || p->shape[d] > DIM_MAX || p->offsets[d] < 0 ||
                p->offsets[d] > DIM_MAX || p->sizes[d] < 0 || p->sizes[d] > DIM_MAX)
                return dt__error(DT_ERR_INVALID_ARGUMENT,
                                 "dt_save: piece %d of tensor '%s': dim %d: shape %" PRId64
                                 ", offset %" PRId64 ", size %" PRId64
                                 " (each must be in [0, 2^50])",
                                 i, p->name, d, p->shape[d], p->offsets[d], p->sizes[d]);
            empty |= p->sizes[d] == 0;
        }
        if (!empty && !p->data)
            return dt__error(DT_ERR_INVALID_ARGUMENT, "dt_save: piece %d of tensor '%s': NULL data",
                             i, p->name);
    }
    return DT_OK;
}

/* ---- the gather ------------------------------------------------------------------------------ */

/* A descriptor as int64 words: name bytes (with NUL, padded to 8), dtype, rank, position,
 * local index, then shape, offsets and sizes (rank each), then the name. */
enum { HEAD_WORDS = 5 };

static int64_t name_words(const char *name)
{
    return (int64_t)((strlen(name) + 1 + 7) / 8);
}

static int64_t desc_words(const dt_ckpt_piece *p)
{
    return HEAD_WORDS + 3 * p->rank + name_words(p->name);
}

static void encode(const dt_mesh *mesh, const dt_ckpt_piece *p, int local, int64_t *w)
{
    int64_t nw = name_words(p->name);
    w[0] = nw;
    w[1] = (int64_t)p->dtype;
    w[2] = p->rank;
    w[3] = dt_mesh_position(mesh, dt_mesh_local_device_id(mesh, p->device));
    w[4] = local;
    for (int d = 0; d < p->rank; d++) {
        w[HEAD_WORDS + d] = p->shape[d];
        w[HEAD_WORDS + p->rank + d] = p->offsets[d];
        w[HEAD_WORDS + 2 * p->rank + d] = p->sizes[d];
    }
    char *name = (char *)(w + HEAD_WORDS + 3 * p->rank);
    memset(name, 0, (size_t)nw * 8);
    memcpy(name, p->name, strlen(p->name));
}

/* Every client's descriptors into *buf_out (owned) and *descs_out (owned, pointing into it),
 * in group order then each client's order. */
static dt_status gather(const dt_mesh *mesh, const dt__group *g, int np, const dt_ckpt_piece *pc,
                        char **buf_out, desc **descs_out, int64_t *count_out)
{
    int64_t mine = 0;
    for (int i = 0; i < np; i++)
        mine += desc_words(&pc[i]);
    int64_t *words = calloc((size_t)g->size, sizeof *words);
    int *counts = calloc((size_t)g->size, sizeof *counts);
    int *displs = calloc((size_t)g->size, sizeof *displs);
    int64_t *send = malloc(((size_t)mine + 1) * sizeof *send);
    int64_t *recv = NULL;
    desc *ds = NULL;
    dt_status st = DT_ERR_NO_MEMORY;
    if (!words || !counts || !displs || !send)
        goto out;
    for (int i = 0, k = 0; i < np; k += (int)desc_words(&pc[i]), i++)
        encode(mesh, &pc[i], i, send + k);
    MPI_Request req = MPI_REQUEST_NULL;
    int rc = MPI_Iallgather(&mine, 1, MPI_INT64_T, words, 1, MPI_INT64_T, g->comm, &req);
    if ((st = dt__ckpt_wait(g, &req, rc, "dt_save: gathering the pieces")) != DT_OK)
        goto lost;
    st = DT_ERR_NO_MEMORY;
    int64_t total = 0;
    for (int r = 0; r < g->size; r++) {
        displs[r] = (int)total;
        counts[r] = (int)words[r];
        total += words[r];
        if (total > INT_MAX) { /* the same on every client: all return here */
            st = dt__error(DT_ERR_INVALID_ARGUMENT,
                           "dt_save: too many pieces (their descriptors exceed 16 GiB)");
            goto out;
        }
    }
    recv = malloc(((size_t)total + 1) * sizeof *recv);
    if (!recv)
        goto out;
    rc = MPI_Iallgatherv(send, (int)mine, MPI_INT64_T, recv, counts, displs, MPI_INT64_T,
                         g->comm, &req);
    if ((st = dt__ckpt_wait(g, &req, rc, "dt_save: gathering the pieces")) != DT_OK)
        goto lost;
    st = DT_ERR_NO_MEMORY;
    /* Fewer descriptors than words / HEAD_WORDS. */
    ds = malloc(((size_t)(total / HEAD_WORDS) + 1) * sizeof *ds);
    if (!ds)
        goto out;
    int64_t nd = 0;
    for (int r = 0; r < g->size; r++)
        for (int64_t k = displs[r]; k < (int64_t)displs[r] + counts[r];) {
            const int64_t *w = recv + k;
            desc *d = &ds[nd++];
            d->dtype = (dt_dtype)w[1];
            d->rank = (int)w[2];
            d->position = w[3];
            d->local = (int)w[4];
            d->client = r;
            d->shape = w + HEAD_WORDS;
            d->off = w + HEAD_WORDS + d->rank;
            d->size = w + HEAD_WORDS + 2 * d->rank;
            d->name = (const char *)(w + HEAD_WORDS + 3 * d->rank);
            k += HEAD_WORDS + 3 * d->rank + w[0];
        }
    *buf_out = (char *)recv;
    *descs_out = ds;
    *count_out = nd;
    recv = NULL;
    ds = NULL;
    st = DT_OK;
out:
    if (st == DT_ERR_NO_MEMORY)
        dt__error(st, "dt_save: no memory for the pieces");
    free(words);
    free(counts);
    free(displs);
    free(send);
    free(recv);
    free(ds);
    return st;
lost:
    /* Not DT_ERR_TIMEOUT: the collective ended, its buffers may go. Else it is still pending
     * and MPI may write into them: they are left allocated. */
    if (st != DT_ERR_TIMEOUT)
        goto out;
    free(ds);
    return st;
}

/* ---- the checks on the whole list ------------------------------------------------------------ */

/* "box [0,4]+[2,3] from client 1's device 0" */
static void describe(char *buf, size_t len, const dt__group *g, const desc *d)
{
    char o[160], s[160];
    dt__shape_str(d->rank, d->off, o, sizeof o);
    dt__shape_str(d->rank, d->size, s, sizeof s);
    snprintf(buf, len, "box %s+%s from client %d (its piece %d)", o, s, g->clients[d->client],
             d->local);
}

static int cmp_desc(const void *pa, const void *pb, void *arg)
{
    const desc *ds = arg;
    int64_t a = *(const int64_t *)pa, b = *(const int64_t *)pb;
    int c = strcmp(ds[a].name, ds[b].name);
    if (c)
        return c;
    return a < b ? -1 : a > b;
}

static int cmp_first(const void *pa, const void *pb)
{
    const int64_t *a = pa, *b = pb; /* (first descriptor, group start) pairs */
    return a[0] < b[0] ? -1 : a[0] > b[0];
}

static int cmp_str(const void *pa, const void *pb)
{
    return strcmp(*(const char *const *)pa, *(const char *const *)pb);
}

/* The pieces of one tensor (descriptors idx[0..k)): agreeing, inside, tiling. */
static dt_status check_tensor(const dt__group *g, const desc *ds, const int64_t *idx, int64_t k,
                              ck_box *boxes)
{
    const desc *f = &ds[idx[0]];
    char a[400], b[400], sh[160];
    uint64_t numel = 1;
    for (int d = 0; d < f->rank; d++)
        if (__builtin_mul_overflow(numel, (uint64_t)f->shape[d], &numel) ||
            numel > (uint64_t)DIM_MAX)
            return dt__error(DT_ERR_INVALID_ARGUMENT,
                             "dt_save: tensor '%s' has more than 2^50 elements", f->name);
    dt__shape_str(f->rank, f->shape, sh, sizeof sh);
    uint64_t covered = 0;
    int64_t nb = 0;
    for (int64_t i = 0; i < k; i++) {
        const desc *p = &ds[idx[i]];
        int same = p->dtype == f->dtype && p->rank == f->rank;
        for (int d = 0; same && d < f->rank; d++)
            same = p->shape[d] == f->shape[d];
        if (!same) {
            char psh[160];
            dt__shape_str(p->rank, p->shape, psh, sizeof psh);
            describe(a, sizeof a, g, f);
            describe(b, sizeof b, g, p);
            return dt__error(DT_ERR_INVALID_ARGUMENT,
                             "dt_save: pieces of tensor '%s' disagree: %s says %s %s, %s says "
                             "%s %s",
                             f->name, a, dt_dtype_name(f->dtype), sh, b, dt_dtype_name(p->dtype),
                             psh);
        }
        uint64_t vol = 1;
        for (int d = 0; d < p->rank; d++) {
            if (p->off[d] + p->size[d] > p->shape[d]) {
                describe(a, sizeof a, g, p);
                return dt__error(DT_ERR_INVALID_ARGUMENT,
                                 "dt_save: piece of tensor '%s' %s: %s lies outside the "
                                 "tensor (dim %d)",
                                 f->name, sh, a, d);
            }
            vol *= (uint64_t)p->size[d]; /* inside a tensor of <= 2^50 elements */
        }
        if (vol == 0)
            continue;
        if (__builtin_add_overflow(covered, vol, &covered))
            covered = UINT64_MAX;
        memcpy(boxes[nb].off, p->off, (size_t)p->rank * sizeof(int64_t));
        memcpy(boxes[nb].size, p->size, (size_t)p->rank * sizeof(int64_t));
        boxes[nb++].id = idx[i];
    }
    int64_t x = 0, y = 0;
    if (dt__ckpt_find_overlap(f->rank, boxes, nb, &x, &y)) {
        describe(a, sizeof a, g, &ds[x]);
        describe(b, sizeof b, g, &ds[y]);
        return dt__error(DT_ERR_INVALID_ARGUMENT,
                         "dt_save: pieces of tensor '%s' %s overlap: %s and %s", f->name, sh, a, b);
    }
    if (covered != numel)
        return dt__error(DT_ERR_INVALID_ARGUMENT,
                         "dt_save: pieces of tensor '%s' %s leave a gap: they cover %" PRIu64
                         " of its %" PRIu64 " elements",
                         f->name, sh, covered, numel);
    return DT_OK;
}

void dt__ckpt_pieces_free(ck_pieces *p)
{
    if (!p)
        return;
    free(p->names);
    free(p->dtypes);
    free(p->ranks);
    free(p->shapes);
    free(p->shape_ptrs);
    free(p->pieces);
    free(p->buf);
    memset(p, 0, sizeof *p);
}

dt_status dt__ckpt_pieces_gather(const dt_mesh *mesh, const dt__group *g, int n,
                                 const char *const *names, int np, const dt_ckpt_piece *pc,
                                 ck_pieces *out)
{
    memset(out, 0, sizeof *out);
    desc *ds = NULL;
    int64_t nd = 0;
    dt_status st = gather(mesh, g, np, pc, &out->buf, &ds, &nd);
    if (st != DT_OK)
        return st;
    int64_t *idx = malloc(((size_t)nd + 1) * sizeof *idx);
    int64_t *groups = malloc(((size_t)nd + 1) * 2 * sizeof *groups);
    ck_box *boxes = malloc(((size_t)nd + 1) * sizeof *boxes);
    const char **sorted = malloc(((size_t)n + 1) * sizeof *sorted);
    int64_t *tensor_of = malloc(((size_t)nd + 1) * sizeof *tensor_of);
    st = DT_ERR_NO_MEMORY;
    if (!idx || !groups || !boxes || !sorted || !tensor_of)
        goto err;
    /* Group by name (sorted, ties in gather order), tensors in order of first appearance. */
    for (int64_t i = 0; i < nd; i++)
        idx[i] = i;
    qsort_r(idx, (size_t)nd, sizeof *idx, cmp_desc, ds);
    int64_t ng = 0;
    for (int64_t i = 0; i < nd; i++)
        if (i == 0 || strcmp(ds[idx[i]].name, ds[idx[i - 1]].name) != 0) {
            groups[2 * ng] = idx[i];
            groups[2 * ng++ + 1] = i;
        }
    qsort(groups, (size_t)ng, 2 * sizeof *groups, cmp_first);
    if (ng > INT_MAX - n) {
        st = dt__error(DT_ERR_INVALID_ARGUMENT, "dt_save: too many tensors");
        goto err;
    }
    for (int t = 0; t < n; t++)
        sorted[t] = names[t];
    qsort(sorted, (size_t)n, sizeof *sorted, cmp_str);
    out->ntensors = (int)ng;
    out->names = calloc((size_t)ng + 1, sizeof *out->names);
    out->dtypes = calloc((size_t)ng + 1, sizeof *out->dtypes);
    out->ranks = calloc((size_t)ng + 1, sizeof *out->ranks);
    out->shapes = calloc((size_t)ng + 1, sizeof *out->shapes);
    out->shape_ptrs = calloc((size_t)ng + 1, sizeof *out->shape_ptrs);
    out->pieces = calloc((size_t)nd + 1, sizeof *out->pieces);
    if (!out->names || !out->dtypes || !out->ranks || !out->shapes || !out->shape_ptrs ||
        !out->pieces)
        goto err;
    for (int64_t t = 0; t < ng; t++) {
        int64_t start = groups[2 * t + 1], end = start + 1;
        while (end < nd && strcmp(ds[idx[end]].name, ds[idx[start]].name) == 0)
            end++;
        const desc *f = &ds[idx[start]];
        if (bsearch(&f->name, sorted, (size_t)n, sizeof *sorted, cmp_str)) {
            st = dt__error(DT_ERR_INVALID_ARGUMENT,
                           "dt_save: tensor '%s' is given both in names and as pieces", f->name);
            goto err;
        }
        if ((st = check_tensor(g, ds, idx + start, end - start, boxes)) != DT_OK)
            goto err;
        out->names[t] = f->name;
        out->dtypes[t] = f->dtype;
        out->ranks[t] = f->rank;
        memcpy(out->shapes[t], f->shape, (size_t)f->rank * sizeof(int64_t));
        out->shape_ptrs[t] = out->shapes[t];
        for (int64_t i = start; i < end; i++)
            tensor_of[idx[i]] = n + t;
    }
    for (int64_t i = 0; i < nd; i++) {
        ck_plan_piece *p = &out->pieces[i];
        p->tensor = (int)tensor_of[i];
        p->position = ds[i].position;
        memcpy(p->off, ds[i].off, (size_t)ds[i].rank * sizeof(int64_t));
        memcpy(p->size, ds[i].size, (size_t)ds[i].rank * sizeof(int64_t));
        p->client = ds[i].client;
        p->local = ds[i].local;
    }
    out->npieces = nd;
    st = DT_OK;
err:
    if (st == DT_ERR_NO_MEMORY)
        dt__error(st, "dt_save: no memory for the pieces");
    free(ds);
    free(idx);
    free(groups);
    free(boxes);
    free(sorted);
    free(tensor_of);
    if (st != DT_OK)
        dt__ckpt_pieces_free(out);
    return st;
}

dt_status dt__ckpt_pieces_clone(const ck_pieces *src, ck_pieces *dst)
{
    memset(dst, 0, sizeof *dst);
    int n = src->ntensors;
    size_t text = 1;
    for (int t = 0; t < n; t++)
        text += strlen(src->names[t]) + 1;
    dst->names = calloc((size_t)n + 1, sizeof *dst->names);
    dst->dtypes = calloc((size_t)n + 1, sizeof *dst->dtypes);
    dst->ranks = calloc((size_t)n + 1, sizeof *dst->ranks);
    dst->shapes = calloc((size_t)n + 1, sizeof *dst->shapes);
    dst->shape_ptrs = calloc((size_t)n + 1, sizeof *dst->shape_ptrs);
    dst->pieces = calloc((size_t)src->npieces + 1, sizeof *dst->pieces);
    dst->buf = malloc(text);
    if (!dst->names || !dst->dtypes || !dst->ranks || !dst->shapes || !dst->shape_ptrs ||
        !dst->pieces || !dst->buf) {
        dt__ckpt_pieces_free(dst);
        return dt__error(DT_ERR_NO_MEMORY, "dt_save: no memory for the pieces");
    }
    char *p = dst->buf;
    for (int t = 0; t < n; t++) {
        size_t k = strlen(src->names[t]) + 1;
        memcpy(p, src->names[t], k);
        dst->names[t] = p;
        p += k;
        dst->dtypes[t] = src->dtypes[t];
        dst->ranks[t] = src->ranks[t];
        memcpy(dst->shapes[t], src->shapes[t], sizeof dst->shapes[t]);
        dst->shape_ptrs[t] = dst->shapes[t];
    }
    if (src->npieces)
        memcpy(dst->pieces, src->pieces, (size_t)src->npieces * sizeof *dst->pieces);
    dst->ntensors = n;
    dst->npieces = src->npieces;
    return DT_OK;
}
