/* The ZeRO optimizer object: creation and options, parameter groups (flattening, state
 * allocation), queries, learning rates and the memory report. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "mesh/mesh_group.h"
#include "optim/optim_impl.h"
#include "runtime/error.h"
#include "runtime/util.h"

static dt_status make_layout(const dt_zero *z, const char *last, int partial,
                             dt_layout **out)
{
    const char *specs[DT_MAX_RANK];
    for (int j = 0; j < z->k; j++)
        specs[j] = dt_mesh_dim_name(z->mesh, z->nondp[j]);
    specs[z->k] = last;
    const char *pdim = dt_mesh_dim_name(z->mesh, z->dp);
    dt_reduce_op op = DT_REDUCE_SUM;
    return dt_layout_create_partial(z->mesh, z->k + 1, specs, partial ? 1 : 0, &pdim, &op, out);
}

/* dt_zero_create's checks of its arguments and of the mesh here, before any communication. */
static dt_status check_create(const char *fn, const dt_mesh *mesh, const dt_zero_opts *opts)
{
    const dt_zero_opts defaults = DT_ZERO_OPTS_INIT;
    if (opts->stage < 0 || opts->stage > 3)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "%s: stage %d (0, 1, 2 or 3 expected)", fn,
                         opts->stage);
    const char *dp_name = opts->dp_dim ? opts->dp_dim : "batch";
    int dp = dt_mesh_dim_index(mesh, dp_name);
    if (dp < 0)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "%s: dp_dim '%s' is not a dimension of the "
                         "mesh", fn, dp_name);
    if (opts->allgather_size < 0)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "%s: allgather_size %lld is negative", fn,
                         (long long)opts->allgather_size);
    if (opts->reduce_bucket_size <= 0)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "%s: reduce_bucket_size %lld must be > 0 "
                         "(bytes; DT_ZERO_OPTS_INIT has %lld)", fn,
                         (long long)opts->reduce_bucket_size,
                         (long long)defaults.reduce_bucket_size);
    if (opts->max_live_bucket_bytes < 0)
        return dt__error(DT_ERR_INVALID_ARGUMENT,
                         "%s: max_live_bucket_bytes %lld is negative "
                         "(0: 2 * reduce_bucket_size)",
                         fn, (long long)opts->max_live_bucket_bytes);
    if (opts->offload_block < 0)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "%s: offload_block %lld is negative", fn,
                         (long long)opts->offload_block);
    if (opts->reduce_dtype != DT_ZERO_REDUCE_PARAM && opts->reduce_dtype != DT_ZERO_REDUCE_F32)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "%s: reduce_dtype %d (DT_ZERO_REDUCE_PARAM "
                         "or DT_ZERO_REDUCE_F32)", fn, opts->reduce_dtype);
    if (opts->offload && opts->reduce_dtype == DT_ZERO_REDUCE_F32)
        return dt__error(DT_ERR_UNSUPPORTED, "%s: reduce_dtype f32 does not work with offload",
                         fn);
    if (opts->offload && opts->stage > 2)
        return dt__error(DT_ERR_UNSUPPORTED, "%s: offload works with stages 0, 1 and 2, not "
                         "stage %d", fn, opts->stage);
    if (opts->offload && dt_mesh_device_type(mesh) != DT_DEVICE_GPU)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "%s: offload needs a mesh of GPU devices "
                         "(this mesh's are %s: their optimizer state is in host memory "
                         "already, there is nothing to offload)", fn,
                         dt_mesh_device_type_name(mesh));
    if (isnan(opts->clip_norm))
        return dt__error(DT_ERR_INVALID_ARGUMENT, "%s: clip_norm is NaN", fn);
    dt_status st = dt__scaler_check(fn, &opts->scaler);
    if (st != DT_OK)
        return st;
    return dt_mesh_check_devices(mesh);
}

dt_status dt_zero_create(const dt_mesh *mesh, const dt_zero_opts *opts, dt_zero **zero_out)
{
    static const char fn[] = "dt_zero_create";
    const dt_zero_opts defaults = DT_ZERO_OPTS_INIT;
    if (!mesh || !zero_out)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "%s: mesh and zero_out are required", fn);
    if (!opts)
        opts = &defaults;
    /* The options are this client's: the mesh's clients agree on the checks' outcome before
     * the first collective (the reduction's communicator), so that a bad option on one of
     * them fails the call on all of them instead of leaving them waiting there. */
    dt_status st = check_create(fn, mesh, opts);
    if (dt_is_initialized())
        st = dt__mesh_agree(mesh, st, fn);
    if (st != DT_OK)
        return st;
    const char *dp_name = opts->dp_dim ? opts->dp_dim : "batch";
    int dp = dt_mesh_dim_index(mesh, dp_name);
    int nlocal = dt_mesh_num_local_devices(mesh);
    if (nlocal < 1)
        return dt__error(DT_ERR_STATE,
                         "%s: this client (%d) holds no device of mesh '%s' (an "
                         "optimizer is made on the mesh's clients only: docs/mesh.md)",
                         fn, dt_client_id(), dt_mesh_name(mesh));

    dt_zero *z = calloc(1, sizeof *z);
    if (!z)
        return dt__error(DT_ERR_NO_MEMORY, "%s: no memory", fn);
    z->coords = calloc((size_t)nlocal, sizeof *z->coords);
    z->devs = calloc((size_t)nlocal, sizeof *z->devs);
    if (!z->coords || !z->devs) {
        free(z->coords);
        free(z->devs);
        free(z);
        return dt__error(DT_ERR_NO_MEMORY, "%s: no memory", fn);
    }
    z->mesh = dt_mesh_retain(mesh);
    /* Stage 3 is stage 2's gradients and state plus sharded parameters (stage3.c). */
    z->stage = opts->stage == 3 ? 2 : opts->stage;
    z->sharded_params = opts->stage == 3;
    z->dp = dp;
    z->dp_size = dt_mesh_dim_size(mesh, dp);
    for (int d = 0; d < dt_mesh_rank(mesh); d++)
        if (d != dp)
            z->nondp[z->k++] = d;
    z->allgather_size = opts->allgather_size ? opts->allgather_size
                                             : (int64_t)DT__ZERO_DEFAULT_ALLGATHER;
    /* Chunks of a multiple of N elements (at least N): every dp rank owns len / N of each
     * chunk but the last, so no rank is left without state and the memory is even. */
    z->allgather_size -= z->allgather_size % z->dp_size;
    if (z->allgather_size < z->dp_size)
        z->allgather_size = z->dp_size;
    z->reduce_bucket_size = opts->reduce_bucket_size;
    z->max_live_bytes =
        opts->max_live_bucket_bytes
            ? opts->max_live_bucket_bytes
            : (opts->reduce_bucket_size > INT64_MAX / 2 ? INT64_MAX : 2 * opts->reduce_bucket_size);
    z->offload = opts->offload != 0;
    z->reduce_f32 = opts->reduce_dtype == DT_ZERO_REDUCE_F32;
    z->offload_block = opts->offload_block ? opts->offload_block : (int64_t)1 << 20;
    z->comm = MPI_COMM_NULL;
    z->clip_norm = opts->clip_norm;
    z->on_overflow = opts->on_overflow;
    z->on_overflow_arg = opts->on_overflow_arg;
    z->combine = opts->combine;
    z->combine_arg = opts->combine_arg;
    dt__scaler_init(&z->scaler, &opts->scaler);
    z->nlocal = nlocal;
    for (int i = 0; st == DT_OK && i < nlocal; i++) {
        int id = dt_mesh_local_device_id(mesh, i);
        st = dt_mesh_coords(mesh, dt_mesh_position(mesh, id), z->coords[i]);
        z->devs[i] = dt__device_by_id(dt_mesh_device_type(mesh), id);
        if (st == DT_OK && !z->devs[i])
            st = dt__error(DT_ERR_DEVICE_MISMATCH, "%s: local device %d (device %d) is not "
                           "open in this client", fn, i, id);
        if (st == DT_OK && !z->devs[i]->kind->ops())
            st = dt__error(DT_ERR_UNSUPPORTED, "%s: the mesh's %s devices have no kernels in "
                           "this build", fn, z->devs[i]->kind->name);
    }
    const char *dp_spec = z->stage == 0 ? DT_UNSHARDED : dp_name;
    if (st == DT_OK)
        st = make_layout(z, DT_UNSHARDED, 1, &z->flat_layout);
    if (st == DT_OK)
        st = make_layout(z, dp_spec, 0, &z->state_layout);
    if (st == DT_OK)
        st = make_layout(z, DT_UNSHARDED, 0, &z->gather_layout);
    if (st == DT_OK)
        st = dt__zero_overlap_init(z);
    if (st != DT_OK) {
        dt_zero_destroy(z);
        return st;
    }
    *zero_out = z;
    return DT_OK;
}

void dt_zero_destroy(dt_zero *zero)
{
    if (!zero)
        return;
    dt__zero_ready_reset(zero);
    for (int j = 0; zero->pending.gl && j < zero->nparams; j++) /* a step begun, not ended */
        dt_tensor_destroy(zero->pending.gl[j]);
    free(zero->pending.gl);
    /* Stage 3 gathers in flight are waited for while their communicator exists. */
    for (int g = 0; g < zero->ngroups; g++)
        dt__zero_s3_free_group(zero, &zero->groups[g]);
    dt__zero_overlap_fini(zero);
    dt__zero_offload_fini(zero);
    for (int g = 0; g < zero->ngroups; g++)
        dt__zero_free_group(&zero->groups[g]);
    free(zero->groups);
    dt_layout_destroy(zero->flat_layout);
    dt_layout_destroy(zero->state_layout);
    dt_layout_destroy(zero->gather_layout);
    dt_mesh_destroy(zero->mesh);
    free(zero->coords);
    free(zero->devs);
    free(zero);
}

static dt_status check_hparams(const char *fn, const dt_optim_hparams *hp)
{
    if (hp->kind != DT_OPTIM_SGD && hp->kind != DT_OPTIM_ADAM && hp->kind != DT_OPTIM_ADAMW)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "%s: hp->kind %d is not a dt_optim_kind", fn,
                         (int)hp->kind);
    if (!isfinite(hp->lr) || !isfinite(hp->weight_decay))
        return dt__error(DT_ERR_INVALID_ARGUMENT, "%s: hp->lr and hp->weight_decay must be "
                         "finite", fn);
    if (hp->kind == DT_OPTIM_SGD) {
        if (!(hp->momentum >= 0.0f) || !isfinite(hp->momentum) || !isfinite(hp->dampening))
            return dt__error(DT_ERR_INVALID_ARGUMENT, "%s: hp->momentum %g must be >= 0 and "
                             "hp->dampening finite", fn, (double)hp->momentum);
        if (hp->nesterov && (hp->momentum == 0.0f || hp->dampening != 0.0f))
            return dt__error(DT_ERR_INVALID_ARGUMENT, "%s: Nesterov momentum needs momentum > 0 "
                             "and dampening 0", fn);
        return DT_OK;
    }
    if (!(hp->beta1 >= 0.0f && hp->beta1 < 1.0f) || !(hp->beta2 >= 0.0f && hp->beta2 < 1.0f))
        return dt__error(DT_ERR_INVALID_ARGUMENT, "%s: hp->beta1 %g and hp->beta2 %g must be in "
                         "[0, 1)", fn, (double)hp->beta1, (double)hp->beta2);
    if (!(hp->eps >= 0.0f) || !isfinite(hp->eps))
        return dt__error(DT_ERR_INVALID_ARGUMENT, "%s: hp->eps %g must be >= 0", fn,
                         (double)hp->eps);
    return DT_OK;
}

static int name_taken(const dt_zero *z, const dt__zgroup *cur, int upto, const char *name,
                      const dt_tensor *t, const char **other)
{
    for (int g = 0; g < z->ngroups; g++)
        for (int j = 0; j < z->groups[g].nparams; j++) {
            const dt__zparam *p = &z->groups[g].params[j];
            if (strcmp(p->name, name) == 0 || p->tensor == t) {
                *other = p->name;
                return 1;
            }
        }
    for (int j = 0; j < upto; j++)
        if (strcmp(cur->params[j].name, name) == 0 || cur->params[j].tensor == t) {
            *other = cur->params[j].name;
            return 1;
        }
    return 0;
}

/* Checks parameter `t` and fills p's flattening facts (not offset, index, name, tensor). */
static dt_status describe_param(const dt_zero *z, const char *fn, const char *name,
                                const dt_tensor *t, dt_dtype dtype, dt__zparam *p)
{
    const dt_layout *l = dt_tensor_layout(t);
    if (!dt_mesh_equal(dt_layout_mesh(l), z->mesh))
        return dt__error(DT_ERR_SHAPE, "%s: parameter '%s' is on another mesh than the "
                         "optimizer", fn, name);
    dt_dtype dt = dt_tensor_dtype(t);
    if (dt != DT_DTYPE_F32 && dt != DT_DTYPE_F16 && dt != DT_DTYPE_BF16)
        return dt__error(DT_ERR_SHAPE, "%s: parameter '%s' has dtype %s (f32, f16 or bf16 "
                         "expected)", fn, name, dt_dtype_name(dt));
    if (dt != dtype)
        return dt__error(DT_ERR_SHAPE, "%s: parameter '%s' has dtype %s, the group's first "
                         "parameter %s", fn, name, dt_dtype_name(dt), dt_dtype_name(dtype));
    if (dt_layout_num_partial(l) > 0)
        return dt__error(DT_ERR_SHAPE, "%s: parameter '%s' is partial (a parameter must hold "
                         "its value)", fn, name);
    int rank = dt_layout_rank(l);
    uint32_t sharded = 0;
    const char *specs[DT_MAX_RANK];
    for (int i = 0; i < rank; i++) {
        int d = dt_layout_spec_mesh_dim(l, i);
        if (d == z->dp)
            return dt__error(DT_ERR_SHAPE, "%s: parameter '%s' is sharded along the "
                             "data-parallel dim '%s' (it must be replicated along it)", fn,
                             name, dt_mesh_dim_name(z->mesh, z->dp));
        if (d >= 0)
            sharded |= 1u << d;
        specs[i] = dt_layout_spec(l, i);
    }
    memset(p, 0, sizeof *p);
    p->rank = rank;
    memcpy(p->shape, dt_tensor_shape(t), (size_t)rank * sizeof *p->shape);
    for (int j = 0; j < z->k; j++) {
        int d = z->nondp[j];
        if (sharded >> d & 1u)
            p->shard_dims[p->nshard++] = d;
        else
            p->rep_mask |= 1u << d;
    }
    /* n: the longest local shard over the model coordinates (dp coordinate 0). */
    int64_t size = dt_mesh_size(z->mesh);
    for (int64_t pos = 0; pos < size; pos++) {
        int64_t coords[DT_MESH_MAX_DIMS], off[DT_MAX_RANK], shp[DT_MAX_RANK];
        dt_status st = dt_mesh_coords(z->mesh, pos, coords);
        if (st != DT_OK)
            return st;
        if (coords[z->dp] != 0)
            continue;
        st = dt_layout_shard(l, dt_tensor_shape(t), pos, off, shp);
        if (st != DT_OK)
            return st;
        int64_t n = dt__numel(rank, shp);
        if (n > p->n)
            p->n = n;
    }
    const char *pdim = dt_mesh_dim_name(z->mesh, z->dp);
    dt_reduce_op op = DT_REDUCE_SUM;
    p->layout = dt_layout_retain(l);
    return dt_layout_create_partial(z->mesh, rank, specs, 1, &pdim, &op, &p->grad_layout);
}

dt_status dt_zero_add_group(dt_zero *zero, int n, const char *const *names,
                            dt_tensor *const *params, const dt_optim_hparams *hp,
                            int *group_out)
{
    static const char fn[] = "dt_zero_add_group";
    if (!zero || !names || !params || !hp)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "%s: zero, names, params and hp are required",
                         fn);
    if (n < 1)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "%s: a group needs at least one parameter "
                         "(n = %d)", fn, n);
    if (zero->nready > 0)
        return dt__error(DT_ERR_STATE, "%s: a step is in progress (dt_zero_grad_ready was "
                         "called); add groups between steps", fn);
    dt_status st = check_hparams(fn, hp);
    if (st == DT_OK && zero->sharded_params)
        st = dt__zero_s3_idle(zero, fn);
    if (st != DT_OK)
        return st;
    for (int j = 0; j < n; j++) {
        if (!params[j] || !names[j] || !names[j][0])
            return dt__error(DT_ERR_INVALID_ARGUMENT, "%s: parameter %d has a NULL tensor or "
                             "an empty name", fn, j);
    }
    dt__zgroup *grown = realloc(zero->groups, (size_t)(zero->ngroups + 1) * sizeof *grown);
    if (!grown)
        return dt__error(DT_ERR_NO_MEMORY, "%s: no memory", fn);
    zero->groups = grown;
    dt__zgroup *g = &zero->groups[zero->ngroups];
    memset(g, 0, sizeof *g);
    g->hp = *hp;
    g->dtype = dt_tensor_dtype(params[0]);
    g->gdtype = zero->reduce_f32 ? DT_DTYPE_F32 : g->dtype;
    g->params = calloc((size_t)n, sizeof *g->params);
    if (!g->params)
        return dt__error(DT_ERR_NO_MEMORY, "%s: no memory", fn);
    for (int j = 0; j < n; j++) {
        const char *other = NULL;
        if (name_taken(zero, g, g->nparams, names[j], params[j], &other)) {
            st = strcmp(other, names[j]) == 0
                     ? dt__error(DT_ERR_INVALID_ARGUMENT, "%s: parameter name '%s' is already "
                                 "used", fn, names[j])
                     : dt__error(DT_ERR_INVALID_ARGUMENT, "%s: parameter '%s' is the same "
                                 "tensor as '%s'", fn, names[j], other);
            break;
        }
        dt__zparam *p = &g->params[j];
        st = describe_param(zero, fn, names[j], params[j], g->dtype, p);
        if (st != DT_OK)
            break;
        g->nparams = j + 1;
        p->name = strdup(names[j]);
        if (!p->name) {
            st = dt__error(DT_ERR_NO_MEMORY, "%s: no memory", fn);
            break;
        }
        p->tensor = dt_tensor_retain(params[j]);
        p->index = zero->nparams + j;
        p->offset = g->length;
        g->length += p->n;
    }
    if (st == DT_OK)
        st = dt__zero_alloc_state(zero, g);
    if (st == DT_OK && zero->sharded_params)
        st = dt__zero_s3_adopt(zero, g);
    if (st != DT_OK) {
        dt__zero_s3_free_group(zero, g);
        dt__zero_free_group(g);
        return st;
    }
    zero->nparams += n;
    if (group_out)
        *group_out = zero->ngroups;
    zero->ngroups++;
    return DT_OK;
}

int dt_zero_num_params(const dt_zero *zero)
{
    return zero ? zero->nparams : 0;
}

double dt_zero_loss_scale(const dt_zero *zero)
{
    return zero ? dt__scaler_scale(&zero->scaler) : 1.0;
}

dt_status dt_zero_set_lr(dt_zero *zero, int group, float lr)
{
    if (!zero)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "dt_zero_set_lr: zero is NULL");
    if (group < 0 || group >= zero->ngroups)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "dt_zero_set_lr: group %d (the optimizer has "
                         "%d)", group, zero->ngroups);
    if (!isfinite(lr))
        return dt__error(DT_ERR_INVALID_ARGUMENT, "dt_zero_set_lr: lr is not finite");
    zero->groups[group].hp.lr = lr;
    return DT_OK;
}

static uint64_t local_bytes(const dt_tensor *t)
{
    uint64_t b = 0;
    for (int i = 0; t && i < dt_tensor_num_local(t); i++) {
        const DLTensor *d = dt_tensor_local(t, i);
        b += (uint64_t)dt__numel(d->ndim, d->shape) * dt_dtype_size(dt_tensor_dtype(t));
    }
    return b;
}

dt_status dt_zero_memory_usage(const dt_zero *zero, dt_zero_memory *memory_out)
{
    if (!zero || !memory_out)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "dt_zero_memory_usage: zero and memory_out "
                         "are required");
    dt_zero_memory m;
    memset(&m, 0, sizeof m);
    for (int g = 0; g < zero->ngroups; g++) {
        const dt__zgroup *gr = &zero->groups[g];
        uint64_t dsz = dt_dtype_size(gr->gdtype);
        for (int j = 0; j < gr->nparams; j++)
            m.param_bytes += local_bytes(gr->params[j].tensor);
        for (int c = 0; c < gr->nchunks; c++) {
            const dt__zchunk *ch = &gr->chunks[c];
            m.grad_bytes += local_bytes(ch->flat) + local_bytes(ch->gpart);
            m.state_bytes += local_bytes(ch->master) + local_bytes(ch->s1) +
                             local_bytes(ch->s2);
            m.param_bytes += local_bytes(ch->psh);
            /* The largest per-chunk temporary: the reduced chunk (stages 0, 1: the partition
             * before it is copied back; stage 2: the transient partial flat chunk), or the
             * all-gather's destination plus, for 16-bit parameters in stage 1, its cast
             * source. */
            uint64_t part = 0;
            for (int i = 0; i < zero->nlocal; i++) {
                int64_t off, len;
                dt__zero_part(zero, ch, i, &off, &len);
                part += (uint64_t)len * dsz;
            }
            uint64_t full = (uint64_t)zero->nlocal * (uint64_t)ch->len * dsz;
            uint64_t reduce = zero->stage == 2 ? full : part;
            uint64_t gather = 0;
            /* (Offload, stage 1: the partition in the parameters' dtype whatever it is.) */
            int cast_src = gr->dtype != DT_DTYPE_F32 || zero->offload;
            if (zero->sharded_params)
                gather = 0; /* the gathered parameters themselves are in param_bytes */
            else if (zero->stage > 0)
                gather = full + (zero->stage == 1 && cast_src ? part : 0);
            uint64_t tmp = reduce > gather ? reduce : gather;
            if (tmp > m.gather_bytes)
                m.gather_bytes = tmp;
        }
    }
    m.host_bytes = dt__zero_offload_host_bytes(zero);
    *memory_out = m;
    return DT_OK;
}
