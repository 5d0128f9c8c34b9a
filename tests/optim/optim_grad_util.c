/* Helpers of the optim tests (see optim_grad_util.h). */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "ops/ops_test_util.h"
#include "optim_grad_util.h"

dt_mesh *og_mesh_1d(void)
{
    const char *names[1] = {"batch"};
    int64_t sizes[1] = {dt_test_num_devices()};
    dt_mesh *m = NULL;
    DT_ASSERT_OK(dt_mesh_create("dp", 1, names, sizes, dt_test_device_type(), &m));
    return m;
}

dt_mesh *og_mesh_2d(void)
{
    const char *names[2] = {"batch", "model"};
    int64_t n = dt_test_num_devices();
    int64_t sizes[2] = {2, n / 2};
    dt_mesh *m = NULL;
    DT_ASSERT_OK(dt_mesh_create("dpmp", 2, names, sizes, dt_test_device_type(), &m));
    return m;
}

static int64_t numel(int rank, const int64_t *shape)
{
    int64_t n = 1;
    for (int i = 0; i < rank; i++)
        n *= shape[i];
    return n;
}

dt_tensor *og_tensor(const dt_layout *layout, dt_dtype dtype, const int64_t *shape,
                     const float *data)
{
    int64_t n = numel(dt_layout_rank(layout), shape);
    void *buf = malloc((size_t)(n ? n : 1) * dt_dtype_size(dtype));
    CU_ASSERT_FATAL(buf != NULL);
    DT_ASSERT_OK(dt_kernel_cast(n, data, DT_DTYPE_F32, buf, dtype));
    dt_tensor *t = ot_tensor(layout, dtype, shape, buf);
    free(buf);
    return t;
}

void og_fetch(const dt_tensor *t, float *out)
{
    int64_t n = dt_tensor_numel(t);
    void *buf = malloc((size_t)(n ? n : 1) * dt_dtype_size(dt_tensor_dtype(t)));
    CU_ASSERT_FATAL(buf != NULL);
    ot_fetch(t, buf);
    DT_ASSERT_OK(dt_kernel_cast(n, buf, dt_tensor_dtype(t), out, DT_DTYPE_F32));
    free(buf);
}

dt_tensor *og_grad(const dt_tensor *param, dt_dtype dtype, og_grad_fn fn, int step, float scale,
                   void *arg)
{
    const dt_layout *pl = dt_tensor_layout(param);
    const dt_mesh *mesh = dt_layout_mesh(pl);
    int rank = dt_layout_rank(pl);
    const char *specs[DT_MAX_RANK];
    for (int i = 0; i < rank; i++)
        specs[i] = dt_layout_spec(pl, i);
    const char *pdim = "batch";
    dt_reduce_op op = DT_REDUCE_SUM;
    dt_layout *l = NULL;
    DT_ASSERT_OK(dt_layout_create_partial(mesh, rank, specs, 1, &pdim, &op, &l));
    dt_tensor *g = NULL;
    const int64_t *shape = dt_tensor_shape(param);
    DT_ASSERT_OK(dt_tensor_zeros(l, dtype, shape, &g));
    int dp = dt_mesh_dim_index(mesh, "batch");
    for (int i = 0; i < dt_tensor_num_local(g); i++) {
        int64_t coords[DT_MESH_MAX_DIMS];
        DT_ASSERT_OK(dt_mesh_coords(mesh, dt_tensor_local_position(g, i), coords));
        const DLTensor *d = dt_tensor_local(g, i);
        const int64_t *off = dt_tensor_local_offset(g, i);
        int64_t n = numel(d->ndim, d->shape);
        float *vals = malloc((size_t)(n ? n : 1) * sizeof *vals);
        for (int64_t e = 0; e < n; e++) {
            /* Global row-major index of local element e. */
            int64_t rem = e, idx = 0, stride = 1;
            int64_t gidx[DT_MAX_RANK];
            for (int k = d->ndim - 1; k >= 0; k--) {
                gidx[k] = off[k] + rem % d->shape[k];
                rem /= d->shape[k];
            }
            for (int k = d->ndim - 1; k >= 0; k--) {
                idx += gidx[k] * stride;
                stride *= shape[k];
            }
            vals[e] = fn(idx, coords[dp], step, arg) * scale;
        }
        void *cast = malloc((size_t)(n ? n : 1) * dt_dtype_size(dtype));
        CU_ASSERT_FATAL(cast != NULL);
        DT_ASSERT_OK(dt_kernel_cast(n, vals, DT_DTYPE_F32, cast, dtype));
        dt_test_local_set(g, i, cast);
        free(cast);
        free(vals);
    }
    dt_layout_destroy(l);
    return g;
}

void og_grad_ref(int64_t n, int64_t ndp, og_grad_fn fn, int step, float scale, void *arg,
                 float *out)
{
    for (int64_t i = 0; i < n; i++) {
        float s = 0.0f;
        for (int64_t r = 0; r < ndp; r++)
            s += fn(i, r, step, arg) * scale;
        out[i] = s;
    }
}

int64_t og_diff(const char *what, const float *a, const float *b, int64_t n)
{
    int64_t bad = 0;
    for (int64_t i = 0; i < n; i++)
        if (memcmp(&a[i], &b[i], sizeof a[i]) != 0) {
            if (bad < 5)
                fprintf(stderr, "[rank %d] %s: element %lld is %.9g, want %.9g\n",
                        dt_client_id(), what, (long long)i, (double)a[i], (double)b[i]);
            bad++;
        }
    return bad;
}

