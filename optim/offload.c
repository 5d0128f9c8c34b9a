/* Offload of the optimizer to the host (DeepSpeed's cpu_offload): the fp32 master partition
 * and moments in pinned host memory, the inner optimizer's CPU kernel on them, and per local
 * device a pipeline in which a transfer thread moves the reduced gradient partition down and
 * the updated parameters up, block by block, while the host updates the block between them
 * (docs/optim.md, "Offload"). */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "optim/optim_impl.h"
#include "runtime/error.h"

/* The transfer blocks, allocated at the first offloaded step: two gradient blocks and two
 * parameter blocks (the parameters' dtype, so the widest: 4 bytes an element) and one f32
 * block for widening 16-bit gradients, each `block` elements of pinned host memory. */
struct dt__zoff {
    const dt__device_kind *kind;
    int64_t block;            /* elements of a block: offload_block, or less for a small
                               * optimizer */
    size_t bytes;             /* of each block */
    void *grad[2], *param[2];
    float *wide;
};

/* ---- where the state is ---------------------------------------------------------------------- */

void dt__zero_part(const dt_zero *z, const dt__zchunk *ch, int i, int64_t *off, int64_t *len)
{
    int64_t shape[DT_MAX_RANK], o[DT_MAX_RANK], n[DT_MAX_RANK];
    for (int j = 0; j < z->k; j++)
        shape[j] = dt_mesh_dim_size(z->mesh, z->nondp[j]);
    shape[z->k] = ch->len;
    int64_t pos = dt_mesh_position(z->mesh, dt_mesh_local_device_id(z->mesh, i));
    /* The layout and position are the optimizer's own: the shard cannot fail. */
    dt_status st = dt_layout_shard(z->state_layout, shape, pos, o, n);
    *off = st == DT_OK ? o[z->k] : 0;
    *len = st == DT_OK ? n[z->k] : 0;
}

float *dt__zero_state_data(const dt__zchunk *ch, int kind, int i)
{
    if (ch->host[kind])
        return ch->host[kind][i];
    const dt_tensor *t = kind == 0 ? ch->master : kind == 1 ? ch->s1 : ch->s2;
    return t ? dt_tensor_local(t, i)->data : NULL;
}

int dt__zero_state_on_host(const dt_zero *z, int i)
{
    return z->offload || z->devs[i]->kind->host_visible;
}

/* ---- the state's host memory -------------------------------------------------------------------- */

dt_status dt__zero_offload_adopt(const dt_zero *z, dt__zchunk *ch, int s1, int s2)
{
    const dt__device_kind *kind = z->devs[0]->kind;
    dt_status st = dt__zero_sync(z);
    ch->hkind = kind;
    int want[3] = {1, s1, s2};
    for (int kd = 0; st == DT_OK && kd < 3; kd++) {
        if (!want[kd])
            continue;
        /* One entry more than the devices: the list ends with NULL (for the free). */
        ch->host[kd] = calloc((size_t)z->nlocal + 1, sizeof *ch->host[kd]);
        if (!ch->host[kd]) {
            st = dt__error(DT_ERR_NO_MEMORY, "dt_zero (offload): no memory");
            break;
        }
        for (int i = 0; st == DT_OK && i < z->nlocal; i++) {
            int64_t off, len;
            dt__zero_part(z, ch, i, &off, &len);
            size_t bytes = (size_t)len * sizeof(float);
            st = kind->host_alloc(bytes ? bytes : sizeof(float), (void **)&ch->host[kd][i]);
            if (st != DT_OK)
                break;
            /* The master starts as the parameters (gathered on the device); moments at 0. */
            if (kd == 0)
                st = z->devs[i]->kind->copy(z->devs[i], DT__COPY_D2H, ch->host[0][i],
                                            dt_tensor_local(ch->master, i)->data, bytes);
            else
                memset(ch->host[kd][i], 0, bytes);
        }
    }
    if (st == DT_OK) {
        dt_tensor_destroy(ch->master);
        ch->master = NULL;
    }
    return st;
}

void dt__zero_offload_free_chunk(dt__zchunk *ch)
{
    for (int kd = 0; kd < 3; kd++) {
        /* The lists end with NULL, as do those cut short by a failed allocation. */
        for (int i = 0; ch->host[kd] && ch->hkind; i++) {
            if (!ch->host[kd][i])
                break;
            ch->hkind->host_free(ch->host[kd][i]);
        }
        free(ch->host[kd]);
        ch->host[kd] = NULL;
    }
}

static void free_staging(struct dt__zoff *o)
{
    if (!o)
        return;
    for (int b = 0; b < 2; b++) {
        if (o->grad[b])
            o->kind->host_free(o->grad[b]);
        if (o->param[b])
            o->kind->host_free(o->param[b]);
    }
    if (o->wide)
        o->kind->host_free(o->wide);
    free(o);
}

void dt__zero_offload_fini(dt_zero *z)
{
    free_staging(z->off);
    z->off = NULL;
}

static dt_status staging(dt_zero *z)
{
    if (z->off)
        return DT_OK;
    struct dt__zoff *o = calloc(1, sizeof *o);
    if (!o)
        return dt__error(DT_ERR_NO_MEMORY, "dt_zero_step (offload): no memory");
    o->kind = z->devs[0]->kind;
    /* No block longer than the longest partition. */
    int64_t most = 1;
    for (int g = 0; g < z->ngroups; g++)
        for (int c = 0; c < z->groups[g].nchunks; c++)
            for (int i = 0; i < z->nlocal; i++) {
                int64_t off, len;
                dt__zero_part(z, &z->groups[g].chunks[c], i, &off, &len);
                most = len > most ? len : most;
            }
    o->block = z->offload_block < most ? z->offload_block : most;
    o->bytes = (size_t)o->block * sizeof(float);
    dt_status st = DT_OK;
    for (int b = 0; st == DT_OK && b < 2; b++) {
        st = o->kind->host_alloc(o->bytes, &o->grad[b]);
        if (st == DT_OK)
            st = o->kind->host_alloc(o->bytes, &o->param[b]);
    }
    if (st == DT_OK)
        st = o->kind->host_alloc(o->bytes, (void **)&o->wide);
    if (st != DT_OK) {
        free_staging(o);
        return st;
    }
    z->off = o;
    return DT_OK;
}

uint64_t dt__zero_offload_host_bytes(const dt_zero *z)
{
    uint64_t b = z->off ? 5 * (uint64_t)z->off->bytes : 0;
    for (int g = 0; g < z->ngroups; g++)
        for (int c = 0; c < z->groups[g].nchunks; c++) {
            const dt__zchunk *ch = &z->groups[g].chunks[c];
            for (int i = 0; i < z->nlocal; i++) {
                int64_t off, len;
                dt__zero_part(z, ch, i, &off, &len);
                for (int kd = 0; kd < 3; kd++)
                    b += ch->host[kd] ? (uint64_t)len * sizeof(float) : 0;
            }
        }
    return b;
}

/* ---- one device's pipeline ------------------------------------------------------------------- */

/* Block k of n: gradient down into grad[k % 2], the host's update, parameters up from
 * param[k % 2] (or, f32 parameters, straight from the master). The transfer thread runs
 * down(0), then down(k + 1) and up(k) for each k, each down waiting until the host is done
 * with the block that used its buffer two blocks before, each up until the host is done with
 * its block: so the host's update of block k runs beside up(k - 1) and down(k + 1). */
typedef struct pipe {
    const dt__device *dev;
    const struct dt__zoff *o;
    dt_dtype dtype;
    size_t dsz;
    int64_t len, block, nblocks;
    const char *gsrc;         /* device: the reduced gradient partition */
    char *pdst;               /* device: where the updated parameters go */
    const float *master;      /* host: the updated master (f32 parameters go up from it) */
    pthread_mutex_t lock;
    pthread_cond_t cv;
    int64_t down;             /* blocks downloaded */
    int64_t done;             /* blocks updated by the host */
    int failed;               /* either side failed: the other stops */
    dt_status st;             /* the transfer thread's failure, and its message */
    char msg[512];
} pipe;

static int64_t block_len(const pipe *p, int64_t k)
{
    int64_t rest = p->len - k * p->block;
    return rest < p->block ? rest : p->block;
}

/* Waits until *counter >= want or a failure; 0 on failure. Under p->lock. */
static int wait_for(pipe *p, const int64_t *counter, int64_t want)
{
    while (*counter < want && !p->failed)
        pthread_cond_wait(&p->cv, &p->lock);
    return !p->failed;
}

static dt_status transfer(pipe *p, int up, int64_t k)
{
    size_t at = (size_t)(k * p->block) * p->dsz, bytes = (size_t)block_len(p, k) * p->dsz;
    if (!up)
        return p->dev->kind->copy(p->dev, DT__COPY_D2H, p->o->grad[k % 2], p->gsrc + at, bytes);
    const void *src = p->dtype == DT_DTYPE_F32 ? (const void *)(p->master + k * p->block)
                                               : p->o->param[k % 2];
    return p->dev->kind->copy(p->dev, DT__COPY_H2D, p->pdst + at, src, bytes);
}

static void *transfer_main(void *arg)
{
    pipe *p = arg;
    dt_status st = DT_OK;
    for (int64_t k = -1; st == DT_OK && k < p->nblocks; k++) {
        /* down(k + 1): its buffer was block k - 1's. */
        if (k + 1 < p->nblocks) {
            pthread_mutex_lock(&p->lock);
            int go = wait_for(p, &p->done, k);
            pthread_mutex_unlock(&p->lock);
            if (!go)
                break;
            st = transfer(p, 0, k + 1);
            pthread_mutex_lock(&p->lock);
            if (st == DT_OK)
                p->down = k + 2;
            pthread_cond_broadcast(&p->cv);
            pthread_mutex_unlock(&p->lock);
        }
        if (st != DT_OK || k < 0)
            continue;
        pthread_mutex_lock(&p->lock);
        int go = wait_for(p, &p->done, k + 1);
        pthread_mutex_unlock(&p->lock);
        if (!go)
            break;
        st = transfer(p, 1, k);
    }
    if (st != DT_OK) {
        /* The message is this thread's: hand it to the caller's. */
        pthread_mutex_lock(&p->lock);
        p->st = st;
        snprintf(p->msg, sizeof p->msg, "%s", dt_last_error());
        p->failed = 1;
        pthread_cond_broadcast(&p->cv);
        pthread_mutex_unlock(&p->lock);
    }
    return NULL;
}

/* The host's update of block k on device i's partition of chunk ch (state at `at`). */
static dt_status update_block(const dt__zgroup *g, const dt__zchunk *ch, int i, const pipe *p,
                              int64_t k, float grad_scale, int64_t t)
{
    const dt__ops_backend *cpu = dt__ops_cpu_backend();
    const dt_optim_hparams *hp = &g->hp;
    int64_t at = k * p->block, b = block_len(p, k);
    const float *grad = p->o->grad[k % 2];
    dt_status st = DT_OK;
    if (p->dtype != DT_DTYPE_F32) {
        st = cpu->cast(b, grad, p->dtype, p->o->wide, DT_DTYPE_F32);
        grad = p->o->wide;
    }
    float *w = ch->host[0][i] + at;
    float *m = ch->host[1] ? ch->host[1][i] + at : NULL;
    float *v = ch->host[2] ? ch->host[2][i] + at : NULL;
    if (st == DT_OK && hp->kind == DT_OPTIM_SGD) {
        dt_sgd_opts so = {hp->lr, hp->momentum, hp->dampening, hp->weight_decay, hp->nesterov,
                          grad_scale};
        st = cpu->sgd(b, &so, w, grad, m);
    } else if (st == DT_OK) {
        dt_adam_opts ao = {hp->lr, hp->beta1, hp->beta2, hp->eps, hp->weight_decay,
                           hp->kind == DT_OPTIM_ADAMW, grad_scale};
        st = cpu->adam(b, &ao, t, w, grad, m, v);
    }
    if (st == DT_OK && p->dtype != DT_DTYPE_F32)
        st = cpu->cast(b, w, DT_DTYPE_F32, p->o->param[k % 2], p->dtype);
    return st;
}

/* Device i's partition of chunk ch: gradients from gsrc down, the update, parameters up into
 * pdst (both device memory of the partition's length, the group's dtype; may be the same). */
static dt_status run_pipe(const dt_zero *z, const dt__zgroup *g, const dt__zchunk *ch, int i,
                          const char *gsrc, char *pdst, float grad_scale, int64_t t)
{
    int64_t off, len;
    dt__zero_part(z, ch, i, &off, &len);
    if (len == 0)
        return DT_OK;
    pipe p;
    memset(&p, 0, sizeof p);
    p.dev = z->devs[i];
    p.o = z->off;
    p.dtype = g->dtype;
    p.dsz = dt_dtype_size(g->dtype);
    p.len = len;
    p.block = z->off->block;
    p.nblocks = (len + p.block - 1) / p.block;
    p.gsrc = gsrc;
    p.pdst = pdst;
    p.master = ch->host[0][i];
    pthread_mutex_init(&p.lock, NULL);
    pthread_cond_init(&p.cv, NULL);
    pthread_t th;
    dt_status st = DT_OK;
    if (pthread_create(&th, NULL, transfer_main, &p) != 0) {
        pthread_cond_destroy(&p.cv);
        pthread_mutex_destroy(&p.lock);
        return dt__error(DT_ERR_NO_MEMORY, "dt_zero_step (offload): cannot start the transfer "
                         "thread");
    }
    for (int64_t k = 0; st == DT_OK && k < p.nblocks; k++) {
        pthread_mutex_lock(&p.lock);
        int go = wait_for(&p, &p.down, k + 1);
        pthread_mutex_unlock(&p.lock);
        if (!go)
            break;
        st = update_block(g, ch, i, &p, k, grad_scale, t);
        pthread_mutex_lock(&p.lock);
        if (st == DT_OK)
            p.done = k + 1;
        else
            p.failed = 1;
        pthread_cond_broadcast(&p.cv);
        pthread_mutex_unlock(&p.lock);
    }
    pthread_join(th, NULL);
    if (st == DT_OK && p.st != DT_OK)
        st = dt__error(p.st, "%s", p.msg);
    pthread_cond_destroy(&p.cv);
    pthread_mutex_destroy(&p.lock);
    return st;
}

/* ---- the step ------------------------------------------------------------------------------ */

/* Chunk ch: every device's partition through the pipeline, then the parameters rebuilt from
 * the updated partitions. Stage 0 holds the whole chunk everywhere: the update goes up into
 * the flat buffer (its gradients spent) and back into the parameters from there. Stages 1
 * and 2 gather the partitions in the parameters' dtype: from the spent gradient partition
 * (stage 2) or a transient (stage 1, whose gradient partition lies in the flat buffer). */
static dt_status update_chunk(const dt_zero *z, const dt__zgroup *g, dt__zchunk *ch,
                              float grad_scale, int64_t t)
{
    size_t dsz = dt_dtype_size(g->dtype);
    dt_tensor *dst = z->stage == 2 ? ch->gpart : NULL, *tmp = NULL, *full = NULL;
    dt_status st = DT_OK, done;
    if (z->stage == 1)
        st = dt__zero_chunk_tensor(z, z->state_layout, g->dtype, ch->len, 0, &tmp);
    if (tmp)
        dst = tmp;
    for (int i = 0; st == DT_OK && i < z->nlocal; i++) {
        int64_t off, len;
        dt__zero_part(z, ch, i, &off, &len);
        const char *gsrc = z->stage == 2 ? dt_tensor_local(ch->gpart, i)->data
                                         : (char *)dt_tensor_local(ch->flat, i)->data + off * dsz;
        char *pdst = z->stage == 0 ? (char *)dt_tensor_local(ch->flat, i)->data
                                   : dt_tensor_local(dst, i)->data;
        st = run_pipe(z, g, ch, i, gsrc, pdst, grad_scale, t);
    }
    if (st == DT_OK && z->stage > 0)
        st = dt_relayout(dst, z->gather_layout, &full);
    dt_tensor_destroy(tmp);
    const dt_tensor *from = z->stage == 0 ? ch->flat : full;
    for (int i = 0; st == DT_OK && i < z->nlocal; i++)
        st = dt__zero_scatter_out(z, g, i, ch->start, ch->len, dt_tensor_local(from, i)->data,
                                  g->dtype);
    done = dt__zero_sync(z);
    dt_tensor_destroy(full);
    return st != DT_OK ? st : done;
}

dt_status dt__zero_offload_update(dt_zero *z, float grad_scale, int64_t t)
{
    dt_status st = staging(z);
    for (int g = 0; st == DT_OK && g < z->ngroups; g++)
        for (int c = 0; st == DT_OK && c < z->groups[g].nchunks; c++)
            st = update_chunk(z, &z->groups[g], &z->groups[g].chunks[c], grad_scale, t);
    return st;
}
