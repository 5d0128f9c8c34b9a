/* Helpers of the ZeRO system tests (see zero_ref_util.h). */
#include "zero_ref_util.h"

#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"

int zt_num_devices(void)
{
    return dt_test_num_devices();
}

dt_mesh *zt_mesh_dp(int64_t k)
{
    return zt_mesh_bm(k, 0);
}

dt_mesh *zt_mesh_bm(int64_t b, int64_t m)
{
    int64_t n = zt_num_devices(), k = b * (m ? m : 1);
    CU_ASSERT_FATAL(k >= 1 && k <= n);
    /* Devices spread evenly over the present ones (ids floor(i n / k)), so under MPI a small
     * mesh still spans several processes. */
    char text[4096];
    const char *dev = dt_device_type_name(dt_test_device_type());
    int len = m ? snprintf(text, sizeof text, "mesh:\n  name: bm%lldx%lld\n  device_type: %s\n"
                           "  dims: {batch: %lld, model: %lld}\n  device_ids: [", (long long)b,
                           (long long)m, dev, (long long)b, (long long)m)
                : snprintf(text, sizeof text, "mesh:\n  name: dp%lld\n  device_type: %s\n"
                           "  dims: {batch: %lld}\n  device_ids: [", (long long)b, dev,
                           (long long)b);
    for (int64_t i = 0; i < k; i++)
        len += snprintf(text + len, sizeof text - (size_t)len, "%s%lld", i ? ", " : "",
                        (long long)(i * n / k));
    snprintf(text + len, sizeof text - (size_t)len, "]\n");
    dt_mesh *mesh = NULL;
    DT_ASSERT_OK(dt_mesh_from_yaml_string(text, NULL, &mesh));
    return mesh;
}

dt_mesh *zt_mesh_batch_model(void)
{
    const char *names[2] = {"batch", "model"};
    int64_t n = zt_num_devices();
    CU_ASSERT_FATAL(n % 2 == 0);
    int64_t sizes[2] = {n / 2, 2};
    dt_mesh *m = NULL;
    DT_ASSERT_OK(dt_mesh_create("bm", 2, names, sizes, dt_test_device_type(), &m));
    return m;
}

int zt_in_mesh(const dt_mesh *mesh)
{
    return dt_mesh_num_local_devices(mesh) > 0;
}

/* Box of component i of t as (row offset, rows, column offset, columns) in a [R, C] view
 * (rank 1: one row). */
static void box_of(const dt_tensor *t, int i, int64_t *r0, int64_t *nr, int64_t *c0, int64_t *nc,
                   int64_t *gcols)
{
    const DLTensor *dl = dt_tensor_local(t, i);
    const int64_t *off = dt_tensor_local_offset(t, i);
    if (dt_tensor_rank(t) == 1) {
        *r0 = 0;
        *nr = 1;
        *c0 = off[0];
        *nc = dl->shape[0];
        *gcols = dt_tensor_shape(t)[0];
    } else {
        *r0 = off[0];
        *nr = dl->shape[0];
        *c0 = off[1];
        *nc = dl->shape[1];
        *gcols = dt_tensor_shape(t)[1];
    }
}

static int coord_of(const dt_tensor *t, int i, int dim)
{
    if (dim < 0)
        return 0;
    const dt_mesh *mesh = dt_layout_mesh(dt_tensor_layout(t));
    int64_t coords[DT_MESH_MAX_DIMS] = {0};
    DT_ASSERT_OK(dt_mesh_coords(mesh, dt_tensor_local_position(t, i), coords));
    return (int)coords[dim];
}

dt_tensor *zt_tensor_from(const dt_layout *layout, dt_dtype dtype, const int64_t *shape, int by_dim,
                          const float *const *src)
{
    dt_tensor *t = NULL;
    DT_ASSERT_OK(dt_tensor_zeros(layout, dtype, shape, &t));
    CU_ASSERT_FATAL(dt_tensor_rank(t) == 1 || dt_tensor_rank(t) == 2);
    size_t es = dt_dtype_size(dtype);
    for (int i = 0; i < dt_tensor_num_local(t); i++) {
        int64_t r0, nr, c0, nc, gc;
        box_of(t, i, &r0, &nr, &c0, &nc, &gc);
        const float *s = src[coord_of(t, i, by_dim)];
        char *dst = malloc(dt_test_local_bytes(t, i) + 1);
        CU_ASSERT_FATAL(dst != NULL);
        for (int64_t r = 0; r < nr && nc > 0; r++)
            DT_ASSERT_OK(dt_kernel_cast(nc, s + (r0 + r) * gc + c0, DT_DTYPE_F32,
                                        dst + (size_t)(r * nc) * es, dtype));
        dt_test_local_set(t, i, dst);
        free(dst);
    }
    return t;
}

dt_tensor *zt_tensor(const dt_layout *layout, dt_dtype dtype, const int64_t *shape,
                     const float *src)
{
    return zt_tensor_from(layout, dtype, shape, -1, &src);
}

/* Compares component boxes; exact: bitwise in t's dtype, else with the tolerance in f32. */
static int64_t compare(const char *what, const dt_tensor *t, const float *want, int exact,
                       float atol, float rtol)
{
    dt_dtype dt = dt_tensor_dtype(t);
    size_t es = dt_dtype_size(dt);
    int64_t bad = 0;
    for (int i = 0; i < dt_tensor_num_local(t); i++) {
        int64_t r0, nr, c0, nc, gc;
        box_of(t, i, &r0, &nr, &c0, &nc, &gc);
        if (nc == 0 || nr == 0)
            continue;
        char *data = dt_test_local_get(t, i);
        float *got = malloc(sizeof(float) * (size_t)nc);
        float *exp = malloc(sizeof(float) * (size_t)nc);
        char *expb = malloc(es * (size_t)nc);
        for (int64_t r = 0; r < nr; r++) {
            const char *row = data + (size_t)(r * nc) * es;
            DT_ASSERT_OK(dt_kernel_cast(nc, row, dt, got, DT_DTYPE_F32));
            const float *w = want + (r0 + r) * gc + c0;
            DT_ASSERT_OK(dt_kernel_cast(nc, w, DT_DTYPE_F32, expb, dt));
            DT_ASSERT_OK(dt_kernel_cast(nc, expb, dt, exp, DT_DTYPE_F32));
            for (int64_t c = 0; c < nc; c++) {
                int ok = exact ? memcmp(row + c * es, expb + c * es, es) == 0
                               : (fabsf(got[c] - exp[c]) <= atol + rtol * fabsf(exp[c]) ||
                                  got[c] == exp[c]);
                if (!ok) {
                    if (bad < 4)
                        fprintf(stderr,
                                "[rank %d] %s: device %d element [%lld,%lld] is %.9g, "
                                "want %.9g\n",
                                dt_client_id(), what, dt_tensor_local(t, i)->device.device_id,
                                (long long)(r0 + r), (long long)(c0 + c), (double)got[c],
                                (double)exp[c]);
                    bad++;
                }
            }
        }
        free(got);
        free(exp);
        free(expb);
        free(data);
    }
    return bad;
}

int64_t zt_bit_mismatches(const char *what, const dt_tensor *t, const float *want)
{
    return compare(what, t, want, 1, 0.0f, 0.0f);
}

int64_t zt_mismatches(const char *what, const dt_tensor *t, const float *want, float atol,
                      float rtol)
{
    return compare(what, t, want, 0, atol, rtol);
}

uint64_t zt_hash(uint64_t a, uint64_t b, uint64_t c)
{
    uint64_t z = a * 0x9e3779b97f4a7c15ull ^ (b + 0x632be59bd9b4e019ull) * 0xbf58476d1ce4e5b9ull ^
                 (c + 0x2545f4914f6cdd1dull) * 0x94d049bb133111ebull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

void zt_fill_real(float *x, int64_t n, float lo, float hi, uint64_t seed)
{
    for (int64_t i = 0; i < n; i++)
        x[i] = lo + (hi - lo) *
                        (float)((double)(zt_hash(seed, (uint64_t)i, 0) >> 11) / 9007199254740992.0);
}

float zt_int_at(uint64_t seed, uint64_t i, int lo, int hi)
{
    return (float)(lo + (int)(zt_hash(seed, i, 1) % (uint64_t)(hi - lo + 1)));
}

/* The reference updates: the documented formulas, written out here with the f32 operation
 * order of ops/optimizer.c so that results are bit-identical (grad_scale is 1: the scaled
 * gradients the tests use are exact multiples, so unscaling is exact). */
void zt_ref_sgd(int64_t n, const dt_optim_hparams *hp, float *p, const float *g, float *buf)
{
    const float lr = hp->lr, mu = hp->momentum, damp = 1.0f - hp->dampening;
    const float wd = hp->weight_decay, gs = 1.0f;
    for (int64_t i = 0; i < n; i++) {
        if (mu == 0.0f) {
            p[i] -= lr * (gs * g[i] + wd * p[i]);
            continue;
        }
        float gi = gs * g[i] + wd * p[i];
        float b = mu * buf[i] + damp * gi;
        buf[i] = b;
        p[i] -= hp->nesterov ? lr * (gi + mu * b) : lr * b;
    }
}

void zt_ref_adam(int64_t n, const dt_optim_hparams *hp, int64_t step, float *p, const float *g,
                 float *m, float *v)
{
    const int decoupled = hp->kind == DT_OPTIM_ADAMW;
    const float b1 = hp->beta1, b2 = hp->beta2, eps = hp->eps, gs = 1.0f;
    const float lr = hp->lr, wd = hp->weight_decay;
    const double bc1 = 1.0 - pow((double)b1, (double)step);
    const double bc2 = 1.0 - pow((double)b2, (double)step);
    const float step_size = (float)(lr / bc1);
    const float inv_sqrt_bc2 = (float)(1.0 / sqrt(bc2));
    const float l2 = decoupled ? 0.0f : wd;
    const float decay = decoupled ? 1.0f - lr * wd : 1.0f;
    for (int64_t i = 0; i < n; i++) {
        float w = p[i];
        float gi = gs * g[i] + l2 * w;
        float mi = b1 * m[i] + (1.0f - b1) * gi;
        float vi = b2 * v[i] + (1.0f - b2) * gi * gi;
        m[i] = mi;
        v[i] = vi;
        w *= decay;
        p[i] = w - step_size * mi / (sqrtf(vi) * inv_sqrt_bc2 + eps);
    }
}

void zt_ref_update(int64_t n, const dt_optim_hparams *hp, int64_t step, float *p, const float *g,
                   float *s1, float *s2)
{
    if (hp->kind == DT_OPTIM_SGD)
        zt_ref_sgd(n, hp, p, g, s1);
    else
        zt_ref_adam(n, hp, step, p, g, s1, s2);
}


const dt_optim_hparams *zt_test_hparams(int group)
{
    static dt_optim_hparams adamw = DT_OPTIM_ADAMW_INIT, sgd = DT_OPTIM_SGD_INIT;
    adamw.lr = 0.02f;
    adamw.weight_decay = 0.05f;
    sgd.lr = 0.05f;
    sgd.momentum = 0.9f;
    sgd.dampening = 0.1f;
    return group == 0 ? &adamw : &sgd;
}

int64_t zt_numel2(int rank, const int64_t shape[2])
{
    return rank == 1 ? shape[0] : shape[0] * shape[1];
}
