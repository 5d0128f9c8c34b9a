/* Helpers of the ops tests (see ops_test_util.h). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "ops_test_util.h"

dt_mesh *ot_mesh_1d(void)
{
    const char *names[1] = {"x"};
    int64_t sizes[1] = {dt_test_num_devices()};
    dt_mesh *m = NULL;
    DT_ASSERT_OK(dt_mesh_create("line", 1, names, sizes, dt_test_device_type(), &m));
    return m;
}

dt_mesh *ot_mesh_2d(void)
{
    const char *names[2] = {"b", "m"};
    int64_t n = dt_test_num_devices();
    int64_t sizes[2] = {2, n / 2};
    dt_mesh *m = NULL;
    DT_ASSERT_OK(dt_mesh_create("grid", 2, names, sizes, dt_test_device_type(), &m));
    return m;
}

dt_tensor *ot_tensor(const dt_layout *layout, dt_dtype dtype, const int64_t *shape,
                     const void *data)
{
    const dt_mesh *mesh = dt_layout_mesh(layout);
    int rank = dt_layout_rank(layout);
    dt_layout *rep = NULL;
    DT_ASSERT_OK(dt_layout_replicated(mesh, rank, &rep));
    int n = dt_mesh_num_local_devices(mesh);
    const void *comps[64];
    CU_ASSERT_FATAL(n <= 64);
    for (int i = 0; i < n; i++)
        comps[i] = data;
    dt_tensor *r = NULL, *t = NULL;
    DT_ASSERT_OK(dt_test_pack_host(rep, dtype, shape, comps, &r));
    DT_ASSERT_OK(dt_relayout(r, layout, &t));
    dt_tensor_destroy(r);
    dt_layout_destroy(rep);
    return t;
}

void ot_fetch(const dt_tensor *t, void *out)
{
    const dt_layout *l = dt_tensor_layout(t);
    dt_layout *rep = NULL;
    DT_ASSERT_OK(dt_layout_replicated(dt_layout_mesh(l), dt_layout_rank(l), &rep));
    dt_tensor *r = NULL;
    DT_ASSERT_OK(dt_relayout(t, rep, &r));
    size_t bytes = (size_t)dt_tensor_numel(t) * dt_dtype_size(dt_tensor_dtype(t));
    CU_ASSERT_FATAL(dt_tensor_num_local(r) >= 1);
    for (int i = 0; i < dt_tensor_num_local(r); i++) {
        void *got = dt_test_local_get(r, i);
        if (i == 0 && bytes)
            memcpy(out, got, bytes);
        CU_ASSERT(bytes == 0 || memcmp(out, got, bytes) == 0);
        free(got);
    }
    dt_tensor_destroy(r);
    dt_layout_destroy(rep);
}

static uint64_t next(uint64_t *s)
{
    *s += 0x9e3779b97f4a7c15ull;
    uint64_t z = *s;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

void ot_fill_int(float *x, int64_t n, int lo, int hi, uint64_t seed)
{
    for (int64_t i = 0; i < n; i++)
        x[i] = (float)(lo + (int)(next(&seed) % (uint64_t)(hi - lo + 1)));
}

void ot_fill_real(float *x, int64_t n, float lo, float hi, uint64_t seed)
{
    for (int64_t i = 0; i < n; i++)
        x[i] = lo + (hi - lo) * (float)((double)(next(&seed) >> 11) / 9007199254740992.0);
}

int64_t ot_mismatches(const char *what, const float *a, const float *b, int64_t n, float atol,
                      float rtol)
{
    int64_t bad = 0;
    for (int64_t i = 0; i < n; i++) {
        float d = fabsf(a[i] - b[i]);
        if (!(d <= atol + rtol * fabsf(b[i])) && !(a[i] == b[i])) {
            if (bad < 5)
                fprintf(stderr, "[rank %d] %s: element %lld is %.9g, want %.9g\n",
                        dt_client_id(), what, (long long)i, (double)a[i], (double)b[i]);
            bad++;
        }
    }
    return bad;
}

int ot_is_partial(const dt_tensor *t)
{
    return dt_layout_num_partial(dt_tensor_layout(t)) > 0;
}

int ot_spec(const dt_tensor *t, int dim)
{
    return dt_layout_spec_mesh_dim(dt_tensor_layout(t), dim);
}
