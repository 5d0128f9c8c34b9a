/* dt_tensor: a global shape, a dtype, a retained layout and one local component per local
 * device of the mesh. Creation (zeros, filled), pack / pack_managed / unpack through DLPack,
 * reference counting and queries. */
#include <inttypes.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "layout/tensor_dev.h"
#include "runtime/device.h"
#include "runtime/error.h"
#include "runtime/util.h"
#include "runtime/record.h"

/* One local component. `dl` is the borrowed view handed out by dt_tensor_local; its shape
 * points at `shape`. The memory is either ours (`alloc`, from the host pool or the device) or
 * a managed tensor we took over (`managed`), never both. */
typedef struct component {
    DLTensor dl;
    int64_t shape[DT_MAX_RANK];
    int64_t offset[DT_MAX_RANK];
    int64_t position;
    int device_id;
    const dt__device *dev; /* the local device holding it */
    size_t bytes;
    void *alloc;
    DLManagedTensor *managed;
} component;

/* Serial numbers of tensors, from 1 (0 means none). */
static atomic_uint_fast64_t next_serial = 1;

struct dt_tensor {
    atomic_int refs;
    uint64_t serial; /* unique per tensor in the process (autograd's identity of a value) */
    dt_layout *layout;
    dt_device_type device_type;
    dt_dtype dtype;
    int rank;
    int64_t shape[DT_MAX_RANK];
    int64_t numel;
    int nlocal;
    component *comps;
    dt_tensor *base; /* a shared view (dt__tensor_share): the tensor owning the memory */
};

/* What a unpacked DLManagedTensor points at: the manager context owns the shape array and a
 * reference on the tensor that owns the data. */
typedef struct unpack_ctx {
    DLManagedTensor managed;
    dt_tensor *tensor;
    int64_t shape[DT_MAX_RANK];
} unpack_ctx;

static void free_component_memory(const dt_tensor *t, component *c)
{
    if (c->managed) {
        if (c->managed->deleter)
            c->managed->deleter(c->managed);
    } else if (c->alloc) {
        dt__device_free(c->dev, c->alloc, c->bytes);
    }
    c->managed = NULL;
    c->alloc = NULL;
}

static void free_tensor(dt_tensor *t)
{
    for (int i = 0; i < t->nlocal; i++)
        free_component_memory(t, &t->comps[i]);
    free(t->comps);
    dt_layout_destroy(t->layout);
    dt_tensor_destroy(t->base);
    free(t);
}

/* Builds a tensor with every component described (shape, offset, device, byte size) but no
 * memory: checks the arguments, the mesh against the runtime and the sizes for overflow. */
static dt_status make_skeleton(const char *fn, const dt_layout *layout, dt_dtype dtype,
                               const int64_t *shape, dt_tensor **t_out)
{
    char sbuf[256];
    if (!layout)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "%s: NULL layout", fn);
    if (dt_dtype_size(dtype) == 0)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "%s: invalid dtype %d", fn, (int)dtype);
    int rank = dt_layout_rank(layout);
    if (rank < 0 || rank > DT_MAX_RANK)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "%s: layout rank %d out of range", fn, rank);
    if (rank > 0 && !shape)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "%s: NULL shape for a rank-%d layout", fn,
                         rank);
    size_t numel = 1;
    for (int d = 0; d < rank; d++) {
        if (shape[d] < 0)
            return dt__error(DT_ERR_INVALID_ARGUMENT, "%s: global shape %s has a negative dim",
                             fn, dt__shape_str(rank, shape, sbuf, sizeof sbuf));
        if (dt__mul_size(numel, (size_t)shape[d], &numel) != 0 || numel > (size_t)INT64_MAX)
            return dt__error(DT_ERR_INVALID_ARGUMENT,
                             "%s: global shape %s has more than 2^63-1 elements", fn,
                             dt__shape_str(rank, shape, sbuf, sizeof sbuf));
    }

    const dt_mesh *mesh = dt_layout_mesh(layout);
    dt_status st = dt_mesh_check_devices(mesh);
    if (st != DT_OK)
        return st;
    int nlocal = dt_mesh_num_local_devices(mesh);
    if (nlocal < 0)
        return dt__error(DT_ERR_DEVICE_MISMATCH, "%s: mesh has %d local devices", fn, nlocal);

    dt_tensor *t = calloc(1, sizeof *t);
    if (!t)
        return dt__error(DT_ERR_NO_MEMORY, "%s: cannot allocate the tensor", fn);
    atomic_init(&t->refs, 1);
    t->serial = atomic_fetch_add_explicit(&next_serial, 1, memory_order_relaxed);
    t->device_type = dt_mesh_device_type(mesh);
    t->dtype = dtype;
    t->rank = rank;
    for (int d = 0; d < rank; d++)
        t->shape[d] = shape[d];
    t->numel = (int64_t)numel;
    if (nlocal > 0) {
        t->comps = calloc((size_t)nlocal, sizeof *t->comps);
        if (!t->comps) {
            st = dt__error(DT_ERR_NO_MEMORY, "%s: cannot allocate %d components", fn, nlocal);
            goto err_free_tensor;
        }
    }
    t->layout = dt_layout_retain(layout);
    t->nlocal = nlocal;

    size_t esize = dt_dtype_size(dtype);
    for (int i = 0; i < nlocal; i++) {
        component *c = &t->comps[i];
        c->device_id = dt_mesh_local_device_id(mesh, i);
        c->position = dt_mesh_position(mesh, c->device_id);
        c->dev = dt__device_by_id(t->device_type, c->device_id);
        if (c->position < 0 || !c->dev) {
            st = dt__error(DT_ERR_DEVICE_MISMATCH, "%s: local device %d (device %d) is not in "
                           "the mesh", fn, i, c->device_id);
            goto err_free_tensor;
        }
        st = dt_layout_shard(layout, shape, c->position, c->offset, c->shape);
        if (st != DT_OK)
            goto err_free_tensor;
        size_t n = esize;
        for (int d = 0; d < rank; d++) {
            if (dt__mul_size(n, (size_t)c->shape[d], &n) != 0) {
                st = dt__error(DT_ERR_INVALID_ARGUMENT,
                               "%s: component %d (device %d): shard %s of %s overflows size_t",
                               fn, i, c->device_id,
                               dt__shape_str(rank, c->shape, sbuf, sizeof sbuf),
                               dt_dtype_name(dtype));
                goto err_free_tensor;
            }
        }
        c->bytes = n;
        c->dl.device.device_type = c->dev->kind->dl_type;
        c->dl.device.device_id = c->dev->kind->dl_type == kDLCPU ? 0 : c->dev->ordinal;
        c->dl.ndim = rank;
        c->dl.dtype = dt_dtype_to_dlpack(dtype);
        c->dl.shape = c->shape;
        c->dl.strides = NULL;
        c->dl.byte_offset = 0;
    }
    *t_out = t;
    return DT_OK;

err_free_tensor:
    free_tensor(t);
    return st;
}

/* Gives every component its own memory. Empty components still get a (1-byte) block so
 * that data is never NULL. On failure the caller frees the tensor (and what was allocated). */
static dt_status alloc_components(dt_tensor *t)
{
    for (int i = 0; i < t->nlocal; i++) {
        component *c = &t->comps[i];
        dt_status st = dt__device_alloc(c->dev, c->bytes, &c->alloc);
        if (st != DT_OK)
            return st;
        c->dl.data = c->alloc;
    }
    return DT_OK;
}

/* Sets every element of every component to the element at `value`, or to zero. */
static dt_status fill_components(dt_tensor *t, const void *value)
{
    size_t esize = dt_dtype_size(t->dtype);
    dt_status st = DT_OK;
    for (int i = 0; i < t->nlocal && st == DT_OK; i++) {
        component *c = &t->comps[i];
        if (value)
            st = c->dev->kind->fill(c->dev, c->alloc, (int64_t)(c->bytes / esize), value, esize);
        else
            st = c->dev->kind->memset0(c->dev, c->alloc, c->bytes);
    }
    return st;
}

/* Waits for the devices of the tensor's components (once per device). */
static dt_status sync_components(const dt_tensor *t)
{
    dt_status st = DT_OK;
    for (int i = 0; i < t->nlocal && st == DT_OK; i++) {
        const dt__device *d = t->comps[i].dev;
        int seen = 0;
        for (int j = 0; j < i && !seen; j++)
            seen = t->comps[j].dev->ordinal == d->ordinal && t->comps[j].dev->kind == d->kind;
        if (!seen)
            st = d->kind->sync(d);
    }
    return st;
}

/* value: one element to fill with; NULL: zeros; `fill` 0: leave the memory as it comes. */
static dt_status create_filled(const char *fn, const dt_layout *layout, dt_dtype dtype,
                               const int64_t *shape, const void *value, int fill,
                               dt_tensor **tensor_out)
{
    if (!tensor_out)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "%s: NULL tensor_out", fn);
    dt_tensor *t = NULL;
    dt_status st = make_skeleton(fn, layout, dtype, shape, &t);
    if (st != DT_OK)
        return st;
    st = alloc_components(t);
    if (st != DT_OK)
        goto err_free_tensor;
    if (fill)
        st = fill_components(t, value);
    /* else the caller overwrites every element */
    if (st == DT_OK && fill)
        st = sync_components(t);
    if (st != DT_OK)
        goto err_free_tensor;
    *tensor_out = t;
    return DT_OK;

err_free_tensor:
    free_tensor(t);
    return st;
}

dt_status dt_tensor_zeros(const dt_layout *layout, dt_dtype dtype, const int64_t *shape,
                          dt_tensor **tensor_out)
{
    return create_filled("dt_tensor_zeros", layout, dtype, shape, NULL, 1, tensor_out);
}

dt_status dt__tensor_empty(const dt_layout *layout, dt_dtype dtype, const int64_t *shape,
                           dt_tensor **tensor_out)
{
    return create_filled("relayout", layout, dtype, shape, NULL, 0, tensor_out);
}

dt_status dt_tensor_filled(const dt_layout *layout, dt_dtype dtype, const int64_t *shape,
                           const void *value, dt_tensor **tensor_out)
{
    if (!value)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "dt_tensor_filled: NULL value");
    return create_filled("dt_tensor_filled", layout, dtype, shape, value, 1, tensor_out);
}

/* Names a DLPack type for messages: "f32", or "(code 5, bits 64, lanes 1)". */
static const char *describe_type(char *buf, size_t len, DLDataType type)
{
    for (int i = 0; i < DT_DTYPE_COUNT_; i++) {
        DLDataType k = dt_dtype_to_dlpack((dt_dtype)i);
        if (k.code == type.code && k.bits == type.bits && k.lanes == type.lanes) {
            snprintf(buf, len, "%s", dt_dtype_name((dt_dtype)i));
            return buf;
        }
    }
    snprintf(buf, len, "(code %u, bits %u, lanes %u)", (unsigned)type.code,
             (unsigned)type.bits, (unsigned)type.lanes);
    return buf;
}

static const char *dl_device_name(DLDeviceType type)
{
    switch (type) {
    case kDLCPU: return "kDLCPU";
    case kDLCUDA: return "kDLCUDA";
    case kDLCUDAHost: return "kDLCUDAHost";
    case kDLCUDAManaged: return "kDLCUDAManaged";
    default: return "other";
    }
}

/* Checks component i (as given by the caller) against what the skeleton expects. */
static dt_status check_component(const char *fn, const dt_tensor *t, int i, const DLTensor *x)
{
    const component *c = &t->comps[i];
    char pre[128], a[256], b[256], g[256];
    snprintf(pre, sizeof pre, "%s: component %d (device %d, mesh position %" PRId64 ")", fn, i,
             c->device_id, c->position);
    if (x->ndim != t->rank)
        return dt__error(DT_ERR_SHAPE, "%s: ndim %d but the layout has rank %d", pre, x->ndim,
                         t->rank);
    DLDataType want = dt_dtype_to_dlpack(t->dtype);
    if (x->dtype.code != want.code || x->dtype.bits != want.bits ||
        x->dtype.lanes != want.lanes)
        return dt__error(DT_ERR_SHAPE, "%s: dtype %s but the tensor's dtype is %s (from "
                         "component 0)", pre, describe_type(a, sizeof a, x->dtype),
                         dt_dtype_name(t->dtype));
    if (x->device.device_type != c->dl.device.device_type ||
        (c->dl.device.device_type != kDLCPU && x->device.device_id != c->dl.device.device_id))
        return dt__error(DT_ERR_DEVICE_MISMATCH, "%s: DLPack device %s:%d but the %s mesh needs "
                         "%s:%d (%s device %d)", pre, dl_device_name(x->device.device_type),
                         x->device.device_id, dt_device_type_name(t->device_type),
                         dl_device_name(c->dl.device.device_type), c->dl.device.device_id,
                         c->dev->kind->name, c->device_id);
    if (t->rank > 0 && !x->shape)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "%s: NULL shape", pre);
    for (int d = 0; d < t->rank; d++) {
        if (x->shape[d] != c->shape[d])
            return dt__error(DT_ERR_SHAPE, "%s: shape %s but the layout needs %s for global "
                             "shape %s", pre, dt__shape_str(t->rank, x->shape, a, sizeof a),
                             dt__shape_str(t->rank, c->shape, b, sizeof b),
                             dt__shape_str(t->rank, t->shape, g, sizeof g));
    }
    if (x->strides && c->bytes > 0) {
        /* Compact row-major; a dim of size 1 may carry any stride (as PyTorch emits). */
        int64_t expect = 1;
        for (int d = t->rank - 1; d >= 0; d--) {
            if (c->shape[d] != 1 && x->strides[d] != expect)
                return dt__error(DT_ERR_UNSUPPORTED, "%s: strides %s are not compact row-major "
                                 "for shape %s", pre,
                                 dt__shape_str(t->rank, x->strides, a, sizeof a),
                                 dt__shape_str(t->rank, c->shape, b, sizeof b));
            expect *= c->shape[d];
        }
    }
    if (!x->data && c->bytes > 0)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "%s: NULL data for %zu bytes", pre, c->bytes);
    return DT_OK;
}

/* Argument checks shared by both packs; builds the skeleton with the dtype of component 0. */
static dt_status begin_pack(const char *fn, const dt_layout *layout, const int64_t *shape,
                            int n, const DLTensor *first, dt_tensor **t_out)
{
    if (!layout)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "%s: NULL layout", fn);
    const dt_mesh *mesh = dt_layout_mesh(layout);
    dt_status st = dt_mesh_check_devices(mesh);
    if (st != DT_OK)
        return st;
    int nlocal = dt_mesh_num_local_devices(mesh);
    if (n != nlocal)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "%s: %d components given but the mesh has %d "
                         "local devices on client %d", fn, n, nlocal, dt_client_id());
    if (n == 0)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "%s: the mesh has no local devices here, so "
                         "the dtype cannot come from a component (use dt_tensor_zeros)", fn);
    if (!first)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "%s: NULL components", fn);
    dt_dtype dtype;
    st = dt_dtype_from_dlpack(first->dtype, &dtype);
    if (st != DT_OK) {
        char a[64];
        return dt__error(st, "%s: component 0 (device %d): DLPack type %s is not supported "
                         "(f32, f64, f16, bf16, i32, i64, u8 with lanes 1)", fn,
                         dt_mesh_local_device_id(mesh, 0),
                         describe_type(a, sizeof a, first->dtype));
    }
    return make_skeleton(fn, layout, dtype, shape, t_out);
}

dt_status dt_tensor_pack(const dt_layout *layout, const int64_t *shape, int n,
                         const DLTensor *components, dt_tensor **tensor_out)
{
    static const char fn[] = "dt_tensor_pack";
    if (!tensor_out)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "%s: NULL tensor_out", fn);
    dt_tensor *t = NULL;
    dt_status st = begin_pack(fn, layout, shape, n, components, &t);
    if (st != DT_OK)
        return st;
    for (int i = 0; i < n; i++) {
        st = check_component(fn, t, i, &components[i]);
        if (st != DT_OK)
            goto err_free_tensor;
    }
    st = alloc_components(t);
    if (st != DT_OK)
        goto err_free_tensor;
    for (int i = 0; i < n; i++) {
        component *c = &t->comps[i];
        if (c->bytes == 0)
            continue;
        const char *src = (const char *)components[i].data + components[i].byte_offset;
        st = c->dev->kind->copy(c->dev, DT__COPY_D2D, c->alloc, src, c->bytes);
        if (st != DT_OK)
            goto err_free_tensor;
    }
    st = sync_components(t);
    if (st != DT_OK)
        goto err_free_tensor;
    *tensor_out = t;
    return DT_OK;

err_free_tensor:
    free_tensor(t);
    return st;
}

dt_status dt_tensor_pack_managed(const dt_layout *layout, const int64_t *shape, int n,
                                 DLManagedTensor *const *components, dt_tensor **tensor_out)
{
    static const char fn[] = "dt_tensor_pack_managed";
    if (!tensor_out)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "%s: NULL tensor_out", fn);
    if (n > 0 && !components)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "%s: NULL components", fn);
    for (int i = 0; i < n; i++) {
        if (!components[i])
            return dt__error(DT_ERR_INVALID_ARGUMENT, "%s: component %d is NULL", fn, i);
        for (int j = 0; j < i; j++)
            if (components[j] == components[i])
                return dt__error(DT_ERR_INVALID_ARGUMENT, "%s: components %d and %d are the "
                                 "same managed tensor", fn, j, i);
    }
    dt_tensor *t = NULL;
    dt_status st = begin_pack(fn, layout, shape, n, n > 0 ? &components[0]->dl_tensor : NULL,
                              &t);
    if (st != DT_OK)
        return st;
    for (int i = 0; i < n; i++) {
        st = check_component(fn, t, i, &components[i]->dl_tensor);
        if (st != DT_OK)
            goto err_free_tensor;
    }
    /* Nothing can fail from here: take ownership of every component at once. */
    for (int i = 0; i < n; i++) {
        component *c = &t->comps[i];
        const DLTensor *x = &components[i]->dl_tensor;
        c->managed = components[i];
        c->dl.data = x->data ? (char *)x->data + x->byte_offset : NULL;
    }
    *tensor_out = t;
    return DT_OK;

err_free_tensor:
    free_tensor(t);
    return st;
}

dt_status dt__tensor_share(const dt_tensor *src, const dt_layout *layout, dt_tensor **tensor_out)
{
    static const char fn[] = "relayout";
    if (!src || !tensor_out)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "%s: NULL %s", fn, src ? "output" : "source");
    dt_tensor *t = NULL;
    dt_status st = make_skeleton(fn, layout, src->dtype, src->shape, &t);
    if (st != DT_OK)
        return st;
    if (t->nlocal != src->nlocal || t->device_type != src->device_type) {
        st = dt__error(DT_ERR_SHAPE, "%s: cannot share the buffers of a tensor on another mesh",
                       fn);
        goto err_free_tensor;
    }
    for (int i = 0; i < t->nlocal; i++) {
        component *c = &t->comps[i];
        const component *s = &src->comps[i];
        if (c->device_id != s->device_id || c->bytes != s->bytes ||
            memcmp(c->offset, s->offset, (size_t)t->rank * sizeof *c->offset) != 0 ||
            memcmp(c->shape, s->shape, (size_t)t->rank * sizeof *c->shape) != 0) {
            st = dt__error(DT_ERR_SHAPE, "%s: component %d (device %d) is placed differently "
                           "by the two layouts, so its buffer cannot be shared", fn, i,
                           c->device_id);
            goto err_free_tensor;
        }
        c->dl.data = s->dl.data;
    }
    t->base = dt_tensor_retain(src->base ? src->base : src);
    *tensor_out = t;
    return DT_OK;

err_free_tensor:
    free_tensor(t);
    return st;
}

static void unpack_deleter(DLManagedTensor *self)
{
    unpack_ctx *ctx = self->manager_ctx;
    dt_tensor_destroy(ctx->tensor);
    free(ctx);
}

dt_status dt_tensor_unpack(const dt_tensor *tensor, int n, DLManagedTensor **managed_out)
{
    if (!tensor || !managed_out)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "dt_tensor_unpack: NULL %s",
                         tensor ? "managed_out" : "tensor");
    if (n != tensor->nlocal)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "dt_tensor_unpack: n is %d but the tensor "
                         "has %d local components", n, tensor->nlocal);
    unpack_ctx **ctx = calloc(n > 0 ? (size_t)n : 1, sizeof *ctx);
    if (!ctx)
        return dt__error(DT_ERR_NO_MEMORY, "dt_tensor_unpack: out of memory");
    for (int i = 0; i < n; i++) {
        ctx[i] = calloc(1, sizeof *ctx[i]);
        if (!ctx[i]) {
            for (int j = 0; j < i; j++)
                free(ctx[j]);
            free(ctx);
            return dt__error(DT_ERR_NO_MEMORY, "dt_tensor_unpack: out of memory");
        }
    }
    for (int i = 0; i < n; i++) {
        const component *c = &tensor->comps[i];
        unpack_ctx *x = ctx[i];
        memcpy(x->shape, c->shape, sizeof x->shape);
        x->managed.dl_tensor = c->dl;
        x->managed.dl_tensor.shape = x->shape;
        x->managed.manager_ctx = x;
        x->managed.deleter = unpack_deleter;
        x->tensor = dt_tensor_retain(tensor);
        managed_out[i] = &x->managed;
    }
    free(ctx);
    return DT_OK;
}

uint64_t dt__tensor_serial(const dt_tensor *tensor)
{
    return tensor ? tensor->serial : 0;
}

int dt__tensor_exclusive(const dt_tensor *t)
{
    if (!t || t->base || atomic_load_explicit(&t->refs, memory_order_acquire) != 1)
        return 0;
    for (int i = 0; i < t->nlocal; i++)
        if (t->comps[i].managed || (t->comps[i].bytes > 0 && !t->comps[i].alloc))
            return 0;
    return 1;
}

dt_tensor *dt_tensor_retain(const dt_tensor *tensor)
{
    dt_tensor *t = (dt_tensor *)tensor;
    if (t)
        atomic_fetch_add_explicit(&t->refs, 1, memory_order_relaxed);
    return t;
}

void dt_tensor_destroy(dt_tensor *tensor)
{
    if (tensor && atomic_fetch_sub_explicit(&tensor->refs, 1, memory_order_acq_rel) == 1)
        free_tensor(tensor);
}

const dt_layout *dt_tensor_layout(const dt_tensor *tensor)
{
    return tensor->layout;
}

dt_dtype dt_tensor_dtype(const dt_tensor *tensor)
{
    return tensor->dtype;
}

int dt_tensor_rank(const dt_tensor *tensor)
{
    return tensor->rank;
}

const int64_t *dt_tensor_shape(const dt_tensor *tensor)
{
    return tensor->shape;
}

int64_t dt_tensor_numel(const dt_tensor *tensor)
{
    return tensor->numel;
}

int dt_tensor_num_local(const dt_tensor *tensor)
{
    return tensor->nlocal;
}

const DLTensor *dt_tensor_local(const dt_tensor *tensor, int i)
{
    return i >= 0 && i < tensor->nlocal ? &tensor->comps[i].dl : NULL;
}

int64_t dt_tensor_local_position(const dt_tensor *tensor, int i)
{
    return i >= 0 && i < tensor->nlocal ? tensor->comps[i].position : -1;
}

const int64_t *dt_tensor_local_offset(const dt_tensor *tensor, int i)
{
    return i >= 0 && i < tensor->nlocal ? tensor->comps[i].offset : NULL;
}

const dt__device *dt__tensor_device(const dt_tensor *tensor, int i)
{
    return i >= 0 && i < tensor->nlocal ? tensor->comps[i].dev : NULL;
}

/* Checks a host transfer of local component i; *c_out on success. */
static dt_status check_host_io(const char *fn, const dt_tensor *t, int i, const void *buf,
                               size_t bytes, const component **c_out)
{
    if (!t || !buf)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "%s: NULL %s", fn, t ? "buffer" : "tensor");
    if (t->nlocal == 0) { /* outside the mesh: every call on it gave DT_OK and no component */
        const dt_mesh *m = dt_layout_mesh(t->layout);
        return dt__error(DT_ERR_INVALID_ARGUMENT,
                         "%s: component %d: this client (%d) holds no "
                         "device of the tensor's mesh '%s' (its %lld devices are on %d of the "
                         "%d clients), so it holds no component (dt_mesh_num_local_devices "
                         "tells; dt_mesh_check_clients refuses such a mesh)",
                         fn, i, dt_client_id(), dt_mesh_name(m), (long long)dt_mesh_size(m),
                         dt_mesh_num_clients(m), dt_num_clients());
    }
    if (i < 0 || i >= t->nlocal)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "%s: component %d out of range 0..%d", fn, i,
                         t->nlocal - 1);
    if (bytes != t->comps[i].bytes)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "%s: component %d holds %zu bytes, not %zu",
                         fn, i, t->comps[i].bytes, bytes);
    *c_out = &t->comps[i];
    return DT_OK;
}

dt_status dt_tensor_local_read(const dt_tensor *tensor, int i, void *dst, size_t bytes)
{
    const component *c;
    dt_status st = check_host_io("dt_tensor_local_read", tensor, i, dst, bytes, &c);
    if (st == DT_OK)
        st = c->dev->kind->sync(c->dev);
    if (st == DT_OK && bytes)
        st = c->dev->kind->copy(c->dev, DT__COPY_D2H, dst, c->dl.data, bytes);
    return st;
}

dt_status dt_tensor_local_write(dt_tensor *tensor, int i, const void *src, size_t bytes)
{
    const component *c;
    dt_status st = check_host_io("dt_tensor_local_write", tensor, i, src, bytes, &c);
    if (st == DT_OK && bytes)
        st = c->dev->kind->copy(c->dev, DT__COPY_H2D, c->dl.data, src, bytes);
    if (st == DT_OK)
        st = c->dev->kind->sync(c->dev);
    return st;
}
