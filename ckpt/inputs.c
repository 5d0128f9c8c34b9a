/* What a save works on (ck_inputs): checking names, meshes and options, the host-mesh layouts
 * without partial dims, the tensors reduced and cast on their own mesh, the plan's view of
 * them and where each slice's bytes are; and dt_sharded_prefix, which needs only the plan. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt/ckpt_impl.h"
#include "dtensor/ops.h" /* dt_cast */
#include "layout/tensor_dev.h"
#include "runtime/device.h"
#include "runtime/error.h"

void dt__ckpt_inputs_free(ck_inputs *in)
{
    for (int t = 0; t < in->n; t++) {
        if (in->layouts)
            dt_layout_destroy(in->layouts[t]);
        if (in->tensors)
            dt_tensor_destroy(in->tensors[t]);
    }
    free(in->layouts);
    free(in->tensors);
    for (int t = 0; in->names && t < in->n; t++)
        free(in->names[t]);
    free(in->names);
    free(in->shapes);
    free(in->dtypes);
    free(in->ranks);
    dt__ckpt_pieces_free(&in->pieces);
    free((void *)in->plan_in.names);
    free((void *)in->plan_in.layouts);
    free((void *)in->plan_in.ranks);
    free((void *)in->plan_in.shapes);
    free((void *)in->plan_in.dtypes);
    dt_mesh_destroy(in->host);
    memset(in, 0, sizeof *in);
}

/* The plan's view: the n tensors with layouts, then the tensors of the gathered pieces. */
dt_status dt__ckpt_plan_input(ck_inputs *in)
{
    const ck_pieces *pc = &in->pieces;
    int total = in->n + pc->ntensors;
    const char **nm = calloc((size_t)total + 1, sizeof *nm);
    const dt_layout **ls = calloc((size_t)total + 1, sizeof *ls);
    int *rk = calloc((size_t)total + 1, sizeof *rk);
    const int64_t **sh = calloc((size_t)total + 1, sizeof *sh);
    dt_dtype *dt = calloc((size_t)total + 1, sizeof *dt);
    in->plan_in = (ck_plan_input){.n = total, .names = nm, .layouts = ls, .ranks = rk,
                                  .shapes = sh, .dtypes = dt, .npieces = pc->npieces,
                                  .pieces = pc->pieces};
    if (!nm || !ls || !rk || !sh || !dt)
        return dt__error(DT_ERR_NO_MEMORY, "dt_save: no memory");
    for (int t = 0; t < in->n; t++) {
        nm[t] = in->names[t];
        ls[t] = in->layouts[t];
        rk[t] = in->ranks[t];
        sh[t] = in->shapes[t];
        dt[t] = in->dtypes[t];
    }
    for (int t = 0; t < pc->ntensors; t++) {
        nm[in->n + t] = pc->names[t];
        rk[in->n + t] = pc->ranks[t];
        sh[in->n + t] = pc->shape_ptrs[t];
        dt[in->n + t] = pc->dtypes[t];
    }
    return DT_OK;
}

/* Checks names and meshes; builds the host layouts (same specs, no partial dims). */
dt_status dt__ckpt_inputs_init(const char *fn, const dt_mesh *mesh, int n,
                               const char *const *names, const dt_tensor *const *tensors,
                               ck_inputs *in)
{
    memset(in, 0, sizeof *in);
    if (!mesh || n < 0 || (n > 0 && (!names || !tensors)))
        return dt__error(DT_ERR_INVALID_ARGUMENT, "%s: NULL mesh, names or tensors, or n < 0",
                         fn);
    dt_status st;
    for (int t = 0; t < n; t++) {
        if ((st = dt__ckpt_check_name(fn, "tensor", names[t])) != DT_OK)
            return st;
        for (int u = 0; u < t; u++)
            if (strcmp(names[u], names[t]) == 0)
                return dt__error(DT_ERR_INVALID_ARGUMENT, "%s: tensor name '%s' repeated", fn,
                                 names[t]);
        if (!tensors[t])
            return dt__error(DT_ERR_INVALID_ARGUMENT, "%s: tensor '%s' is NULL", fn, names[t]);
        if (!dt_mesh_equal(dt_layout_mesh(dt_tensor_layout(tensors[t])), mesh))
            return dt__error(DT_ERR_INVALID_ARGUMENT,
                             "%s: tensor '%s' is not on the mesh being saved", fn, names[t]);
    }
    in->n = n;
    in->names = calloc((size_t)n + 1, sizeof *in->names);
    in->layouts = calloc((size_t)n + 1, sizeof *in->layouts);
    in->shapes = calloc((size_t)n + 1, sizeof *in->shapes);
    in->dtypes = calloc((size_t)n + 1, sizeof *in->dtypes);
    in->ranks = calloc((size_t)n + 1, sizeof *in->ranks);
    int bad = !in->names || !in->layouts || !in->shapes || !in->dtypes || !in->ranks;
    for (int t = 0; !bad && t < n; t++)
        bad = !(in->names[t] = strdup(names[t]));
    if (bad) {
        dt__ckpt_inputs_free(in);
        return dt__error(DT_ERR_NO_MEMORY, "%s: no memory", fn);
    }
    if ((st = dt_mesh_host_mesh(mesh, &in->host)) != DT_OK) {
        dt__ckpt_inputs_free(in);
        return st;
    }
    for (int t = 0; t < n; t++) {
        const dt_layout *l = dt_tensor_layout(tensors[t]);
        const char *specs[DT_MAX_RANK];
        int rank = dt_layout_rank(l);
        for (int d = 0; d < rank; d++)
            specs[d] = dt_layout_spec(l, d);
        if ((st = dt_layout_create(in->host, rank, specs, &in->layouts[t])) != DT_OK) {
            dt__ckpt_inputs_free(in);
            return st;
        }
        if (rank > 0)
            memcpy(in->shapes[t], dt_tensor_shape(tensors[t]), (size_t)rank * sizeof(int64_t));
        in->dtypes[t] = dt_tensor_dtype(tensors[t]);
        in->ranks[t] = rank;
    }
    return DT_OK;
}

void dt_ckpt_shards_free(dt_ckpt_shard *shards, int count)
{
    for (int i = 0; shards && i < count; i++)
        free(shards[i].path);
    free(shards);
}

dt_status dt_sharded_prefix(const dt_mesh *mesh, const char *dir, int n,
                            const char *const *names, const dt_tensor *const *tensors,
                            dt_ckpt_shard **shards_out, int *count_out)
{
    const char *fn = "dt_sharded_prefix";
    char d[CK_PATH_MAX];
    if (!shards_out || !count_out)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "%s: NULL output", fn);
    dt_status st = dt__ckpt_norm_dir(fn, dir, d, sizeof d);
    ck_inputs in;
    if (st != DT_OK || (st = dt__ckpt_inputs_init(fn, mesh, n, names, tensors, &in)) != DT_OK)
        return st;
    ck_plan plan;
    if ((st = dt__ckpt_plan_input(&in)) == DT_OK)
        st = dt__ckpt_plan(in.host, &in.plan_in, DT_CKPT_CHUNK_BYTES, &plan);
    if (st != DT_OK) {
        dt__ckpt_inputs_free(&in);
        return st;
    }
    dt_ckpt_shard *sh = calloc((size_t)plan.nfiles + 1, sizeof *sh);
    char name[64];
    for (int64_t f = 0; sh && f < plan.nfiles; f++) {
        dt__ckpt_file_name(name, sizeof name, f, plan.nfiles);
        size_t len = strlen(d) + strlen(name) + 2;
        if (!(sh[f].path = malloc(len))) {
            dt_ckpt_shards_free(sh, (int)f);
            sh = NULL;
            break;
        }
        snprintf(sh[f].path, len, "%s/%s", d, name);
        sh[f].device_id = plan.files[f].device_id;
        sh[f].position = plan.files[f].position;
        sh[f].num_slices = plan.files[f].nslices;
        sh[f].data_bytes = plan.files[f].data_bytes;
    }
    int count = (int)plan.nfiles;
    dt__ckpt_plan_free(&plan);
    dt__ckpt_inputs_free(&in);
    if (!sh)
        return dt__error(DT_ERR_NO_MEMORY, "%s: no memory", fn);
    *shards_out = sh;
    *count_out = count;
    return DT_OK;
}

/* Index of the local component of t at mesh position p, or -1. */
static int component_at(const dt_tensor *t, int64_t p)
{
    for (int i = 0; i < dt_tensor_num_local(t); i++)
        if (dt_tensor_local_position(t, i) == p)
            return i;
    return -1;
}

/* Where every plan slice this client writes lives (NULL data for the others'), as
 * dt__ckpt_write_local_files and the staging take them: a layout's block is the tensor's
 * local component at its position (on its device), a piece is the caller's host memory from
 * dt_save_opts.pieces (dev NULL). */
dt_status dt__ckpt_slice_data(const ck_plan *plan, const ck_inputs *in, ck_slice_src **out)
{
    ck_slice_src *src = calloc((size_t)plan->nslices + 1, sizeof *src);
    if (!src)
        return dt__error(DT_ERR_NO_MEMORY, "dt_save: no memory");
    int me = dt_client_id();
    for (int64_t si = 0; si < plan->nslices; si++) {
        const ck_plan_slice *s = &plan->slices[si];
        int64_t f = plan->file_of_position[s->position];
        if (dt_device_client(DT_DEVICE_CPU, plan->files[f].device_id) != me)
            continue;
        if (s->piece >= 0) {
            src[si].data = in->user_pieces[plan->pieces[s->piece].local].data;
        } else {
            const dt_tensor *t = in->tensors[s->tensor];
            int i = component_at(t, s->position);
            if (i >= 0) {
                src[si].data = dt_tensor_local(t, i)->data;
                src[si].dev = dt__tensor_device(t, i);
            }
        }
    }
    *out = src;
    return DT_OK;
}

int dt__ckpt_slices_on_device(const ck_plan *plan, const ck_slice_src *src,
                              const dt__device_kind **kind_out)
{
    *kind_out = NULL;
    for (int64_t si = 0; si < plan->nslices; si++)
        if (src[si].dev && !src[si].dev->kind->host_visible) {
            *kind_out = src[si].dev->kind;
            return 1;
        }
    return 0;
}

dt_status dt__ckpt_check_opts(const dt_save_opts *o)
{
    if (!o)
        return DT_OK;
    if (o->chunk_bytes && (o->chunk_bytes % 4096 || o->chunk_bytes > ((uint64_t)1 << 30)))
        return dt__error(DT_ERR_INVALID_ARGUMENT,
                         "dt_save: chunk_bytes %llu is not a multiple of 4096 (or above 1 GiB)",
                         (unsigned long long)o->chunk_bytes);
    if (o->node_local != 0 && o->node_local != 1)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "dt_save: node_local %d is not 0 or 1",
                         o->node_local);
    if (o->nvalues < 0 || (o->nvalues > 0 && !o->values))
        return dt__error(DT_ERR_INVALID_ARGUMENT, "dt_save: bad nvalues/values");
    for (int v = 0; v < o->nvalues; v++) {
        const dt_ckpt_value *x = &o->values[v];
        dt_status st = dt__ckpt_check_name("dt_save", "value", x->name);
        if (st != DT_OK)
            return st;
        for (int u = 0; u < v; u++)
            if (strcmp(o->values[u].name, x->name) == 0)
                return dt__error(DT_ERR_INVALID_ARGUMENT, "dt_save: value name '%s' repeated",
                                 x->name);
        if ((unsigned)x->type > DT_CKPT_VALUE_BYTES)
            return dt__error(DT_ERR_INVALID_ARGUMENT, "dt_save: value '%s' has a bad type %d",
                             x->name, (int)x->type);
        if (x->type == DT_CKPT_VALUE_BYTES &&
            ((x->nbytes && !x->bytes) || x->nbytes > ((size_t)16 << 20)))
            return dt__error(DT_ERR_INVALID_ARGUMENT,
                             "dt_save: value '%s': NULL bytes or more than 16 MiB", x->name);
    }
    return DT_OK;
}

int dt__ckpt_castable(dt_dtype a, dt_dtype b)
{
    return a == b || ((a == DT_DTYPE_F32 || a == DT_DTYPE_F64 || a == DT_DTYPE_F16 ||
                       a == DT_DTYPE_BF16) &&
                      (b == DT_DTYPE_F32 || b == DT_DTYPE_F64 || b == DT_DTYPE_F16 ||
                       b == DT_DTYPE_BF16));
}

dt_status dt__ckpt_check_save_dtypes(const char *fn, const dt_save_opts *o, const ck_inputs *in)
{
    for (int t = 0; o && o->save_dtypes && t < in->n; t++)
        if (!dt__ckpt_castable(in->dtypes[t], o->save_dtypes[t]))
            return dt__error(DT_ERR_INVALID_ARGUMENT, "%s: tensor '%s' of dtype %s cannot be "
                             "saved as %s (casts are among f32, f64, f16, bf16)", fn,
                             in->names[t], dt_dtype_name(in->dtypes[t]),
                             dt_dtype_name(o->save_dtypes[t]));
    return DT_OK;
}

/* Partial tensors are reduced and casts made on the tensors' own mesh (on their devices):
 * the bytes are then read from the components where they are (dt__ckpt_slice_data). */
dt_status dt__ckpt_take_tensors(const dt_tensor *const *tensors, const dt_save_opts *o,
                                ck_inputs *in)
{
    in->tensors = calloc((size_t)in->n + 1, sizeof *in->tensors);
    if (!in->tensors)
        return dt__error(DT_ERR_NO_MEMORY, "dt_save: no memory");
    for (int t = 0; t < in->n; t++) {
        const dt_layout *l = dt_tensor_layout(tensors[t]);
        dt_tensor *reduced = NULL;
        dt_status st = DT_OK;
        if (dt_layout_num_partial(l) > 0) {
            const char *specs[DT_MAX_RANK];
            for (int d = 0; d < dt_layout_rank(l); d++)
                specs[d] = dt_layout_spec(l, d);
            dt_layout *plain = NULL;
            st = dt_layout_create(dt_layout_mesh(l), dt_layout_rank(l), specs, &plain);
            if (st == DT_OK)
                st = dt_relayout(tensors[t], plain, &reduced);
            dt_layout_destroy(plain);
        } else {
            reduced = dt_tensor_retain(tensors[t]);
        }
        if (st == DT_OK)
            in->tensors[t] = reduced;
        dt_dtype want = o && o->save_dtypes ? o->save_dtypes[t] : in->dtypes[t];
        if (st == DT_OK && want != in->dtypes[t]) {
            dt_tensor *cast = NULL;
            st = dt_cast(in->tensors[t], want, &cast);
            dt_tensor_destroy(in->tensors[t]);
            in->tensors[t] = cast;
            in->dtypes[t] = want;
        }
        if (st != DT_OK)
            return st;
    }
    return DT_OK;
}
