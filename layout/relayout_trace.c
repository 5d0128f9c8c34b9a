/* The relayout's and the barrier's entries in the flight recorder of collectives and their
 * collective check (runtime/trace.h): the group of clients, the call's text (dtype, shape,
 * both layouts) and, after the call, the path (transport) its plans took. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "layout/layout_impl.h"
#include "runtime/trace.h"
#include "runtime/util.h"

enum { ON_STACK = 256 };

/* Marks in seen[] the clients holding devices of mesh. */
static void mark_clients(const dt_mesh *mesh, unsigned char *seen, int nclients)
{
    dt_device_type type = dt_mesh_device_type(mesh);
    for (int64_t p = 0; p < dt_mesh_size(mesh); p++) {
        int c = dt_device_client(type, dt_mesh_device_id(mesh, p));
        if (c >= 0 && c < nclients)
            seen[c] = 1;
    }
}

/* Begins the collective `call` over the clients of meshes a and b (b may be NULL), with
 * detail or lazy (taken over); a client outside them records nothing. */
static dt_status begin_over(const dt_mesh *a, const dt_mesh *b, const char *call,
                            const char *detail, const dt__trace_lazy *lazy, long *token)
{
    int nclients = dt_num_clients(), me = dt_client_id(), n = 0;
    unsigned char seen_stack[ON_STACK];
    int list_stack[ON_STACK];
    unsigned char *seen = nclients <= ON_STACK ? seen_stack : calloc((size_t)nclients, 1);
    int *list = nclients <= ON_STACK ? list_stack : malloc((size_t)nclients * sizeof *list);
    dt_status st = DT_OK;
    *token = -1;
    if (!seen || !list)
        goto out;                      /* nothing recorded rather than a failed collective */
    memset(seen, 0, (size_t)nclients);
    mark_clients(a, seen, nclients);
    if (b && b != a)
        mark_clients(b, seen, nclients);
    for (int c = 0; c < nclients; c++)
        if (seen[c])
            list[n++] = c;
    if (me >= 0 && me < nclients && seen[me]) {
        st = lazy ? dt__coll_begin_lazy(list, n, call, lazy, token)
                  : dt__coll_begin(list, n, call, detail, token);
        lazy = NULL;
    }
out:
    if (lazy && lazy->release) {
        dt__trace_lazy copy = *lazy;
        lazy->release(copy.payload);
    }
    if (seen != seen_stack)
        free(seen);
    if (list != list_stack)
        free(list);
    return st;
}

/* A relayout's detail, formatted only when the record is written: the two layouts (held
 * by a reference until then), the dtype and the shape. */
typedef struct rl_detail {
    dt_layout *from, *to;
    int dtype, rank;
    int64_t shape[DT_MAX_RANK];
} rl_detail;
_Static_assert(sizeof(rl_detail) <= DT__TRACE_PAYLOAD, "relayout detail fits the payload");

static void rl_detail_format(const void *payload, char *buf, size_t len)
{
    rl_detail d;
    memcpy(&d, payload, sizeof d);
    char from[DT__TRACE_DETAIL], to[DT__TRACE_DETAIL], shape[128];
    const dt_mesh *ms = dt_layout_mesh(d.from), *md = dt_layout_mesh(d.to);
    dt__layout_format_specs(d.from, from, sizeof from);
    dt__layout_format_specs(d.to, to, sizeof to);
    dt__shape_str(d.rank, d.shape, shape, sizeof shape);
    if (dt_mesh_equal(ms, md))
        snprintf(buf, len, "%s%s %s -> %s", dt_dtype_name((dt_dtype)d.dtype), shape, from, to);
    else
        snprintf(buf, len, "%s%s %s -> %s (mesh '%s' -> '%s')", dt_dtype_name((dt_dtype)d.dtype),
                 shape, from, to, dt_mesh_name(ms), dt_mesh_name(md));
}

static void rl_detail_release(void *payload)
{
    rl_detail d;
    memcpy(&d, payload, sizeof d);
    dt_layout_destroy(d.from);
    dt_layout_destroy(d.to);
}

dt_status dt__rl_trace_begin(const dt_tensor *src, const dt_layout *dst, long *token)
{
    *token = -1;
    if (!dt__trace_on() && !dt__check_on())
        return DT_OK;
    rl_detail d = {dt_layout_retain(dt_tensor_layout(src)), dt_layout_retain(dst),
                   (int)dt_tensor_dtype(src), dt_tensor_rank(src), {0}};
    memcpy(d.shape, dt_tensor_shape(src), (size_t)d.rank * sizeof d.shape[0]);
    dt__trace_lazy lazy = {rl_detail_format, rl_detail_release, {0}};
    memcpy(lazy.payload, &d, sizeof d);
    return begin_over(dt_layout_mesh(d.from), dt_layout_mesh(d.to), "relayout", NULL, &lazy,
                      token);
}

void dt__rl_trace_end(long token, rl_plan *const *plans, int nplans, dt_status st)
{
    if (token < 0)
        return;
    const char *path = "local";
    for (int i = 0; i < nplans; i++)
        if (plans[i] && plans[i]->transport)
            path = plans[i]->transport->name;
    dt__coll_end(token, path, st);
}

dt_status dt__barrier_trace_begin(const dt_mesh *mesh, const char *name, long *token)
{
    *token = -1;
    if (!dt__trace_on() && !dt__check_on())
        return DT_OK;
    char detail[DT__TRACE_DETAIL];
    snprintf(detail, sizeof detail, "'%s' on mesh '%s' (%lld devices)", name ? name : "",
             dt_mesh_name(mesh), (long long)dt_mesh_size(mesh));
    return begin_over(mesh, NULL, "barrier", detail, NULL, token);
}
