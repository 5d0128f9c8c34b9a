/* dt_save, dt_save_async and the manager's dt_save_step(_async): the collective start of a save
 * (inputs checked, pieces gathered, tensors reduced and cast on their mesh, plan, temporary
 * directory), then either the files written here and the save finished (finish.c), or the
 * bytes copied into staging memory (stage.c) while a background thread writes, finishes and
 * commits. Bytes in device memory always go through bounded staging. */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "ckpt/ckpt_impl.h"
#include "mesh/mesh_group.h"
#include "runtime/comm.h"
#include "runtime/device.h"
#include "runtime/error.h"
#include "runtime/util.h"

/* One save, from its start to its end. */
typedef struct ck_save {
    char dir[CK_PATH_MAX], tmp[CK_PATH_MAX];
    ck_inputs in;
    dt__group g;                  /* the mesh's cached group; an own duplicate when asynchronous */
    ck_plan plan;
    int have_plan;
    uint32_t *crcs, **chunk_crcs, *chunk_store;
    char *mesh_str;
    ck_publish publish;
    /* The named values: the caller's (synchronous) or owned copies (asynchronous). */
    int nvalues;
    dt_ckpt_value *own_values;
    unsigned char **own_bytes;
    ck_finish fin;
    ck_quick *quick;              /* a quick node-local save (dt_memckpt): no agreements */
} ck_save;

struct dt_save_request {
    ck_save *job;
    ck_stage *stage;
    pthread_t thread;
    int joined;                   /* the thread was started and joined, or never started */
    atomic_int done;
    dt_status status;
    char msg[1024];
};

static void job_free(ck_save *j)
{
    if (!j)
        return;
    free(j->crcs);
    free(j->chunk_crcs);
    free(j->chunk_store);
    if (j->have_plan)
        dt__ckpt_plan_free(&j->plan);
    dt__group_free(&j->g);
    dt__ckpt_inputs_free(&j->in);
    free(j->mesh_str);
    for (int v = 0; j->own_values && v < j->nvalues; v++) {
        free((char *)j->own_values[v].name);
        free(j->own_bytes[v]);
    }
    free(j->own_values);
    free(j->own_bytes);
    free(j);
}

/* Owned copies of the named values, for a save that outlives the call. */
static dt_status copy_values(ck_save *j, const dt_save_opts *o)
{
    j->own_values = calloc((size_t)j->nvalues + 1, sizeof *j->own_values);
    j->own_bytes = calloc((size_t)j->nvalues + 1, sizeof *j->own_bytes);
    if (!j->own_values || !j->own_bytes)
        return dt__error(DT_ERR_NO_MEMORY, "dt_save_async: no memory");
    for (int v = 0; v < j->nvalues; v++) {
        dt_ckpt_value *x = &j->own_values[v];
        *x = o->values[v];
        x->name = strdup(o->values[v].name);
        if (x->type == DT_CKPT_VALUE_BYTES) {
            j->own_bytes[v] = malloc(x->nbytes + 1);
            if (j->own_bytes[v] && x->nbytes)
                memcpy(j->own_bytes[v], x->bytes, x->nbytes);
            x->bytes = j->own_bytes[v];
        }
        if (!x->name || (x->type == DT_CKPT_VALUE_BYTES && !j->own_bytes[v]))
            return dt__error(DT_ERR_NO_MEMORY, "dt_save_async: no memory");
    }
    j->fin.values = j->own_values;
    return DT_OK;
}

/* CRC arrays of the plan, one list of chunk CRCs per slice in one allocation. */
static dt_status alloc_crcs(ck_save *j)
{
    int64_t nch = 0;
    for (int64_t si = 0; si < j->plan.nslices; si++)
        nch += j->plan.slices[si].nchunks;
    j->crcs = calloc((size_t)j->plan.nslices + 1, sizeof *j->crcs);
    j->chunk_crcs = calloc((size_t)j->plan.nslices + 1, sizeof *j->chunk_crcs);
    j->chunk_store = calloc((size_t)nch + 1, sizeof *j->chunk_store);
    if (!j->crcs || !j->chunk_crcs || !j->chunk_store)
        return dt__error(DT_ERR_NO_MEMORY, "dt_save: no memory for CRCs");
    for (int64_t si = 0, k = 0; si < j->plan.nslices; si++) {
        j->chunk_crcs[si] = j->chunk_store + k;
        k += j->plan.slices[si].nchunks;
    }
    return DT_OK;
}

/* A save whose own checks failed here (`st`: its dir, options, names, tensors) on a client of
 * the mesh: it meets the others at their first sync point and cleanup, as a failing client of
 * theirs would, so that every client returns this failure instead of waiting for this one.
 * Returns st unchanged on a client outside the mesh or where no group can be had. */
static dt_status fail_alike(const dt_mesh *mesh, const dt_save_opts *opts, int owned, dt_status st)
{
    const dt__group *g = NULL;
    if (!mesh || !dt_is_initialized() || dt_mesh_num_local_devices(mesh) < 1)
        return st;
    char keep[1024];
    dt__strlcpy(keep, dt_last_error(), sizeof keep);
    if (dt__mesh_group(mesh, &g) != DT_OK || g->comm == MPI_COMM_NULL)
        return dt__error(st, "%s", keep);
    dt__group d = {.comm = MPI_COMM_NULL};
    dt_mesh *host = NULL;
    double timeout = opts ? opts->timeout_seconds : 0.0;
    if (owned && dt__group_dup(g, &d) != DT_OK) /* the others agree over their duplicate */
        return dt__error(st, "%s", keep);
    if (timeout > 0 && dt_mesh_host_mesh(mesh, &host) != DT_OK)
        host = NULL;
    ck_finish f = {.g = owned ? &d : g, .barrier_mesh = host, .timeout = timeout};
    dt__error(st, "%s", keep);
    st = dt__ckpt_sync_point(&f, "dt_save:pieces", st);
    st = dt__ckpt_save_cleanup(&f, st);
    dt_mesh_destroy(host);
    dt__group_free(&d);
    return st;
}

/* 64-bit FNV-1a of a string: which clients name the same directory. */
static uint64_t fnv1a(const char *s)
{
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h;
}

/* Whether this client prepares, indexes and commits `dir`: client 0, or for a node-local
 * save the lowest client of those naming the same directory. Collective over g when
 * node_local. */
static dt_status dir_leader(const char *fn, const dt__group *g, const char *dir, int node_local,
                            int *leader_out)
{
    *leader_out = g->rank == 0;
    if (!node_local || g->size <= 1)
        return DT_OK;
    uint64_t mine = fnv1a(dir), *all = malloc((size_t)g->size * sizeof *all);
    if (!all)
        return dt__error(DT_ERR_NO_MEMORY, "%s: no memory", fn);
    MPI_Request req = MPI_REQUEST_NULL;
    int rc = MPI_Iallgather(&mine, 1, MPI_UINT64_T, all, 1, MPI_UINT64_T, g->comm, &req);
    dt_status st = dt__ckpt_wait(g, &req, rc, "dt_save: node-local directories");
    if (st == DT_OK) {
        int r = 0;
        while (r < g->rank && all[r] != mine)
            r++;
        *leader_out = r == g->rank;
        free(all);
    }
    return st;
}

/* ---- quick node-local saves (dt_memckpt, ck_quick) ------------------------------------------ */

static _Thread_local ck_quick *quick_cur;

void dt__ckpt_quick_set(ck_quick *q)
{
    quick_cur = q;
}

static uint64_t mix(uint64_t h, const void *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        h = (h ^ ((const unsigned char *)p)[i]) * 1099511628211ull;
    return h;
}

/* What a quick save relies on being unchanged since the first: this client's tensor names and
 * pieces (names, dtypes, devices, boxes). Data addresses are not part of it. */
static uint64_t pieces_digest(int n, const char *const *names, int np, const dt_ckpt_piece *pc)
{
    uint64_t h = 1469598103934665603ull;
    h = mix(h, &n, sizeof n);
    for (int t = 0; t < n; t++)
        h = mix(h, names[t], strlen(names[t]) + 1);
    h = mix(h, &np, sizeof np);
    for (int i = 0; i < np; i++) {
        const dt_ckpt_piece *q = &pc[i];
        h = mix(h, q->name, strlen(q->name) + 1);
        h = mix(h, &q->dtype, sizeof q->dtype);
        h = mix(h, &q->rank, sizeof q->rank);
        h = mix(h, &q->device, sizeof q->device);
        h = mix(h, q->shape, (size_t)q->rank * sizeof *q->shape);
        h = mix(h, q->offsets, (size_t)q->rank * sizeof *q->offsets);
        h = mix(h, q->sizes, (size_t)q->rank * sizeof *q->sizes);
    }
    return h;
}

/* The ranks, shapes and dtypes of the named tensors. */
static uint64_t pieces_digest_in(const ck_inputs *in)
{
    uint64_t h = 1469598103934665603ull;
    for (int t = 0; t < in->n; t++) {
        h = mix(h, &in->ranks[t], sizeof in->ranks[t]);
        h = mix(h, &in->dtypes[t], sizeof in->dtypes[t]);
        h = mix(h, in->shapes[t], (size_t)in->ranks[t] * sizeof in->shapes[t][0]);
    }
    return h;
}

/* The collective start of every save, up to the temporary directory being ready on every
 * client. *job_out is NULL (and DT_OK returned) on a client holding no device of the mesh. */
static dt_status save_begin(const char *fn, const dt_mesh *mesh, const char *dir, int n,
                            const char *const *names, const dt_tensor *const *tensors,
                            const dt_save_opts *opts, const ck_publish *publish, int owned,
                            ck_save **job_out)
{
    *job_out = NULL;
    ck_save *j = calloc(1, sizeof *j);
    if (!j)
        return dt__error(DT_ERR_NO_MEMORY, "%s: no memory", fn);
    j->g.comm = MPI_COMM_NULL;
    dt_status st = dt__ckpt_norm_dir(fn, dir, j->dir, sizeof j->dir);
    if (st == DT_OK)
        st = dt__ckpt_check_opts(opts);
    if (st == DT_OK && (st = dt_mesh_check_devices(mesh)) == DT_OK &&
        (st = dt__ckpt_inputs_init(fn, mesh, n, names, tensors, &j->in)) == DT_OK)
        st = dt__ckpt_check_save_dtypes(fn, opts, &j->in);
    /* A quick save (dt_memckpt after its first save) agrees on nothing: the others go on. */
    ck_quick *q = quick_cur && opts && opts->node_local && !owned && !publish ? quick_cur : NULL;
    if (q && q->primed)
        j->quick = q;
    if (st != DT_OK) {
        int quick = j->quick != NULL;
        job_free(j);
        return quick ? st : fail_alike(mesh, opts, owned, st);
    }
    const dt__group *g = NULL;
    if (st == DT_OK)
        st = dt__mesh_group(mesh, &g);
    /* A save finished on a background thread has a communicator of its own, so that its
     * collectives never interleave with the caller's on the mesh's group. */
    if (st == DT_OK && owned)
        st = dt__group_dup(g, &j->g);
    else if (st == DT_OK)
        j->g = *g;
    if (st != DT_OK) {
        job_free(j);
        return st;
    }
    int np = opts ? opts->npieces : 0;
    if (j->g.comm == MPI_COMM_NULL) {      /* holds no device of the mesh: nothing to do */
        job_free(j);
        if (np != 0)
            return dt__error(DT_ERR_INVALID_ARGUMENT, "%s: %d pieces given by a client "
                             "holding no device of the mesh", fn, np);
        return DT_OK;
    }
    if (publish)
        j->publish = *publish;
    j->nvalues = opts ? opts->nvalues : 0;
    j->fin = (ck_finish){.plan = &j->plan, .g = &j->g, .dir = j->dir, .tmp = j->tmp,
                         .num_devices = dt_mesh_size(j->in.host), .crcs = NULL,
                         .do_fsync = opts ? opts->fsync : 1, .nvalues = j->nvalues,
                         .values = opts ? opts->values : NULL, .publish = &j->publish,
                         .barrier_mesh = j->in.host,
                         .timeout = opts ? opts->timeout_seconds : 0.0,
                         .node_local = opts ? opts->node_local : 0};
    if (j->fin.node_local && publish && publish->active)
        st = dt__error(DT_ERR_INVALID_ARGUMENT, "%s: node_local saves are not manager steps", fn);
    /* Pieces differ between clients: checked here, then gathered and checked together, so
     * that every client fails alike before anything is written. */
    j->in.user_pieces = opts ? opts->pieces : NULL;
    st = dt__ckpt_pieces_check_local(mesh, np, j->in.user_pieces);
    if (j->quick) {
        /* Every client's pieces as at the first save, once this client's are seen unchanged. */
        if (st == DT_OK && pieces_digest(n, names, np, j->in.user_pieces) != q->digest)
            st = dt__error(DT_ERR_STATE, "%s: the tensors or pieces saved differ from those of "
                           "the first in-memory save (a quick save needs the same structure)", fn);
        if (st == DT_OK && pieces_digest_in(&j->in) != q->in_digest)
            st = dt__error(DT_ERR_STATE, "%s: the tensors saved differ in rank, shape or dtype "
                           "from those of the first in-memory save", fn);
        if (st == DT_OK && !q->tmpl)
            st = dt__ckpt_pieces_clone(&q->pieces, &j->in.pieces);
        if (st != DT_OK) {
            job_free(j);
            return st;
        }
    } else {
        if ((st = dt__ckpt_sync_point(&j->fin, "dt_save:pieces", st)) != DT_OK)
            goto fail;
        st = dt__ckpt_pieces_gather(mesh, &j->g, n, names, np, j->in.user_pieces,
                                    &j->in.pieces);
        if ((st = dt__ckpt_sync_point(&j->fin, "dt_save:pieces_checked", st)) != DT_OK)
            goto fail;
        if (q) { /* the first: what the quick saves after it reuse */
            dt__ckpt_pieces_free(&q->pieces);
            q->digest = pieces_digest(n, names, np, j->in.user_pieces);
            q->in_digest = pieces_digest_in(&j->in);
            if ((st = dt__ckpt_pieces_clone(&j->in.pieces, &q->pieces)) != DT_OK)
                goto fail;
        }
    }
    size_t mlen = dt_mesh_format(j->in.host, NULL, 0) + 1;
    if (!(j->mesh_str = malloc(mlen)))
        st = dt__error(DT_ERR_NO_MEMORY, "%s: no memory", fn);
    else
        dt_mesh_format(j->in.host, j->mesh_str, mlen);
    j->fin.mesh_str = j->mesh_str;
    if (st == DT_OK && (owned || j->quick)) /* a quick save's index is written later */
        st = copy_values(j, opts);
    if (st == DT_OK)
        st = dt__ckpt_take_tensors(tensors, opts, &j->in);
    uint64_t chunk = opts && opts->chunk_bytes ? opts->chunk_bytes : DT_CKPT_CHUNK_BYTES;
    if (j->quick && q->tmpl) {
        /* The same structure: the first quick save's plan (borrowed; its names, layouts and
         * pieces stay in the template), with this save's data and CRCs. */
        j->plan = q->tmpl->plan;
    } else {
        if (st == DT_OK)
            st = dt__ckpt_plan_input(&j->in);
        if (st == DT_OK &&
            (st = dt__ckpt_plan(j->in.host, &j->in.plan_in, chunk, &j->plan)) == DT_OK)
            j->have_plan = 1;
    }
    if (st == DT_OK && (st = alloc_crcs(j)) == DT_OK) {
        j->fin.crcs = j->crcs;
        j->fin.chunk_crcs = j->chunk_crcs;
    }
    if (j->quick) {
        /* Every client of the directory makes the temporary directory if it is not there yet
         * (no client removes it: the others may be writing into it). */
        j->fin.leader = q->leader;
        if (st == DT_OK)
            st = dt__ckpt_join(j->tmp, sizeof j->tmp, j->dir, "", CK_SUFFIX_TMP);
        if (st == DT_OK && mkdir(j->tmp, 0755) != 0 && errno != EEXIST)
            st = dt__error(DT_ERR_IO, "%s: mkdir %s: %s", fn, j->tmp, strerror(errno));
        if (st != DT_OK) {
            job_free(j);
            return st;
        }
        *job_out = j;
        return DT_OK;
    }
    if (st == DT_OK)
        st = dir_leader(fn, &j->g, j->dir, j->fin.node_local, &j->fin.leader);
    if (st == DT_OK && q)
        q->leader = j->fin.leader;
    if (st == DT_OK && j->fin.leader) {
        /* A manager save over a damaged step keeps it, set aside (docs/ckpt.md). */
        if (j->publish.active)
            st = dt__ckpt_step_set_aside(j->dir, j->fin.do_fsync);
        if (st == DT_OK)
            st = dt__ckpt_prepare(j->dir, j->tmp, sizeof j->tmp);
        j->fin.made_tmp = st == DT_OK;
    } else if (st == DT_OK) {
        st = dt__ckpt_join(j->tmp, sizeof j->tmp, j->dir, "", CK_SUFFIX_TMP);
    }
    if ((st = dt__ckpt_sync_point(&j->fin, "dt_save:prepare", st)) != DT_OK)
        goto fail;
    *job_out = j;
    return DT_OK;
fail:
    st = dt__ckpt_save_cleanup(&j->fin, st);
    job_free(j);
    return st;
}

/* The staging bound of a save: the caller's, else none for host memory and the default for
 * device memory. */
static dt_status staging_bound(const char *fn, const dt_save_opts *o, int on_device,
                               uint64_t *bound_out)
{
    *bound_out = 0;
    if (o && o->staging_bytes)
        *bound_out = o->staging_bytes;
    else if (on_device)
        return dt__ckpt_device_staging(fn, bound_out);
    return DT_OK;
}

/* The writing thread of a synchronous save that stages. */
typedef struct stage_writer {
    ck_save *j;
    ck_stage *stage;
    dt_status st;
    char msg[1024];
} stage_writer;

static void *write_staged(void *arg)
{
    stage_writer *w = arg;
    ck_save *j = w->j;
    w->st = dt__ckpt_write_local_files(&j->plan, dt__ckpt_stage_source(w->stage), j->dir, &j->g,
                                       j->tmp, j->fin.do_fsync, j->crcs, j->chunk_crcs);
    if (w->st != DT_OK) {
        dt__strlcpy(w->msg, dt_last_error(), sizeof w->msg);
        dt__ckpt_stage_abort(w->stage);
    }
    return NULL;
}

/* This client's files of a synchronous save whose slices are partly in device memory: this
 * thread copies them piece by piece into the staging ring while a thread writes the pieces
 * copied before (the file write of one overlapping the device copy of the next). */
static dt_status write_through_stage(ck_save *j, const ck_slice_src *src,
                                     const dt__device_kind *kind, const dt_save_opts *opts)
{
    stage_writer w = {.j = j};
    uint64_t bound = 0;
    dt_status st = staging_bound("dt_save", opts, 1, &bound);
    if (st == DT_OK)
        st = dt__ckpt_stage_create(&j->plan, bound, kind, 1, &w.stage);
    if (st != DT_OK)
        return st;
    pthread_t th;
    if (pthread_create(&th, NULL, write_staged, &w) != 0) {
        dt__ckpt_stage_destroy(w.stage);
        return dt__error(DT_ERR_NO_MEMORY, "dt_save: cannot start the writing thread");
    }
    dt__ckpt_stage_fill(w.stage, &j->plan, src);
    pthread_join(th, NULL);
    dt__ckpt_stage_destroy(w.stage);
    return w.st == DT_OK ? DT_OK : dt__error(w.st, "%s", w.msg);
}

/* This client's files of the step are moved in from the recycled step directory, if there,
 * and written over in place: their memory pages are reused (the old step loses them, so it
 * is no longer complete). */
static void quick_recycle(ck_save *j)
{
    const ck_quick *q = j->quick;
    j->plan.overwrite = 1;
    if (!q->recycle[0])
        return;
    int me = dt_client_id();
    for (int64_t k = 0; k < j->plan.nfiles; k++) {
        if (dt_device_client(DT_DEVICE_CPU, j->plan.files[k].device_id) != me)
            continue;
        char name[64], from[CK_PATH_MAX + 72], to[CK_PATH_MAX + 72];
        dt__ckpt_file_name(name, sizeof name, k, j->plan.nfiles);
        snprintf(from, sizeof from, "%s/%s", q->recycle, name);
        snprintf(to, sizeof to, "%s/%s", j->tmp, name);
        (void)rename(from, to); /* a new file is written where there was none to take */
    }
}

/* A quick save's files are written (outcome st): its file list kept for the buddy copy, the
 * tensors released, the CRC gather posted; the index and commit are left to
 * dt__ckpt_quick_complete. Frees the job on failure. */
static dt_status quick_post(ck_save *j, dt_status st)
{
    ck_quick *q = j->quick;
    for (int t = 0; j->in.tensors && t < j->in.n; t++) {
        dt_tensor_destroy(j->in.tensors[t]);
        j->in.tensors[t] = NULL;
    }
    j->in.user_pieces = NULL;
    ck_local_file *v = NULL;
    if (st == DT_OK && !(v = calloc((size_t)j->plan.nfiles + 1, sizeof *v)))
        st = dt__error(DT_ERR_NO_MEMORY, "dt_save: no memory");
    for (int64_t k = 0; st == DT_OK && k < j->plan.nfiles; k++) {
        const ck_plan_file *pf = &j->plan.files[k];
        dt__ckpt_file_name(v[k].name, sizeof v[k].name, k, j->plan.nfiles);
        v[k].bytes = pf->header_bytes + pf->data_bytes;
        v[k].client = dt_device_client(DT_DEVICE_CPU, pf->device_id);
    }
    if (st == DT_OK)
        st = dt__ckpt_crcs_post(&j->plan, q->g, 1, j->crcs, j->chunk_crcs, &q->cg);
    if (st != DT_OK) {
        free(v);
        job_free(j);
        return st;
    }
    free(q->files);
    q->files = v;
    q->nfiles = j->plan.nfiles;
    dt__strlcpy(q->tmp, j->tmp, sizeof q->tmp);
    q->pending = j;
    return DT_OK;
}

static void *quick_commit(void *arg)
{
    ck_quick *q = arg;
    dt_status st = dt__ckpt_index_commit(&q->commit_job->fin);
    if (st != DT_OK)
        dt__strlcpy(q->commit_msg, dt_last_error(), sizeof q->commit_msg);
    else if (q->after_commit)
        q->after_commit(q->after_arg);
    q->commit_status = st;
    atomic_store(&q->committed, 1);
    return NULL;
}

/* A finished quick save: kept as the template when it has the first plan, else freed. */
static void quick_retire(ck_quick *q, ck_save *j, dt_status st)
{
    if (!q->tmpl && j->have_plan && st == DT_OK)
        q->tmpl = j;
    else
        job_free(j);
}

/* Joins the committing thread (its outcome returned). */
static dt_status quick_join(ck_quick *q)
{
    pthread_join(q->thread, NULL);
    q->committing = 0;
    dt_status st = q->commit_status;
    if (st != DT_OK)
        dt__error(st, "%s", q->commit_msg);
    quick_retire(q, q->commit_job, st);
    q->commit_job = NULL;
    return st;
}

dt_status dt__ckpt_quick_complete(ck_quick *q, int mode, int *done_out)
{
    dt_status st = DT_OK;
    /* The commit before: finished, or waited for. */
    if (q->committing && (mode == 2 || atomic_load(&q->committed)))
        st = quick_join(q);
    ck_save *j = q->pending;
    int gathered = 1;
    if (st == DT_OK && j && q->cg.req != MPI_REQUEST_NULL) {
        if (mode >= 1)
            st = dt__ckpt_wait(q->g, &q->cg.req, MPI_SUCCESS, "dt_memckpt: gathering CRCs");
        else if (MPI_Test(&q->cg.req, &gathered, MPI_STATUS_IGNORE) != MPI_SUCCESS)
            st = dt__error(DT_ERR_COMM, "dt_memckpt: gathering CRCs failed");
    }
    if (st == DT_OK && j && gathered) {
        st = dt__ckpt_crcs_unpack(&j->plan, q->g, &q->cg, j->crcs, j->chunk_crcs);
        dt__ckpt_crcs_free(&q->cg);
        q->pending = NULL;
        if (st == DT_OK && j->fin.leader && q->committing)
            st = quick_join(q); /* one commit at a time, in step order */
        if (st == DT_OK && j->fin.leader) {
            q->commit_job = j;
            atomic_store(&q->committed, 0);
            if (pthread_create(&q->thread, NULL, quick_commit, q) == 0) {
                q->committing = 1;
            } else { /* here, then */
                quick_commit(q);
                if ((st = q->commit_status) != DT_OK)
                    dt__error(st, "%s", q->commit_msg);
                q->commit_job = NULL;
                quick_retire(q, j, st);
            }
            if (st == DT_OK && q->committing && mode == 2)
                st = quick_join(q);
        } else {
            quick_retire(q, j, st);
        }
    } else if (st != DT_OK && j) {
        if (st == DT_ERR_TIMEOUT)
            q->cg.send = q->cg.recv = NULL; /* still pending: MPI may write into them */
        dt__ckpt_crcs_free(&q->cg);
        job_free(j);
        q->pending = NULL;
    }
    if (done_out)
        *done_out = !q->pending && !q->committing;
    return st;
}

void dt__ckpt_quick_free(ck_quick *q)
{
    if (!q)
        return;
    if (q->committing)
        (void)quick_join(q);
    if (q->pending) {
        if (q->cg.req != MPI_REQUEST_NULL) { /* left to MPI, with its buffers */
            q->cg.send = q->cg.recv = NULL;
        }
        dt__ckpt_crcs_free(&q->cg);
        job_free(q->pending);
        q->pending = NULL;
    }
    job_free(q->tmpl);
    q->tmpl = NULL;
    dt__ckpt_pieces_free(&q->pieces);
    free(q->files);
    q->files = NULL;
    q->primed = 0;
}

/* The rest of a synchronous save: this client's files written from the tensors (directly
 * from memory host code may touch, else through staging), then the end (finish.c). Frees
 * the job. */
static dt_status save_here(ck_save *j, const dt_save_opts *opts)
{
    ck_slice_src *src = NULL;
    const dt__device_kind *kind = NULL;
    if (j->quick)
        quick_recycle(j);
    dt_status st = dt__ckpt_slice_data(&j->plan, &j->in, &src);
    if (st == DT_OK && dt__ckpt_slices_on_device(&j->plan, src, &kind)) {
        st = write_through_stage(j, src, kind, opts);
    } else if (st == DT_OK) {
        ck_source direct = dt__ckpt_direct_source(src);
        /* A quick save's few small files in memory: written here, one after the other (a
         * thread per file costs more than it saves, its join polled every 2 ms). */
        if (j->quick)
            direct.parallel = 0;
        st = dt__ckpt_write_local_files(&j->plan, &direct, j->dir, &j->g, j->tmp,
                                        j->fin.do_fsync, j->crcs, j->chunk_crcs);
    }
    free(src);
    if (j->quick)
        return quick_post(j, st);
    st = dt__ckpt_save_finish(&j->fin, st);
    job_free(j);
    return st;
}

/* ---- asynchronous saves ---------------------------------------------------------------------- */

static pthread_mutex_t inflight_mu = PTHREAD_MUTEX_INITIALIZER;
static dt_save_request *inflight;  /* the save whose thread may still run (not joined) */

/* Joins the thread of the save in flight, if any: a new save starts only after the previous
 * one committed (its outcome stays in its request for dt_save_wait). */
static void drain_inflight(void)
{
    pthread_mutex_lock(&inflight_mu);
    dt_save_request *r = inflight;
    inflight = NULL;
    if (r && !r->joined) {
        pthread_join(r->thread, NULL);
        r->joined = 1;
    }
    pthread_mutex_unlock(&inflight_mu);
}

/* dt_finalize runs hooks newest first: this one (registered after the reaper's) first joins
 * the save in flight, then waits for the closes it may have handed to the reaper. */
static void at_finalize(void)
{
    drain_inflight();
    dt__ckpt_reap_wait();
}

/* The background thread: writes from the staging queue, then finishes (no timed barriers:
 * dt_barrier shares the runtime's communicator with the caller's thread). */
static void *save_background(void *arg)
{
    dt_save_request *r = arg;
    ck_save *j = r->job;
    ck_source *src = dt__ckpt_stage_source(r->stage);
    dt_status st = dt__ckpt_write_local_files(&j->plan, src, j->dir, &j->g, j->tmp,
                                              j->fin.do_fsync, j->crcs, j->chunk_crcs);
    if (st != DT_OK)
        dt__ckpt_stage_abort(r->stage);   /* the caller stops copying */
    j->fin.barrier_mesh = NULL;
    st = dt__ckpt_save_finish(&j->fin, st);
    r->status = st;
    if (st != DT_OK)
        dt__strlcpy(r->msg, dt_last_error(), sizeof r->msg);
    atomic_store(&r->done, 1);
    return NULL;
}

static dt_status save_async(const char *fn, const dt_mesh *mesh, const char *dir, int n,
                            const char *const *names, const dt_tensor *const *tensors,
                            const dt_save_opts *opts, const ck_publish *publish,
                            dt_save_request **req_out)
{
    if (!req_out)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "%s: NULL request output", fn);
    /* Hooks registered here, in the caller's thread (the background thread retires the
     * replaced checkpoint, whose closes dt_finalize waits for; stage.c frees its buffer). */
    dt_status st = dt__ckpt_reap_register();
    if (st == DT_OK)
        st = dt__at_finalize(at_finalize);
    if (st != DT_OK)
        return st;
    drain_inflight();
    dt_save_request *r = calloc(1, sizeof *r);
    if (!r)
        return dt__error(DT_ERR_NO_MEMORY, "%s: no memory", fn);
    r->joined = 1;
    /* Without MPI_THREAD_MULTIPLE the background thread could not agree with the other
     * clients: the save then runs to its end here, and the request is done at once. */
    int background = dt__mpi_thread_level() >= MPI_THREAD_MULTIPLE;
    ck_save *j = NULL;
    st = save_begin(fn, mesh, dir, n, names, tensors, opts, publish, background, &j);
    if (st != DT_OK) {
        free(r);
        return st;
    }
    if (j && !background) {
        r->status = save_here(j, opts);
        j = NULL;
        if (r->status != DT_OK)
            dt__strlcpy(r->msg, dt_last_error(), sizeof r->msg);
    }
    if (!j) {
        atomic_store(&r->done, 1);
        *req_out = r;
        return DT_OK;
    }
    r->job = j;
    ck_slice_src *src = NULL;
    const dt__device_kind *kind = NULL;
    st = dt__ckpt_slice_data(&j->plan, &j->in, &src);
    uint64_t bound = 0;
    if (st == DT_OK)
        st = staging_bound(fn, opts, dt__ckpt_slices_on_device(&j->plan, src, &kind), &bound);
    if (st == DT_OK)
        st = dt__ckpt_stage_create(&j->plan, bound, kind, 0, &r->stage);
    if (st == DT_OK && pthread_create(&r->thread, NULL, save_background, r) != 0)
        st = dt__error(DT_ERR_NO_MEMORY, "%s: cannot start the writing thread", fn);
    if (st != DT_OK) {
        /* Nothing written yet: every client must still fail alike (agreeing as the others'
         * background threads do, without timed barriers). */
        free(src);
        j->fin.barrier_mesh = NULL;
        st = dt__ckpt_save_finish(&j->fin, st);
        dt__ckpt_stage_destroy(r->stage);
        job_free(j);
        free(r);
        return st;
    }
    r->joined = 0;
    pthread_mutex_lock(&inflight_mu);
    inflight = r;
    pthread_mutex_unlock(&inflight_mu);
    /* The copy the caller waits for; a failure here reaches the writer, which fails the save
     * on every client (reported by dt_save_wait). */
    dt__ckpt_stage_fill(r->stage, &j->plan, src);
    free(src);
    /* The caller's tensors and pieces are no longer read. */
    for (int t = 0; j->in.tensors && t < j->in.n; t++) {
        dt_tensor_destroy(j->in.tensors[t]);
        j->in.tensors[t] = NULL;
    }
    j->in.user_pieces = NULL;
    *req_out = r;
    return DT_OK;
}

dt_status dt_save_wait(dt_save_request *req)
{
    if (!req)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "dt_save_wait: NULL request");
    pthread_mutex_lock(&inflight_mu);
    if (!req->joined) {
        pthread_join(req->thread, NULL);
        req->joined = 1;
    }
    if (inflight == req)
        inflight = NULL;
    pthread_mutex_unlock(&inflight_mu);
    dt_status st = req->status;
    if (st != DT_OK)
        dt__error(st, "%s", req->msg);
    dt__ckpt_stage_destroy(req->stage);
    job_free(req->job);
    free(req);
    return st;
}

dt_status dt_save_test(const dt_save_request *req, int *done_out)
{
    if (!req || !done_out)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "dt_save_test: NULL argument");
    *done_out = atomic_load(&req->done);
    return DT_OK;
}

/* ---- the entry points ---------------------------------------------------------------------- */

dt_status dt_save(const dt_mesh *mesh, const char *dir, int n, const char *const *names,
                  const dt_tensor *const *tensors, const dt_save_opts *opts)
{
    drain_inflight();
    ck_save *j = NULL;
    dt_status st = save_begin("dt_save", mesh, dir, n, names, tensors, opts, NULL, 0, &j);
    return st != DT_OK || !j ? st : save_here(j, opts);
}

dt_status dt_save_async(const dt_mesh *mesh, const char *dir, int n, const char *const *names,
                        const dt_tensor *const *tensors, const dt_save_opts *opts,
                        dt_save_request **req_out)
{
    return save_async("dt_save_async", mesh, dir, n, names, tensors, opts, NULL, req_out);
}

/* The publish step of ROOT/step-N with keep (checked). */
static dt_status step_publish(const char *fn, const char *root, int64_t step,
                              const dt_ckpt_keep *keep, ck_publish *p, char *dir, size_t len)
{
    dt_ckpt_keep k = DT_CKPT_KEEP_INIT;
    if (keep)
        k = *keep;
    dt_status st = dt__ckpt_check_keep(fn, &k);
    if (st == DT_OK)
        st = dt_ckpt_step_dir(root, step, dir, len);
    if (st == DT_OK)
        st = dt__ckpt_norm_dir(fn, root, p->root, sizeof p->root);
    p->active = 1;
    p->step = step;
    p->keep = k;
    return st;
}

dt_status dt_save_step(const dt_mesh *mesh, const char *root, int64_t step,
                       const dt_ckpt_keep *keep, int n, const char *const *names,
                       const dt_tensor *const *tensors, const dt_save_opts *opts)
{
    ck_publish p;
    char dir[CK_PATH_MAX];
    dt_status st = step_publish("dt_save_step", root, step, keep, &p, dir, sizeof dir);
    if (st != DT_OK) /* this client's root or step */
        return fail_alike(mesh, opts, 0, st);
    drain_inflight();
    ck_save *j = NULL;
    st = save_begin("dt_save_step", mesh, dir, n, names, tensors, opts, &p, 0, &j);
    return st != DT_OK || !j ? st : save_here(j, opts);
}

dt_status dt_save_step_async(const dt_mesh *mesh, const char *root, int64_t step,
                             const dt_ckpt_keep *keep, int n, const char *const *names,
                             const dt_tensor *const *tensors, const dt_save_opts *opts,
                             dt_save_request **req_out)
{
    ck_publish p;
    char dir[CK_PATH_MAX];
    dt_status st = step_publish("dt_save_step_async", root, step, keep, &p, dir, sizeof dir);
    if (st != DT_OK)
        return st;
    return save_async("dt_save_step_async", mesh, dir, n, names, tensors, opts, &p, req_out);
}
