/* In-memory checkpoints (dt_memckpt, docs/recovery.md): the handle, the node-local save of a
 * step into the host's memory directory, the pruning of old steps and the cleanup. The copy to
 * the buddy: memckpt_copy.c; finding and fetching a step for a restart: memckpt_find.c. */
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt/ckpt_impl.h"
#include "mesh/mesh_group.h"
#include "runtime/comm.h"
#include "runtime/error.h"
#include "runtime/util.h"

/* ---- names ------------------------------------------------------------------------------- */

static int job_id_ok(const char *id)
{
    size_t n = strlen(id);
    if (n == 0 || n > 64)
        return 0;
    for (size_t i = 0; i < n; i++) {
        char c = id[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '.' || c == '_' || c == '-'))
            return 0;
    }
    return 1;
}

/* The directory template with %h (host name) and %c (client id) replaced. */
static dt_status expand_dir(const char *tmpl, char *buf, size_t len)
{
    char host[256] = "";
    gethostname(host, sizeof host - 1);
    size_t o = 0;
    for (const char *p = tmpl; *p; p++) {
        char piece[300];
        if (p[0] == '%' && p[1] == 'h') {
            snprintf(piece, sizeof piece, "%s", host);
            p++;
        } else if (p[0] == '%' && p[1] == 'c') {
            snprintf(piece, sizeof piece, "%d", dt_client_id());
            p++;
        } else {
            piece[0] = *p;
            piece[1] = '\0';
        }
        size_t k = strlen(piece);
        if (o + k + 1 > len)
            return dt__error(DT_ERR_INVALID_ARGUMENT, "dt_memckpt_create: directory %s too long",
                             tmpl);
        memcpy(buf + o, piece, k + 1);
        o += k;
    }
    return DT_OK;
}

uint64_t dt__memckpt_hash(const char *s)
{
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h;
}

/* mkdir -p. */
dt_status dt__memckpt_mkdirs(const char *path)
{
    char buf[CK_PATH_MAX];
    snprintf(buf, sizeof buf, "%s", path);
    for (char *p = buf + 1;; p++) {
        char c = *p;
        if (c != '/' && c != '\0')
            continue;
        *p = '\0';
        if (mkdir(buf, 0700) != 0 && errno != EEXIST)
            return dt__error(DT_ERR_IO, "dt_memckpt: mkdir %s: %s", buf, strerror(errno));
        *p = c;
        if (c == '\0')
            break;
    }
    return DT_OK;
}

static void prune_after_commit(void *arg);

/* ---- create / destroy ---------------------------------------------------------------------- */

dt_status dt_memckpt_create(const dt_mesh *mesh, const dt_memckpt_opts *opts,
                            dt_memckpt **mc_out)
{
    dt_memckpt_opts o = DT_MEMCKPT_OPTS_INIT;
    if (opts)
        o = *opts;
    if (!mesh || !mc_out)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "dt_memckpt_create: NULL mesh or output");
    const char *job = o.job_id ? o.job_id : getenv("DT_JOB_ID");
    if (!job || !*job)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "dt_memckpt_create: no job id (opts.job_id "
                         "or DT_JOB_ID; dtensor launch sets one)");
    if (!job_id_ok(job))
        return dt__error(DT_ERR_INVALID_ARGUMENT, "dt_memckpt_create: job id '%s': use 1-64 of "
                         "[A-Za-z0-9._-]", job);
    if (o.every < 1 || o.keep < 1 || o.buddy < 0)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "dt_memckpt_create: every %lld, keep %d, "
                         "buddy %d: every and keep must be >= 1, buddy >= 0",
                         (long long)o.every, o.keep, o.buddy);
    const char *tmpl = o.dir ? o.dir : getenv("DT_MEMCKPT_DIR");
    if (!tmpl || !*tmpl)
        tmpl = "/dev/shm";
    dt_memckpt *mc = calloc(1, sizeof *mc);
    if (!mc)
        return dt__error(DT_ERR_NO_MEMORY, "dt_memckpt_create: no memory");
    mc->every = o.every;
    mc->keep = o.keep;
    mc->g.comm = MPI_COMM_NULL;
    mc->copy_dir = -1;
    snprintf(mc->job, sizeof mc->job, "%s", job);
    char base[CK_PATH_MAX - 128];
    dt_status st = expand_dir(tmpl, base, sizeof base);
    if (st == DT_OK)
        snprintf(mc->root, sizeof mc->root, "%s/dtensor-mem-%s", base, job);
    const dt__group *g = NULL;
    if (st == DT_OK)
        st = dt__mesh_group(mesh, &g);
    if (st == DT_OK)
        st = dt__group_dup(g, &mc->g);
    if (st != DT_OK) {
        free(mc);
        return st;
    }
    int n = mc->g.size;
    mc->dir_ids = calloc((size_t)(n > 0 ? n : 1), sizeof *mc->dir_ids);
    if (!mc->dir_ids) {
        dt_memckpt_destroy(mc);
        return dt__error(DT_ERR_NO_MEMORY, "dt_memckpt_create: no memory");
    }
    uint64_t mine = dt__memckpt_hash(mc->root);
    if (n > 1) {
        MPI_Request req = MPI_REQUEST_NULL;
        int rc = MPI_Iallgather(&mine, 1, MPI_UINT64_T, mc->dir_ids, 1, MPI_UINT64_T,
                                mc->g.comm, &req);
        if ((st = dt__ckpt_wait(&mc->g, &req, rc, "dt_memckpt_create")) != DT_OK) {
            mc->dir_ids = NULL; /* still pending after a timeout: left to MPI */
            dt_memckpt_destroy(mc);
            return st;
        }
    } else if (n == 1) {
        mc->dir_ids[0] = mine;
    }
    int r = 0;
    while (r < mc->g.rank && mc->dir_ids[r] != mine)
        r++;
    mc->leader = r == mc->g.rank;
    mc->hosts = 0;
    for (int i = 0; i < n; i++) {
        int k = 0;
        while (k < i && mc->dir_ids[k] != mc->dir_ids[i])
            k++;
        mc->hosts += k == i;
    }
    /* J: the smallest that puts every buddy on another host, else 1 (one host). */
    int J = o.buddy;
    for (int j = 1; J == 0 && j < n; j++) {
        int ok = 1;
        for (int c = 0; c < n && ok; c++)
            ok = mc->dir_ids[c] != mc->dir_ids[(c + j) % n];
        if (ok)
            J = j;
    }
    if (J == 0)
        J = 1;
    mc->buddy_j = n > 0 ? J % n : 0;
    mc->buddy = n > 0 ? (mc->g.rank + mc->buddy_j) % n : 0;
    mc->source = n > 0 ? ((mc->g.rank - mc->buddy_j) % n + n) % n : 0;
    for (int c = 0; c < n; c++)
        if (mc->dir_ids[c] == mc->dir_ids[(c + mc->buddy_j) % n])
            mc->buddy_same_host = 1;
    mc->copy_step = -1;
    mc->quick.g = &mc->g;
    mc->quick.after_commit = prune_after_commit;
    mc->quick.after_arg = mc;
    *mc_out = mc;
    return DT_OK;
}

void dt_memckpt_destroy(dt_memckpt *mc)
{
    if (!mc)
        return;
    (void)dt_memckpt_wait(mc);
    dt__ckpt_quick_free(&mc->quick);
    dt__memckpt_xfers_free(mc);
    dt__memckpt_maps_free(mc);
    dt__group_free(&mc->g);
    free(mc->dir_ids);
    free(mc);
}

int dt_memckpt_due(const dt_memckpt *mc, int64_t step)
{
    return mc && step > 0 && step % mc->every == 0;
}

dt_status dt_memckpt_step_dir(const dt_memckpt *mc, int64_t step, char *buf, size_t len)
{
    if (!mc || !buf || step < 0)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "dt_memckpt_step_dir: bad arguments");
    if ((size_t)snprintf(buf, len, "%s/step-%010lld", mc->root, (long long)step) >= len)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "dt_memckpt_step_dir: buffer too small");
    return DT_OK;
}

dt_status dt_memckpt_stats_get(const dt_memckpt *mc, dt_memckpt_stats *stats_out)
{
    if (!mc || !stats_out)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "dt_memckpt_stats_get: NULL argument");
    dt_memckpt_stats s = {
        .buddy = mc->g.size ? mc->g.clients[mc->buddy] : 0,
        .source = mc->g.size ? mc->g.clients[mc->source] : 0,
        .buddy_same_host = mc->buddy_same_host, .hosts = mc->hosts,
        .own_bytes = mc->own_bytes, .buddy_bytes = mc->buddy_bytes,
        .held_bytes = (mc->own_bytes + mc->buddy_bytes) * (uint64_t)mc->keep,
        .last_save_seconds = mc->last_save_seconds};
    *stats_out = s;
    return DT_OK;
}

/* ---- save, prune, cleanup ------------------------------------------------------------------ */

/* The steps found in root ("step-N" directories, any suffix), newest first, at most max. */
int dt__memckpt_list_steps(const char *root, int64_t *steps, int max)
{
    DIR *d = opendir(root);
    if (!d)
        return 0;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        long long s;
        char tail[8];
        int k = sscanf(e->d_name, "step-%lld%7s", &s, tail);
        if (k != 1 || s < 0)
            continue;
        int i = n < max ? n++ : max - 1;
        if (i == max - 1 && n == max && steps[i] >= s)
            continue;
        steps[i] = s;
        for (; i > 0 && steps[i - 1] < steps[i]; i--) {
            int64_t t = steps[i - 1];
            steps[i - 1] = steps[i];
            steps[i] = t;
        }
    }
    closedir(d);
    return n;
}

/* Removes a step directory with whatever it holds (files only), and its save's leftovers. */
static void remove_step(const char *root, int64_t step)
{
    static const char *const suffix[] = {"", CK_SUFFIX_TMP, CK_SUFFIX_OLD};
    for (int i = 0; i < 3; i++) {
        char p[CK_PATH_MAX + 64];
        snprintf(p, sizeof p, "%s/step-%010lld%s", root, (long long)step, suffix[i]);
        (void)dt__ckpt_remove_dir(p);
    }
}

/* The leader of a directory: every step directory below the `keep` newest goes. */
static void prune(dt_memckpt *mc)
{
    int64_t steps[256];
    int n = dt__memckpt_list_steps(mc->root, steps, 256);
    for (int i = mc->keep; i < n; i++)
        remove_step(mc->root, steps[i]);
}

/* After a quick save's commit, on the committing thread (the leader). */
static void prune_after_commit(void *arg)
{
    prune(arg);
}

/* The pending quick save's commit (the leader: index, rename, pruning), then the buddy copy:
 * progressed (wait 0; *done_out 1 when nothing is left) or completed. */
static dt_status progress(dt_memckpt *mc, int wait, int *done_out)
{
    int committed = 1, copied = 1;
    dt_status st = dt__ckpt_quick_complete(&mc->quick, wait, &committed);
    dt_status cs = wait ? dt__memckpt_copy_wait(mc) : dt__memckpt_copy_poll(mc, &copied);
    if (wait == 1)
        committed = 1; /* left to its thread */
    if (done_out)
        *done_out = committed && copied;
    return st != DT_OK ? st : cs;
}

dt_status dt_memckpt_poll(dt_memckpt *mc, int *done_out)
{
    if (!mc)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "dt_memckpt_poll: NULL handle");
    return progress(mc, 0, done_out);
}

dt_status dt_memckpt_wait(dt_memckpt *mc)
{
    if (!mc)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "dt_memckpt_wait: NULL handle");
    return progress(mc, 2, NULL);
}

/* The first save: the whole node-local dt_save (agreed by every client), which records for
 * the quick saves after it; then the copy of the committed step. */
static dt_status first_save(dt_memckpt *mc, const char *dir, int64_t step,
                            dt_memckpt_save_fn save, void *arg, const dt_save_opts *o)
{
    dt_status st = DT_OK;
    if (mc->leader)
        st = dt__memckpt_mkdirs(mc->root);
    st = dt__ckpt_agree(&mc->g, st);
    if (st != DT_OK)
        return st;
    uint64_t serial = dt__ckpt_local_serial() + 1;
    dt__ckpt_quick_set(&mc->quick);
    st = save(arg, dir, o);
    dt__ckpt_quick_set(NULL);
    if (st != DT_OK)
        return st;
    ck_local_file *files = NULL;
    int64_t nf = 0;
    st = dt__memckpt_step_files(dir, serial, &files, &nf);
    if (st == DT_OK) {
        st = dt__memckpt_start_copy(mc, files, nf, dir);
        mc->copy_step = step;
    }
    free(files);
    /* A copy posted on one side only would leave its pair waiting: every client drops its
     * copy when one could not post its own (the job's saves fail alike). */
    st = dt__ckpt_agree(&mc->g, st);
    if (st != DT_OK) {
        for (int i = 0; i < mc->nreq; i++)
            if (mc->reqs[i] != MPI_REQUEST_NULL) {
                MPI_Cancel(&mc->reqs[i]);
                MPI_Request_free(&mc->reqs[i]);
            }
        /* MPI may still touch the mapped files: their mappings are left in place. */
        for (int i = 0; i < mc->nx; i++)
            mc->x[i].addr = NULL;
        mc->nreq = 0;
        dt__memckpt_xfers_free(mc);
        return st;
    }
    mc->quick.primed = 1;
    if (mc->leader)
        prune(mc);
    return DT_OK;
}

dt_status dt_memckpt_save(dt_memckpt *mc, int64_t step, dt_memckpt_save_fn save, void *arg,
                          const dt_save_opts *base)
{
    if (!mc || !save || step < 0)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "dt_memckpt_save: bad arguments");
    double t0 = dt__now_seconds();
    /* The previous step: its CRCs gathered and its copy complete (normally done already,
     * during the step), its commit started (on the leader's thread). */
    dt_status st = progress(mc, 1, NULL);
    char dir[CK_PATH_MAX];
    if (st == DT_OK)
        st = dt_memckpt_step_dir(mc, step, dir, sizeof dir);
    if (st != DT_OK && !mc->quick.primed)
        st = dt__ckpt_agree(&mc->g, st);
    if (st != DT_OK)
        return st;
    dt_save_opts o = DT_SAVE_OPTS_INIT;
    if (base)
        o = *base;
    o.node_local = 1;
    o.fsync = 0; /* memory: nothing to make durable */
    if (!mc->quick.primed) {
        st = first_save(mc, dir, step, save, arg, &o);
        mc->last_save_seconds = dt__now_seconds() - t0;
        return st;
    }
    /* A quick save: this client's files into the step's temporary directory, the CRC gather
     * and the copy posted; no client waits for another here. A client failing here fails its
     * job (its peers then fail at their next collective with it, or are stopped). */
    /* The oldest step kept (the keep-th newest) gives its files' memory to the new step's
     * (it is the one the commit of this step would remove), once the previous step is
     * committed (else it might be the only complete step here); never with keep 1. */
    int64_t steps[64];
    int n = dt__memckpt_list_steps(mc->root, steps, 64);
    mc->quick.recycle[0] = '\0';
    if (mc->keep > 1 && n >= mc->keep && steps[0] >= step - mc->every && steps[0] < step)
        (void)dt_memckpt_step_dir(mc, steps[mc->keep - 1], mc->quick.recycle,
                                  sizeof mc->quick.recycle);
    dt__ckpt_quick_set(&mc->quick);
    st = save(arg, dir, &o);
    dt__ckpt_quick_set(NULL);
    if (st == DT_OK && mc->quick.pending) {
        st = dt__memckpt_start_copy(mc, mc->quick.files, mc->quick.nfiles, mc->quick.tmp);
        mc->copy_step = step;
    } else if (st == DT_OK) {
        st = dt__error(DT_ERR_STATE, "dt_memckpt_save: the save function wrote no node-local "
                       "dt_save of this mesh");
    }
    mc->last_save_seconds = dt__now_seconds() - t0;
    return st;
}

/* Removes root and everything below it (two levels: step directories of files). */
static void remove_root(const char *root)
{
    DIR *d = opendir(root);
    if (!d)
        return;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
            continue;
        char p[CK_PATH_MAX];
        snprintf(p, sizeof p, "%s/%s", root, e->d_name);
        if (unlink(p) != 0)
            (void)dt__ckpt_remove_dir(p);
    }
    closedir(d);
    rmdir(root);
}

dt_status dt_memckpt_cleanup(dt_memckpt *mc)
{
    if (!mc)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "dt_memckpt_cleanup: NULL handle");
    dt_status st = dt_memckpt_wait(mc);
    st = dt__ckpt_agree(&mc->g, st);
    if (st != DT_OK)
        return st;
    dt__memckpt_maps_free(mc); /* they hold the files' memory */
    if (mc->leader)
        remove_root(mc->root);
    return dt__ckpt_agree(&mc->g, DT_OK);
}
