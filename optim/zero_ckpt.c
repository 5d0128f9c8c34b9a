/* Saving and restoring the optimizer through the DSaver: parameters as tensors, the state as
 * explicitly placed slices of each parameter's flattened form ("<name>/master", ...), the
 * scaler and counters as named values; a restore reads each device's own (new) partition.
 * State in device memory host code cannot reach is copied to host buffers for the save and
 * written back through bounded host chunks on a restore (docs/optim.md). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "optim/optim_impl.h"
#include "runtime/error.h"
#include "runtime/util.h"

#define NKINDS 3
/* The named value marking state saved in the parameters' global shapes; checkpoints without
 * it hold the older per-model-row form. */
#define FORMAT_VALUE "zero/state_format"
#define FORMAT_GLOBAL 2
/* State kinds in save order; a kind is present in a chunk when its tensor is. */
static const char *kind_name(const dt__zgroup *g, int kind)
{
    switch (kind) {
    case 0: return "master";
    case 1: return g->hp.kind == DT_OPTIM_SGD ? "momentum" : "exp_avg";
    default: return "exp_avg_sq";
    }
}

static int kind_present(const dt__zgroup *g, int kind)
{
    if (kind == 0)
        return 1;
    if (kind == 1)
        return g->hp.kind != DT_OPTIM_SGD || g->hp.momentum != 0.0f;
    return g->hp.kind != DT_OPTIM_SGD;
}

/* Global shape of parameter p's state tensors: [sizes of the mesh dims sharding p..., n]. */
static int state_shape(const dt_zero *z, const dt__zparam *p, int64_t *shape)
{
    for (int j = 0; j < p->nshard; j++)
        shape[j] = dt_mesh_dim_size(z->mesh, p->shard_dims[j]);
    shape[p->nshard] = p->n;
    return p->nshard + 1;
}

/* ---- save ---------------------------------------------------------------------------------- */

typedef struct save_lists {
    int nnames;
    const char **names;
    const dt_tensor **tensors;
    int nvalues;
    dt_ckpt_value *values;
    char (*value_names)[32];
    int npieces, cap_pieces;
    dt_ckpt_piece *pieces;
    int64_t *dims;             /* 3 * DT_MAX_RANK per piece: shape, offsets, sizes */
    int nstrings;
    char **strings;            /* "<name>/<kind>" */
    int nstaged;
    void **staged;             /* per piece: a host copy of device data, or NULL */
    const dt__device_kind **staged_kind; /* whose host_free releases it */
    int nhost;
    void **host;               /* dt_zero_save_joint: host copies of the parameters' shards */
} save_lists;

static void free_lists(save_lists *s)
{
    for (int j = 0; s->staged && j < s->nstaged; j++)
        if (s->staged[j])
            s->staged_kind[j]->host_free(s->staged[j]);
    free(s->staged);
    free(s->staged_kind);
    for (int j = 0; j < s->nhost; j++)
        free(s->host[j]);
    free(s->host);
    for (int j = 0; j < s->nstrings; j++)
        free(s->strings[j]);
    free(s->strings);
    free(s->names);
    free(s->tensors);
    free(s->values);
    free(s->value_names);
    free(s->pieces);
    free(s->dims);
}

static char *state_name(const char *param, const char *kind)
{
    size_t n = strlen(param) + strlen(kind) + 2;
    char *s = malloc(n);
    if (s)
        snprintf(s, n, "%s/%s", param, kind);
    return s;
}

static dt_status add_piece(save_lists *s, const dt_ckpt_piece *pc)
{
    if (s->npieces == s->cap_pieces) {
        int cap = s->cap_pieces ? 2 * s->cap_pieces : 64;
        dt_ckpt_piece *np = realloc(s->pieces, (size_t)cap * sizeof *np);
        if (!np)
            return dt__error(DT_ERR_NO_MEMORY, "dt_zero_save: no memory for pieces");
        s->pieces = np;
        int64_t *nd = realloc(s->dims, (size_t)cap * 3 * DT_MAX_RANK * sizeof *nd);
        if (!nd)
            return dt__error(DT_ERR_NO_MEMORY, "dt_zero_save: no memory for pieces");
        s->dims = nd;
        s->cap_pieces = cap;
    }
    s->pieces[s->npieces++] = *pc;
    return DT_OK;
}

/* The part [*a, *b) of parameter p's flat run that lies in local device i's partition of
 * chunk ch, and where that partition starts (*lo); 0 when they do not meet. */
static int run_part(const dt_zero *z, const dt__zparam *p, const dt__zchunk *ch, int i,
                    int64_t *lo, int64_t *a, int64_t *b)
{
    int64_t off, len;
    dt__zero_part(z, ch, i, &off, &len);
    *lo = ch->start + off;
    int64_t hi = *lo + len;
    *a = p->offset > *lo ? p->offset : *lo;
    *b = p->offset + p->n < hi ? p->offset + p->n : hi;
    return *b > *a;
}

/* The part of device i's partition of chunk ch (as run_part) inside parameter p's local
 * shard on device i, as positions [*pa, *pb) of the shard's row-major form (padding
 * dropped), *src the address of *pa in state `kind` (device memory, or host memory under
 * offload); 0 when empty. */
static int shard_part(const dt_zero *z, const dt__zparam *p, const dt__zchunk *ch, int kind,
                      int i, int64_t *pa, int64_t *pb, float **src)
{
    int64_t lo, a, b;
    if (!run_part(z, p, ch, i, &lo, &a, &b))
        return 0;
    const DLTensor *d = dt_tensor_local(p->tensor, i);
    int64_t numel = dt__numel(d->ndim, d->shape);
    *pa = a - p->offset;
    *pb = b - p->offset < numel ? b - p->offset : numel;
    *src = dt__zero_state_data(ch, kind, i) + (a - lo);
    return *pb > *pa;
}

/* This client's slices of parameter p's state in the parameter's global shape: for each local
 * device that is the first of its copies, the part of its partition of each chunk inside its
 * local shard, cut into boxes of the global tensor. */
static dt_status param_pieces(const dt_zero *z, const dt__zgroup *g, const dt__zparam *p,
                              save_lists *s)
{
    const int rank = dt_tensor_rank(p->tensor);
    const int64_t *shape = dt_tensor_shape(p->tensor);
    for (int kind = 0; kind < NKINDS; kind++) {
        if (!kind_present(g, kind) || p->n == 0)
            continue;
        char *name = state_name(p->name, kind_name(g, kind));
        char **ns = realloc(s->strings, (size_t)(s->nstrings + 1) * sizeof *ns);
        if (!name || !ns) {
            free(name);
            if (ns)
                s->strings = ns;
            return dt__error(DT_ERR_NO_MEMORY, "dt_zero_save: no memory");
        }
        s->strings = ns;
        s->strings[s->nstrings++] = name;
        for (int i = 0; i < z->nlocal; i++) {
            if (!dt__zero_counts(z, p, i))
                continue;
            const DLTensor *loc = dt_tensor_local(p->tensor, i);
            const int64_t *loff = dt_tensor_local_offset(p->tensor, i);
            for (int c = 0; c < g->nchunks; c++) {
                int64_t pa, pb;
                float *src;
                if (!shard_part(z, p, &g->chunks[c], kind, i, &pa, &pb, &src))
                    continue;
                dt__zbox boxes[DT__ZERO_MAX_BOXES];
                int nb = dt__zero_boxes(rank, loc->shape, pa, pb, boxes);
                for (int k = 0; k < nb; k++) {
                    dt_ckpt_piece pc;
                    memset(&pc, 0, sizeof pc);
                    dt_status st = add_piece(s, &pc);
                    if (st != DT_OK)
                        return st;
                    /* dims are pointed at after every piece is added (the array may move). */
                    int64_t *d = s->dims + (size_t)(s->npieces - 1) * 3 * DT_MAX_RANK;
                    for (int j = 0; j < rank; j++) {
                        d[j] = shape[j];
                        d[DT_MAX_RANK + j] = loff[j] + boxes[k].offsets[j];
                        d[2 * DT_MAX_RANK + j] = boxes[k].sizes[j];
                    }
                    dt_ckpt_piece *q = &s->pieces[s->npieces - 1];
                    q->name = name;
                    q->dtype = DT_DTYPE_F32;
                    q->rank = rank;
                    q->device = i;
                    q->data = src + (boxes[k].start - pa);
                }
            }
        }
    }
    return DT_OK;
}

/* Points our pieces (from `first` on) held in memory host code cannot read at host copies of
 * their data (dt_save reads pieces from host memory; the checkpoint is the same). */
static dt_status stage_pieces(const dt_zero *z, int first, save_lists *s)
{
    s->staged = calloc((size_t)s->npieces + 1, sizeof *s->staged);
    s->staged_kind = calloc((size_t)s->npieces + 1, sizeof *s->staged_kind);
    if (!s->staged || !s->staged_kind)
        return dt__error(DT_ERR_NO_MEMORY, "dt_zero_save: no memory");
    s->nstaged = s->npieces;
    dt_status st = dt__zero_sync(z);
    for (int j = first; st == DT_OK && j < s->npieces; j++) {
        dt_ckpt_piece *pc = &s->pieces[j];
        const dt__device *dev = z->devs[pc->device];
        if (dt__zero_state_on_host(z, pc->device))
            continue;
        size_t bytes = (size_t)dt__numel(pc->rank, pc->sizes) * sizeof(float);
        st = dev->kind->host_alloc(bytes, &s->staged[j]);
        if (st != DT_OK)
            break;
        s->staged_kind[j] = dev->kind;
        st = dev->kind->copy(dev, DT__COPY_D2H, s->staged[j], pc->data, bytes);
        pc->data = s->staged[j];
    }
    return st;
}

static dt_status build_lists(const dt_zero *z, int n_extra, const char *const *extra_names,
                             const dt_tensor *const *extra_tensors, const dt_save_opts *o,
                             save_lists *s)
{
    static const char fn[] = "dt_zero_save";
    s->nnames = z->nparams + n_extra;
    s->names = calloc((size_t)s->nnames + 1, sizeof *s->names);
    s->tensors = calloc((size_t)s->nnames + 1, sizeof *s->tensors);
    int nours = 6 + z->ngroups;
    s->nvalues = o->nvalues + nours;
    s->values = calloc((size_t)s->nvalues, sizeof *s->values);
    s->value_names = calloc((size_t)z->ngroups + 1, sizeof *s->value_names);
    if (!s->names || !s->tensors || !s->values || !s->value_names)
        return dt__error(DT_ERR_NO_MEMORY, "%s: no memory", fn);
    for (int g = 0; g < z->ngroups; g++)
        for (int j = 0; j < z->groups[g].nparams; j++) {
            const dt__zparam *p = &z->groups[g].params[j];
            s->names[p->index] = p->name;
            s->tensors[p->index] = p->tensor;
        }
    for (int j = 0; j < n_extra; j++) {
        s->names[z->nparams + j] = extra_names[j];
        s->tensors[z->nparams + j] = extra_tensors[j];
    }
    for (int j = 0; j < o->nvalues; j++)
        s->values[j] = o->values[j];
    dt_ckpt_value *v = s->values + o->nvalues;
    const dt__scaler *sc = &z->scaler;
    v[0] = (dt_ckpt_value){"zero/step", DT_CKPT_VALUE_I64, z->step, 0.0, NULL, 0};
    v[1] = (dt_ckpt_value){"zero/iteration", DT_CKPT_VALUE_I64, sc->iteration, 0.0, NULL, 0};
    v[2] = (dt_ckpt_value){"zero/loss_scale", DT_CKPT_VALUE_F64, 0, sc->scale, NULL, 0};
    v[3] = (dt_ckpt_value){"zero/hysteresis_left", DT_CKPT_VALUE_I64, sc->hysteresis_left, 0.0,
                           NULL, 0};
    v[4] = (dt_ckpt_value){"zero/last_overflow", DT_CKPT_VALUE_I64, sc->last_overflow, 0.0, NULL,
                           0};
    v[5] = (dt_ckpt_value){FORMAT_VALUE, DT_CKPT_VALUE_I64, FORMAT_GLOBAL, 0.0, NULL, 0};
    for (int g = 0; g < z->ngroups; g++) {
        snprintf(s->value_names[g], sizeof s->value_names[g], "zero/group%d/lr", g);
        v[6 + g] = (dt_ckpt_value){s->value_names[g], DT_CKPT_VALUE_F64, 0,
                                   (double)z->groups[g].hp.lr, NULL, 0};
    }
    for (int j = 0; j < o->npieces; j++) {
        dt_status st = add_piece(s, &o->pieces[j]);
        if (st != DT_OK)
            return st;
    }
    int nuser = s->npieces;
    for (int g = 0; g < z->ngroups; g++)
        for (int j = 0; j < z->groups[g].nparams; j++) {
            dt_status st = param_pieces(z, &z->groups[g], &z->groups[g].params[j], s);
            if (st != DT_OK)
                return st;
        }
    /* Point our pieces at their dims now that the arrays no longer move. */
    for (int j = nuser; j < s->npieces; j++) {
        int64_t *d = s->dims + (size_t)j * 3 * DT_MAX_RANK;
        s->pieces[j].shape = d;
        s->pieces[j].offsets = d + DT_MAX_RANK;
        s->pieces[j].sizes = d + 2 * DT_MAX_RANK;
    }
    return stage_pieces(z, nuser, s);
}

/* Where a save goes: a directory, or a manager's step under a root (root not NULL); from the
 * optimizer's mesh, or (joint not NULL) from a larger mesh that other optimizers save from in
 * the same call (dt_zero_save_joint). */
typedef struct save_target {
    const char *dir, *root;
    int64_t step;
    const dt_ckpt_keep *keep;
    const dt_mesh *joint;
} save_target;

/* dt_zero_save_joint: the parameters become pieces too (the other optimizers' clients save
 * other names, so no tensor list is common to all), and every piece names its device among
 * the joint mesh's local devices (map: ours -> the joint mesh's). Each parameter box is
 * written by the device whose coordinates on the dims replicating it (the dp dim included)
 * are 0, from a host copy kept in s->host until the lists are freed. */
static dt_status joint_params(const dt_zero *z, const int *map, int nuser, save_lists *s)
{
    for (int j = nuser; j < s->npieces; j++)
        s->pieces[j].device = map[s->pieces[j].device];
    int first = s->npieces;
    s->host = calloc((size_t)z->nparams * (size_t)z->nlocal + 1, sizeof *s->host);
    if (!s->host)
        return dt__error(DT_ERR_NO_MEMORY, "dt_zero_save_joint: no memory");
    for (int g = 0; g < z->ngroups; g++)
        for (int n = 0; n < z->groups[g].nparams; n++) {
            const dt__zparam *p = &z->groups[g].params[n];
            const dt_tensor *t = s->tensors[p->index];
            for (int i = 0; i < z->nlocal; i++) {
                int writes = z->coords[i][z->dp] == 0;
                for (int d = 0; d < dt_mesh_rank(z->mesh); d++)
                    writes &= !(p->rep_mask >> d & 1u) || z->coords[i][d] == 0;
                if (!writes)
                    continue;
                const DLTensor *loc = dt_tensor_local(t, i);
                size_t bytes = (size_t)dt__numel(loc->ndim, loc->shape) *
                               dt_dtype_size(dt_tensor_dtype(t));
                void *buf = malloc(bytes ? bytes : 1);
                if (!buf)
                    return dt__error(DT_ERR_NO_MEMORY, "dt_zero_save_joint: no memory");
                s->host[s->nhost++] = buf;
                dt_status st = dt_tensor_local_read(t, i, buf, bytes);
                dt_ckpt_piece pc = {p->name, dt_tensor_dtype(t), dt_tensor_rank(t),
                                    dt_tensor_shape(t), dt_tensor_local_offset(t, i),
                                    loc->shape, map[i], buf};
                if (st == DT_OK)
                    st = add_piece(s, &pc);
                if (st != DT_OK)
                    return st;
            }
        }
    /* add_piece may have moved the dims the state pieces point at. */
    for (int j = nuser; j < first; j++) {
        int64_t *d = s->dims + (size_t)j * 3 * DT_MAX_RANK;
        s->pieces[j].shape = d;
        s->pieces[j].offsets = d + DT_MAX_RANK;
        s->pieces[j].sizes = d + 2 * DT_MAX_RANK;
    }
    return DT_OK;
}

static dt_status joint_pieces(const dt_zero *z, const dt_mesh *joint, int nuser, save_lists *s)
{
    int nj = dt_mesh_num_local_devices(joint);
    int *map = calloc((size_t)z->nlocal + 1, sizeof *map);
    if (!map)
        return dt__error(DT_ERR_NO_MEMORY, "dt_zero_save_joint: no memory");
    dt_status st = DT_OK;
    for (int i = 0; st == DT_OK && i < z->nlocal; i++) {
        int id = dt_mesh_local_device_id(z->mesh, i);
        map[i] = -1;
        for (int j = 0; j < nj; j++)
            if (dt_mesh_local_device_id(joint, j) == id)
                map[i] = j;
        if (map[i] < 0)
            st = dt__error(DT_ERR_INVALID_ARGUMENT, "dt_zero_save_joint: device %d of mesh '%s' "
                           "is not in mesh '%s'", id, dt_mesh_name(z->mesh), dt_mesh_name(joint));
    }
    if (st == DT_OK)
        st = joint_params(z, map, nuser, s);
    free(map);
    return st;
}

/* dt_zero_save(_async) and dt_zero_save_step: req_out NULL saves synchronously. */
static dt_status zero_save(const char *fn, dt_zero *zero, const save_target *t, int n_extra,
                           const char *const *extra_names, const dt_tensor *const *extra_tensors,
                           const dt_save_opts *opts, dt_save_request **req_out)
{
    if (!zero || !(t->root || t->dir))
        return dt__error(DT_ERR_INVALID_ARGUMENT, "%s: zero and dir are required", fn);
    if (n_extra < 0 || (n_extra > 0 && (!extra_names || !extra_tensors)))
        return dt__error(DT_ERR_INVALID_ARGUMENT, "%s: %d extra tensors need their names and "
                         "tensors", fn, n_extra);
    const dt_save_opts defaults = DT_SAVE_OPTS_INIT;
    if (!opts)
        opts = &defaults;
    if ((opts->nvalues > 0 && !opts->values) || (opts->npieces > 0 && !opts->pieces) ||
        opts->nvalues < 0 || opts->npieces < 0)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "%s: opts->values or opts->pieces is NULL "
                         "or has a negative count", fn);
    save_lists s;
    memset(&s, 0, sizeof s);
    dt_dtype *dtypes = NULL;
    /* Stage 3: the parameters are whole for the time of the save (an asynchronous save
     * would need them after the release). */
    unsigned char *held = NULL;
    dt_status st = zero->sharded_params && req_out
                       ? dt__error(DT_ERR_UNSUPPORTED,
                                   "%s: stage 3 saves synchronously "
                                   "(dt_zero_save or dt_zero_save_step)",
                                   fn)
                       : dt__zero_s3_hold_all(zero, &held);
    if (st == DT_OK)
        st = build_lists(zero, n_extra, extra_names, extra_tensors, opts, &s);
    /* The caller's save_dtypes cover its extra tensors; the parameters keep their dtype (a
     * restore must give them back exactly). */
    if (st == DT_OK && opts->save_dtypes) {
        dtypes = calloc((size_t)s.nnames + 1, sizeof *dtypes);
        if (!dtypes)
            st = dt__error(DT_ERR_NO_MEMORY, "%s: no memory", fn);
        for (int j = 0; dtypes && j < s.nnames; j++)
            dtypes[j] = j < zero->nparams ? dt_tensor_dtype(s.tensors[j])
                                          : opts->save_dtypes[j - zero->nparams];
    }
    if (st == DT_OK) {
        dt_save_opts o = *opts;
        o.nvalues = s.nvalues;
        o.values = s.values;
        o.npieces = s.npieces;
        o.pieces = s.pieces;
        o.save_dtypes = dtypes;
        if (t->joint) {
            st = joint_pieces(zero, t->joint, opts->npieces, &s);
            o.npieces = s.npieces;
            o.pieces = s.pieces;
            o.save_dtypes = NULL;
            if (st == DT_OK && t->root)
                st = dt_save_step(t->joint, t->root, t->step, t->keep, 0, NULL, NULL, &o);
            else if (st == DT_OK)
                st = dt_save(t->joint, t->dir, 0, NULL, NULL, &o);
        } else if (t->root)
            st = dt_save_step(zero->mesh, t->root, t->step, t->keep, s.nnames, s.names,
                              s.tensors, &o);
        else if (req_out)
            st = dt_save_async(zero->mesh, t->dir, s.nnames, s.names, s.tensors, &o, req_out);
        else
            st = dt_save(zero->mesh, t->dir, s.nnames, s.names, s.tensors, &o);
    }
    free(dtypes);
    free_lists(&s);
    dt__zero_s3_drop(zero, held);
    return st;
}

dt_status dt_zero_save(dt_zero *zero, const char *dir, int n_extra,
                       const char *const *extra_names, const dt_tensor *const *extra_tensors,
                       const dt_save_opts *opts)
{
    const save_target t = {.dir = dir};
    return zero_save("dt_zero_save", zero, &t, n_extra, extra_names, extra_tensors, opts, NULL);
}

dt_status dt_zero_save_step(dt_zero *zero, const char *root, int64_t step,
                            const dt_ckpt_keep *keep, int n_extra, const char *const *extra_names,
                            const dt_tensor *const *extra_tensors, const dt_save_opts *opts)
{
    if (!root)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "dt_zero_save_step: root is required");
    const save_target t = {.root = root, .step = step, .keep = keep};
    return zero_save("dt_zero_save_step", zero, &t, n_extra, extra_names, extra_tensors, opts,
                     NULL);
}

dt_status dt_zero_save_joint(dt_zero *zero, const dt_mesh *mesh, const char *dir,
                             const dt_save_opts *opts)
{
    if (!mesh)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "dt_zero_save_joint: mesh is required");
    const save_target t = {.dir = dir, .joint = mesh};
    return zero_save("dt_zero_save_joint", zero, &t, 0, NULL, NULL, opts, NULL);
}

dt_status dt_zero_save_joint_step(dt_zero *zero, const dt_mesh *mesh, const char *root,
                                  int64_t step, const dt_ckpt_keep *keep,
                                  const dt_save_opts *opts)
{
    if (!mesh || !root)
        return dt__error(DT_ERR_INVALID_ARGUMENT,
                         "dt_zero_save_joint_step: mesh and root are required");
    const save_target t = {.root = root, .step = step, .keep = keep, .joint = mesh};
    return zero_save("dt_zero_save_joint_step", zero, &t, 0, NULL, NULL, opts, NULL);
}

dt_status dt_zero_save_async(dt_zero *zero, const char *dir, int n_extra,
                             const char *const *extra_names,
                             const dt_tensor *const *extra_tensors, const dt_save_opts *opts,
                             dt_save_request **req_out)
{
    if (!req_out)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "dt_zero_save_async: req_out is required");
    *req_out = NULL;
    const save_target t = {.dir = dir};
    return zero_save("dt_zero_save_async", zero, &t, n_extra, extra_names, extra_tensors, opts,
                     req_out);
}

/* ---- load ---------------------------------------------------------------------------------- */

typedef struct loaded_values {
    int64_t step, iteration, hysteresis_left, last_overflow;
    double loss_scale;
    double *lr;
} loaded_values;

static dt_status read_values(const dt_zero *z, const dt_ckpt *ck, loaded_values *lv)
{
    static const char fn[] = "dt_zero_load";
    const char *i64_names[4] = {"zero/step", "zero/iteration", "zero/hysteresis_left",
                                "zero/last_overflow"};
    int64_t *i64_dst[4] = {&lv->step, &lv->iteration, &lv->hysteresis_left, &lv->last_overflow};
    for (int j = 0; j < 4; j++) {
        dt_status st = dt_ckpt_value_i64(ck, i64_names[j], i64_dst[j]);
        if (st != DT_OK)
            return dt__error(st, "%s: %s: value '%s' %s", fn, dt_ckpt_path(ck), i64_names[j],
                             st == DT_ERR_NOT_FOUND ? "is missing" : "is not an integer");
    }
    dt_status st = dt_ckpt_value_f64(ck, "zero/loss_scale", &lv->loss_scale);
    if (st != DT_OK)
        return dt__error(st, "%s: %s: value 'zero/loss_scale' %s", fn, dt_ckpt_path(ck),
                         st == DT_ERR_NOT_FOUND ? "is missing" : "is not a float");
    for (int g = 0; g < z->ngroups; g++) {
        char name[32];
        snprintf(name, sizeof name, "zero/group%d/lr", g);
        st = dt_ckpt_value_f64(ck, name, &lv->lr[g]);
        if (st != DT_OK)
            return dt__error(st, "%s: %s: value '%s' %s (the optimizer has %d groups)", fn,
                             dt_ckpt_path(ck), name,
                             st == DT_ERR_NOT_FOUND ? "is missing" : "is not a float",
                             z->ngroups);
    }
    if (lv->step < 0 || lv->iteration < 0 || lv->hysteresis_left < 1 || lv->last_overflow < -1 ||
        !(lv->loss_scale > 0.0))
        return dt__error(DT_ERR_CORRUPT, "%s: %s: the saved scaler state is out of range", fn,
                         dt_ckpt_path(ck));
    return DT_OK;
}

/* *global_out = 1 for state saved in each parameter's global shape ("zero/state_format" 2),
 * 0 for the older per-model-row form (no such value). */
static dt_status read_format(const dt_ckpt *ck, int *global_out)
{
    int64_t v = 0;
    dt_status st = dt_ckpt_value_i64(ck, FORMAT_VALUE, &v);
    if (st == DT_ERR_NOT_FOUND) {
        dt_clear_error();
        *global_out = 0;
        return DT_OK;
    }
    if (st != DT_OK || v != FORMAT_GLOBAL)
        return dt__error(st != DT_OK ? st : DT_ERR_UNSUPPORTED, "dt_zero_load: %s: value '%s' "
                         "is not the integer %d this version writes", dt_ckpt_path(ck),
                         FORMAT_VALUE, FORMAT_GLOBAL);
    *global_out = 1;
    return DT_OK;
}

/* The parameter was saved with the same sharding (specs and the sizes of the mesh dims they
 * name); a layout that cannot be parsed is not checked here (shapes are, below). */
static dt_status check_param_layout(const dt_zero *z, const dt_ckpt *ck, int global,
                                    const dt__zparam *p)
{
    int64_t idx = -1;
    dt_ckpt_tensor_info info;
    if (dt_ckpt_find(ck, p->name, &idx) != DT_OK ||
        dt_ckpt_tensor(ck, idx, &info) != DT_OK)
        return dt__error(DT_ERR_NOT_FOUND, "dt_zero_load: %s: no parameter '%s'",
                         dt_ckpt_path(ck), p->name);
    if (global)
        return DT_OK; /* any sharding reads the global state; dt_restore_into checks shapes */
    dt_layout *saved = NULL;
    if (!info.layout || dt_layout_parse(info.layout, &saved) != DT_OK) {
        dt_clear_error();
        return DT_OK;
    }
    const dt_layout *now = dt_tensor_layout(p->tensor);
    dt_status st = DT_OK;
    if (dt_layout_rank(saved) != dt_layout_rank(now)) {
        st = dt__error(DT_ERR_SHAPE, "dt_zero_load: parameter '%s' was saved with rank %d, has "
                       "rank %d", p->name, dt_layout_rank(saved), dt_layout_rank(now));
    }
    for (int d = 0; st == DT_OK && d < dt_layout_rank(now); d++) {
        const char *a = dt_layout_spec(saved, d), *b = dt_layout_spec(now, d);
        int ms = dt_layout_spec_mesh_dim(saved, d), mn = dt_layout_spec_mesh_dim(now, d);
        int64_t sa = ms >= 0 ? dt_mesh_dim_size(dt_layout_mesh(saved), ms) : 1;
        int64_t sb = mn >= 0 ? dt_mesh_dim_size(z->mesh, mn) : 1;
        if (strcmp(a, b) != 0 || sa != sb)
            st = dt__error(DT_ERR_SHAPE, "dt_zero_load: parameter '%s' dim %d was saved sharded "
                           "as '%s' over %lld, is now '%s' over %lld (the model-dim sharding "
                           "must not change)", p->name, d, a, (long long)sa, b, (long long)sb);
    }
    dt_layout_destroy(saved);
    return st;
}

/* The state tensors of parameter p exist with the shape this optimizer expects. */
static dt_status check_state(const dt_zero *z, const dt_ckpt *ck, int global,
                             const dt__zgroup *g, const dt__zparam *p, int64_t *idx_out)
{
    int64_t shape[DT_MAX_RANK];
    int rank = dt_tensor_rank(p->tensor);
    if (global)
        memcpy(shape, dt_tensor_shape(p->tensor), (size_t)rank * sizeof *shape);
    else
        rank = state_shape(z, p, shape);
    for (int kind = 0; kind < NKINDS; kind++) {
        idx_out[kind] = -1;
        if (!kind_present(g, kind) || p->n == 0)
            continue;
        char name[512];
        snprintf(name, sizeof name, "%s/%s", p->name, kind_name(g, kind));
        dt_ckpt_tensor_info info;
        if (dt_ckpt_find(ck, name, &idx_out[kind]) != DT_OK ||
            dt_ckpt_tensor(ck, idx_out[kind], &info) != DT_OK)
            return dt__error(DT_ERR_NOT_FOUND, "dt_zero_load: %s: no optimizer state '%s' (was "
                             "it saved by another optimizer kind?)", dt_ckpt_path(ck), name);
        int same = info.rank == rank && info.dtype == DT_DTYPE_F32;
        for (int j = 0; same && j < rank; j++)
            same = info.shape[j] == shape[j];
        if (!same) {
            char a[128], b[128];
            return dt__error(DT_ERR_SHAPE, "dt_zero_load: state '%s' is %s %s, f32 %s "
                             "expected (%s)", name, dt_dtype_name(info.dtype),
                             dt__shape_str(info.rank, info.shape, a, sizeof a),
                             dt__shape_str(rank, shape, b, sizeof b),
                             global ? "the parameter's global shape"
                                    : "a checkpoint of the older per-model-row format, "
                                      "which restores only onto a mesh whose model dims "
                                      "shard each parameter over the same sizes");
        }
    }
    return DT_OK;
}

/* Reads box (offs, sizes) of saved state `idx`, whose last dim runs [at, at + len), into dst
 * in local device i's memory: directly when host code reaches it, else through `stage`
 * (DT__ZERO_STAGE floats of host memory) a bounded piece at a time. */
static dt_status read_box_into(const dt_zero *z, const dt_ckpt *ck, int64_t idx, int rank,
                               int64_t *offs, int64_t *sizes, int64_t at, int64_t len, int i,
                               float *dst, float *stage)
{
    const dt__device *dev = z->devs[i];
    if (dt__zero_state_on_host(z, i)) {
        offs[rank - 1] = at;
        sizes[rank - 1] = len;
        return dt_ckpt_read_box(ck, idx, offs, sizes, dst, (size_t)len * sizeof(float));
    }
    dt_status st = DT_OK;
    for (int64_t k = 0; st == DT_OK && k < len; k += DT__ZERO_STAGE) {
        int64_t b = len - k < DT__ZERO_STAGE ? len - k : DT__ZERO_STAGE;
        offs[rank - 1] = at + k;
        sizes[rank - 1] = b;
        size_t bytes = (size_t)b * sizeof(float);
        st = dt_ckpt_read_box(ck, idx, offs, sizes, stage, bytes);
        if (st == DT_OK)
            st = dev->kind->copy(dev, DT__COPY_H2D, dst + k, stage, bytes);
    }
    return st;
}

/* Reads this client's partition of parameter p's state. */
static dt_status read_state(const dt_zero *z, const dt_ckpt *ck, const dt__zgroup *g,
                            const dt__zparam *p, const int64_t *idx, float *stage)
{
    int64_t shape[DT_MAX_RANK], offs[DT_MAX_RANK], sizes[DT_MAX_RANK];
    int rank = state_shape(z, p, shape);
    for (int kind = 0; kind < NKINDS; kind++) {
        if (idx[kind] < 0)
            continue;
        for (int i = 0; i < z->nlocal; i++)
            for (int c = 0; c < g->nchunks; c++) {
                const dt__zchunk *ch = &g->chunks[c];
                int64_t lo, a, b;
                if (!run_part(z, p, ch, i, &lo, &a, &b))
                    continue;
                for (int j = 0; j < p->nshard; j++) {
                    offs[j] = z->coords[i][p->shard_dims[j]];
                    sizes[j] = 1;
                }
                float *dst = dt__zero_state_data(ch, kind, i) + (a - lo);
                dt_status st = read_box_into(z, ck, idx[kind], rank, offs, sizes,
                                             a - p->offset, b - a, i, dst, stage);
                if (st != DT_OK)
                    return st;
            }
    }
    return DT_OK;
}

/* Reads device i's positions [pa, pb) of parameter p's local shard from saved state `idx`
 * (the parameter's global shape) into dst in that device's memory: box by box, directly
 * when host code reaches it, else through `stage` (DT__ZERO_STAGE floats of host memory). */
static dt_status read_shard_part(const dt_zero *z, const dt_ckpt *ck, int64_t idx,
                                 const dt__zparam *p, int i, int64_t pa, int64_t pb,
                                 float *dst, float *stage)
{
    const dt__device *dev = z->devs[i];
    const DLTensor *loc = dt_tensor_local(p->tensor, i);
    const int64_t *loff = dt_tensor_local_offset(p->tensor, i);
    int visible = dt__zero_state_on_host(z, i);
    int64_t step = visible ? pb - pa : DT__ZERO_STAGE;
    dt_status st = DT_OK;
    for (int64_t k = pa; st == DT_OK && k < pb; k += step) {
        int64_t e = pb - k < step ? pb : k + step;
        float *to = visible ? dst + (k - pa) : stage;
        dt__zbox boxes[DT__ZERO_MAX_BOXES];
        int nb = dt__zero_boxes(loc->ndim, loc->shape, k, e, boxes);
        for (int b = 0; st == DT_OK && b < nb; b++) {
            int64_t offs[DT_MAX_RANK];
            for (int j = 0; j < loc->ndim; j++)
                offs[j] = loff[j] + boxes[b].offsets[j];
            st = dt_ckpt_read_box(ck, idx, offs, boxes[b].sizes, to + (boxes[b].start - k),
                                  (size_t)boxes[b].len * sizeof(float));
        }
        if (st == DT_OK && !visible)
            st = dev->kind->copy(dev, DT__COPY_H2D, dst + (k - pa), stage,
                                 (size_t)(e - k) * sizeof(float));
    }
    return st;
}

/* Reads this client's partition of parameter p's state saved in its global shape: every
 * local device (copies included) reads the part of its partition inside its shard. */
static dt_status read_state_global(const dt_zero *z, const dt_ckpt *ck, const dt__zgroup *g,
                                   const dt__zparam *p, const int64_t *idx, float *stage)
{
    for (int kind = 0; kind < NKINDS; kind++) {
        if (idx[kind] < 0)
            continue;
        for (int i = 0; i < z->nlocal; i++)
            for (int c = 0; c < g->nchunks; c++) {
                int64_t pa, pb;
                float *dst;
                if (!shard_part(z, p, &g->chunks[c], kind, i, &pa, &pb, &dst))
                    continue;
                dt_status st = read_shard_part(z, ck, idx[kind], p, i, pa, pb, dst, stage);
                if (st != DT_OK)
                    return st;
            }
    }
    return DT_OK;
}

/* Host memory for staging a restore into devices host code cannot reach (NULL, and DT_OK,
 * when every local device is host visible). */
static dt_status stage_alloc(const dt_zero *z, float **stage_out, const dt__device_kind **kind_out)
{
    *stage_out = NULL;
    *kind_out = NULL;
    for (int i = 0; i < z->nlocal; i++)
        if (!dt__zero_state_on_host(z, i)) {
            *kind_out = z->devs[i]->kind;
            return z->devs[i]->kind->host_alloc(DT__ZERO_STAGE * sizeof(float),
                                                (void **)stage_out);
        }
    return DT_OK;
}

static dt_status zero_load(dt_zero *zero, const char *dir);

/* Stage 3: the parameters are whole for the time of the restore, then their shards are made
 * from the restored master. */
dt_status dt_zero_load(dt_zero *zero, const char *dir)
{
    if (!zero || !dir)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "dt_zero_load: zero and dir are required");
    unsigned char *held = NULL;
    dt_status st = dt__zero_s3_hold_all(zero, &held);
    if (st == DT_OK)
        st = zero_load(zero, dir);
    for (int g = 0; st == DT_OK && zero->sharded_params && g < zero->ngroups; g++)
        for (int c = 0; st == DT_OK && c < zero->groups[g].nchunks; c++)
            st = dt__zero_s3_refresh(zero, &zero->groups[g], &zero->groups[g].chunks[c]);
    dt_status done = dt__zero_sync(zero);
    if (st == DT_OK)
        st = done;
    dt__zero_s3_drop(zero, held);
    return st;
}

static dt_status zero_load(dt_zero *zero, const char *dir)
{
    static const char fn[] = "dt_zero_load";
    loaded_values lv;
    memset(&lv, 0, sizeof lv);
    lv.lr = calloc((size_t)zero->ngroups + 1, sizeof *lv.lr);
    int64_t *idx = calloc((size_t)zero->nparams * NKINDS + 1, sizeof *idx);
    const char **names = calloc((size_t)zero->nparams + 1, sizeof *names);
    dt_tensor **tensors = calloc((size_t)zero->nparams + 1, sizeof *tensors);
    dt_ckpt *ck = NULL;
    dt_status st = DT_OK;
    if (!lv.lr || !idx || !names || !tensors)
        st = dt__error(DT_ERR_NO_MEMORY, "%s: no memory", fn);
    /* Everything the index can tell is checked before any data moves. */
    if (st == DT_OK)
        st = dt_ckpt_open(dir, &ck);
    int global = 0;
    if (st == DT_OK)
        st = read_format(ck, &global);
    for (int g = 0; st == DT_OK && g < zero->ngroups; g++)
        for (int j = 0; st == DT_OK && j < zero->groups[g].nparams; j++) {
            const dt__zparam *p = &zero->groups[g].params[j];
            names[p->index] = p->name;
            tensors[p->index] = p->tensor;
            st = check_param_layout(zero, ck, global, p);
            if (st == DT_OK)
                st = check_state(zero, ck, global, &zero->groups[g], p,
                                 idx + (size_t)p->index * NKINDS);
        }
    if (st == DT_OK)
        st = read_values(zero, ck, &lv);
    st = dt__zero_agree(zero, fn, st);
    if (st == DT_OK && zero->nparams > 0)
        st = dt_restore_into(dir, zero->nparams, names, tensors);
    if (st == DT_OK) {
        float *stage = NULL;
        const dt__device_kind *stage_kind = NULL;
        st = stage_alloc(zero, &stage, &stage_kind);
        for (int g = 0; st == DT_OK && g < zero->ngroups; g++)
            for (int j = 0; st == DT_OK && j < zero->groups[g].nparams; j++) {
                const dt__zparam *p = &zero->groups[g].params[j];
                const int64_t *pidx = idx + (size_t)p->index * NKINDS;
                st = global ? read_state_global(zero, ck, &zero->groups[g], p, pidx, stage)
                            : read_state(zero, ck, &zero->groups[g], p, pidx, stage);
            }
        dt_status done = dt__zero_sync(zero);
        if (st == DT_OK)
            st = done;
        if (stage)
            stage_kind->host_free(stage);
        st = dt__zero_agree(zero, fn, st);
    }
    if (st == DT_OK) {
        zero->step = lv.step;
        zero->scaler.iteration = lv.iteration;
        zero->scaler.last_overflow = lv.last_overflow;
        /* A static or absent scaler keeps its configured scale. */
        if (zero->scaler.opts.mode == DT_LOSS_SCALE_DYNAMIC) {
            zero->scaler.hysteresis_left = (int)lv.hysteresis_left;
            zero->scaler.scale = lv.loss_scale;
        }
        for (int g = 0; g < zero->ngroups; g++)
            zero->groups[g].hp.lr = (float)lv.lr[g];
    }
    dt_ckpt_close(ck);
    free(tensors);
    free(names);
    free(idx);
    free(lv.lr);
    return st;
}
