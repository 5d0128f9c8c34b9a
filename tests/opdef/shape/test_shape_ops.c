/* The shape, index and host-transfer family through the generic path: every op on a
 * 1-device mesh and on meshes of 2, 2x2 and 2 x (devices / 2) devices, its inputs replicated,
 * sharded on each dim (all of them, or the first alone) and sum-partial where the op is linear
 * in them, against a naive single-device reference computed here, bit for bit; error cases on
 * every client; the host transfers on every layout. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "../../ops/ops_test_util.h"

#define MAXIN 12

/* ---- meshes and layouts ----------------------------------------------------------------- */

static dt_mesh *mesh_of(const char *name, int ndims, const int64_t *sizes)
{
    const char *names1[1] = {"x"}, *names2[2] = {"b", "m"};
    dt_mesh *m = NULL;
    DT_ASSERT_OK(dt_mesh_create(name, ndims, ndims == 1 ? names1 : names2, sizes,
                                dt_test_device_type(), &m));
    return m;
}

/* The meshes of every test: 1, 2, 2x2 and 2 x (devices / 2) devices. */
static int meshes(dt_mesh **out)
{
    int n = 0, devs = dt_test_num_devices();
    out[n++] = mesh_of("one", 1, (int64_t[]){1});
    out[n++] = mesh_of("pair", 1, (int64_t[]){2});
    out[n++] = mesh_of("grid", 2, (int64_t[]){2, 2});
    if (devs > 4)
        out[n++] = mesh_of("all", 2, (int64_t[]){2, devs / 2});
    return n;
}

static void meshes_free(dt_mesh **m, int n)
{
    for (int i = 0; i < n; i++)
        dt_mesh_destroy(m[i]);
}

/* A layout: tensor dim d sharded on mesh dim spec[d] (-1: not), sum-partial over mesh dim
 * `partial` (-1: none). */
static dt_layout *layout_of(const dt_mesh *mesh, int rank, const int *spec, int partial)
{
    const char *specs[DT_MAX_RANK];
    for (int d = 0; d < rank; d++)
        specs[d] = spec && spec[d] >= 0 ? dt_mesh_dim_name(mesh, spec[d]) : DT_UNSHARDED;
    const char *pd[1] = {partial >= 0 ? dt_mesh_dim_name(mesh, partial) : NULL};
    dt_reduce_op po[1] = {DT_REDUCE_SUM};
    dt_layout *l = NULL;
    DT_ASSERT_OK(dt_layout_create_partial(mesh, rank, specs, partial >= 0 ? 1 : 0, pd, po, &l));
    return l;
}

/* ---- one case: inputs, the call, the reference ------------------------------------------ */

typedef struct tcase tcase;
typedef dt_status (*call_fn)(const tcase *c, const dt_tensor *const *in, dt_tensor **out);

struct tcase {
    const char *name;
    int nin;
    dt_dtype dtype[MAXIN];
    int rank[MAXIN];
    int64_t shape[MAXIN][DT_MAX_RANK];
    const void *data[MAXIN];
    unsigned partial_ok; /* bit i: input i may come sum-partial (the op is linear in it) */
    call_fn call;
    int64_t arg[DT_MAX_RANK + 2]; /* the call's arguments */
    dt_dtype out_dtype;
    int out_rank;
    int64_t out_shape[DT_MAX_RANK];
    const void *want;
};

static int64_t numel_of(int rank, const int64_t *shape)
{
    int64_t n = 1;
    for (int d = 0; d < rank; d++)
        n *= shape[d];
    return n;
}

/* Runs c with the inputs laid out as lay[i], compares with c->want bit for bit. */
static void run_once(const tcase *c, dt_layout *const *lay, const char *where)
{
    dt_tensor *in[MAXIN] = {0}, *out = NULL;
    for (int i = 0; i < c->nin; i++)
        DT_ASSERT_OK(dt_tensor_from_host(lay[i], c->dtype[i], c->shape[i], c->data[i], &in[i]));
    dt_status st = c->call(c, (const dt_tensor *const *)in, &out);
    if (st != DT_OK)
        fprintf(stderr, "[rank %d] %s on %s: %s: %s\n", dt_client_id(), c->name, where,
                dt_status_name(st), dt_last_error());
    CU_ASSERT_EQUAL_FATAL(st, DT_OK);
    CU_ASSERT_EQUAL(dt_tensor_dtype(out), c->out_dtype);
    CU_ASSERT_EQUAL_FATAL(dt_tensor_rank(out), c->out_rank);
    CU_ASSERT_EQUAL(
        memcmp(dt_tensor_shape(out), c->out_shape, (size_t)c->out_rank * sizeof(int64_t)), 0);
    size_t bytes = (size_t)numel_of(c->out_rank, c->out_shape) * dt_dtype_size(c->out_dtype);
    void *got = malloc(bytes ? bytes : 1);
    ot_fetch(out, got);
    int same = bytes == 0 || memcmp(got, c->want, bytes) == 0;
    if (!same)
        fprintf(stderr, "[rank %d] %s on %s: values differ from the reference\n", dt_client_id(),
                c->name, where);
    CU_ASSERT(same);
    free(got);
    dt_tensor_destroy(out);
    for (int i = 0; i < c->nin; i++)
        dt_tensor_destroy(in[i]);
}

/* c on every mesh and layout pattern. */
static void check_everywhere(const tcase *c)
{
    dt_mesh *ms[4];
    int nm = meshes(ms);
    for (int mi = 0; mi < nm; mi++) {
        const dt_mesh *mesh = ms[mi];
        if (dt_mesh_num_local_devices(mesh) == 0)
            continue;
        int mr = dt_mesh_rank(mesh);
        /* Patterns: 0 replicated; then (tensor dim d, mesh dim m) for every input or the
         * first alone; both mesh dims on dims 0 and 1; partial inputs. */
        for (int p = 0; p < 64; p++) {
            int spec[MAXIN][DT_MAX_RANK], partial[MAXIN];
            char where[160];
            for (int i = 0; i < c->nin; i++) {
                partial[i] = -1;
                for (int d = 0; d < DT_MAX_RANK; d++)
                    spec[i][d] = -1;
            }
            int valid = 1;
            if (p == 0) {
                snprintf(where, sizeof where, "%s, replicated", dt_mesh_name(mesh));
            } else if (p <= 2 * DT_MAX_RANK * mr) {
                int k = p - 1, only_first = k % 2, d = (k / 2) % DT_MAX_RANK,
                    m = k / 2 / DT_MAX_RANK;
                valid = d < c->rank[0] && (!only_first || c->nin > 1);
                /* The time budget: the first input alone on the pair only, and the widest
                 * mesh's "b" (of 2, as the grid's) only with "m". */
                valid &= !only_first || mr == 1;
                valid &= !(mi == 3 && m == 0);
                for (int i = 0; i < c->nin; i++)
                    if (d < c->rank[i] && (!only_first || i == 0))
                        spec[i][d] = m;
                snprintf(where, sizeof where, "%s, dim %d on %s (%s)", dt_mesh_name(mesh), d,
                         dt_mesh_dim_name(mesh, m), only_first ? "input 0" : "every input");
            } else if (p == 2 * DT_MAX_RANK * mr + 1) {
                valid = mr == 2;
                for (int i = 0; i < c->nin; i++)
                    for (int d = 0; d < c->rank[i] && d < 2; d++)
                        spec[i][d] = d;
                snprintf(where, sizeof where, "%s, dims 0 and 1 on b and m", dt_mesh_name(mesh));
            } else if (p == 2 * DT_MAX_RANK * mr + 2) {
                valid = c->partial_ok != 0 && dt_mesh_size(mesh) > 1;
                for (int i = 0; i < c->nin; i++)
                    if (c->partial_ok & (1u << i))
                        partial[i] = mr - 1;
                snprintf(where, sizeof where, "%s, partial over %s", dt_mesh_name(mesh),
                         dt_mesh_dim_name(mesh, mr - 1));
            } else {
                break;
            }
            if (!valid || (dt_mesh_size(mesh) == 1 && p > 0) || (mi == 3 && p == 0))
                continue;
            dt_layout *lay[MAXIN];
            for (int i = 0; i < c->nin; i++)
                lay[i] = layout_of(mesh, c->rank[i], spec[i], partial[i]);
            run_once(c, lay, where);
            for (int i = 0; i < c->nin; i++)
                dt_layout_destroy(lay[i]);
        }
    }
    meshes_free(ms, nm);
}

/* ---- reference helpers ------------------------------------------------------------------ */

static void fill_f32(float *x, int64_t n, uint64_t seed)
{
    ot_fill_int(x, n, -9, 9, seed);
}

static void fill_f64(double *x, int64_t n, uint64_t seed)
{
    float *t = malloc((size_t)n * sizeof *t);
    ot_fill_int(t, n, -9, 9, seed);
    for (int64_t k = 0; k < n; k++)
        x[k] = t[k] + 0.25 * (double)(k % 4);
    free(t);
}

static void set_in(tcase *c, int i, dt_dtype dtype, int rank, const int64_t *shape,
                   const void *data)
{
    c->dtype[i] = dtype;
    c->rank[i] = rank;
    if (rank)
        memcpy(c->shape[i], shape, (size_t)rank * sizeof *shape);
    c->data[i] = data;
}

static void set_out(tcase *c, dt_dtype dtype, int rank, const int64_t *shape, const void *want)
{
    c->out_dtype = dtype;
    c->out_rank = rank;
    if (rank)
        memcpy(c->out_shape, shape, (size_t)rank * sizeof *shape);
    c->want = want;
}

/* ---- shape ops -------------------------------------------------------------------------- */

static dt_status call_reshape(const tcase *c, const dt_tensor *const *in, dt_tensor **out)
{
    return dt_reshape(in[0], (int)c->arg[0], c->arg + 1, out);
}

static void test_reshape_matches_the_reference_on_every_layout(void)
{
    float x[48];
    fill_f32(x, 48, 1);
    static const struct {
        int rin, rout;
        int64_t in[4], arg[4], out[4];
    } cases[] = {
        {2, 3, {4, 12}, {2, 2, 12}, {2, 2, 12}},
        {3, 2, {4, 3, 4}, {4, -1}, {4, 12}},
        {2, 1, {8, 6}, {-1}, {48}},
        {3, 3, {2, 6, 4}, {2, 4, 6}, {2, 4, 6}},
        {2, 4, {6, 8}, {2, 3, 2, 4}, {2, 3, 2, 4}},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        tcase c = {.name = "reshape", .nin = 1, .partial_ok = 1, .call = call_reshape};
        set_in(&c, 0, DT_DTYPE_F32, cases[k].rin, cases[k].in, x);
        c.arg[0] = cases[k].rout;
        memcpy(c.arg + 1, cases[k].arg, sizeof cases[k].arg);
        set_out(&c, DT_DTYPE_F32, cases[k].rout, cases[k].out, x); /* same row-major bytes */
        check_everywhere(&c);
    }
    /* A scalar to [1, 1] and back. */
    tcase s = {.name = "reshape of a scalar",
               .nin = 1,
               .partial_ok = 1,
               .call = call_reshape,
               .arg = {2, 1, 1}};
    set_in(&s, 0, DT_DTYPE_F32, 0, NULL, x);
    set_out(&s, DT_DTYPE_F32, 2, (int64_t[]){1, 1}, x);
    check_everywhere(&s);
    tcase b = {.name = "reshape to a scalar", .nin = 1, .partial_ok = 1, .call = call_reshape};
    set_in(&b, 0, DT_DTYPE_F32, 2, (int64_t[]){1, 1}, x);
    set_out(&b, DT_DTYPE_F32, 0, NULL, x);
    check_everywhere(&b);
}

static dt_status call_permute(const tcase *c, const dt_tensor *const *in, dt_tensor **out)
{
    int perm[DT_MAX_RANK];
    for (int d = 0; d < c->rank[0]; d++)
        perm[d] = (int)c->arg[d];
    return dt_permute(in[0], perm, out);
}

static dt_status call_transpose(const tcase *c, const dt_tensor *const *in, dt_tensor **out)
{
    return dt_transpose(in[0], (int)c->arg[0], (int)c->arg[1], out);
}

static void test_permute_and_transpose_match_the_reference_on_every_layout(void)
{
    double x[60], y[60], t[60];
    fill_f64(x, 60, 2);
    /* [3, 4, 5] -> perm (2, 0, 1) -> [5, 3, 4] */
    for (int i = 0; i < 3; i++)
        for (int j = 0; j < 4; j++)
            for (int k = 0; k < 5; k++) {
                y[(k * 3 + i) * 4 + j] = x[(i * 4 + j) * 5 + k];
                t[(k * 4 + j) * 3 + i] = x[(i * 4 + j) * 5 + k]; /* transpose(0, 2) */
            }
    tcase c = {
        .name = "permute", .nin = 1, .partial_ok = 1, .call = call_permute, .arg = {2, 0, 1}};
    set_in(&c, 0, DT_DTYPE_F64, 3, (int64_t[]){3, 4, 5}, x);
    set_out(&c, DT_DTYPE_F64, 3, (int64_t[]){5, 3, 4}, y);
    check_everywhere(&c);
    tcase d = c;
    d.name = "transpose";
    d.call = call_transpose;
    d.arg[0] = 0;
    d.arg[1] = -1;
    set_out(&d, DT_DTYPE_F64, 3, (int64_t[]){5, 4, 3}, t);
    check_everywhere(&d);
}

static dt_status call_slice(const tcase *c, const dt_tensor *const *in, dt_tensor **out)
{
    return dt_slice(in[0], (int)c->arg[0], c->arg[1], c->arg[2], c->arg[3], out);
}

static void test_slice_matches_python_ranges_on_every_layout(void)
{
    float x[42];
    fill_f32(x, 42, 3); /* [6, 7] */
    static const int64_t args[][4] = {{0, 1, 6, 2}, {1, -5, 100, 3}, {-1, 0, 7, 1}, {0, 4, 2, 1}};
    for (size_t k = 0; k < 4; k++) {
        const int64_t *a = args[k];
        int axis = a[0] < 0 ? (int)a[0] + 2 : (int)a[0];
        int64_t n = axis ? 7 : 6, first = a[1] < 0 ? a[1] + n : a[1];
        int64_t stop = a[2] > n ? n : a[2],
                cnt = stop > first ? (stop - first + a[3] - 1) / a[3] : 0;
        int64_t shape[2] = {6, 7};
        shape[axis] = cnt;
        float want[42];
        for (int64_t i = 0; i < shape[0]; i++)
            for (int64_t j = 0; j < shape[1]; j++)
                want[i * shape[1] + j] =
                    axis == 0 ? x[(first + i * a[3]) * 7 + j] : x[i * 7 + first + j * a[3]];
        tcase c = {.name = "slice", .nin = 1, .partial_ok = 1, .call = call_slice};
        memcpy(c.arg, a, sizeof args[0]);
        set_in(&c, 0, DT_DTYPE_F32, 2, (int64_t[]){6, 7}, x);
        set_out(&c, DT_DTYPE_F32, 2, shape, want);
        check_everywhere(&c);
    }
}

static dt_status call_concat(const tcase *c, const dt_tensor *const *in, dt_tensor **out)
{
    return dt_concat(in, c->nin, (int)c->arg[0], out);
}

static dt_status call_stack(const tcase *c, const dt_tensor *const *in, dt_tensor **out)
{
    return dt_stack(in, c->nin, (int)c->arg[0], out);
}

static void test_concat_and_stack_match_the_reference_on_every_layout(void)
{
    float a[12], b[8], d[16], want[36];
    fill_f32(a, 12, 4); /* [4, 3] */
    fill_f32(b, 8, 5);  /* [4, 2] */
    fill_f32(d, 16, 6); /* [4, 4] */
    for (int i = 0; i < 4; i++) {
        memcpy(want + i * 9, a + i * 3, 3 * sizeof(float));
        memcpy(want + i * 9 + 3, b + i * 2, 2 * sizeof(float));
        memcpy(want + i * 9 + 5, d + i * 4, 4 * sizeof(float));
    }
    tcase c = {.name = "concat", .nin = 3, .partial_ok = 7, .call = call_concat, .arg = {1}};
    set_in(&c, 0, DT_DTYPE_F32, 2, (int64_t[]){4, 3}, a);
    set_in(&c, 1, DT_DTYPE_F32, 2, (int64_t[]){4, 2}, b);
    set_in(&c, 2, DT_DTYPE_F32, 2, (int64_t[]){4, 4}, d);
    set_out(&c, DT_DTYPE_F32, 2, (int64_t[]){4, 9}, want);
    check_everywhere(&c);
    /* Ten inputs along axis 0 (more than one call takes): rows of a, one by one. */
    float r[10][3], w10[30];
    tcase m = {.name = "concat of ten", .nin = 10, .partial_ok = 0x3ff, .call = call_concat};
    for (int k = 0; k < 10; k++) {
        for (int j = 0; j < 3; j++)
            r[k][j] = w10[k * 3 + j] = (float)(k * 10 + j);
        set_in(&m, k, DT_DTYPE_F32, 2, (int64_t[]){1, 3}, r[k]);
    }
    set_out(&m, DT_DTYPE_F32, 2, (int64_t[]){10, 3}, w10);
    check_everywhere(&m);
    /* stack of two [4, 3] on axis 1: [4, 2, 3]. */
    float e[12], ws[24];
    fill_f32(e, 12, 7);
    for (int i = 0; i < 4; i++) {
        memcpy(ws + i * 6, a + i * 3, 3 * sizeof(float));
        memcpy(ws + i * 6 + 3, e + i * 3, 3 * sizeof(float));
    }
    tcase s = {.name = "stack", .nin = 2, .partial_ok = 3, .call = call_stack, .arg = {1}};
    set_in(&s, 0, DT_DTYPE_F32, 2, (int64_t[]){4, 3}, a);
    set_in(&s, 1, DT_DTYPE_F32, 2, (int64_t[]){4, 3}, e);
    set_out(&s, DT_DTYPE_F32, 3, (int64_t[]){4, 2, 3}, ws);
    check_everywhere(&s);
}

static dt_status call_split_part(const tcase *c, const dt_tensor *const *in, dt_tensor **out)
{
    dt_tensor *parts[3] = {0};
    dt_status st = dt_split(in[0], (int)c->arg[0], c->arg + 2, 3, parts);
    if (st != DT_OK)
        return st;
    for (int k = 0; k < 3; k++) {
        if (k == c->arg[1])
            *out = parts[k];
        else
            dt_tensor_destroy(parts[k]);
    }
    return DT_OK;
}

static void test_split_gives_each_part_on_every_layout(void)
{
    float x[40], want[40];
    fill_f32(x, 40, 8); /* [5, 8] split on axis 1 into 3, 0, 5 */
    int64_t sizes[3] = {3, 0, 5}, off = 0;
    for (int k = 0; k < 3; k++) {
        for (int i = 0; i < 5; i++)
            for (int j = 0; j < sizes[k]; j++)
                want[i * sizes[k] + j] = x[i * 8 + off + j];
        tcase c = {.name = "split",
                   .nin = 1,
                   .partial_ok = 1,
                   .call = call_split_part,
                   .arg = {1, k, 3, 0, 5}};
        set_in(&c, 0, DT_DTYPE_F32, 2, (int64_t[]){5, 8}, x);
        set_out(&c, DT_DTYPE_F32, 2, (int64_t[]){5, sizes[k]}, want);
        check_everywhere(&c);
        off += sizes[k];
    }
}

static dt_status call_expand(const tcase *c, const dt_tensor *const *in, dt_tensor **out)
{
    return dt_expand(in[0], (int)c->arg[0], c->arg + 1, out);
}

static dt_status call_squeeze(const tcase *c, const dt_tensor *const *in, dt_tensor **out)
{
    return c->arg[0] ? dt_unsqueeze(in[0], (int)c->arg[1], out)
                     : dt_squeeze(in[0], (int)c->arg[1], out);
}

static void test_expand_squeeze_and_unsqueeze_match_the_reference_on_every_layout(void)
{
    float x[4], want[40];
    fill_f32(x, 4, 9); /* [4, 1] -> [2, 4, 5] */
    for (int b = 0; b < 2; b++)
        for (int i = 0; i < 4; i++)
            for (int j = 0; j < 5; j++)
                want[(b * 4 + i) * 5 + j] = x[i];
    tcase c = {
        .name = "expand", .nin = 1, .partial_ok = 1, .call = call_expand, .arg = {3, 2, -1, 5}};
    set_in(&c, 0, DT_DTYPE_F32, 2, (int64_t[]){4, 1}, x);
    set_out(&c, DT_DTYPE_F32, 3, (int64_t[]){2, 4, 5}, want);
    check_everywhere(&c);
    float y[24];
    fill_f32(y, 24, 10);
    tcase s = {.name = "squeeze", .nin = 1, .partial_ok = 1, .call = call_squeeze, .arg = {0, 1}};
    set_in(&s, 0, DT_DTYPE_F32, 3, (int64_t[]){4, 1, 6}, y);
    set_out(&s, DT_DTYPE_F32, 2, (int64_t[]){4, 6}, y);
    check_everywhere(&s);
    tcase u = {
        .name = "unsqueeze", .nin = 1, .partial_ok = 1, .call = call_squeeze, .arg = {1, -1}};
    set_in(&u, 0, DT_DTYPE_F32, 2, (int64_t[]){4, 6}, y);
    set_out(&u, DT_DTYPE_F32, 3, (int64_t[]){4, 6, 1}, y);
    check_everywhere(&u);
}

/* ---- index ops -------------------------------------------------------------------------- */

static dt_status call_gather(const tcase *c, const dt_tensor *const *in, dt_tensor **out)
{
    return dt_gather(in[0], (int)c->arg[0], in[1], out);
}

static dt_status call_scatter_add(const tcase *c, const dt_tensor *const *in, dt_tensor **out)
{
    return dt_scatter_add(in[0], (int)c->arg[0], in[1], in[2], out);
}

static void test_gather_and_scatter_add_match_the_reference_on_every_layout(void)
{
    double x[24], src[16], g[16], s[24];
    fill_f64(x, 24, 11); /* [4, 6] */
    fill_f64(src, 16, 12);
    int64_t idx[16]; /* [4, 4] along axis 1, values 0..5 with repeats */
    for (int k = 0; k < 16; k++)
        idx[k] = (k * 5 + 3) % 6;
    memcpy(s, x, sizeof s);
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 4; j++) {
            g[i * 4 + j] = x[i * 6 + idx[i * 4 + j]];
            s[i * 6 + idx[i * 4 + j]] += src[i * 4 + j];
        }
    tcase c = {.name = "gather", .nin = 2, .partial_ok = 1, .call = call_gather, .arg = {1}};
    set_in(&c, 0, DT_DTYPE_F64, 2, (int64_t[]){4, 6}, x);
    set_in(&c, 1, DT_DTYPE_I64, 2, (int64_t[]){4, 4}, idx);
    set_out(&c, DT_DTYPE_F64, 2, (int64_t[]){4, 4}, g);
    check_everywhere(&c);
    tcase t = {
        .name = "scatter_add", .nin = 3, .partial_ok = 5, .call = call_scatter_add, .arg = {1}};
    set_in(&t, 0, DT_DTYPE_F64, 2, (int64_t[]){4, 6}, x);
    set_in(&t, 1, DT_DTYPE_I64, 2, (int64_t[]){4, 4}, idx);
    set_in(&t, 2, DT_DTYPE_F64, 2, (int64_t[]){4, 4}, src);
    set_out(&t, DT_DTYPE_F64, 2, (int64_t[]){4, 6}, s);
    check_everywhere(&t);
    /* Along axis 0 with a smaller index ([2, 6] of x's [4, 6], i32). */
    int32_t i0[12];
    double g0[12];
    for (int k = 0; k < 12; k++) {
        i0[k] = (k * 7 + 1) % 4;
        g0[k] = x[i0[k] * 6 + k % 6];
    }
    tcase c0 = {
        .name = "gather axis 0", .nin = 2, .partial_ok = 1, .call = call_gather, .arg = {0}};
    set_in(&c0, 0, DT_DTYPE_F64, 2, (int64_t[]){4, 6}, x);
    set_in(&c0, 1, DT_DTYPE_I32, 2, (int64_t[]){2, 6}, i0);
    set_out(&c0, DT_DTYPE_F64, 2, (int64_t[]){2, 6}, g0);
    check_everywhere(&c0);
}

static dt_status call_index_select(const tcase *c, const dt_tensor *const *in, dt_tensor **out)
{
    return dt_index_select(in[0], (int)c->arg[0], in[1], out);
}

static dt_status call_index_add(const tcase *c, const dt_tensor *const *in, dt_tensor **out)
{
    return dt_index_add(in[0], (int)c->arg[0], in[1], in[2], out);
}

static void test_index_select_and_index_add_match_the_reference_on_every_layout(void)
{
    float x[30], src[36], sel[36], add[30];
    fill_f32(x, 30, 13);   /* [5, 6], axis 0 */
    fill_f32(src, 36, 14); /* [6, 6] */
    int32_t idx[6] = {4, 0, 4, 2, 1, 4};
    memcpy(add, x, sizeof add);
    for (int j = 0; j < 6; j++)
        for (int c = 0; c < 6; c++) {
            sel[j * 6 + c] = x[idx[j] * 6 + c];
            add[idx[j] * 6 + c] += src[j * 6 + c];
        }
    tcase c = {
        .name = "index_select", .nin = 2, .partial_ok = 1, .call = call_index_select, .arg = {0}};
    set_in(&c, 0, DT_DTYPE_F32, 2, (int64_t[]){5, 6}, x);
    set_in(&c, 1, DT_DTYPE_I32, 1, (int64_t[]){6}, idx);
    set_out(&c, DT_DTYPE_F32, 2, (int64_t[]){6, 6}, sel);
    check_everywhere(&c);
    tcase t = {.name = "index_add", .nin = 3, .partial_ok = 5, .call = call_index_add, .arg = {0}};
    set_in(&t, 0, DT_DTYPE_F32, 2, (int64_t[]){5, 6}, x);
    set_in(&t, 1, DT_DTYPE_I32, 1, (int64_t[]){6}, idx);
    set_in(&t, 2, DT_DTYPE_F32, 2, (int64_t[]){6, 6}, src);
    set_out(&t, DT_DTYPE_F32, 2, (int64_t[]){5, 6}, add);
    check_everywhere(&t);
}

static dt_status call_one_hot(const tcase *c, const dt_tensor *const *in, dt_tensor **out)
{
    return dt_one_hot(in[0], c->arg[0], (dt_dtype)c->arg[1], out);
}

static void test_one_hot_matches_the_reference_on_every_layout(void)
{
    int64_t idx[8] = {3, 0, 4, 4, 1, 2, 0, 3}; /* [2, 4] */
    float want[40] = {0};
    for (int p = 0; p < 8; p++)
        want[p * 5 + idx[p]] = 1;
    tcase c = {.name = "one_hot", .nin = 1, .call = call_one_hot, .arg = {5, DT_DTYPE_F32}};
    set_in(&c, 0, DT_DTYPE_I64, 2, (int64_t[]){2, 4}, idx);
    set_out(&c, DT_DTYPE_F32, 3, (int64_t[]){2, 4, 5}, want);
    check_everywhere(&c);
}

/* ---- propagation ------------------------------------------------------------------------ */

/* The propagator's plan for op on inputs sharded as spec[i] (one tensor dim on mesh dim 0 of
 * the pair, -1: replicated): no input is relaid out, and the output's dim out_dim is sharded
 * on it (out_dim -1: the output is sum-partial over it). */
static void check_plan(const dt_mesh *mesh, const char *name, int nin, const int *rank,
                       const int64_t (*shape)[DT_MAX_RANK], const dt_dtype *dtype, const int *spec,
                       const dt_op_attrs *a, int out_dim)
{
    const dt_op *op = dt_op_find(name);
    CU_ASSERT_PTR_NOT_NULL_FATAL(op);
    dt_tensor *in[4] = {0};
    dt_layout *lay[4] = {0}, *out = NULL;
    for (int i = 0; i < nin; i++) {
        int sp[DT_MAX_RANK] = {-1, -1, -1, -1, -1, -1, -1, -1};
        if (spec[i] >= 0)
            sp[spec[i]] = 0;
        dt_layout *l = layout_of(mesh, rank[i], sp, -1);
        DT_ASSERT_OK(dt_tensor_zeros(l, dtype[i], shape[i], &in[i]));
        dt_layout_destroy(l);
    }
    DT_ASSERT_OK(dt_op_plan(op, (const dt_tensor *const *)in, nin, a, NULL, lay, &out));
    for (int i = 0; i < nin; i++) {
        int same = dt_layout_equal(lay[i], dt_tensor_layout(in[i]));
        if (!same)
            fprintf(stderr, "%s: input %d is relaid out\n", name, i);
        CU_ASSERT(same);
        dt_layout_destroy(lay[i]);
        dt_tensor_destroy(in[i]);
    }
    int got = out_dim >= 0 ? dt_layout_spec_mesh_dim(out, out_dim) : dt_layout_num_partial(out);
    if (got != (out_dim >= 0 ? 0 : 1)) {
        char text[256];
        dt_layout_format(out, text, sizeof text);
        fprintf(stderr, "%s: output layout %s\n", name, text);
    }
    CU_ASSERT_EQUAL(got, out_dim >= 0 ? 0 : 1);
    dt_layout_destroy(out);
}

static void test_sharding_propagates_through_the_family_without_relayouts(void)
{
    dt_mesh *ms[4];
    int nm = meshes(ms);
    const dt_mesh *pair = ms[1];
    if (dt_mesh_num_local_devices(pair) > 0) {
        const dt_dtype f = DT_DTYPE_F32, i64 = DT_DTYPE_I64;
        dt_op_attrs a = DT_OP_ATTRS_INIT;
        a.i[0] = 3, a.i[1] = 2, a.i[2] = 2, a.i[3] = 12;
        check_plan(pair, "reshape", 1, (int[]){2}, (const int64_t[][8]){{4, 12}}, (dt_dtype[]){f},
                   (int[]){0}, &a, 0);
        a = (dt_op_attrs)DT_OP_ATTRS_INIT;
        a.i[0] = 1, a.i[1] = 48;
        check_plan(pair, "reshape", 1, (int[]){2}, (const int64_t[][8]){{4, 12}}, (dt_dtype[]){f},
                   (int[]){0}, &a, 0);
        a = (dt_op_attrs)DT_OP_ATTRS_INIT;
        a.i[0] = 2, a.i[1] = 0, a.i[2] = 1;
        check_plan(pair, "permute", 1, (int[]){3}, (const int64_t[][8]){{2, 3, 4}}, (dt_dtype[]){f},
                   (int[]){2}, &a, 0);
        a = (dt_op_attrs)DT_OP_ATTRS_INIT;
        a.i[0] = 0, a.i[1] = 1, a.i[2] = 5, a.i[3] = 2;
        check_plan(pair, "slice", 1, (int[]){2}, (const int64_t[][8]){{6, 8}}, (dt_dtype[]){f},
                   (int[]){1}, &a, 1);
        a = (dt_op_attrs)DT_OP_ATTRS_INIT;
        a.i[0] = 1;
        check_plan(pair, "concat", 2, (int[]){2, 2}, (const int64_t[][8]){{4, 3}, {4, 2}},
                   (dt_dtype[]){f, f}, (int[]){0, 0}, &a, 0);
        check_plan(pair, "gather", 2, (int[]){2, 2}, (const int64_t[][8]){{4, 6}, {4, 4}},
                   (dt_dtype[]){f, i64}, (int[]){0, 0}, &a, 0);
        a.i[0] = 0;
        check_plan(pair, "index_select", 2, (int[]){2, 1}, (const int64_t[][8]){{5, 6}, {4}},
                   (dt_dtype[]){f, i64}, (int[]){1, -1}, &a, 1);
        a = (dt_op_attrs)DT_OP_ATTRS_INIT;
        a.i[0] = 3, a.i[1] = 2, a.i[2] = 4, a.i[3] = 5;
        check_plan(pair, "expand", 1, (int[]){2}, (const int64_t[][8]){{4, 1}}, (dt_dtype[]){f},
                   (int[]){0}, &a, 1);
        a = (dt_op_attrs)DT_OP_ATTRS_INIT;
        a.i[0] = 2, a.i[1] = 4, a.i[2] = 1;
        check_plan(pair, "expand_backward", 1, (int[]){3}, (const int64_t[][8]){{2, 4, 5}},
                   (dt_dtype[]){f}, (int[]){0}, &a, -1);
        a = (dt_op_attrs)DT_OP_ATTRS_INIT;
        a.i[0] = 1;
        check_plan(pair, "squeeze", 1, (int[]){3}, (const int64_t[][8]){{4, 1, 6}}, (dt_dtype[]){f},
                   (int[]){2}, &a, 1);
    }
    meshes_free(ms, nm);
}

/* ---- errors ----------------------------------------------------------------------------- */

static void test_bad_calls_fail_on_every_client_with_a_message(void)
{
    dt_mesh *ms[4];
    int nm = meshes(ms);
    const dt_mesh *mesh = ms[nm - 1]; /* the mesh every client holds a device of */
    if (dt_mesh_num_local_devices(mesh) > 0) {
        float x[24] = {0};
        int64_t bad_i[4] = {0, 5, 1, 2}, ok_i[4] = {0, 1, 2, 3};
        dt_layout *l2 = layout_of(mesh, 2, (int[]){0, -1}, -1);
        dt_layout *l1 = layout_of(mesh, 1, (int[]){0}, -1);
        dt_tensor *t = NULL, *bad = NULL, *ok = NULL, *out = NULL;
        DT_ASSERT_OK(dt_tensor_from_host(l2, DT_DTYPE_F32, (int64_t[]){4, 6}, x, &t));
        DT_ASSERT_OK(dt_tensor_from_host(l1, DT_DTYPE_I64, (int64_t[]){4}, bad_i, &bad));
        DT_ASSERT_OK(dt_tensor_from_host(l1, DT_DTYPE_I64, (int64_t[]){4}, ok_i, &ok));
        DT_ASSERT_FAILS(dt_reshape(t, 2, (int64_t[]){5, -1}, &out), DT_ERR_SHAPE);
        DT_ASSERT_ERROR_MENTIONS("reshape");
        DT_ASSERT_FAILS(dt_permute(t, (int[]){1, 1}, &out), DT_ERR_INVALID_ARGUMENT);
        DT_ASSERT_FAILS(dt_slice(t, 2, 0, 1, 1, &out), DT_ERR_INVALID_ARGUMENT);
        DT_ASSERT_ERROR_MENTIONS("axis 2");
        DT_ASSERT_FAILS(dt_squeeze(t, 0, &out), DT_ERR_SHAPE);
        DT_ASSERT_FAILS(dt_expand(t, 2, (int64_t[]){4, 7}, &out), DT_ERR_SHAPE);
        DT_ASSERT_FAILS(dt_split(t, 1, (int64_t[]){2, 2}, 2, (dt_tensor *[2]){0}), DT_ERR_SHAPE);
        const dt_tensor *two[2] = {t, ok};
        DT_ASSERT_FAILS(dt_concat(two, 2, 0, &out), DT_ERR_SHAPE);
        DT_ASSERT_FAILS(dt_index_select(t, 0, bad, &out), DT_ERR_INVALID_ARGUMENT);
        DT_ASSERT_ERROR_MENTIONS("index 5 out of range [0, 4)");
        DT_ASSERT_FAILS(dt_index_select(t, 3, ok, &out), DT_ERR_INVALID_ARGUMENT);
        DT_ASSERT_FAILS(dt_one_hot(bad, 5, DT_DTYPE_F32, &out), DT_ERR_INVALID_ARGUMENT);
        DT_ASSERT_ERROR_MENTIONS("index 5 out of range [0, 5)");
        DT_ASSERT_FAILS(dt_one_hot(t, 5, DT_DTYPE_F32, &out), DT_ERR_SHAPE);
        CU_ASSERT_PTR_NULL(out);
        dt_tensor_destroy(t);
        dt_tensor_destroy(bad);
        dt_tensor_destroy(ok);
        dt_layout_destroy(l1);
        dt_layout_destroy(l2);
    }
    meshes_free(ms, nm);
}

/* ---- host transfers --------------------------------------------------------------------- */

static void test_host_transfers_round_trip_on_every_layout(void)
{
    double x[60], got[60];
    fill_f64(x, 60, 15); /* [3, 4, 5] */
    const int64_t shape[3] = {3, 4, 5};
    dt_mesh *ms[4];
    int nm = meshes(ms);
    for (int mi = 0; mi < nm; mi++) {
        const dt_mesh *mesh = ms[mi];
        if (dt_mesh_num_local_devices(mesh) == 0)
            continue;
        int mr = dt_mesh_rank(mesh);
        int specs[][3] = {{-1, -1, -1}, {0, -1, -1}, {-1, 0, -1},
                          {-1, -1, 0},  {0, 1, -1},  {-1, 1, 0}};
        for (int p = 0; p < 6; p++) {
            for (int part = -1; part < mr; part++) {
                int ok = 1;
                for (int d = 0; d < 3; d++)
                    ok &= specs[p][d] < mr && (part < 0 || specs[p][d] != part);
                if (!ok)
                    continue;
                dt_layout *l = layout_of(mesh, 3, specs[p], part);
                dt_tensor *a = NULL, *b = NULL;
                /* from_host against the tests' own builder (pack + relayout). */
                DT_ASSERT_OK(dt_tensor_from_host(l, DT_DTYPE_F64, shape, x, &a));
                memset(got, 0, sizeof got);
                ot_fetch(a, got);
                CU_ASSERT_EQUAL(memcmp(got, x, sizeof x), 0);
                /* to_host on every client, then on the first client of the mesh alone. */
                memset(got, 0, sizeof got);
                DT_ASSERT_OK(dt_tensor_to_host(a, -1, got, sizeof got));
                CU_ASSERT_EQUAL(memcmp(got, x, sizeof x), 0);
                int root = dt_device_client(dt_test_device_type(), dt_mesh_device_id(mesh, 0));
                memset(got, 0, sizeof got);
                DT_ASSERT_OK(dt_tensor_to_host(a, root, dt_client_id() == root ? got : NULL,
                                               dt_client_id() == root ? sizeof got : 0));
                if (dt_client_id() == root)
                    CU_ASSERT_EQUAL(memcmp(got, x, sizeof x), 0);
                /* scatter_from: only the last client of the mesh passes the array. */
                int last = dt_device_client(dt_test_device_type(),
                                            dt_mesh_device_id(mesh, dt_mesh_size(mesh) - 1));
                DT_ASSERT_OK(dt_tensor_scatter_from(l, DT_DTYPE_F64, shape,
                                                    dt_client_id() == last ? x : NULL, last, &b));
                memset(got, 0, sizeof got);
                ot_fetch(b, got);
                CU_ASSERT_EQUAL(memcmp(got, x, sizeof x), 0);
                dt_tensor_destroy(a);
                dt_tensor_destroy(b);
                dt_layout_destroy(l);
            }
        }
    }
    meshes_free(ms, nm);
}

static void test_host_transfers_reject_bad_buffers_on_every_client(void)
{
    dt_mesh *ms[4];
    int nm = meshes(ms);
    const dt_mesh *mesh = ms[nm - 1];
    if (dt_mesh_num_local_devices(mesh) > 0) {
        float x[8] = {1, 2, 3, 4, 5, 6, 7, 8}, y[8];
        dt_layout *l = layout_of(mesh, 1, (int[]){0}, -1);
        dt_tensor *t = NULL, *u = NULL;
        DT_ASSERT_OK(dt_tensor_from_host(l, DT_DTYPE_F32, (int64_t[]){8}, x, &t));
        /* Client 0 alone passes a short buffer: every client fails. */
        DT_ASSERT_FAILS(dt_tensor_to_host(t, -1, y, dt_client_id() == 0 ? 4 : sizeof y),
                        DT_ERR_INVALID_ARGUMENT);
        DT_ASSERT_ERROR_MENTIONS("bytes");
        /* The root passes no data. */
        DT_ASSERT_FAILS(dt_tensor_scatter_from(l, DT_DTYPE_F32, (int64_t[]){8}, NULL, 0, &u),
                        DT_ERR_INVALID_ARGUMENT);
        DT_ASSERT_ERROR_MENTIONS("NULL data");
        CU_ASSERT_PTR_NULL(u);
        DT_ASSERT_FAILS(
            dt_tensor_scatter_from(l, DT_DTYPE_F32, (int64_t[]){8}, x, dt_num_clients() + 3, &u),
            DT_ERR_INVALID_ARGUMENT);
        dt_tensor_destroy(t);
        dt_layout_destroy(l);
    }
    meshes_free(ms, nm);
}

int main(int argc, char **argv)
{
    static const dt_test_case cases[] = {
        DT_TEST(test_host_transfers_round_trip_on_every_layout),
        DT_TEST(test_host_transfers_reject_bad_buffers_on_every_client),
        DT_TEST(test_reshape_matches_the_reference_on_every_layout),
        DT_TEST(test_permute_and_transpose_match_the_reference_on_every_layout),
        DT_TEST(test_slice_matches_python_ranges_on_every_layout),
        DT_TEST(test_concat_and_stack_match_the_reference_on_every_layout),
        DT_TEST(test_split_gives_each_part_on_every_layout),
        DT_TEST(test_expand_squeeze_and_unsqueeze_match_the_reference_on_every_layout),
        DT_TEST(test_gather_and_scatter_add_match_the_reference_on_every_layout),
        DT_TEST(test_index_select_and_index_add_match_the_reference_on_every_layout),
        DT_TEST(test_one_hot_matches_the_reference_on_every_layout),
        DT_TEST(test_sharding_propagates_through_the_family_without_relayouts),
        DT_TEST(test_bad_calls_fail_on_every_client_with_a_message),
        DT_TEST_END,
    };
    return dt_test_main_device(argc, argv, "opdef_shape", cases);
}
