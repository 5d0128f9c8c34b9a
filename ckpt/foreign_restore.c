/* dt_foreign_view_shape and dt_foreign_restore: a view (rows, split, transpose, zero padding)
 * of a stored tensor is mapped back to the stored box each target component needs, which its
 * device reads with pread in contiguous runs, converts and transposes on the host. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ckpt/ckpt_impl.h"
#include "layout/tensor_dev.h"
#include "mesh/mesh_group.h"
#include "runtime/device.h"
#include "runtime/error.h"
#include "runtime/group.h"
#include "runtime/half.h"
#include "runtime/util.h"

/* A resolved view: the stored tensor, the stored offset of the selection, the result's
 * shape (padded) and its rows before padding. */
typedef struct ck_fview {
    const ck_ftensor *t;
    int rank;
    int64_t shape[DT_MAX_RANK];
    int64_t rows;
    int64_t base[DT_MAX_RANK];
    int transpose;
} ck_fview;

static dt_status resolve(const dt_foreign *src, const dt_foreign_view *view, const char *fn,
                         ck_fview *v)
{
    if (!src || !view || !view->source)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "%s: NULL source or view", fn);
    int64_t ti = dt__foreign_lookup(src, view->source);
    if (ti < 0)
        return dt__error(DT_ERR_NOT_FOUND, "%s: %s: no tensor '%s'", fn, src->shown,
                         view->source);
    const ck_ftensor *t = &src->tensors[ti];
    const char *file = src->files[t->file].path;
    memset(v, 0, sizeof *v);
    v->t = t;
    v->rank = t->rank;
    int64_t sel[DT_MAX_RANK];
    for (int d = 0; d < t->rank; d++)
        sel[d] = t->shape[d];
    int64_t rb = view->row_begin, re = view->row_end;
    if (t->rank == 0 && (rb != 0 || re >= 0 || view->split_parts > 1 || view->transpose ||
                         view->pad_rows > 0))
        return dt__error(DT_ERR_SHAPE, "%s: %s: tensor '%s' is a scalar: no rows, split, "
                         "transpose or padding", fn, file, t->name);
    if (t->rank > 0) {
        if (re < 0)
            re = t->shape[0];
        if (rb < 0 || rb > re || re > t->shape[0])
            return dt__error(DT_ERR_SHAPE, "%s: %s: tensor '%s': rows [%" PRId64 ", %" PRId64
                             ") outside its %" PRId64 " rows", fn, file, t->name, rb, re,
                             t->shape[0]);
        sel[0] = re - rb;
        v->base[0] = rb;
    }
    if (view->split_parts < 1)
        return dt__error(DT_ERR_SHAPE, "%s: %s: tensor '%s': split_parts %d < 1", fn, file,
                         t->name, view->split_parts);
    if (view->split_parts > 1) {
        int d = view->split_dim, k = view->split_index;
        if (d < 0 || d >= t->rank || k < 0 || k >= view->split_parts ||
            sel[d] % view->split_parts != 0)
            return dt__error(DT_ERR_SHAPE, "%s: %s: tensor '%s': cannot take part %d of %d "
                             "along dim %d", fn, file, t->name, k, view->split_parts, d);
        sel[d] /= view->split_parts;
        v->base[d] += (int64_t)k * sel[d];
    }
    for (int d = 0; d < t->rank; d++)
        v->shape[d] = sel[d];
    if (view->transpose) {
        if (t->rank != 2)
            return dt__error(DT_ERR_SHAPE, "%s: %s: tensor '%s' has rank %d: only a 2-D "
                             "tensor is transposed", fn, file, t->name, t->rank);
        v->transpose = 1;
        v->shape[0] = sel[1];
        v->shape[1] = sel[0];
    }
    v->rows = t->rank > 0 ? v->shape[0] : 1;
    if (view->pad_rows > 0) {
        if (view->pad_rows < v->rows)
            return dt__error(DT_ERR_SHAPE, "%s: %s: tensor '%s': pad_rows %" PRId64 " below "
                             "its %" PRId64 " rows", fn, file, t->name, view->pad_rows,
                             v->rows);
        v->shape[0] = view->pad_rows;
    }
    return DT_OK;
}

dt_status dt_foreign_view_shape(const dt_foreign *src, const dt_foreign_view *view,
                                int *rank_out, int64_t *shape_out)
{
    ck_fview v;
    if (!rank_out || !shape_out)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "dt_foreign_view_shape: NULL output");
    dt_status st = resolve(src, view, "dt_foreign_view_shape", &v);
    if (st != DT_OK)
        return st;
    *rank_out = v.rank;
    for (int d = 0; d < DT_MAX_RANK; d++)
        shape_out[d] = d < v.rank ? v.shape[d] : 0;
    return DT_OK;
}

/* ---- element conversion ------------------------------------------------------------------ */

static int convertible(dt_dtype d)
{
    return d == DT_DTYPE_F32 || d == DT_DTYPE_F64 || d == DT_DTYPE_F16 || d == DT_DTYPE_BF16;
}

static double load(dt_dtype d, const void *p, int64_t i)
{
    uint16_t h;
    float f;
    double x;
    switch (d) {
    case DT_DTYPE_F64:
        memcpy(&x, (const char *)p + 8 * i, 8);
        return x;
    case DT_DTYPE_F16:
        memcpy(&h, (const char *)p + 2 * i, 2);
        return dt__f16_to_f32(h);
    case DT_DTYPE_BF16:
        memcpy(&h, (const char *)p + 2 * i, 2);
        return dt__bf16_to_f32(h);
    default:
        memcpy(&f, (const char *)p + 4 * i, 4);
        return f;
    }
}

static void store(dt_dtype d, void *p, int64_t i, double x)
{
    uint16_t h;
    float f = (float)x;
    switch (d) {
    case DT_DTYPE_F64:
        memcpy((char *)p + 8 * i, &x, 8);
        break;
    case DT_DTYPE_F16:
        h = dt__f32_to_f16(f);
        memcpy((char *)p + 2 * i, &h, 2);
        break;
    case DT_DTYPE_BF16:
        h = dt__f32_to_bf16(f);
        memcpy((char *)p + 2 * i, &h, 2);
        break;
    default:
        memcpy((char *)p + 4 * i, &f, 4);
        break;
    }
}

/* ---- reading one component ---------------------------------------------------------------- */

typedef struct ck_freader {
    const dt_foreign *src;
    int *fds;
    const char *fn;
} ck_freader;

static dt_status file_fd(ck_freader *rd, int64_t f, const char *tensor, int *fd_out)
{
    if (rd->fds[f] < 0) {
        int fd = open(rd->src->files[f].path, O_RDONLY | O_CLOEXEC);
        if (fd < 0)
            return dt__error(DT_ERR_IO, "%s: %s: tensor '%s': %s", rd->fn,
                             rd->src->files[f].path, tensor, strerror(errno));
        rd->fds[f] = fd;
    }
    *fd_out = rd->fds[f];
    return DT_OK;
}

static void count_bytes(const dt_foreign *src, int device, uint64_t bytes)
{
    ck_fstats *s = src->stats;
    s->total += bytes;
    if (device < 0)
        return;
    if (device >= s->n) {
        int n = device + 1;
        uint64_t *b = realloc(s->by_device, (size_t)n * sizeof *b);
        if (!b)
            return;
        memset(b + s->n, 0, (size_t)(n - s->n) * sizeof *b);
        s->by_device = b;
        s->n = n;
    }
    s->by_device[device] += bytes;
}

/* Stored box (off, sz) of t into buf (compact, stored dtype): one pread per contiguous run. */
static dt_status read_box(ck_freader *rd, const ck_ftensor *t, const int64_t *off,
                          const int64_t *sz, void *buf, int device)
{
    int r = t->rank;
    int64_t n = dt__numel(r, sz);
    if (n == 0)
        return DT_OK;
    size_t es = dt_dtype_size(t->dtype);
    int fd = -1;
    dt_status st = file_fd(rd, t->file, t->name, &fd);
    if (st != DT_OK)
        return st;
    /* Dims k.. form one run: every dim after k is whole. */
    int k = r > 0 ? r - 1 : 0;
    while (k > 0 && sz[k] == t->shape[k])
        k--;
    int64_t run = 1;
    for (int d = k; d < r; d++)
        run *= sz[d];
    int64_t stride[DT_MAX_RANK + 1];
    stride[r] = 1;
    for (int d = r - 1; d >= 0; d--)
        stride[d] = stride[d + 1] * t->shape[d];
    int64_t idx[DT_MAX_RANK] = {0};
    char *out = buf;
    for (int64_t done = 0; done < n; done += run) {
        int64_t lin = 0;
        for (int d = 0; d < r; d++)
            lin += (off[d] + (d < k ? idx[d] : 0)) * stride[d + 1];
        uint64_t at = t->offset + (uint64_t)lin * es, len = (uint64_t)run * es;
        int64_t got = dt__ckpt_pread(fd, out, (size_t)len, at);
        if (got < 0)
            return dt__error(DT_ERR_IO, "%s: %s: tensor '%s': %s", rd->fn,
                             rd->src->files[t->file].path, t->name, strerror(errno));
        if ((uint64_t)got != len)
            return dt__error(DT_ERR_CORRUPT, "%s: %s: tensor '%s': the file ends before its "
                             "data (truncated since it was opened?)", rd->fn,
                             rd->src->files[t->file].path, t->name);
        count_bytes(rd->src, device, len);
        out += len;
        for (int d = k - 1; d >= 0; d--) {
            if (++idx[d] < sz[d])
                break;
            idx[d] = 0;
        }
    }
    return DT_OK;
}

/* Component (coff, cshape) of view v's result into dst (host memory, dtype `dt`). */
static dt_status fill_component(ck_freader *rd, const ck_fview *v, const int64_t *coff,
                                const int64_t *cshape, void *dst, dt_dtype dt, int device)
{
    int r = v->rank;
    size_t tes = dt_dtype_size(dt);
    int64_t rowlen = 1;
    for (int d = 1; d < r; d++)
        rowlen *= cshape[d];
    /* Rows of the component that hold data; the rest is zero padding. */
    int64_t nrows = r > 0 ? cshape[0] : 1;
    int64_t data_rows = nrows;
    if (r > 0) {
        int64_t end = coff[0] + cshape[0] < v->rows ? coff[0] + cshape[0] : v->rows;
        data_rows = end > coff[0] ? end - coff[0] : 0;
    }
    if (data_rows < nrows)
        memset((char *)dst + (size_t)(data_rows * rowlen) * tes, 0,
               (size_t)((nrows - data_rows) * rowlen) * tes);
    if (data_rows == 0 || rowlen == 0)
        return DT_OK;
    int64_t roff[DT_MAX_RANK], rsz[DT_MAX_RANK], soff[DT_MAX_RANK], ssz[DT_MAX_RANK];
    for (int d = 0; d < r; d++) {
        roff[d] = coff[d];
        rsz[d] = d == 0 ? data_rows : cshape[d];
    }
    for (int d = 0; d < r; d++) {
        int s = v->transpose ? 1 - d : d;
        soff[s] = roff[d] + v->base[s];
        ssz[s] = rsz[d];
    }
    int64_t n = data_rows * rowlen;
    if (!v->transpose && v->t->dtype == dt)
        return read_box(rd, v->t, soff, ssz, dst, device);
    void *tmp = malloc((size_t)n * dt_dtype_size(v->t->dtype));
    if (!tmp)
        return dt__error(DT_ERR_NO_MEMORY, "%s: no memory for tensor '%s'", rd->fn,
                         v->t->name);
    dt_status st = read_box(rd, v->t, soff, ssz, tmp, device);
    if (st == DT_OK && !v->transpose) {
        for (int64_t i = 0; i < n; i++)
            store(dt, dst, i, load(v->t->dtype, tmp, i));
    } else if (st == DT_OK) {
        /* dst [a, b] = tmp [b, a]; tmp is ssz = [rsz[1], rsz[0]]. */
        int64_t a = rsz[0], b = rsz[1];
        for (int64_t i = 0; i < a; i++)
            for (int64_t j = 0; j < b; j++)
                store(dt, dst, i * b + j, load(v->t->dtype, tmp, j * a + i));
    }
    free(tmp);
    return st;
}

static dt_status restore_one(ck_freader *rd, const ck_fview *v, dt_tensor *t)
{
    dt_dtype dt = dt_tensor_dtype(t);
    size_t es = dt_dtype_size(dt);
    for (int i = 0; i < dt_tensor_num_local(t); i++) {
        const DLTensor *x = dt_tensor_local(t, i);
        const dt__device *dev = dt__tensor_device(t, i);
        int64_t n = dt__numel(v->rank, x->shape);
        if (n == 0)
            continue;
        void *host = dev->kind->host_visible ? x->data : malloc((size_t)n * es);
        if (!host)
            return dt__error(DT_ERR_NO_MEMORY, "%s: no memory for tensor '%s'", rd->fn,
                             v->t->name);
        dt_status st = fill_component(rd, v, dt_tensor_local_offset(t, i), x->shape, host, dt,
                                      dev->global_id);
        if (st == DT_OK && host != x->data)
            st = dt_tensor_local_write(t, i, host, (size_t)n * es);
        if (host != x->data)
            free(host);
        if (st != DT_OK)
            return st;
    }
    return DT_OK;
}

dt_status dt_foreign_restore(const dt_foreign *src, int n, const dt_foreign_view *views,
                             dt_tensor *const *tensors)
{
    const char *fn = "dt_foreign_restore";
    if (!src || n <= 0 || !views || !tensors)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "%s: NULL source, views or tensors, or n <= 0",
                         fn);
    for (int i = 0; i < n; i++)
        if (!tensors[i])
            return dt__error(DT_ERR_INVALID_ARGUMENT, "%s: tensor %d is NULL", fn, i);
    const dt_mesh *mesh = dt_layout_mesh(dt_tensor_layout(tensors[0]));
    dt_status st = dt_mesh_check_devices(mesh);
    if (st != DT_OK)
        return st;
    const dt__group *g = NULL;
    if ((st = dt__mesh_group(mesh, &g)) != DT_OK)
        return st;
    /* Argument checks are the same on every client: a failure returns at once everywhere. */
    for (int i = 0; i < n; i++) {
        const dt_layout *l = dt_tensor_layout(tensors[i]);
        if (!dt_mesh_equal(dt_layout_mesh(l), mesh))
            return dt__error(DT_ERR_INVALID_ARGUMENT, "%s: tensor %d ('%s') is on another mesh",
                             fn, i, views[i].source ? views[i].source : "?");
        if (dt_layout_num_partial(l) > 0)
            return dt__error(DT_ERR_INVALID_ARGUMENT, "%s: tensor %d ('%s'): cannot restore "
                             "into a partial layout", fn, i,
                             views[i].source ? views[i].source : "?");
    }
    ck_freader rd = {src, calloc((size_t)src->nfiles + 1, sizeof(int)), fn};
    if (!rd.fds)
        st = dt__error(DT_ERR_NO_MEMORY, "%s: no memory", fn);
    for (int64_t f = 0; rd.fds && f < src->nfiles; f++)
        rd.fds[f] = -1;
    for (int i = 0; st == DT_OK && i < n; i++) {
        ck_fview v;
        if ((st = resolve(src, &views[i], fn, &v)) != DT_OK)
            break;
        const char *file = src->files[v.t->file].path;
        const int64_t *shape = dt_tensor_shape(tensors[i]);
        int same = dt_tensor_rank(tensors[i]) == v.rank;
        for (int d = 0; same && d < v.rank; d++)
            same = shape[d] == v.shape[d];
        if (!same) {
            char a[160], b[160];
            st = dt__error(DT_ERR_SHAPE, "%s: %s: tensor '%s': the view's shape %s differs "
                           "from the target's %s", fn, file, v.t->name,
                           dt__shape_str(v.rank, v.shape, a, sizeof a),
                           dt__shape_str(dt_tensor_rank(tensors[i]), shape, b, sizeof b));
            break;
        }
        if (!convertible(v.t->dtype) || !convertible(dt_tensor_dtype(tensors[i]))) {
            if (v.t->dtype != dt_tensor_dtype(tensors[i]) || v.transpose) {
                st = dt__error(DT_ERR_INVALID_ARGUMENT, "%s: %s: tensor '%s': cannot convert "
                               "%s to %s", fn, file, v.t->name, dt_dtype_name(v.t->dtype),
                               dt_dtype_name(dt_tensor_dtype(tensors[i])));
                break;
            }
        }
        st = restore_one(&rd, &v, tensors[i]);
    }
    if (st == DT_OK)
        st = dt__device_sync_all(dt_mesh_device_type(mesh));
    for (int64_t f = 0; rd.fds && f < src->nfiles; f++)
        if (rd.fds[f] >= 0)
            close(rd.fds[f]);
    free(rd.fds);
    return dt__ckpt_agree(g, st);
}
