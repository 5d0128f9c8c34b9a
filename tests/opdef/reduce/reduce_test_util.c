/* Helpers of the reduce family's tests (see reduce_test_util.h). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "reduce_test_util.h"

dt_mesh *rt_mesh(int which)
{
    const char *n1[1] = {"x"}, *n2[2] = {"b", "m"};
    int64_t s1[1] = {which == 0 ? 1 : 2}, s2[2] = {2, 2};
    dt_mesh *m = NULL;
    if (which < 2)
        DT_ASSERT_OK(dt_mesh_create("line", 1, n1, s1, dt_test_device_type(), &m));
    else
        DT_ASSERT_OK(dt_mesh_create("grid", 2, n2, s2, dt_test_device_type(), &m));
    return m;
}

int rt_here(const dt_mesh *m)
{
    return dt_mesh_num_local_devices(m) > 0;
}

dt_tensor *rt_tensor(const dt_layout *l, dt_dtype t, int rank, const int64_t *shape,
                     const double *x)
{
    int64_t n = 1;
    for (int d = 0; d < rank; d++)
        n *= shape[d];
    void *h = malloc((size_t)(n > 0 ? n : 1) * 8);
    CU_ASSERT_FATAL(h != NULL);
    for (int64_t e = 0; e < n; e++) {
        if (t == DT_DTYPE_F32)
            ((float *)h)[e] = (float)x[e];
        else if (t == DT_DTYPE_F64)
            ((double *)h)[e] = x[e];
        else if (t == DT_DTYPE_I64)
            ((int64_t *)h)[e] = (int64_t)x[e];
        else
            ((int32_t *)h)[e] = (int32_t)x[e];
    }
    dt_tensor *r = ot_tensor(l, t, shape, h);
    free(h);
    return r;
}

void rt_fetch(const dt_tensor *t, double *out, int64_t n)
{
    dt_dtype dt = dt_tensor_dtype(t);
    void *h = malloc((size_t)(n > 0 ? n : 1) * 8);
    CU_ASSERT_FATAL(h != NULL);
    ot_fetch(t, h);
    for (int64_t e = 0; e < n; e++)
        out[e] = dt == DT_DTYPE_F32   ? (double)((float *)h)[e]
                 : dt == DT_DTYPE_F64 ? ((double *)h)[e]
                 : dt == DT_DTYPE_I64 ? (double)((int64_t *)h)[e]
                                      : (double)((int32_t *)h)[e];
    free(h);
}

/* Every layout of a rank-`rank` tensor on m: each mesh dim replicated, sharding one tensor dim
 * (no two on one) or, with partial_ok, partial (sum). */
static int layouts(const dt_mesh *m, int rank, int partial_ok, dt_layout **out, int cap)
{
    int nd = dt_mesh_rank(m), n = 0;
    int opts = rank + 1 + (partial_ok ? 1 : 0); /* -1 replicated, 0..rank-1, rank: partial */
    int total = 1;
    for (int i = 0; i < nd; i++)
        total *= opts;
    for (int code = 0; code < total && n < cap; code++) {
        int c = code, use[2];
        for (int i = 0; i < nd; i++) {
            use[i] = c % opts - 1;
            c /= opts;
        }
        if (nd == 2 && use[0] >= 0 && use[0] < rank && use[0] == use[1])
            continue;
        if (dt_mesh_dim_size(m, 0) == 1 && code > 0)
            break; /* one device: replicated only */
        const char *specs[DT_MAX_RANK], *pd[2];
        dt_reduce_op ops[2] = {DT_REDUCE_SUM, DT_REDUCE_SUM};
        int np = 0;
        for (int d = 0; d < rank; d++)
            specs[d] = DT_UNSHARDED;
        for (int i = 0; i < nd; i++) {
            if (use[i] >= 0 && use[i] < rank)
                specs[use[i]] = dt_mesh_dim_name(m, i);
            else if (use[i] == rank)
                pd[np++] = dt_mesh_dim_name(m, i);
        }
        DT_ASSERT_OK(dt_layout_create_partial(m, rank, specs, np, pd, ops, &out[n]));
        n++;
    }
    return n;
}

static int is_float(dt_dtype t)
{
    return t == DT_DTYPE_F32 || t == DT_DTYPE_F64;
}

static void run_one(const rt_case *c, const dt_mesh *m, dt_layout *const *l, double *got,
                    double *first, int *have_first)
{
    dt_tensor *in[2] = {NULL, NULL}, *out = NULL;
    for (int i = 0; i < c->nin; i++)
        in[i] = rt_tensor(l[i], c->dtype[i], c->rank[i], c->shape[i], c->x[i]);
    dt_status st = c->fn((const dt_tensor *const *)in, &out);
    if (st != DT_OK) {
        char b0[256] = "", b1[256] = "";
        dt_layout_format(l[0], b0, sizeof b0);
        if (c->nin > 1)
            dt_layout_format(l[1], b1, sizeof b1);
        fprintf(stderr, "[rank %d] %s on %s %s: %s: %s\n", dt_client_id(), c->what, b0, b1,
                dt_status_name(st), dt_last_error());
    }
    CU_ASSERT_EQUAL_FATAL(st, DT_OK);
    if (rt_here(m)) {
        CU_ASSERT_EQUAL(dt_tensor_numel(out), c->nout);
        CU_ASSERT_EQUAL(dt_tensor_dtype(out), c->out_dtype);
        rt_fetch(out, got, c->nout);
        int64_t bad = 0;
        for (int64_t e = 0; e < c->nout; e++) {
            double want = c->out_dtype == DT_DTYPE_F32 ? (double)(float)c->ref[e] : c->ref[e];
            int ok =
                c->tol == 0 ? got[e] == want : fabs(got[e] - want) <= c->tol * (1 + fabs(want));
            if (c->bitwise && *have_first)
                ok = ok && memcmp(&got[e], &first[e], sizeof(double)) == 0;
            if (!ok && bad++ < 3) {
                char b0[256] = "", b1[256] = "";
                dt_layout_format(l[0], b0, sizeof b0);
                if (c->nin > 1)
                    dt_layout_format(l[1], b1, sizeof b1);
                fprintf(stderr,
                        "[rank %d] %s on %s %s: element %lld is %.17g, want %.17g "
                        "(first layout: %.17g)\n",
                        dt_client_id(), c->what, b0, b1, (long long)e, got[e], want,
                        *have_first ? first[e] : NAN);
            }
        }
        CU_ASSERT_EQUAL(bad, 0);
        if (!*have_first) {
            memcpy(first, got, sizeof(double) * (size_t)c->nout);
            *have_first = 1;
        }
    }
    dt_tensor_destroy(out);
    for (int i = 0; i < c->nin; i++)
        dt_tensor_destroy(in[i]);
}

void rt_check_layouts(const rt_case *c)
{
    double *got = malloc(sizeof(double) * (size_t)c->nout),
           *first = malloc(sizeof(double) * (size_t)c->nout);
    CU_ASSERT_FATAL(got && first);
    int have_first = 0;
    for (int w = 0; w < 3; w++) {
        dt_mesh *m = rt_mesh(w);
        dt_layout *la[64], *lb[64];
        int na = layouts(m, c->rank[0], is_float(c->dtype[0]), la, 64);
        int nb = c->nin > 1 ? layouts(m, c->rank[1], is_float(c->dtype[1]), lb, 64) : 0;
        for (int i = 0; i < na; i++) {
            dt_layout *l[2] = {la[i], nb ? lb[(i * 7 + 3) % nb] : NULL};
            run_one(c, m, l, got, first, &have_first);
        }
        for (int j = 1; j < nb; j++) { /* every layout of b against a replicated a */
            dt_layout *l[2] = {la[0], lb[j]};
            run_one(c, m, l, got, first, &have_first);
        }
        for (int i = 0; i < na; i++)
            dt_layout_destroy(la[i]);
        for (int j = 0; j < nb; j++)
            dt_layout_destroy(lb[j]);
        dt_mesh_destroy(m);
    }
    free(got);
    free(first);
}
