/* Reference tensors for the relayout tests, computed without the library's shard math. */
#include "rl_test_util.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "runtime/half.h" /* half conversions, for building f16/bf16 data */

uint64_t rl_next(rl_rng *r)
{
    /* splitmix64 */
    uint64_t z = (r->s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

int64_t rl_below(rl_rng *r, int64_t n)
{
    return (int64_t)(rl_next(r) % (uint64_t)n);
}

double rl_summand_value(uint64_t seed, int64_t c, int64_t e, dt_dtype dtype)
{
    uint64_t h = seed * 1000003u + (uint64_t)c * 7919u + (uint64_t)e * 104729u;
    h ^= h >> 13;
    h *= 0x5bd1e995u;
    h ^= h >> 15;
    int64_t v = (int64_t)(h % 9u);               /* 0..8 */
    if (dtype != DT_DTYPE_U8)
        v -= 4;                                  /* -4..4 */
    return (double)v;
}

static void store(void *base, int64_t i, dt_dtype dtype, double v)
{
    switch (dtype) {
    case DT_DTYPE_F32: ((float *)base)[i] = (float)v; break;
    case DT_DTYPE_F64: ((double *)base)[i] = v; break;
    case DT_DTYPE_F16: ((uint16_t *)base)[i] = dt__f32_to_f16((float)v); break;
    case DT_DTYPE_BF16: ((uint16_t *)base)[i] = dt__f32_to_bf16((float)v); break;
    case DT_DTYPE_I32: ((int32_t *)base)[i] = (int32_t)v; break;
    case DT_DTYPE_I64: ((int64_t *)base)[i] = (int64_t)v; break;
    case DT_DTYPE_U8: ((uint8_t *)base)[i] = (uint8_t)v; break;
    default: break;
    }
}

static double load(const void *base, int64_t i, dt_dtype dtype)
{
    switch (dtype) {
    case DT_DTYPE_F32: return ((const float *)base)[i];
    case DT_DTYPE_F64: return ((const double *)base)[i];
    case DT_DTYPE_F16: return dt__f16_to_f32(((const uint16_t *)base)[i]);
    case DT_DTYPE_BF16: return dt__bf16_to_f32(((const uint16_t *)base)[i]);
    case DT_DTYPE_I32: return ((const int32_t *)base)[i];
    case DT_DTYPE_I64: return (double)((const int64_t *)base)[i];
    case DT_DTYPE_U8: return ((const uint8_t *)base)[i];
    default: return NAN;
    }
}

void rl_box_of(int64_t n, int64_t k, int64_t j, int64_t *off, int64_t *len)
{
    /* Walk the shards: shard i takes ceil((n - taken) / (k - i)) elements. */
    int64_t taken = 0;
    for (int64_t i = 0; i <= j; i++) {
        int64_t take = (n - taken + (k - i) - 1) / (k - i);
        if (i == j) {
            *off = taken;
            *len = take;
        }
        taken += take;
    }
}

/* Box of mesh position p under layout l for shape. */
static void position_box(const dt_layout *l, const int64_t *shape, int64_t p, int64_t *off,
                         int64_t *len)
{
    const dt_mesh *m = dt_layout_mesh(l);
    int64_t coords[DT_MESH_MAX_DIMS];
    dt_mesh_coords(m, p, coords);
    for (int d = 0; d < dt_layout_rank(l); d++) {
        int md = dt_layout_spec_mesh_dim(l, d);
        if (md < 0) {
            off[d] = 0;
            len[d] = shape[d];
        } else {
            rl_box_of(shape[d], dt_mesh_dim_size(m, md), coords[md], &off[d], &len[d]);
        }
    }
}

/* Summand index of position p: mixed radix over the layout's partial dims, in their order. */
static int64_t summand_of(const dt_layout *l, int64_t p)
{
    const dt_mesh *m = dt_layout_mesh(l);
    int64_t coords[DT_MESH_MAX_DIMS], c = 0;
    dt_mesh_coords(m, p, coords);
    for (int i = 0; i < dt_layout_num_partial(l); i++) {
        int md;
        dt_reduce_op op;
        dt_layout_partial(l, i, &md, &op);
        c = c * dt_mesh_dim_size(m, md) + coords[md];
    }
    return c;
}

dt_status rl_make_tensor(const dt_layout *layout, const int64_t *shape, dt_dtype dtype,
                         uint64_t seed, dt_tensor **out)
{
    const dt_mesh *m = dt_layout_mesh(layout);
    int rank = dt_layout_rank(layout), n = dt_mesh_num_local_devices(m);
    size_t elem = dt_dtype_size(dtype);
    void **bufs = calloc((size_t)n + 1, sizeof *bufs);
    for (int k = 0; k < n; k++) {
        int64_t p = dt_mesh_position(m, dt_mesh_local_device_id(m, k));
        int64_t off[DT_MAX_RANK], len[DT_MAX_RANK], cnt = 1;
        position_box(layout, shape, p, off, len);
        for (int d = 0; d < rank; d++)
            cnt *= len[d];
        bufs[k] = malloc((size_t)cnt * elem + 1);
        int64_t c = summand_of(layout, p);
        for (int64_t i = 0; i < cnt; i++)
            store(bufs[k], i, dtype,
                  rl_summand_value(seed, c, dt_test_global_index(rank, shape, off, len, i), dtype));
    }
    /* Through the components' device (host buffers written in), whatever the mesh's type. */
    dt_status st = dt_test_pack_host(layout, dtype, shape, (const void *const *)bufs, out);
    for (int k = 0; k < n; k++)
        free(bufs[k]);
    free(bufs);
    return st;
}

/* Expected value at global element e of destination position q. */
static double expected(const dt_layout *src, const dt_layout *dst, int64_t q, int64_t e,
                       uint64_t seed, dt_dtype dtype)
{
    const dt_mesh *sm = dt_layout_mesh(src), *dm = dt_layout_mesh(dst);
    int64_t qc[DT_MESH_MAX_DIMS];
    dt_mesh_coords(dm, q, qc);
    int np = dt_layout_num_partial(src);
    int sdim[DT_MESH_MAX_DIMS], keep_coord[DT_MESH_MAX_DIMS];
    dt_reduce_op sop[DT_MESH_MAX_DIMS], op = DT_REDUCE_SUM;
    int reduce = 0;
    for (int i = 0; i < np; i++) {
        dt_layout_partial(src, i, &sdim[i], &sop[i]);
        keep_coord[i] = -1;
        int dd = dt_mesh_dim_index(dm, dt_mesh_dim_name(sm, sdim[i]));
        for (int j = 0; dd >= 0 && j < dt_layout_num_partial(dst); j++) {
            int md;
            dt_reduce_op o;
            dt_layout_partial(dst, j, &md, &o);
            if (md == dd && o == sop[i] && dt_mesh_dim_size(dm, dd) == dt_mesh_dim_size(sm, sdim[i]))
                keep_coord[i] = (int)qc[dd];
        }
        if (keep_coord[i] < 0) {
            reduce = 1;
            op = sop[i];
        }
    }
    /* New sum-partial dims of the destination: zeros off coordinate 0. */
    for (int j = 0; j < dt_layout_num_partial(dst); j++) {
        int md, kept = 0;
        dt_reduce_op o;
        dt_layout_partial(dst, j, &md, &o);
        for (int i = 0; i < np; i++)
            kept |= keep_coord[i] >= 0 && dt_mesh_dim_index(dm, dt_mesh_dim_name(sm, sdim[i])) == md;
        if (!kept && o == DT_REDUCE_SUM && qc[md] != 0)
            return 0.0;
    }
    /* Reduce over every summand whose kept coordinates match, in summand order. */
    int64_t total = 1;
    for (int i = 0; i < np; i++)
        total *= dt_mesh_dim_size(sm, sdim[i]);
    double acc = 0;
    int64_t count = 0;
    for (int64_t c = 0; c < total; c++) {
        int64_t rest = c, ok = 1;
        for (int i = np - 1; i >= 0; i--) {
            int64_t coord = rest % dt_mesh_dim_size(sm, sdim[i]);
            rest /= dt_mesh_dim_size(sm, sdim[i]);
            if (keep_coord[i] >= 0 && coord != keep_coord[i])
                ok = 0;
        }
        if (!ok)
            continue;
        double v = rl_summand_value(seed, c, e, dtype);
        if (count == 0)
            acc = v;
        else if (op == DT_REDUCE_MAX)
            acc = v > acc ? v : acc;
        else if (op == DT_REDUCE_MIN)
            acc = v < acc ? v : acc;
        else
            acc += v;
        count++;
    }
    if (reduce && op == DT_REDUCE_AVG) {
        acc /= (double)count;
        if (dtype == DT_DTYPE_I32 || dtype == DT_DTYPE_I64 || dtype == DT_DTYPE_U8)
            acc = trunc(acc);
    }
    /* Round to the dtype, as the library stores it. */
    union {
        double f64;
        char bytes[16];
    } tmp;
    store(tmp.bytes, 0, dtype, acc);
    return load(tmp.bytes, 0, dtype);
}

int64_t rl_check_tensor(const dt_tensor *t, const dt_layout *src_layout, uint64_t seed)
{
    const dt_layout *l = dt_tensor_layout(t);
    const dt_mesh *m = dt_layout_mesh(l);
    int rank = dt_tensor_rank(t);
    const int64_t *shape = dt_tensor_shape(t);
    dt_dtype dtype = dt_tensor_dtype(t);
    int64_t bad = 0;
    for (int k = 0; k < dt_tensor_num_local(t); k++) {
        int64_t q = dt_mesh_position(m, dt_mesh_local_device_id(m, k));
        int64_t off[DT_MAX_RANK], len[DT_MAX_RANK];
        position_box(l, shape, q, off, len);
        const DLTensor *dl = dt_tensor_local(t, k);
        int64_t cnt = 1;
        for (int d = 0; d < rank; d++) {
            if (dl->shape[d] != len[d] || dt_tensor_local_offset(t, k)[d] != off[d]) {
                if (bad++ < 3)
                    fprintf(stderr, "[rank %d] component %d dim %d: shape/offset %lld/%lld, "
                            "want %lld/%lld\n", dt_client_id(), k, d, (long long)dl->shape[d],
                            (long long)dt_tensor_local_offset(t, k)[d], (long long)len[d],
                            (long long)off[d]);
                return bad;
            }
            cnt *= len[d];
        }
        void *data = dt_test_local_get(t, k);
        for (int64_t i = 0; i < cnt; i++) {
            int64_t e = dt_test_global_index(rank, shape, off, len, i);
            double want = expected(src_layout, l, q, e, seed, dtype), got = load(data, i, dtype);
            if (got != want && bad++ < 3)
                fprintf(stderr, "[rank %d] position %lld element %lld: got %g want %g\n",
                        dt_client_id(), (long long)q, (long long)e, got, want);
        }
        free(data);
    }
    return bad;
}

dt_layout *rl_layout2(const dt_mesh *m, const char *a, const char *b, const char *partial)
{
    const char *specs[2] = {a, b};
    dt_reduce_op op = DT_REDUCE_SUM;
    dt_layout *l = NULL;
    DT_ASSERT_OK(dt_layout_create_partial(m, 2, specs, partial ? 1 : 0, &partial, &op, &l));
    return l;
}

/* A random layout: each tensor dim sharded on an unused mesh dim with probability 1/2; with
 * `partial`, each remaining mesh dim partial with probability 1/3, all with one reduction. */
dt_status rl_random_layout(rl_rng *r, const dt_mesh *m, int rank, int partial, dt_reduce_op op,
                           dt_layout **out)
{
    const char *specs[DT_MAX_RANK], *pdims[DT_MESH_MAX_DIMS];
    dt_reduce_op ops[DT_MESH_MAX_DIMS];
    int used[DT_MESH_MAX_DIMS] = {0}, mr = dt_mesh_rank(m), np = 0;
    for (int d = 0; d < rank; d++) {
        specs[d] = DT_UNSHARDED;
        int md = (int)rl_below(r, mr);
        if (rl_below(r, 2) && !used[md]) {
            used[md] = 1;
            specs[d] = dt_mesh_dim_name(m, md);
        }
    }
    for (int md = 0; partial && md < mr; md++)
        if (!used[md] && rl_below(r, 3) == 0) {
            pdims[np] = dt_mesh_dim_name(m, md);
            ops[np++] = op;
        }
    return dt_layout_create_partial(m, rank, specs, np, pdims, ops, out);
}
