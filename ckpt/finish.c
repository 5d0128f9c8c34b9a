/* The end of a save, after every client wrote its files: the CRCs gathered on client 0, which
 * writes the index, commits (commit.c) and, for the manager, publishes the step; every client
 * agrees on the outcome, and a failed save is cleaned up (docs/ckpt-format.md). Runs in the
 * caller (dt_save) or in the background thread of an asynchronous save. */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ckpt/ckpt_impl.h"
#include "runtime/error.h"
#include "runtime/group.h"
#include "runtime/util.h"
#include "runtime/trace.h"

/* The CRCs of this client's slices, in plan order (what Gatherv sends). */
static int64_t crc_words(const ck_plan *plan, int64_t si)
{
    return 1 + plan->slices[si].nchunks;
}

/* Posts the gather of every slice's CRCs (to client 0, or to every client when to_all). */
dt_status dt__ckpt_crcs_post(const ck_plan *plan, const dt__group *g, int to_all,
                             const uint32_t *crcs, uint32_t *const *chunk_crcs,
                             ck_crc_gather *cg)
{
    memset(cg, 0, sizeof *cg);
    cg->req = MPI_REQUEST_NULL;
    cg->to_all = to_all;
    if (g->size <= 1)
        return DT_OK;
    cg->counts = calloc((size_t)g->size, sizeof *cg->counts);
    cg->displs = calloc((size_t)g->size, sizeof *cg->displs);
    cg->rank_of_slice = malloc((size_t)(plan->nslices + 1) * sizeof *cg->rank_of_slice);
    if (!cg->counts || !cg->displs || !cg->rank_of_slice)
        goto no_memory;
    int64_t total = 0;
    for (int64_t si = 0; si < plan->nslices; si++) {
        int dev = plan->files[plan->file_of_position[plan->slices[si].position]].device_id;
        int c = dt_device_client(DT_DEVICE_CPU, dev), r = 0;
        while (r < g->size && g->clients[r] != c)
            r++;
        cg->rank_of_slice[si] = r;
        cg->counts[r] += (int)crc_words(plan, si);
        total += crc_words(plan, si);
    }
    for (int r = 1; r < g->size; r++)
        cg->displs[r] = cg->displs[r - 1] + cg->counts[r - 1];
    cg->send = malloc(((size_t)cg->counts[g->rank] + 1) * sizeof *cg->send);
    int gets = g->rank == 0 || to_all;
    cg->recv = gets ? malloc(((size_t)total + 1) * sizeof *cg->recv) : NULL;
    if (!cg->send || (gets && !cg->recv))
        goto no_memory;
    int64_t k = 0;
    for (int64_t si = 0; si < plan->nslices; si++)
        if (cg->rank_of_slice[si] == g->rank) {
            cg->send[k++] = crcs[si];
            for (int64_t c = 0; c < plan->slices[si].nchunks; c++)
                cg->send[k++] = chunk_crcs[si][c];
        }
    /* Node-local saves: every directory's leader writes the whole index. */
    cg->rc = to_all ? MPI_Iallgatherv(cg->send, cg->counts[g->rank], MPI_UINT32_T, cg->recv,
                                      cg->counts, cg->displs, MPI_UINT32_T, g->comm, &cg->req)
                    : MPI_Igatherv(cg->send, cg->counts[g->rank], MPI_UINT32_T, cg->recv,
                                   cg->counts, cg->displs, MPI_UINT32_T, 0, g->comm, &cg->req);
    if (cg->rc != MPI_SUCCESS)
        return dt__error(DT_ERR_COMM, "dt_save: gathering CRCs: MPI error %d", cg->rc);
    return DT_OK;
no_memory:
    dt__ckpt_crcs_free(cg);
    return dt__error(DT_ERR_NO_MEMORY, "dt_save: no memory for CRCs");
}

dt_status dt__ckpt_crcs_unpack(const ck_plan *plan, const dt__group *g,
                               const ck_crc_gather *cg, uint32_t *crcs, uint32_t **chunk_crcs)
{
    if (g->size <= 1 || !cg->recv)
        return DT_OK;
    int64_t *pos = calloc((size_t)g->size, sizeof *pos);
    if (!pos)
        return dt__error(DT_ERR_NO_MEMORY, "dt_save: no memory for CRCs");
    for (int64_t si = 0; si < plan->nslices; si++) {
        int64_t r = cg->rank_of_slice[si];
        const uint32_t *p = cg->recv + cg->displs[r] + pos[r];
        crcs[si] = p[0];
        for (int64_t c = 0; c < plan->slices[si].nchunks; c++)
            chunk_crcs[si][c] = p[1 + c];
        pos[r] += crc_words(plan, si);
    }
    free(pos);
    return DT_OK;
}

void dt__ckpt_crcs_free(ck_crc_gather *cg)
{
    free(cg->counts);
    free(cg->displs);
    free(cg->rank_of_slice);
    free(cg->send);
    free(cg->recv);
    cg->counts = cg->displs = NULL;
    cg->rank_of_slice = NULL;
    cg->send = cg->recv = NULL;
}

static dt_status gather_crcs(const ck_plan *plan, const dt__group *g, int to_all,
                             uint32_t *crcs, uint32_t **chunk_crcs)
{
    ck_crc_gather cg;
    dt_status st = dt__ckpt_crcs_post(plan, g, to_all, crcs, chunk_crcs, &cg);
    if (st != DT_OK || g->size <= 1)
        return st;
    if ((st = dt__ckpt_wait(g, &cg.req, cg.rc, "dt_save: gathering CRCs")) != DT_OK) {
        if (st == DT_ERR_TIMEOUT)
            cg.send = cg.recv = NULL; /* still pending: MPI may write into them; left allocated */
        dt__ckpt_crcs_free(&cg);
        return st;
    }
    if (g->rank == 0 || to_all)
        st = dt__ckpt_crcs_unpack(plan, g, &cg, crcs, chunk_crcs);
    dt__ckpt_crcs_free(&cg);
    return st;
}

/* Client 0: the index into tmp, then the renames, then the manager's pointer and pruning. */
dt_status dt__ckpt_index_commit(const ck_finish *f)
{
    char *text = NULL, path[CK_PATH_MAX];
    dt_status st = dt__ckpt_index_text(f->plan, f->mesh_str, f->num_devices, f->crcs,
                                       (const uint32_t *const *)f->chunk_crcs, f->nvalues,
                                       f->values, &text);
    if (st != DT_OK)
        return st;
    if ((st = dt__ckpt_join(path, sizeof path, f->tmp, "/", DT_CKPT_INDEX_NAME)) != DT_OK) {
        free(text);
        return st;
    }
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    size_t len = strlen(text);
    if (fd < 0 || dt__ckpt_pwrite(fd, text, len, 0) != 0 || (f->do_fsync && fsync(fd) != 0)) {
        st = dt__error(DT_ERR_IO, "dt_save: %s: %s", path, strerror(errno));
        if (fd >= 0)
            close(fd);
        free(text);
        return st;
    }
    free(text);
    if (close(fd) != 0)
        return dt__error(DT_ERR_IO, "dt_save: %s: %s", path, strerror(errno));
    if (f->do_fsync && (st = dt__ckpt_fsync_dir(f->tmp)) != DT_OK)
        return st;
    if ((st = dt__ckpt_commit(f->dir, f->tmp, f->do_fsync)) != DT_OK)
        return st;
    if (f->publish && f->publish->active)
        st = dt__ckpt_step_publish(f->publish->root, f->publish->step, &f->publish->keep,
                                   f->do_fsync);
    return st;
}

/* The last node-local save's files (dt__ckpt_last_local_files). */
static pthread_mutex_t local_mu = PTHREAD_MUTEX_INITIALIZER;
static ck_local_file *local_files;
static int64_t local_n;
static uint64_t local_serial;

void dt__ckpt_record_local_files(const ck_plan *plan)
{
    ck_local_file *v = calloc((size_t)plan->nfiles + 1, sizeof *v);
    if (!v)
        return; /* the caller then reads the index */
    for (int64_t k = 0; k < plan->nfiles; k++) {
        const ck_plan_file *pf = &plan->files[k];
        dt__ckpt_file_name(v[k].name, sizeof v[k].name, k, plan->nfiles);
        v[k].bytes = pf->header_bytes + pf->data_bytes;
        v[k].client = dt_device_client(DT_DEVICE_CPU, pf->device_id);
    }
    pthread_mutex_lock(&local_mu);
    free(local_files);
    local_files = v;
    local_n = plan->nfiles;
    local_serial++;
    pthread_mutex_unlock(&local_mu);
}

uint64_t dt__ckpt_local_serial(void)
{
    pthread_mutex_lock(&local_mu);
    uint64_t s = local_serial;
    pthread_mutex_unlock(&local_mu);
    return s;
}

dt_status dt__ckpt_last_local_files(ck_local_file **files_out, int64_t *n_out,
                                    uint64_t *serial_out)
{
    pthread_mutex_lock(&local_mu);
    ck_local_file *v = malloc(((size_t)local_n + 1) * sizeof *v);
    if (v && local_n)
        memcpy(v, local_files, (size_t)local_n * sizeof *v);
    int64_t n = local_n;
    uint64_t s = local_serial;
    pthread_mutex_unlock(&local_mu);
    if (!v)
        return dt__error(DT_ERR_NO_MEMORY, "dt_save: no memory");
    *files_out = v;
    *n_out = n;
    *serial_out = s;
    return DT_OK;
}

dt_status dt__ckpt_sync_point(const ck_finish *f, const char *name, dt_status st)
{
    if (f->barrier_mesh && f->timeout > 0) {
        dt_status bs = dt_barrier(f->barrier_mesh, name, f->timeout);
        if (bs != DT_OK)
            return bs;
    }
    char call[40];                        /* the flight recorder's checkpoint phase */
    snprintf(call, sizeof call, "ckpt %s", name);
    long tk = f->g->comm != MPI_COMM_NULL ? dt__coll_record(f->g->clients, f->g->size, call, "") : -1;
    st = dt__ckpt_agree(f->g, st);
    dt__coll_end(tk, "mpi", st);
    return st;
}

dt_status dt__ckpt_save_cleanup(const ck_finish *f, dt_status st)
{
    char keep[1024];
    dt__strlcpy(keep, dt_last_error(), sizeof keep);
    if (f->made_tmp)
        dt__ckpt_remove_dir(f->tmp);
    /* Every client knows of the failure (agreed): return together, after the cleanup. */
    if (st != DT_ERR_TIMEOUT && st != DT_ERR_COMM) {
        MPI_Request req = MPI_REQUEST_NULL;
        (void)dt__ckpt_wait(f->g, &req, MPI_Ibarrier(f->g->comm, &req), "dt_save: cleanup");
    }
    return dt__error(st, "%s", keep);
}

dt_status dt__ckpt_save_finish(ck_finish *f, dt_status st)
{
    if ((st = dt__ckpt_sync_point(f, "dt_save:written", st)) != DT_OK)
        return dt__ckpt_save_cleanup(f, st);
    st = gather_crcs(f->plan, f->g, f->node_local, f->crcs, f->chunk_crcs);
    if (st == DT_OK && f->leader) {
        st = dt__ckpt_index_commit(f);
        /* Once committed, tmp is gone (renamed); a failed publish leaves the step in place. */
        f->made_tmp = f->made_tmp && st != DT_OK;
    }
    if ((st = dt__ckpt_sync_point(f, "dt_save:commit", st)) != DT_OK)
        return dt__ckpt_save_cleanup(f, st);
    if (f->node_local)
        dt__ckpt_record_local_files(f->plan);
    return DT_OK;
}
