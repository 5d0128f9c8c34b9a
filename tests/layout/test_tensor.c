/* Tests of dt_tensor and dtypes: pack / unpack checked bit for bit against shards sliced by
 * hand out of a global tensor, pack_managed ownership, zeros / filled, every validation
 * error, and the dtype and DLPack type tables. Adapts to the devices and clients present; on
 * the meshes of dt_test_device_type(), the caller's DLPack memory being device memory on a GPU
 * mesh (read and written only through dt_tensor_local_read/write). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

#define NDTYPES 7
static const dt_dtype all_dtypes[NDTYPES] = {DT_DTYPE_F32, DT_DTYPE_F64, DT_DTYPE_F16,
                                             DT_DTYPE_BF16, DT_DTYPE_I32, DT_DTYPE_I64,
                                             DT_DTYPE_U8};

/* The reference table, written out by hand (DLPack codes: 0 int, 1 uint, 2 float, 4 bfloat). */
static const struct {
    dt_dtype dtype;
    const char *name;
    size_t size;
    uint8_t code, bits;
} hand_dtypes[NDTYPES] = {
    {DT_DTYPE_F32, "f32", 4, 2, 32}, {DT_DTYPE_F64, "f64", 8, 2, 64},
    {DT_DTYPE_F16, "f16", 2, 2, 16}, {DT_DTYPE_BF16, "bf16", 2, 4, 16},
    {DT_DTYPE_I32, "i32", 4, 0, 32}, {DT_DTYPE_I64, "i64", 8, 0, 64},
    {DT_DTYPE_U8, "u8", 1, 1, 8},
};

static size_t hand_size(dt_dtype dtype)
{
    for (int i = 0; i < NDTYPES; i++)
        if (hand_dtypes[i].dtype == dtype)
            return hand_dtypes[i].size;
    return 0;
}

static DLDataType hand_dl_type(dt_dtype dtype)
{
    DLDataType t = {0, 0, 1};
    for (int i = 0; i < NDTYPES; i++) {
        if (hand_dtypes[i].dtype == dtype) {
            t.code = hand_dtypes[i].code;
            t.bits = hand_dtypes[i].bits;
        }
    }
    return t;
}

/* ---- dtype tests ------------------------------------------------------------------------ */

static void test_dtype_sizes_and_names_match_table(void)
{
    for (int i = 0; i < NDTYPES; i++) {
        CU_ASSERT_EQUAL(dt_dtype_size(hand_dtypes[i].dtype), hand_dtypes[i].size);
        CU_ASSERT_STRING_EQUAL(dt_dtype_name(hand_dtypes[i].dtype), hand_dtypes[i].name);
    }
    CU_ASSERT_EQUAL(dt_dtype_size(DT_DTYPE_COUNT_), 0);
    CU_ASSERT_EQUAL(dt_dtype_size((dt_dtype)-1), 0);
    CU_ASSERT_STRING_EQUAL(dt_dtype_name(DT_DTYPE_COUNT_), "?");
}

static void test_dtype_names_round_trip_through_parse(void)
{
    for (int i = 0; i < NDTYPES; i++) {
        dt_dtype d = DT_DTYPE_COUNT_;
        DT_ASSERT_OK(dt_dtype_parse(dt_dtype_name(all_dtypes[i]), &d));
        CU_ASSERT_EQUAL(d, all_dtypes[i]);
    }
    dt_dtype d = DT_DTYPE_I64;
    DT_ASSERT_FAILS(dt_dtype_parse("f33", &d), DT_ERR_PARSE);
    DT_ASSERT_ERROR_MENTIONS("f33");
    CU_ASSERT_EQUAL(d, DT_DTYPE_I64); /* untouched on failure */
    DT_ASSERT_FAILS(dt_dtype_parse("", &d), DT_ERR_PARSE);
    DT_ASSERT_FAILS(dt_dtype_parse("F32 ", &d), DT_ERR_PARSE);
    DT_ASSERT_FAILS(dt_dtype_parse(NULL, &d), DT_ERR_INVALID_ARGUMENT);
}

static void test_dtype_dlpack_conversions_round_trip(void)
{
    for (int i = 0; i < NDTYPES; i++) {
        DLDataType t = dt_dtype_to_dlpack(hand_dtypes[i].dtype);
        CU_ASSERT_EQUAL(t.code, hand_dtypes[i].code);
        CU_ASSERT_EQUAL(t.bits, hand_dtypes[i].bits);
        CU_ASSERT_EQUAL(t.lanes, 1);
        dt_dtype d = DT_DTYPE_COUNT_;
        DT_ASSERT_OK(dt_dtype_from_dlpack(t, &d));
        CU_ASSERT_EQUAL(d, hand_dtypes[i].dtype);
    }
    /* An invalid dtype converts to something from_dlpack refuses. */
    dt_dtype d;
    DT_ASSERT_FAILS(dt_dtype_from_dlpack(dt_dtype_to_dlpack(DT_DTYPE_COUNT_), &d),
                    DT_ERR_UNSUPPORTED);
}

static void test_dtype_from_dlpack_rejects_unsupported_types(void)
{
    static const DLDataType bad[] = {
        {kDLFloat, 32, 4}, /* vector lanes */
        {kDLFloat, 32, 0}, {kDLFloat, 8, 1},   {kDLInt, 16, 1},     {kDLInt, 8, 1},
        {kDLUInt, 32, 1},  {kDLBfloat, 32, 1}, {kDLComplex, 64, 1}, {kDLOpaqueHandle, 64, 1},
        {99, 32, 1},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        dt_dtype d = DT_DTYPE_U8;
        DT_ASSERT_FAILS(dt_dtype_from_dlpack(bad[i], &d), DT_ERR_UNSUPPORTED);
        CU_ASSERT_EQUAL(d, DT_DTYPE_U8);
    }
}

/* ---- global tensors and hand-sliced shards ---------------------------------------------- */

/* f16 bits of a small non-negative integer (exact below 2048). */
static uint16_t f16_of_int(uint32_t v)
{
    if (v == 0)
        return 0;
    int e = 0;
    while ((v >> (e + 1)) != 0)
        e++;
    if (e > 15)
        return 0x7c00;
    uint32_t mant = e <= 10 ? (v << (10 - e)) : (v >> (e - 10));
    return (uint16_t)(((uint32_t)(e + 15) << 10) | (mant & 0x3ff));
}

/* Element `idx` of the reference tensor: the value idx in the dtype. */
static void put_value(dt_dtype dtype, void *dst, int64_t idx)
{
    float f = (float)idx;
    double g = (double)idx;
    int32_t i32 = (int32_t)idx;
    int64_t i64 = idx;
    uint8_t u8 = (uint8_t)(idx & 0xff);
    uint16_t h;
    uint32_t fb;
    switch (dtype) {
    case DT_DTYPE_F32: memcpy(dst, &f, 4); break;
    case DT_DTYPE_F64: memcpy(dst, &g, 8); break;
    case DT_DTYPE_F16: h = f16_of_int((uint32_t)idx); memcpy(dst, &h, 2); break;
    case DT_DTYPE_BF16:
        memcpy(&fb, &f, 4);
        h = (uint16_t)(fb >> 16);
        memcpy(dst, &h, 2);
        break;
    case DT_DTYPE_I32: memcpy(dst, &i32, 4); break;
    case DT_DTYPE_I64: memcpy(dst, &i64, 8); break;
    case DT_DTYPE_U8: memcpy(dst, &u8, 1); break;
    default: break;
    }
}

/* A mesh as the test knows it: dims and the device id at each position. */
typedef struct mesh_desc {
    int ndims;
    const char *names[3];
    int64_t sizes[3];
    int ids[64];
    int64_t size;
} mesh_desc;

static int64_t hand_position(const mesh_desc *md, int device_id)
{
    for (int64_t p = 0; p < md->size; p++)
        if (md->ids[p] == device_id)
            return p;
    return -1;
}

/* The shard box of mesh position `pos`, from the uneven-split rule: the first n % k of k
 * shards get one extra element; offsets accumulate the sizes before. */
static void hand_box(const mesh_desc *md, int rank, const char *const *specs,
                     const int64_t *shape, int64_t pos, int64_t *off, int64_t *len)
{
    int64_t coords[3], rest = pos;
    for (int m = md->ndims - 1; m >= 0; m--) {
        coords[m] = rest % md->sizes[m];
        rest /= md->sizes[m];
    }
    for (int d = 0; d < rank; d++) {
        int m = -1;
        for (int q = 0; q < md->ndims; q++)
            if (strcmp(specs[d], md->names[q]) == 0)
                m = q;
        if (m < 0) {
            off[d] = 0;
            len[d] = shape[d];
            continue;
        }
        int64_t n = shape[d], k = md->sizes[m], j = coords[m];
        int64_t o = 0;
        for (int64_t q = 0; q < j; q++)
            o += n / k + (q < n % k ? 1 : 0);
        off[d] = o;
        len[d] = n / k + (j < n % k ? 1 : 0);
    }
}

static int64_t prod(int rank, const int64_t *v)
{
    int64_t p = 1;
    for (int d = 0; d < rank; d++)
        p *= v[d];
    return p;
}

/* Copies the box out of the row-major global buffer, element by element. */
static void *slice_box(const void *global, size_t esize, int rank, const int64_t *gshape,
                       const int64_t *off, const int64_t *len)
{
    int64_t n = prod(rank, len);
    char *out = malloc(n > 0 ? (size_t)n * esize : 1);
    for (int64_t li = 0; li < n; li++) {
        int64_t gi = dt_test_global_index(rank, gshape, off, len, li);
        memcpy(out + li * (int64_t)esize, (const char *)global + gi * (int64_t)esize, esize);
    }
    return out;
}

static mesh_desc desc_dims(int ndims, const char *const *names, const int64_t *sizes)
{
    mesh_desc md;
    memset(&md, 0, sizeof md);
    md.ndims = ndims;
    md.size = 1;
    for (int m = 0; m < ndims; m++) {
        md.names[m] = names[m];
        md.sizes[m] = sizes[m];
        md.size *= sizes[m];
    }
    for (int64_t p = 0; p < md.size; p++)
        md.ids[p] = (int)p;
    return md;
}

static int num_devices(void)
{
    return dt_test_num_devices();
}

static int on_gpu(void)
{
    return dt_test_device_type() == DT_DEVICE_GPU;
}

/* The DLPack device type of the mesh's memory, and the name pack's messages give it. */
static DLDeviceType mesh_dl_type(void)
{
    return on_gpu() ? kDLCUDA : kDLCPU;
}

/* The caller's memory for n DLPack components of a mesh: host buffers on a CPU mesh (NULL for
 * an empty one, which pack accepts); on a GPU mesh, device memory: the local components of a
 * replicated u8 "carrier" tensor, one per local device, written through
 * dt_tensor_local_write. */
typedef struct caller_mem {
    int n;
    dt_tensor *carrier;
    size_t size;     /* bytes of each carrier component */
    void *ptr[8];
    DLDevice dev[8];
} caller_mem;

/* Overwrites buffer i with `bytes` bytes from host (the rest of a carrier component zero). */
static void caller_mem_write(caller_mem *cm, int i, const void *host, size_t bytes)
{
    if (!cm->carrier) {
        if (bytes)
            memcpy(cm->ptr[i], host, bytes);
        return;
    }
    unsigned char *full = calloc(1, cm->size);
    CU_ASSERT_FATAL(full != NULL && bytes <= cm->size);
    if (bytes)
        memcpy(full, host, bytes);
    dt_test_local_set(cm->carrier, i, full);
    free(full);
}

/* Buffer i gets bytes[i] bytes from host[i] (zeros when host is NULL). */
static void caller_mem_init(caller_mem *cm, const dt_mesh *mesh, int n, void *const *host,
                            const size_t *bytes)
{
    memset(cm, 0, sizeof *cm);
    cm->n = n;
    CU_ASSERT_FATAL(n <= 8);
    if (!on_gpu()) {
        for (int i = 0; i < n; i++) {
            cm->ptr[i] = bytes[i] ? calloc(1, bytes[i]) : NULL;
            cm->dev[i] = (DLDevice){kDLCPU, 0};
            if (host)
                caller_mem_write(cm, i, host[i], bytes[i]);
        }
        return;
    }
    for (int i = 0; i < n; i++)
        cm->size = bytes[i] > cm->size ? bytes[i] : cm->size;
    cm->size += 1;
    dt_layout *rep = NULL;
    int64_t shape[1] = {(int64_t)cm->size};
    DT_ASSERT_OK(dt_layout_replicated(mesh, 1, &rep));
    DT_ASSERT_OK(dt_tensor_zeros(rep, DT_DTYPE_U8, shape, &cm->carrier));
    dt_layout_destroy(rep);
    for (int i = 0; i < n; i++) {
        const DLTensor *c = dt_tensor_local(cm->carrier, i);
        cm->ptr[i] = c->data;
        cm->dev[i] = c->device;
        if (host)
            caller_mem_write(cm, i, host[i], bytes[i]);
    }
}

static void caller_mem_free(caller_mem *cm)
{
    if (cm->carrier)
        dt_tensor_destroy(cm->carrier);
    else
        for (int i = 0; i < cm->n; i++)
            free(cm->ptr[i]);
    memset(cm, 0, sizeof *cm);
}

/* 1 if local component i of t holds exactly `bytes` bytes equal to want. */
static int local_equals(const dt_tensor *t, int i, const void *want, size_t bytes)
{
    if (dt_test_local_bytes(t, i) != bytes)
        return 0;
    void *got = dt_test_local_get(t, i);
    int eq = bytes == 0 || memcmp(got, want, bytes) == 0;
    free(got);
    return eq;
}

/* 1-D {x: N}, 2-D {a: 2, b: N/2}, 3-D {a: 2, b: 2, c: N/4} over all N devices (factors of 1
 * where N does not divide). */
static mesh_desc mesh_desc_for(int ndims)
{
    static const char *names1[] = {"x"}, *names[] = {"a", "b", "c"};
    int64_t n = num_devices(), s[3];
    if (ndims == 1) {
        s[0] = n;
        return desc_dims(1, names1, s);
    }
    s[0] = n % 2 == 0 ? 2 : 1;
    s[1] = n / s[0];
    if (ndims == 3) {
        s[2] = s[1];
        s[1] = s[2] % 2 == 0 ? 2 : 1;
        s[2] /= s[1];
    }
    return desc_dims(ndims, names, s);
}

static dt_mesh *make_mesh(const mesh_desc *md)
{
    dt_mesh *mesh = NULL;
    dt_status st = dt_mesh_create(NULL, md->ndims, md->names, md->sizes, dt_test_device_type(),
                                  &mesh);
    if (st != DT_OK)
        fprintf(stderr, "dt_mesh_create: %s: %s\n", dt_status_name(st), dt_last_error());
    return mesh;
}

typedef struct layout_case {
    int rank;
    const char *specs[3];
    int64_t shape[3];
    const char *partial; /* mesh dim holding partial sums, or NULL */
} layout_case;

static dt_layout *make_layout(const dt_mesh *mesh, const layout_case *lc)
{
    dt_layout *l = NULL;
    dt_status st;
    if (lc->partial) {
        dt_reduce_op op = DT_REDUCE_SUM;
        st = dt_layout_create_partial(mesh, lc->rank, lc->specs, 1, &lc->partial, &op, &l);
    } else {
        st = dt_layout_create(mesh, lc->rank, lc->specs, &l);
    }
    if (st != DT_OK)
        fprintf(stderr, "layout: %s: %s\n", dt_status_name(st), dt_last_error());
    return l;
}

/* Packs hand-sliced shards of the global tensor, checks every query, unpacks and compares the
 * views bit for bit, and checks the views outlive the tensor. */
static void check_round_trip(const dt_mesh *mesh, const mesh_desc *md, const layout_case *lc,
                             dt_dtype dtype)
{
    dt_layout *layout = make_layout(mesh, lc);
    CU_ASSERT_PTR_NOT_NULL_FATAL(layout);
    int rank = lc->rank;
    size_t es = hand_size(dtype);
    int64_t numel = prod(rank, lc->shape);
    char *global = malloc(numel > 0 ? (size_t)numel * es : 1);
    for (int64_t i = 0; i < numel; i++)
        put_value(dtype, global + i * (int64_t)es, i);

    int n = dt_mesh_num_local_devices(mesh);
    CU_ASSERT_FATAL(n >= 1 && n <= 8);
    int64_t off[8][3], len[8][3], pos[8];
    void *expect[8];
    size_t bytes[8];
    DLTensor comps[8];
    for (int i = 0; i < n; i++) {
        pos[i] = hand_position(md, dt_mesh_local_device_id(mesh, i));
        CU_ASSERT_FATAL(pos[i] >= 0);
        hand_box(md, rank, lc->specs, lc->shape, pos[i], off[i], len[i]);
        expect[i] = slice_box(global, es, rank, lc->shape, off[i], len[i]);
        bytes[i] = (size_t)prod(rank, len[i]) * es;
    }
    /* The caller's copy (host: NULL data for an empty shard, documented as accepted). */
    caller_mem given;
    caller_mem_init(&given, mesh, n, expect, bytes);
    for (int i = 0; i < n; i++) {
        memset(&comps[i], 0, sizeof comps[i]);
        comps[i].data = given.ptr[i];
        comps[i].device = given.dev[i];
        comps[i].ndim = rank;
        comps[i].dtype = hand_dl_type(dtype);
        comps[i].shape = len[i];
    }

    dt_tensor *t = NULL;
    DT_ASSERT_OK(dt_tensor_pack(layout, lc->shape, n, comps, &t));
    dt_layout_destroy(layout); /* the tensor holds its own reference */
    /* The tensor owns copies: scribbling on the caller's buffers changes nothing. */
    for (int i = 0; i < n; i++) {
        unsigned char *junk = malloc(bytes[i] + 1);
        memset(junk, 0xA5, bytes[i]);
        caller_mem_write(&given, i, junk, bytes[i]);
        free(junk);
    }

    CU_ASSERT_EQUAL(dt_tensor_dtype(t), dtype);
    CU_ASSERT_EQUAL(dt_tensor_rank(t), rank);
    CU_ASSERT_EQUAL(dt_tensor_numel(t), numel);
    CU_ASSERT_EQUAL(dt_tensor_num_local(t), n);
    CU_ASSERT_EQUAL(dt_layout_rank(dt_tensor_layout(t)), rank);
    CU_ASSERT_PTR_EQUAL(dt_layout_mesh(dt_tensor_layout(t)), mesh);
    for (int d = 0; d < rank; d++)
        CU_ASSERT_EQUAL(dt_tensor_shape(t)[d], lc->shape[d]);
    CU_ASSERT_PTR_NULL(dt_tensor_local(t, n));
    CU_ASSERT_PTR_NULL(dt_tensor_local(t, -1));
    CU_ASSERT_EQUAL(dt_tensor_local_position(t, n), -1);
    CU_ASSERT_PTR_NULL(dt_tensor_local_offset(t, n));
    for (int i = 0; i < n; i++) {
        const DLTensor *x = dt_tensor_local(t, i);
        CU_ASSERT_PTR_NOT_NULL_FATAL(x);
        CU_ASSERT_EQUAL(dt_tensor_local_position(t, i), pos[i]);
        const int64_t *o = dt_tensor_local_offset(t, i);
        CU_ASSERT_PTR_NOT_NULL_FATAL(o);
        for (int d = 0; d < rank; d++) {
            CU_ASSERT_EQUAL(o[d], off[i][d]);
            CU_ASSERT_EQUAL(x->shape[d], len[i][d]);
        }
        CU_ASSERT_EQUAL(x->ndim, rank);
        /* On the device the caller's memory was on (a GPU component: its CUDA ordinal). */
        CU_ASSERT_EQUAL(x->device.device_type, mesh_dl_type());
        CU_ASSERT_EQUAL(x->device.device_id, given.dev[i].device_id);
        CU_ASSERT_EQUAL(x->dtype.code, hand_dl_type(dtype).code);
        CU_ASSERT_EQUAL(x->dtype.bits, hand_dl_type(dtype).bits);
        CU_ASSERT_EQUAL(x->dtype.lanes, 1);
        CU_ASSERT_PTR_NULL(x->strides);
        CU_ASSERT_EQUAL(x->byte_offset, 0);
        CU_ASSERT_PTR_NOT_NULL(x->data); /* documented: never NULL, even when empty */
        CU_ASSERT(x->data != given.ptr[i]);
        CU_ASSERT(local_equals(t, i, expect[i], bytes[i]));
    }
    caller_mem_free(&given);

    DLManagedTensor *views[8];
    DT_ASSERT_OK(dt_tensor_unpack(t, n, views));
    for (int i = 0; i < n; i++)
        CU_ASSERT_PTR_EQUAL(views[i]->dl_tensor.data, dt_tensor_local(t, i)->data);
    dt_tensor_destroy(t); /* the views keep the data alive */
    for (int i = 0; i < n; i++) {
        const DLTensor *x = &views[i]->dl_tensor;
        CU_ASSERT_EQUAL(x->ndim, rank);
        CU_ASSERT_EQUAL(x->device.device_type, mesh_dl_type());
        for (int d = 0; d < rank; d++)
            CU_ASSERT_EQUAL(x->shape[d], len[i][d]);
        if (!on_gpu())
            CU_ASSERT(bytes[i] == 0 || memcmp(x->data, expect[i], bytes[i]) == 0);
    }
    /* The views are DLPack tensors pack_managed takes back, zero copy, on any device: their
     * data read through the tensor are the shards still. */
    dt_layout *again = make_layout(mesh, lc);
    CU_ASSERT_PTR_NOT_NULL_FATAL(again);
    DT_ASSERT_OK(dt_tensor_pack_managed(again, lc->shape, n, views, &t));
    for (int i = 0; i < n; i++) {
        CU_ASSERT_PTR_EQUAL(dt_tensor_local(t, i)->data, views[i]->dl_tensor.data);
        CU_ASSERT(local_equals(t, i, expect[i], bytes[i]));
        free(expect[i]);
    }
    dt_tensor_destroy(t); /* calls the views' deleters */
    dt_layout_destroy(again);
    free(global);
}

static void run_cases(const mesh_desc *md, const layout_case *cases, int ncases)
{
    dt_mesh *mesh = make_mesh(md);
    CU_ASSERT_PTR_NOT_NULL_FATAL(mesh);
    for (int c = 0; c < ncases; c++)
        for (int k = 0; k < NDTYPES; k++)
            check_round_trip(mesh, md, &cases[c], all_dtypes[k]);
    dt_mesh_destroy(mesh);
}

#define U DT_UNSHARDED
#define NCASES(a) ((int)(sizeof(a) / sizeof((a)[0])))

static void test_pack_unpack_round_trip_on_1d_mesh(void)
{
    mesh_desc md = mesh_desc_for(1);
    int64_t n = md.size;
    const layout_case cases[] = {
        {1, {"x"}, {2 * n + 3}, NULL},    /* uneven */
        {1, {"x"}, {3}, NULL},            /* fewer elements than devices: empty shards */
        {2, {"x", U}, {n + 1, 3}, NULL},  /* sharded on dim 0 */
        {2, {U, "x"}, {2, 2 * n}, NULL},  /* sharded on dim 1, even */
        {2, {U, U}, {4, 3}, NULL},        /* replicated */
        {1, {U}, {5}, "x"},               /* partial */
        {0, {NULL}, {0}, NULL},           /* scalar */
    };
    run_cases(&md, cases, NCASES(cases));
}

static void test_pack_unpack_round_trip_on_2d_mesh_with_uneven_7x5(void)
{
    mesh_desc md = mesh_desc_for(2);
    const layout_case cases[] = {
        {2, {U, U}, {7, 5}, NULL},    {2, {"a", U}, {7, 5}, NULL}, {2, {U, "b"}, {7, 5}, NULL},
        {2, {"a", "b"}, {7, 5}, NULL}, {2, {"b", "a"}, {7, 5}, NULL},
        {2, {U, "b"}, {7, 5}, "a"},   {2, {U, U}, {7, 5}, "b"},
        {2, {"b", "a"}, {3, 1}, NULL}, /* some shards empty on each dim */
        {2, {"a", "b"}, {0, 5}, NULL}, /* global shape with a zero dim */
    };
    run_cases(&md, cases, NCASES(cases));
}

static void test_pack_unpack_round_trip_on_3d_mesh(void)
{
    mesh_desc md = mesh_desc_for(3);
    const layout_case cases[] = {
        {3, {"a", "b", "c"}, {5, 3, 6}, NULL},
        {3, {"c", U, "a"}, {5, 3, 6}, "b"},
        {3, {U, "b", U}, {2, 5, 3}, NULL},
        {3, {U, U, U}, {2, 3, 4}, NULL},
        {2, {"c", "a"}, {9, 3}, "b"},
    };
    run_cases(&md, cases, NCASES(cases));
}

/* A YAML mesh listing the device ids in reverse: positions differ from device ids, and local
 * component i is the mesh's i-th local device wherever it sits. */
static void test_pack_unpack_follows_mesh_positions_of_permuted_ids(void)
{
    mesh_desc md = mesh_desc_for(2);
    char yaml[512], ids[256] = "";
    size_t used = 0;
    for (int64_t p = 0; p < md.size; p++) {
        md.ids[p] = (int)(md.size - 1 - p);
        used += (size_t)snprintf(ids + used, sizeof ids - used, "%s%d", p ? ", " : "",
                                 md.ids[p]);
    }
    snprintf(yaml, sizeof yaml,
             "mesh:\n  name: reversed\n  device_type: %s\n  dims: {a: %lld, b: %lld}\n"
             "  device_ids: [%s]\n", dt_device_type_name(dt_test_device_type()),
             (long long)md.sizes[0], (long long)md.sizes[1], ids);
    dt_mesh *mesh = NULL;
    DT_ASSERT_OK(dt_mesh_from_yaml_string(yaml, NULL, &mesh));
    const layout_case cases[] = {
        {2, {"a", "b"}, {7, 5}, NULL},
        {2, {"b", U}, {6, 2}, "a"},
    };
    for (int c = 0; c < NCASES(cases); c++)
        for (int k = 0; k < NDTYPES; k++)
            check_round_trip(mesh, &md, &cases[c], all_dtypes[k]);
    dt_mesh_destroy(mesh);
}

/* ---- pack details ------------------------------------------------------------------------ */

/* Compact strides given explicitly and a non-zero byte_offset are accepted and honoured. */
static void test_pack_honours_byte_offset_and_compact_strides(void)
{
    mesh_desc md = mesh_desc_for(2);
    dt_mesh *mesh = make_mesh(&md);
    CU_ASSERT_PTR_NOT_NULL_FATAL(mesh);
    layout_case lc = {2, {"a", "b"}, {7, 5}, NULL};
    dt_layout *layout = make_layout(mesh, &lc);
    CU_ASSERT_PTR_NOT_NULL_FATAL(layout);
    int64_t global[35];
    for (int i = 0; i < 35; i++)
        global[i] = 1000 + i;
    int n = dt_mesh_num_local_devices(mesh);
    int64_t off[8][3], len[8][3], strides[8][2];
    char *bufs[8];
    void *expect[8];
    size_t sizes[8];
    DLTensor comps[8];
    for (int i = 0; i < n; i++) {
        int64_t pos = hand_position(&md, dt_mesh_local_device_id(mesh, i));
        hand_box(&md, 2, lc.specs, lc.shape, pos, off[i], len[i]);
        expect[i] = slice_box(global, 8, 2, lc.shape, off[i], len[i]);
        size_t bytes = (size_t)(len[i][0] * len[i][1]) * 8;
        sizes[i] = bytes + 24;
        bufs[i] = malloc(bytes + 24);
        memset(bufs[i], 0xEE, 24);
        memcpy(bufs[i] + 24, expect[i], bytes);
        strides[i][0] = len[i][1];
        strides[i][1] = 1;
    }
    caller_mem cm;
    caller_mem_init(&cm, mesh, n, (void *const *)bufs, sizes);
    for (int i = 0; i < n; i++)
        comps[i] = (DLTensor){cm.ptr[i], cm.dev[i], 2, {kDLInt, 64, 1}, len[i], strides[i], 24};
    dt_tensor *t = NULL;
    DT_ASSERT_OK(dt_tensor_pack(layout, lc.shape, n, comps, &t));
    for (int i = 0; i < n; i++) {
        size_t bytes = (size_t)(len[i][0] * len[i][1]) * 8;
        CU_ASSERT(local_equals(t, i, expect[i], bytes));
        free(bufs[i]);
        free(expect[i]);
    }
    caller_mem_free(&cm);
    dt_tensor_destroy(t);
    dt_layout_destroy(layout);
    dt_mesh_destroy(mesh);
}

/* Fixture for the error tests: a 1-D mesh over every device, x-sharded [2N+1, 4] f32 (the
 * device at position 0 gets 3 rows, the others 2), with valid components. */
typedef struct err_fixture {
    mesh_desc md;
    dt_mesh *mesh;
    dt_layout *layout;
    int64_t shape[2];
    int n;
    int64_t len[8][2];
    caller_mem bufs;
    DLTensor comps[8];
} err_fixture;

static int err_fixture_init(err_fixture *f)
{
    memset(f, 0, sizeof *f);
    f->md = mesh_desc_for(1);
    f->mesh = make_mesh(&f->md);
    if (!f->mesh)
        return -1;
    const char *specs[] = {"x", U};
    if (dt_layout_create(f->mesh, 2, specs, &f->layout) != DT_OK)
        return -1;
    f->shape[0] = 2 * f->md.size + 1;
    f->shape[1] = 4;
    f->n = dt_mesh_num_local_devices(f->mesh);
    if (f->n < 2 || f->n > 8)
        return -1;
    size_t sizes[8];
    for (int i = 0; i < f->n; i++)
        sizes[i] = 16 * sizeof(float);
    caller_mem_init(&f->bufs, f->mesh, f->n, NULL, sizes);
    for (int i = 0; i < f->n; i++) {
        int64_t pos = hand_position(&f->md, dt_mesh_local_device_id(f->mesh, i));
        f->len[i][0] = pos == 0 ? 3 : 2;
        f->len[i][1] = 4;
        f->comps[i] = (DLTensor){f->bufs.ptr[i], f->bufs.dev[i], 2, {kDLFloat, 32, 1},
                                 f->len[i], NULL, 0};
    }
    return 0;
}

static void err_fixture_free(err_fixture *f)
{
    caller_mem_free(&f->bufs);
    dt_layout_destroy(f->layout);
    dt_mesh_destroy(f->mesh);
}

static dt_tensor *const SENTINEL = (dt_tensor *)&SENTINEL;

static void test_pack_rejects_wrong_shape_naming_device_and_expected_shape(void)
{
    err_fixture f;
    CU_ASSERT_FATAL(err_fixture_init(&f) == 0);
    int i = f.n - 1;
    int dev = dt_mesh_local_device_id(f.mesh, i);
    int64_t want_rows = f.len[i][0];
    f.len[i][0] = want_rows + 1;
    dt_tensor *t = SENTINEL;
    DT_ASSERT_FAILS(dt_tensor_pack(f.layout, f.shape, f.n, f.comps, &t), DT_ERR_SHAPE);
    CU_ASSERT_PTR_EQUAL(t, SENTINEL); /* output untouched on failure */
    char msg[256];
    snprintf(msg, sizeof msg,
             "component %d (device %d, mesh position %lld): shape [%lld,4] but the layout "
             "needs [%lld,4] for global shape [%lld,4]",
             i, dev, (long long)hand_position(&f.md, dev), (long long)want_rows + 1,
             (long long)want_rows, (long long)f.shape[0]);
    DT_ASSERT_ERROR_MENTIONS(msg);
    /* A rank that differs is a shape error too. */
    f.len[i][0] = want_rows;
    f.comps[i].ndim = 1;
    DT_ASSERT_FAILS(dt_tensor_pack(f.layout, f.shape, f.n, f.comps, &t), DT_ERR_SHAPE);
    DT_ASSERT_ERROR_MENTIONS("ndim 1");
    f.comps[i].ndim = 2;
    /* Fixed, it packs. */
    DT_ASSERT_OK(dt_tensor_pack(f.layout, f.shape, f.n, f.comps, &t));
    dt_tensor_destroy(t);
    err_fixture_free(&f);
}

static void test_pack_rejects_wrong_dtype(void)
{
    err_fixture f;
    CU_ASSERT_FATAL(err_fixture_init(&f) == 0);
    int i = f.n - 1;
    char dev[64];
    snprintf(dev, sizeof dev, "device %d,", dt_mesh_local_device_id(f.mesh, i));
    dt_tensor *t = SENTINEL;
    f.comps[i].dtype = (DLDataType){kDLInt, 32, 1};
    DT_ASSERT_FAILS(dt_tensor_pack(f.layout, f.shape, f.n, f.comps, &t), DT_ERR_SHAPE);
    DT_ASSERT_ERROR_MENTIONS(dev);
    DT_ASSERT_ERROR_MENTIONS("i32");
    f.comps[i].dtype = (DLDataType){kDLFloat, 32, 2};
    DT_ASSERT_FAILS(dt_tensor_pack(f.layout, f.shape, f.n, f.comps, &t), DT_ERR_SHAPE);
    /* A type outside the supported list, on the component that sets the dtype. */
    f.comps[i].dtype = (DLDataType){kDLFloat, 32, 1};
    f.comps[0].dtype = (DLDataType){kDLComplex, 64, 1};
    DT_ASSERT_FAILS(dt_tensor_pack(f.layout, f.shape, f.n, f.comps, &t), DT_ERR_UNSUPPORTED);
    CU_ASSERT_PTR_EQUAL(t, SENTINEL);
    err_fixture_free(&f);
}

static void test_pack_rejects_wrong_device_type(void)
{
    err_fixture f;
    CU_ASSERT_FATAL(err_fixture_init(&f) == 0);
    int i = f.n - 1;
    char dev[64];
    snprintf(dev, sizeof dev, "device %d,", dt_mesh_local_device_id(f.mesh, i));
    dt_tensor *t = SENTINEL;
    /* Host memory on a GPU mesh, CUDA memory on a CPU mesh. */
    f.comps[i].device = on_gpu() ? (DLDevice){kDLCPU, 0} : (DLDevice){kDLCUDA, 0};
    DT_ASSERT_FAILS(dt_tensor_pack(f.layout, f.shape, f.n, f.comps, &t), DT_ERR_DEVICE_MISMATCH);
    DT_ASSERT_ERROR_MENTIONS(dev);
    DT_ASSERT_ERROR_MENTIONS("kDLCPU"); /* both named: what was given and what is needed */
    DT_ASSERT_ERROR_MENTIONS("kDLCUDA");
    CU_ASSERT_PTR_EQUAL(t, SENTINEL);
    err_fixture_free(&f);
}

static void test_pack_rejects_non_compact_strides_and_null_data(void)
{
    err_fixture f;
    CU_ASSERT_FATAL(err_fixture_init(&f) == 0);
    int i = f.n - 1;
    dt_tensor *t = SENTINEL;
    int64_t transposed[2] = {1, f.len[i][0]};
    f.comps[i].strides = transposed;
    DT_ASSERT_FAILS(dt_tensor_pack(f.layout, f.shape, f.n, f.comps, &t), DT_ERR_UNSUPPORTED);
    DT_ASSERT_ERROR_MENTIONS("strides");
    f.comps[i].strides = NULL;
    f.comps[i].data = NULL;
    DT_ASSERT_FAILS(dt_tensor_pack(f.layout, f.shape, f.n, f.comps, &t),
                    DT_ERR_INVALID_ARGUMENT);
    CU_ASSERT_PTR_EQUAL(t, SENTINEL);
    err_fixture_free(&f);
}

static void test_pack_rejects_wrong_component_count(void)
{
    err_fixture f;
    CU_ASSERT_FATAL(err_fixture_init(&f) == 0);
    dt_tensor *t = SENTINEL;
    DT_ASSERT_FAILS(dt_tensor_pack(f.layout, f.shape, f.n - 1, f.comps, &t),
                    DT_ERR_INVALID_ARGUMENT);
    DT_ASSERT_FAILS(dt_tensor_pack(f.layout, f.shape, f.n + 1, f.comps, &t),
                    DT_ERR_INVALID_ARGUMENT);
    DT_ASSERT_FAILS(dt_tensor_pack(f.layout, f.shape, f.n, NULL, &t), DT_ERR_INVALID_ARGUMENT);
    DT_ASSERT_FAILS(dt_tensor_pack(NULL, f.shape, f.n, f.comps, &t), DT_ERR_INVALID_ARGUMENT);
    DT_ASSERT_FAILS(dt_tensor_pack(f.layout, NULL, f.n, f.comps, &t), DT_ERR_INVALID_ARGUMENT);
    CU_ASSERT_PTR_EQUAL(t, SENTINEL);
    DT_ASSERT_FAILS(dt_tensor_pack(f.layout, f.shape, f.n, f.comps, NULL),
                    DT_ERR_INVALID_ARGUMENT);

    /* unpack checks its count too. */
    DT_ASSERT_OK(dt_tensor_pack(f.layout, f.shape, f.n, f.comps, &t));
    DLManagedTensor *views[9];
    DT_ASSERT_FAILS(dt_tensor_unpack(t, f.n + 1, views), DT_ERR_INVALID_ARGUMENT);
    DT_ASSERT_FAILS(dt_tensor_unpack(t, f.n - 1, views), DT_ERR_INVALID_ARGUMENT);
    dt_tensor_destroy(t);
    err_fixture_free(&f);
}

static void test_pack_and_zeros_reject_mesh_bigger_than_devices(void)
{
    err_fixture f;
    CU_ASSERT_FATAL(err_fixture_init(&f) == 0);
    const char *name = "x";
    int64_t size = 2 * f.md.size;
    dt_mesh *big = NULL;
    DT_ASSERT_OK(dt_mesh_create(NULL, 1, &name, &size, dt_test_device_type(), &big));
    const char *specs[] = {"x", U};
    dt_layout *layout = NULL;
    DT_ASSERT_OK(dt_layout_create(big, 2, specs, &layout));
    dt_tensor *t = SENTINEL;
    int n = dt_mesh_num_local_devices(big);
    DT_ASSERT_FAILS(dt_tensor_pack(layout, f.shape, n, f.comps, &t), DT_ERR_DEVICE_MISMATCH);
    DT_ASSERT_FAILS(dt_tensor_zeros(layout, DT_DTYPE_F32, f.shape, &t), DT_ERR_DEVICE_MISMATCH);
    CU_ASSERT_PTR_EQUAL(t, SENTINEL);
    dt_layout_destroy(layout);
    dt_mesh_destroy(big);
    err_fixture_free(&f);
}

/* Layouts that parse and print but cannot hold a tensor: each refusal names its reason. */
static void test_pack_and_zeros_reject_placeholder_tpu_and_empty_layouts(void)
{
    err_fixture f;
    CU_ASSERT_FATAL(err_fixture_init(&f) == 0);
    dt_tensor *t = SENTINEL;
    dt_layout *l = NULL;

    /* TensorFlow's placeholder 'any' on this very mesh. */
    const char *any[] = {U, DT_ANY};
    DT_ASSERT_OK(dt_layout_create(f.mesh, 2, any, &l));
    DT_ASSERT_FAILS(dt_tensor_zeros(l, DT_DTYPE_F32, f.shape, &t), DT_ERR_INVALID_ARGUMENT);
    DT_ASSERT_ERROR_MENTIONS("tensor dim 1");
    DT_ASSERT_ERROR_MENTIONS("placeholder 'any'");
    DT_ASSERT_FAILS(dt_tensor_pack(l, f.shape, f.n, f.comps, &t), DT_ERR_INVALID_ARGUMENT);
    DT_ASSERT_ERROR_MENTIONS("placeholder 'any'");
    dt_tensor *src = NULL;
    DT_ASSERT_OK(dt_tensor_zeros(f.layout, DT_DTYPE_F32, f.shape, &src));
    DT_ASSERT_FAILS(dt_relayout(src, l, &t), DT_ERR_INVALID_ARGUMENT);
    DT_ASSERT_ERROR_MENTIONS("placeholder 'any'");
    dt_tensor_destroy(src);
    dt_layout_destroy(l);

    /* A TPU mesh of the same shape, made and parsed. */
    dt_mesh *tpu = NULL;
    DT_ASSERT_OK(dt_mesh_create("tpus", 1, (const char *const[]){"x"},
                                (const int64_t[]){f.md.size}, DT_DEVICE_TPU, &tpu));
    const char *x[] = {"x", U};
    DT_ASSERT_OK(dt_layout_create(tpu, 2, x, &l));
    DT_ASSERT_FAILS(dt_tensor_zeros(l, DT_DTYPE_F32, f.shape, &t), DT_ERR_UNSUPPORTED);
    DT_ASSERT_ERROR_MENTIONS("mesh 'tpus' is a TPU mesh");
    DT_ASSERT_ERROR_MENTIONS("CPU and GPU devices only");
    dt_layout_destroy(l);
    dt_mesh_destroy(tpu);
    DT_ASSERT_OK(dt_layout_parse("sharding_specs:x,unsharded, mesh:|x=2|*TPU", &l));
    DT_ASSERT_FAILS(dt_tensor_zeros(l, DT_DTYPE_F32, f.shape, &t), DT_ERR_UNSUPPORTED);
    DT_ASSERT_ERROR_MENTIONS("TPU mesh");
    dt_layout_destroy(l);

    /* TensorFlow's empty layout. */
    DT_ASSERT_OK(dt_layout_parse("empty_layout", &l));
    DT_ASSERT_FAILS(dt_tensor_zeros(l, DT_DTYPE_F32, NULL, &t), DT_ERR_INVALID_ARGUMENT);
    DT_ASSERT_ERROR_MENTIONS("empty mesh");
    dt_layout_destroy(l);
    CU_ASSERT_PTR_EQUAL(t, SENTINEL);
    err_fixture_free(&f);
}

/* ---- pack_managed ------------------------------------------------------------------------ */

typedef struct owned {
    DLManagedTensor m;
    int64_t shape[2];
    int *deleted;
} owned;

static void owned_deleter(DLManagedTensor *self)
{
    owned *o = self->manager_ctx;
    (*o->deleted)++;
    free(o->m.dl_tensor.data);
    free(o);
}

static DLManagedTensor *make_owned(const int64_t *shape, float first, int *deleted)
{
    owned *o = calloc(1, sizeof *o);
    o->shape[0] = shape[0];
    o->shape[1] = shape[1];
    int64_t n = shape[0] * shape[1];
    float *data = malloc((size_t)n * sizeof(float) + 16);
    for (int64_t k = 0; k < n; k++)
        data[k + 4] = first + (float)k;
    o->m.dl_tensor = (DLTensor){data, {kDLCPU, 0}, 2, {kDLFloat, 32, 1}, o->shape, NULL, 16};
    o->m.manager_ctx = o;
    o->m.deleter = owned_deleter;
    o->deleted = deleted;
    return &o->m;
}

/* The pack_managed tests hand over host memory (malloc'd, read by the deleter's owner): CPU
 * meshes only; on a GPU mesh check_round_trip packs managed device views. */
static void test_pack_managed_is_zero_copy_and_deletes_once_on_destroy(void)
{
    if (on_gpu())
        return;
    err_fixture f;
    CU_ASSERT_FATAL(err_fixture_init(&f) == 0);
    int deleted[8] = {0};
    DLManagedTensor *m[8];
    for (int i = 0; i < f.n; i++)
        m[i] = make_owned(f.len[i], (float)(100 * i), &deleted[i]);
    dt_tensor *t = NULL;
    DT_ASSERT_OK(dt_tensor_pack_managed(f.layout, f.shape, f.n, m, &t));
    for (int i = 0; i < f.n; i++) {
        const DLTensor *x = dt_tensor_local(t, i);
        /* Zero copy: the tensor views the caller's memory past byte_offset. */
        CU_ASSERT_PTR_EQUAL(x->data, (char *)m[i]->dl_tensor.data + 16);
        CU_ASSERT_EQUAL(x->byte_offset, 0);
        CU_ASSERT_EQUAL(((const float *)x->data)[1], (float)(100 * i) + 1.0f);
        CU_ASSERT_EQUAL(deleted[i], 0);
    }
    /* An unpacked view keeps the managed memory alive past the tensor. */
    DLManagedTensor *views[8];
    DT_ASSERT_OK(dt_tensor_unpack(t, f.n, views));
    dt_tensor_destroy(t);
    for (int i = 0; i < f.n; i++) {
        CU_ASSERT_EQUAL(deleted[i], 0);
        CU_ASSERT_EQUAL(((const float *)views[i]->dl_tensor.data)[0], (float)(100 * i));
    }
    for (int i = 0; i < f.n; i++)
        views[i]->deleter(views[i]);
    for (int i = 0; i < f.n; i++)
        CU_ASSERT_EQUAL(deleted[i], 1);
    err_fixture_free(&f);
}

static void test_pack_managed_takes_nothing_on_failure(void)
{
    if (on_gpu())
        return;
    err_fixture f;
    CU_ASSERT_FATAL(err_fixture_init(&f) == 0);
    int deleted[8] = {0};
    DLManagedTensor *m[8];
    for (int i = 0; i < f.n; i++)
        m[i] = make_owned(f.len[i], 0.0f, &deleted[i]);
    dt_tensor *t = SENTINEL;
    m[f.n - 1]->dl_tensor.shape[1] = 5; /* wrong shape on the last component */
    DT_ASSERT_FAILS(dt_tensor_pack_managed(f.layout, f.shape, f.n, m, &t), DT_ERR_SHAPE);
    DT_ASSERT_FAILS(dt_tensor_pack_managed(f.layout, f.shape, f.n - 1, m, &t),
                    DT_ERR_INVALID_ARGUMENT);
    DLManagedTensor *dup[8];
    for (int i = 0; i < f.n; i++)
        dup[i] = m[0];
    DT_ASSERT_FAILS(dt_tensor_pack_managed(f.layout, f.shape, f.n, dup, &t),
                    DT_ERR_INVALID_ARGUMENT);
    CU_ASSERT_PTR_EQUAL(t, SENTINEL);
    for (int i = 0; i < f.n; i++) {
        CU_ASSERT_EQUAL(deleted[i], 0);
        m[i]->deleter(m[i]); /* still the caller's */
        CU_ASSERT_EQUAL(deleted[i], 1);
    }
    err_fixture_free(&f);
}

/* ---- creation, reference counting ----------------------------------------------------- */

static void test_zeros_and_filled_set_every_local_element(void)
{
    mesh_desc md = mesh_desc_for(2);
    dt_mesh *mesh = make_mesh(&md);
    CU_ASSERT_PTR_NOT_NULL_FATAL(mesh);
    layout_case lc = {2, {"b", "a"}, {7, 5}, NULL};
    dt_layout *layout = make_layout(mesh, &lc);
    CU_ASSERT_PTR_NOT_NULL_FATAL(layout);
    int n = dt_mesh_num_local_devices(mesh);
    for (int k = 0; k < NDTYPES; k++) {
        dt_dtype dtype = all_dtypes[k];
        size_t es = hand_size(dtype);
        unsigned char value[8], zero[8] = {0};
        put_value(dtype, value, 37);
        dt_tensor *z = NULL, *v = NULL;
        DT_ASSERT_OK(dt_tensor_zeros(layout, dtype, lc.shape, &z));
        DT_ASSERT_OK(dt_tensor_filled(layout, dtype, lc.shape, value, &v));
        CU_ASSERT_EQUAL(dt_tensor_dtype(z), dtype);
        CU_ASSERT_EQUAL(dt_tensor_numel(v), 35);
        for (int i = 0; i < n; i++) {
            int64_t off[2], len[2];
            hand_box(&md, 2, lc.specs, lc.shape,
                     hand_position(&md, dt_mesh_local_device_id(mesh, i)), off, len);
            const DLTensor *a = dt_tensor_local(z, i), *b = dt_tensor_local(v, i);
            CU_ASSERT_EQUAL(dt_tensor_local_offset(z, i)[0], off[0]);
            CU_ASSERT_EQUAL(dt_tensor_local_offset(v, i)[1], off[1]);
            CU_ASSERT_EQUAL(a->shape[0], len[0]);
            CU_ASSERT_EQUAL(b->shape[1], len[1]);
            CU_ASSERT_EQUAL(b->dtype.bits, hand_dl_type(dtype).bits);
            CU_ASSERT_EQUAL(b->device.device_type, mesh_dl_type());
            char *za = dt_test_local_get(z, i), *vb = dt_test_local_get(v, i);
            for (int64_t e = 0; e < len[0] * len[1]; e++) {
                CU_ASSERT(memcmp(za + e * (int64_t)es, zero, es) == 0);
                CU_ASSERT(memcmp(vb + e * (int64_t)es, value, es) == 0);
            }
            free(za);
            free(vb);
        }
        dt_tensor_destroy(z);
        dt_tensor_destroy(v);
    }
    dt_tensor *t = SENTINEL;
    DT_ASSERT_FAILS(dt_tensor_filled(layout, DT_DTYPE_F32, lc.shape, NULL, &t),
                    DT_ERR_INVALID_ARGUMENT);
    DT_ASSERT_FAILS(dt_tensor_zeros(layout, DT_DTYPE_COUNT_, lc.shape, &t),
                    DT_ERR_INVALID_ARGUMENT);
    int64_t negative[2] = {7, -1};
    DT_ASSERT_FAILS(dt_tensor_zeros(layout, DT_DTYPE_F32, negative, &t),
                    DT_ERR_INVALID_ARGUMENT);
    CU_ASSERT_PTR_EQUAL(t, SENTINEL);
    dt_layout_destroy(layout);
    dt_mesh_destroy(mesh);
}

/* Components come from the runtime's host pool and go back to it on destroy (CPU meshes). */
static void test_zeros_allocates_from_host_pool(void)
{
    if (on_gpu())
        return;
    mesh_desc md = mesh_desc_for(1);
    dt_mesh *mesh = make_mesh(&md);
    CU_ASSERT_PTR_NOT_NULL_FATAL(mesh);
    layout_case lc = {2, {"x", U}, {md.size * 64, 32}, NULL};
    dt_layout *layout = make_layout(mesh, &lc);
    CU_ASSERT_PTR_NOT_NULL_FATAL(layout);
    dt_pool_stats before, during, after;
    dt_host_pool_stats(&before);
    dt_tensor *t = NULL;
    DT_ASSERT_OK(dt_tensor_zeros(layout, DT_DTYPE_F64, lc.shape, &t));
    dt_host_pool_stats(&during);
    int n = dt_mesh_num_local_devices(mesh);
    CU_ASSERT(during.allocs >= before.allocs + (uint64_t)n);
    CU_ASSERT(during.bytes_in_use >= before.bytes_in_use + (uint64_t)n * 64 * 32 * 8);
    dt_tensor_destroy(t);
    dt_host_pool_stats(&after);
    CU_ASSERT_EQUAL(after.bytes_in_use, before.bytes_in_use);
    dt_layout_destroy(layout);
    dt_mesh_destroy(mesh);
}

static void test_sizes_that_overflow_are_rejected(void)
{
    mesh_desc md = mesh_desc_for(1);
    dt_mesh *mesh = make_mesh(&md);
    CU_ASSERT_PTR_NOT_NULL_FATAL(mesh);
    dt_layout *layout = NULL;
    DT_ASSERT_OK(dt_layout_replicated(mesh, 2, &layout));
    dt_tensor *t = SENTINEL;
    int64_t elements[2] = {INT64_C(1) << 40, INT64_C(1) << 40}; /* 2^80 elements */
    DT_ASSERT_FAILS(dt_tensor_zeros(layout, DT_DTYPE_U8, elements, &t), DT_ERR_INVALID_ARGUMENT);
    int64_t bytes[2] = {INT64_C(1) << 31, INT64_C(1) << 30}; /* 2^61 elements, 2^64 bytes */
    DT_ASSERT_FAILS(dt_tensor_zeros(layout, DT_DTYPE_I64, bytes, &t), DT_ERR_INVALID_ARGUMENT);
    CU_ASSERT_PTR_EQUAL(t, SENTINEL);
    dt_layout_destroy(layout);
    dt_mesh_destroy(mesh);
}

static void test_retain_and_destroy_count_references(void)
{
    mesh_desc md = mesh_desc_for(1);
    dt_mesh *mesh = make_mesh(&md);
    CU_ASSERT_PTR_NOT_NULL_FATAL(mesh);
    dt_layout *layout = NULL;
    DT_ASSERT_OK(dt_layout_batch_sharded(mesh, "x", 1, 0, &layout));
    int64_t shape[1] = {md.size * 3};
    int32_t seven = 7;
    dt_tensor *t = NULL;
    DT_ASSERT_OK(dt_tensor_filled(layout, DT_DTYPE_I32, shape, &seven, &t));
    dt_layout_destroy(layout);
    dt_mesh_destroy(mesh); /* the tensor's layout keeps the mesh */
    CU_ASSERT_PTR_EQUAL(dt_tensor_retain(t), t);
    dt_tensor_destroy(t);
    /* Still alive through the second reference. */
    CU_ASSERT_EQUAL(dt_layout_rank(dt_tensor_layout(t)), 1);
    int32_t *v = dt_test_local_get(t, 0);
    CU_ASSERT_EQUAL(v[2], 7);
    free(v);
    dt_tensor_destroy(t);
    dt_tensor_destroy(NULL);
}

int main(int argc, char **argv)
{
    static const dt_test_case cases[] = {
        DT_TEST(test_dtype_sizes_and_names_match_table),
        DT_TEST(test_dtype_names_round_trip_through_parse),
        DT_TEST(test_dtype_dlpack_conversions_round_trip),
        DT_TEST(test_dtype_from_dlpack_rejects_unsupported_types),
        DT_TEST(test_pack_unpack_round_trip_on_1d_mesh),
        DT_TEST(test_pack_unpack_round_trip_on_2d_mesh_with_uneven_7x5),
        DT_TEST(test_pack_unpack_round_trip_on_3d_mesh),
        DT_TEST(test_pack_unpack_follows_mesh_positions_of_permuted_ids),
        DT_TEST(test_pack_honours_byte_offset_and_compact_strides),
        DT_TEST(test_pack_rejects_wrong_shape_naming_device_and_expected_shape),
        DT_TEST(test_pack_rejects_wrong_dtype),
        DT_TEST(test_pack_rejects_wrong_device_type),
        DT_TEST(test_pack_rejects_non_compact_strides_and_null_data),
        DT_TEST(test_pack_rejects_wrong_component_count),
        DT_TEST(test_pack_and_zeros_reject_mesh_bigger_than_devices),
        DT_TEST(test_pack_and_zeros_reject_placeholder_tpu_and_empty_layouts),
        DT_TEST(test_pack_managed_is_zero_copy_and_deletes_once_on_destroy),
        DT_TEST(test_pack_managed_takes_nothing_on_failure),
        DT_TEST(test_zeros_and_filled_set_every_local_element),
        DT_TEST(test_zeros_allocates_from_host_pool),
        DT_TEST(test_sizes_that_overflow_are_rejected),
        DT_TEST(test_retain_and_destroy_count_references),
        DT_TEST_END,
    };
    return dt_test_main_device(argc, argv, "tensor", cases);
}
