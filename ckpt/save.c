/* dt_save and dt_sharded_prefix: checks the inputs (and gathers the pieces), brings tensors to
 * the host mesh without partial dims, has each client write its devices' files (write.c),
 * gathers the CRCs on client 0, which writes the index and commits (docs/ckpt-format.md). */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ckpt/ckpt_impl.h"

/* What a save works on: host-mesh, non-partial layouts (and tensors, for dt_save). */
typedef struct save_inputs {
    int n;
    dt_mesh *host;
    dt_layout **layouts;
    dt_tensor **tensors;          /* NULL for dt_sharded_prefix */
    const int64_t **shapes;
    dt_dtype *dtypes;
    int *ranks;
    /* dt_save's pieces: this client's (the data), every client's (gathered), and the plan's
     * view of all tensors (the n above, then the pieces' tensors). */
    const dt_ckpt_piece *user_pieces;
    ck_pieces pieces;
    ck_plan_input plan_in;
} save_inputs;

static void inputs_free(save_inputs *in)
{
    for (int t = 0; t < in->n; t++) {
        if (in->layouts)
            dt_layout_destroy(in->layouts[t]);
        if (in->tensors)
            dt_tensor_destroy(in->tensors[t]);
    }
    free(in->layouts);
    free(in->tensors);
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
static dt_status plan_input(const char *const *names, save_inputs *in)
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
        nm[t] = names[t];
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
static dt_status inputs_init(const char *fn, const dt_mesh *mesh, int n, const char *const *names,
                             const dt_tensor *const *tensors, save_inputs *in)
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
    in->layouts = calloc((size_t)n + 1, sizeof *in->layouts);
    in->shapes = calloc((size_t)n + 1, sizeof *in->shapes);
    in->dtypes = calloc((size_t)n + 1, sizeof *in->dtypes);
    in->ranks = calloc((size_t)n + 1, sizeof *in->ranks);
    if (!in->layouts || !in->shapes || !in->dtypes || !in->ranks) {
        inputs_free(in);
        return dt__error(DT_ERR_NO_MEMORY, "%s: no memory", fn);
    }
    if ((st = dt_mesh_host_mesh(mesh, &in->host)) != DT_OK) {
        inputs_free(in);
        return st;
    }
    for (int t = 0; t < n; t++) {
        const dt_layout *l = dt_tensor_layout(tensors[t]);
        const char *specs[DT_MAX_RANK];
        int rank = dt_layout_rank(l);
        for (int d = 0; d < rank; d++)
            specs[d] = dt_layout_spec(l, d);
        if ((st = dt_layout_create(in->host, rank, specs, &in->layouts[t])) != DT_OK) {
            inputs_free(in);
            return st;
        }
        in->shapes[t] = dt_tensor_shape(tensors[t]);
        in->dtypes[t] = dt_tensor_dtype(tensors[t]);
        in->ranks[t] = rank;
    }
    return DT_OK;
}

static uint64_t chunk_of(const dt_save_opts *o)
{
    return o && o->chunk_bytes ? o->chunk_bytes : DT_CKPT_CHUNK_BYTES;
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
    save_inputs in;
    if (st != DT_OK || (st = inputs_init(fn, mesh, n, names, tensors, &in)) != DT_OK)
        return st;
    ck_plan plan;
    if ((st = plan_input(names, &in)) == DT_OK)
        st = dt__ckpt_plan(in.host, &in.plan_in, DT_CKPT_CHUNK_BYTES, &plan);
    if (st != DT_OK) {
        inputs_free(&in);
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
    inputs_free(&in);
    if (!sh)
        return dt__error(DT_ERR_NO_MEMORY, "%s: no memory", fn);
    *shards_out = sh;
    *count_out = count;
    return DT_OK;
}

/* Local component of host tensor t at mesh position p. */
static const DLTensor *component_at(const dt_tensor *t, int64_t p)
{
    for (int i = 0; i < dt_tensor_num_local(t); i++)
        if (dt_tensor_local_position(t, i) == p)
            return dt_tensor_local(t, i);
    return NULL;
}

/* The host bytes of every plan slice this client writes (NULL for the others'), as
 * dt__ckpt_write_local_files takes them: a layout's block from the host tensor's local
 * component at its position, a piece from the caller's dt_save_opts.pieces. */
static dt_status slice_data(const ck_plan *plan, const save_inputs *in, const void ***data_out)
{
    const void **data = calloc((size_t)plan->nslices + 1, sizeof *data);
    if (!data)
        return dt__error(DT_ERR_NO_MEMORY, "dt_save: no memory");
    int me = dt_client_id();
    for (int64_t si = 0; si < plan->nslices; si++) {
        const ck_plan_slice *s = &plan->slices[si];
        int64_t f = plan->file_of_position[s->position];
        if (dt_device_client(DT_DEVICE_CPU, plan->files[f].device_id) != me)
            continue;
        if (s->piece >= 0) {
            data[si] = in->user_pieces[plan->pieces[s->piece].local].data;
        } else {
            const DLTensor *x = component_at(in->tensors[s->tensor], s->position);
            data[si] = x ? x->data : NULL;
        }
    }
    *data_out = data;
    return DT_OK;
}

/* ---- the collective save -------------------------------------------------------------------- */

static dt_status check_opts(const dt_save_opts *o)
{
    if (!o)
        return DT_OK;
    if (o->chunk_bytes && (o->chunk_bytes % 4096 || o->chunk_bytes > ((uint64_t)1 << 30)))
        return dt__error(DT_ERR_INVALID_ARGUMENT,
                         "dt_save: chunk_bytes %llu is not a multiple of 4096 (or above 1 GiB)",
                         (unsigned long long)o->chunk_bytes);
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

/* Brings every tensor to the host mesh without partial dims (collective): partial tensors are
 * reduced on their own mesh first, GPU tensors then copied to the host mesh. */
static dt_status to_host(const dt_tensor *const *tensors, save_inputs *in)
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
        if (st == DT_OK && dt_mesh_device_type(dt_layout_mesh(l)) != DT_DEVICE_CPU) {
            st = dt_copy_to_mesh(reduced, in->layouts[t], &in->tensors[t]);
            dt_tensor_destroy(reduced);
        } else if (st == DT_OK) {
            in->tensors[t] = reduced;
        }
        if (st != DT_OK)
            return st;
    }
    return DT_OK;
}

/* The CRCs of this client's slices, in plan order (what Gatherv sends). */
static int64_t crc_words(const ck_plan *plan, int64_t si)
{
    return 1 + plan->slices[si].nchunks;
}

static dt_status gather_crcs(const ck_plan *plan, const ck_group *g, uint32_t *crcs,
                             uint32_t **chunk_crcs)
{
    if (g->size <= 1)
        return DT_OK;
    int *counts = calloc((size_t)g->size, sizeof *counts);
    int *displs = calloc((size_t)g->size, sizeof *displs);
    int64_t *rank_of_slice = malloc((size_t)(plan->nslices + 1) * sizeof *rank_of_slice);
    uint32_t *send = NULL, *recv = NULL;
    dt_status st = DT_ERR_NO_MEMORY;
    if (!counts || !displs || !rank_of_slice)
        goto out;
    int64_t total = 0;
    for (int64_t si = 0; si < plan->nslices; si++) {
        int dev = plan->files[plan->file_of_position[plan->slices[si].position]].device_id;
        int c = dt_device_client(DT_DEVICE_CPU, dev), r = 0;
        while (r < g->size && g->clients[r] != c)
            r++;
        rank_of_slice[si] = r;
        counts[r] += (int)crc_words(plan, si);
        total += crc_words(plan, si);
    }
    for (int r = 1; r < g->size; r++)
        displs[r] = displs[r - 1] + counts[r - 1];
    send = malloc(((size_t)counts[g->rank] + 1) * sizeof *send);
    recv = g->rank == 0 ? malloc(((size_t)total + 1) * sizeof *recv) : NULL;
    if (!send || (g->rank == 0 && !recv))
        goto out;
    int64_t k = 0;
    for (int64_t si = 0; si < plan->nslices; si++)
        if (rank_of_slice[si] == g->rank) {
            send[k++] = crcs[si];
            for (int64_t c = 0; c < plan->slices[si].nchunks; c++)
                send[k++] = chunk_crcs[si][c];
        }
    int rc = MPI_Gatherv(send, counts[g->rank], MPI_UINT32_T, recv, counts, displs,
                         MPI_UINT32_T, 0, g->comm);
    if (rc != MPI_SUCCESS) {
        st = dt__mpi_error(rc, "dt_save: gathering CRCs");
        goto out;
    }
    if (g->rank == 0) {
        int64_t *pos = calloc((size_t)g->size, sizeof *pos);
        if (!pos)
            goto out;
        for (int64_t si = 0; si < plan->nslices; si++) {
            int64_t r = rank_of_slice[si];
            const uint32_t *p = recv + displs[r] + pos[r];
            crcs[si] = p[0];
            for (int64_t c = 0; c < plan->slices[si].nchunks; c++)
                chunk_crcs[si][c] = p[1 + c];
            pos[r] += crc_words(plan, si);
        }
        free(pos);
    }
    st = DT_OK;
out:
    if (st == DT_ERR_NO_MEMORY)
        dt__error(st, "dt_save: no memory for CRCs");
    free(counts);
    free(displs);
    free(rank_of_slice);
    free(send);
    free(recv);
    return st;
}

/* Client 0: the index into tmp, then the renames. */
static dt_status write_index_and_commit(const ck_plan *plan, const save_inputs *in,
                                        const char *dir, const char *tmp,
                                        const dt_save_opts *o, const uint32_t *crcs,
                                        uint32_t *const *chunk_crcs)
{
    size_t mlen = dt_mesh_format(in->host, NULL, 0) + 1;
    char *ms = malloc(mlen), *text = NULL, path[CK_PATH_MAX];
    if (!ms)
        return dt__error(DT_ERR_NO_MEMORY, "dt_save: no memory");
    dt_mesh_format(in->host, ms, mlen);
    dt_status st = dt__ckpt_index_text(plan, ms, dt_mesh_size(in->host), crcs,
                                       (const uint32_t *const *)chunk_crcs,
                                       o ? o->nvalues : 0, o ? o->values : NULL, &text);
    free(ms);
    if (st != DT_OK)
        return st;
    int do_fsync = o ? o->fsync : 1;
    if ((st = dt__ckpt_join(path, sizeof path, tmp, "/", DT_CKPT_INDEX_NAME)) != DT_OK) {
        free(text);
        return st;
    }
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    size_t len = strlen(text);
    if (fd < 0 || dt__ckpt_pwrite(fd, text, len, 0) != 0 || (do_fsync && fsync(fd) != 0)) {
        st = dt__error(DT_ERR_IO, "dt_save: %s: %s", path, strerror(errno));
        if (fd >= 0)
            close(fd);
        free(text);
        return st;
    }
    free(text);
    if (close(fd) != 0)
        return dt__error(DT_ERR_IO, "dt_save: %s: %s", path, strerror(errno));
    if (do_fsync && (st = dt__ckpt_fsync_dir(tmp)) != DT_OK)
        return st;
    return dt__ckpt_commit(dir, tmp, do_fsync);
}

/* A barrier with the caller's timeout (when set), then agreement on the outcome. */
static dt_status sync_point(const save_inputs *in, const ck_group *g, const dt_save_opts *o,
                            const char *name, dt_status st)
{
    if (o && o->timeout_seconds > 0) {
        dt_status bs = dt_barrier(in->host, name, o->timeout_seconds);
        if (bs != DT_OK)
            return bs;
    }
    return dt__ckpt_agree(g, st);
}

dt_status dt_save(const dt_mesh *mesh, const char *dir, int n, const char *const *names,
                  const dt_tensor *const *tensors, const dt_save_opts *opts)
{
    char d[CK_PATH_MAX], tmp[CK_PATH_MAX];
    save_inputs in;
    ck_group g;
    dt_status st = dt__ckpt_norm_dir("dt_save", dir, d, sizeof d);
    if (st == DT_OK)
        st = check_opts(opts);
    if (st == DT_OK && (st = dt_mesh_check_devices(mesh)) == DT_OK)
        st = inputs_init("dt_save", mesh, n, names, tensors, &in);
    if (st != DT_OK)
        return st;
    if ((st = dt__ckpt_group_create(mesh, &g)) != DT_OK) {
        inputs_free(&in);
        return st;
    }
    int np = opts ? opts->npieces : 0;
    if (g.comm == MPI_COMM_NULL) {         /* holds no device of the mesh: nothing to do */
        dt__ckpt_group_free(&g);
        inputs_free(&in);
        if (np != 0)
            return dt__error(DT_ERR_INVALID_ARGUMENT, "dt_save: %d pieces given by a client "
                             "holding no device of the mesh", np);
        return DT_OK;
    }
    ck_plan plan;
    memset(&plan, 0, sizeof plan);
    uint32_t *crcs = NULL, **chunk_crcs = NULL, *chunk_store = NULL;
    int leader = g.rank == 0, made_tmp = 0;
    /* Pieces differ between clients: checked here, then gathered and checked together, so
     * that every client fails alike before anything is written. */
    in.user_pieces = opts ? opts->pieces : NULL;
    st = dt__ckpt_pieces_check_local(mesh, np, in.user_pieces);
    if ((st = sync_point(&in, &g, opts, "dt_save:pieces", st)) != DT_OK)
        goto out;
    st = dt__ckpt_pieces_gather(mesh, &g, n, names, np, in.user_pieces, &in.pieces);
    if ((st = sync_point(&in, &g, opts, "dt_save:pieces_checked", st)) != DT_OK)
        goto out;
    st = to_host(tensors, &in);
    if (st == DT_OK)
        st = plan_input(names, &in);
    if (st == DT_OK)
        st = dt__ckpt_plan(in.host, &in.plan_in, chunk_of(opts), &plan);
    if (st == DT_OK) {
        int64_t nch = 0;
        for (int64_t si = 0; si < plan.nslices; si++)
            nch += plan.slices[si].nchunks;
        crcs = calloc((size_t)plan.nslices + 1, sizeof *crcs);
        chunk_crcs = calloc((size_t)plan.nslices + 1, sizeof *chunk_crcs);
        chunk_store = calloc((size_t)nch + 1, sizeof *chunk_store);
        if (!crcs || !chunk_crcs || !chunk_store)
            st = dt__error(DT_ERR_NO_MEMORY, "dt_save: no memory for CRCs");
        for (int64_t si = 0, k = 0; st == DT_OK && si < plan.nslices; si++) {
            chunk_crcs[si] = chunk_store + k;
            k += plan.slices[si].nchunks;
        }
    }
    if (st == DT_OK && leader) {
        st = dt__ckpt_prepare(d, tmp, sizeof tmp);
        made_tmp = st == DT_OK;
    } else if (st == DT_OK) {
        st = dt__ckpt_join(tmp, sizeof tmp, d, "", CK_SUFFIX_TMP);
    }
    if ((st = sync_point(&in, &g, opts, "dt_save:prepare", st)) != DT_OK)
        goto out;
    const void **data = NULL;
    if ((st = slice_data(&plan, &in, &data)) == DT_OK)
        st = dt__ckpt_write_local_files(&plan, data, d, &g, tmp, opts ? opts->fsync : 1, crcs,
                                        chunk_crcs);
    free(data);
    if ((st = sync_point(&in, &g, opts, "dt_save:written", st)) != DT_OK)
        goto out;
    st = gather_crcs(&plan, &g, crcs, chunk_crcs);
    if (st == DT_OK && leader) {
        st = write_index_and_commit(&plan, &in, d, tmp, opts, crcs, chunk_crcs);
        made_tmp = st != DT_OK;
    }
    st = sync_point(&in, &g, opts, "dt_save:commit", st);
out:
    if (st != DT_OK) {
        char keep[1024];
        dt__strlcpy(keep, dt_last_error(), sizeof keep);
        if (made_tmp)
            dt__ckpt_remove_dir(tmp);
        /* Every client knows of the failure (agreed): return together, after the cleanup. */
        if (st != DT_ERR_TIMEOUT && st != DT_ERR_COMM)
            MPI_Barrier(g.comm);
        dt__error(st, "%s", keep);
    }
    free(crcs);
    free(chunk_crcs);
    free(chunk_store);
    dt__ckpt_plan_free(&plan);
    dt__ckpt_group_free(&g);
    inputs_free(&in);
    return st;
}
