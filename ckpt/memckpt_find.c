/* In-memory checkpoints at a restart (docs/recovery.md): the newest step complete across the
 * clients' memory directories (dt_memckpt_find), and bringing its missing files into every
 * directory over MPI so that the ordinary reader restores from it (dt_memckpt_fetch). */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt/ckpt_impl.h"
#include "runtime/comm.h"
#include "runtime/error.h"

#define MAX_STEPS 16
#define FETCH_TAG 7302
#define PIECE ((uint64_t)1 << 30)

/* The step's index in this client's directory, or NULL (no index, or a bad one). */
static dt_ckpt *open_step(const dt_memckpt *mc, int64_t step)
{
    char dir[CK_PATH_MAX], idx[CK_PATH_MAX + 32];
    if (dt_memckpt_step_dir(mc, step, dir, sizeof dir) != DT_OK)
        return NULL;
    /* Only a committed step (never a stopped commit's previous one in .dtensor-old). */
    snprintf(idx, sizeof idx, "%s/%s", dir, DT_CKPT_INDEX_NAME);
    if (access(idx, R_OK) != 0)
        return NULL;
    dt_ckpt *ck = NULL;
    return dt_ckpt_open(dir, &ck) == DT_OK ? ck : NULL;
}

/* 1 when file f of ck is in its directory at its size; *buddy_out = 1 when a buddy copy. */
static int have_file(const dt_ckpt *ck, int64_t f, int *buddy_out)
{
    dt_ckpt_file_info fi;
    char p[CK_PATH_MAX + 300];
    struct stat sb;
    *buddy_out = 0;
    if (dt_ckpt_file(ck, f, &fi) != DT_OK)
        return 0;
    snprintf(p, sizeof p, "%s/%s", dt_ckpt_path(ck), fi.name);
    if (stat(p, &sb) != 0 || (uint64_t)sb.st_size != fi.bytes)
        return 0;
    snprintf(p, sizeof p, "%s/%s" MEMCKPT_BUDDY_SUFFIX, dt_ckpt_path(ck), fi.name);
    *buddy_out = access(p, F_OK) == 0;
    return 1;
}

/* A digest of the index's file list (names' hashes, sizes, header CRCs): the same step in
 * two directories must be the same save. */
static uint64_t digest(const dt_ckpt *ck)
{
    uint64_t h = 1469598103934665603ull;
    for (int64_t f = 0; f < dt_ckpt_num_files(ck); f++) {
        dt_ckpt_file_info fi;
        if (dt_ckpt_file(ck, f, &fi) != DT_OK)
            continue;
        h = (h ^ dt__memckpt_hash(fi.name)) * 1099511628211ull;
        h = (h ^ fi.bytes) * 1099511628211ull;
        h = (h ^ fi.header_crc32c) * 1099511628211ull;
    }
    return h;
}

static dt_status allreduce(const dt_memckpt *mc, void *buf, int n, MPI_Datatype t, MPI_Op op,
                           const char *what)
{
    if (mc->g.size <= 1)
        return DT_OK;
    MPI_Request req = MPI_REQUEST_NULL;
    int rc = MPI_Iallreduce(MPI_IN_PLACE, buf, n, t, op, mc->g.comm, &req);
    return dt__ckpt_wait(&mc->g, &req, rc, what);
}

/* The steps any client holds, newest first, into all (unique); the count. */
static dt_status candidate_steps(const dt_memckpt *mc, int64_t *all, int *n_out)
{
    int64_t mine[MAX_STEPS];
    int n = dt__memckpt_list_steps(mc->root, mine, MAX_STEPS);
    for (int i = n; i < MAX_STEPS; i++)
        mine[i] = -1;
    int size = mc->g.size > 0 ? mc->g.size : 1;
    int64_t *got = malloc((size_t)size * MAX_STEPS * sizeof *got);
    if (!got)
        return dt__error(DT_ERR_NO_MEMORY, "dt_memckpt_find: no memory");
    if (mc->g.size > 1) {
        MPI_Request req = MPI_REQUEST_NULL;
        int rc = MPI_Iallgather(mine, MAX_STEPS, MPI_INT64_T, got, MAX_STEPS, MPI_INT64_T,
                                mc->g.comm, &req);
        dt_status st = dt__ckpt_wait(&mc->g, &req, rc, "dt_memckpt_find: steps");
        if (st != DT_OK)
            return st; /* got may still be written by MPI: left allocated */
    } else {
        memcpy(got, mine, sizeof mine);
    }
    int k = 0;
    for (int i = 0; i < size * MAX_STEPS; i++) {
        int64_t s = got[i];
        int dup = s < 0;
        for (int j = 0; j < k && !dup; j++)
            dup = all[j] == s;
        if (!dup && k < MAX_STEPS * 4)
            all[k++] = s;
    }
    free(got);
    for (int i = 1; i < k; i++) /* newest first */
        for (int j = i; j > 0 && all[j - 1] < all[j]; j--) {
            int64_t t = all[j];
            all[j] = all[j - 1];
            all[j - 1] = t;
        }
    *n_out = k;
    return DT_OK;
}

/* How complete step s is: files of its index, those held somewhere, those held only as buddy
 * copies, the hosts holding some. Collective. */
static dt_status judge(const dt_memckpt *mc, int64_t s, int64_t *nfiles, int64_t *held,
                       int64_t *buddy_only, int *hosts, int *consistent)
{
    dt_ckpt *ck = open_step(mc, s);
    int64_t head[3] = {ck ? dt_ckpt_num_files(ck) : 0, 0, 0};
    uint64_t dg = ck ? digest(ck) : 0;
    head[1] = ck ? (int64_t)(dg >> 1) : INT64_MIN;   /* max and -min of the digests */
    head[2] = ck ? -(int64_t)(dg >> 1) : INT64_MIN;
    dt_status st = allreduce(mc, head, 3, MPI_INT64_T, MPI_MAX, "dt_memckpt_find: indexes");
    if (st != DT_OK) {
        dt_ckpt_close(ck);
        return st;
    }
    int64_t F = head[0];
    /* With F > 0 some client has the index, so head[2] > INT64_MIN negates safely. */
    *consistent = F > 0 && head[1] == -head[2];
    unsigned char *bits = calloc((size_t)(2 * F + 1), 1);
    if (!bits) {
        dt_ckpt_close(ck);
        return dt__error(DT_ERR_NO_MEMORY, "dt_memckpt_find: no memory");
    }
    /* bits[f]: held here; bits[F + f]: held here as written (not a buddy copy). */
    int any = 0;
    for (int64_t f = 0; ck && f < F && f < dt_ckpt_num_files(ck); f++) {
        int buddy = 0;
        if (have_file(ck, f, &buddy)) {
            bits[f] = 1;
            bits[F + f] = (unsigned char)!buddy;
            any = 1;
        }
    }
    dt_ckpt_close(ck);
    bits[2 * F] = 0;
    st = allreduce(mc, bits, (int)(2 * F), MPI_UNSIGNED_CHAR, MPI_MAX, "dt_memckpt_find: files");
    /* Hosts holding some: each root's leader counts its own. */
    int h = mc->leader && any;
    if (st == DT_OK)
        st = allreduce(mc, &h, 1, MPI_INT, MPI_SUM, "dt_memckpt_find: hosts");
    if (st == DT_OK) {
        *nfiles = F;
        *held = *buddy_only = 0;
        for (int64_t f = 0; f < F; f++) {
            *held += bits[f];
            *buddy_only += bits[f] && !bits[F + f];
        }
        *hosts = h;
    }
    free(bits);
    return st;
}

dt_status dt_memckpt_find(dt_memckpt *mc, dt_memckpt_found *found_out)
{
    if (!mc || !found_out)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "dt_memckpt_find: NULL argument");
    dt_status st = dt_memckpt_wait(mc);
    if ((st = dt__ckpt_agree(&mc->g, st)) != DT_OK)
        return st;
    int64_t steps[MAX_STEPS * 4];
    int n = 0;
    if ((st = candidate_steps(mc, steps, &n)) != DT_OK)
        return st;
    int64_t newer = -1, newer_missing = 0, newer_files = 0;
    for (int i = 0; i < n; i++) {
        int64_t F = 0, held = 0, bonly = 0;
        int hosts = 0, same = 1;
        if ((st = judge(mc, steps[i], &F, &held, &bonly, &hosts, &same)) != DT_OK)
            return st;
        if (F > 0 && held == F && same) {
            *found_out = (dt_memckpt_found){.step = steps[i], .files = F, .from_buddies = bonly,
                                            .hosts = hosts, .newer_incomplete = newer};
            return DT_OK;
        }
        if (newer < 0) {
            newer = steps[i];
            newer_missing = F - held;
            newer_files = F;
        }
    }
    if (newer < 0)
        return dt__error(DT_ERR_NOT_FOUND, "dt_memckpt_find: no step of job %s in memory "
                         "(%s on this host)", mc->job, mc->root);
    return dt__error(DT_ERR_NOT_FOUND, "dt_memckpt_find: no step of job %s is complete in "
                     "memory: the newest, %lld, lacks %lld of %lld files (their client's host "
                     "and its buddy's are both gone)", mc->job, (long long)newer,
                     (long long)newer_missing, (long long)newer_files);
}

/* ---- fetch ---------------------------------------------------------------------------------- */

/* Sends `path` (len bytes, 0: its size, sent first) to group rank `to`, or receives it from
 * `from` into path (through "<path>.part"), under the watchdog. */
static dt_status move_file(const dt_memckpt *mc, const char *path, uint64_t len, int size_first,
                           int to, int from)
{
    int recv = from >= 0, peer = recv ? from : to;
    int peer_client = mc->g.clients[peer];
    dt_status st = DT_OK;
    if (size_first) {
        MPI_Request rq = MPI_REQUEST_NULL;
        if (!recv) {
            struct stat sb;
            if (stat(path, &sb) != 0)
                return dt__error(DT_ERR_IO, "dt_memckpt_fetch: %s: %s", path, strerror(errno));
            len = (uint64_t)sb.st_size;
        }
        int rc = recv ? MPI_Irecv(&len, 1, MPI_UINT64_T, peer, FETCH_TAG, mc->g.comm, &rq)
                      : MPI_Isend(&len, 1, MPI_UINT64_T, peer, FETCH_TAG, mc->g.comm, &rq);
        if (rc != MPI_SUCCESS)
            return dt__error(DT_ERR_COMM, "dt_memckpt_fetch: MPI failed");
        if ((st = dt__wait_watched(&rq, &peer_client, 1, 0.0, "dt_memckpt_fetch")) != DT_OK)
            return st;
    }
    char part[CK_PATH_MAX + 8];
    snprintf(part, sizeof part, "%s.part", path);
    int fd = recv ? open(part, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600)
                  : open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return dt__error(DT_ERR_IO, "dt_memckpt_fetch: %s: %s", recv ? part : path,
                         strerror(errno));
    void *a = NULL;
    if (len > 0 && recv && ftruncate(fd, (off_t)len) != 0)
        st = dt__error(DT_ERR_IO, "dt_memckpt_fetch: %s: %s", part, strerror(errno));
    if (st == DT_OK && len > 0) {
        a = mmap(NULL, len, recv ? PROT_READ | PROT_WRITE : PROT_READ, MAP_SHARED, fd, 0);
        if (a == MAP_FAILED) {
            a = NULL;
            st = dt__error(DT_ERR_IO, "dt_memckpt_fetch: mmap %s: %s", path, strerror(errno));
        }
    }
    close(fd);
    /* A failure on one side leaves the other to its watchdog (DT_ERR_TIMEOUT); the agreement
     * after the fetch then fails every client alike. */
    int np = (int)((len + PIECE - 1) / PIECE);
    MPI_Request *rq = calloc((size_t)np + 1, sizeof *rq);
    int *peers = calloc((size_t)np + 1, sizeof *peers);
    if (st == DT_OK && (!rq || !peers))
        st = dt__error(DT_ERR_NO_MEMORY, "dt_memckpt_fetch: no memory");
    for (int i = 0; st == DT_OK && i < np; i++) {
        uint64_t at = (uint64_t)i * PIECE, k = len - at < PIECE ? len - at : PIECE;
        int rc = recv ? MPI_Irecv((char *)a + at, (int)k, MPI_BYTE, peer, FETCH_TAG, mc->g.comm,
                                  &rq[i])
                      : MPI_Isend((char *)a + at, (int)k, MPI_BYTE, peer, FETCH_TAG, mc->g.comm,
                                  &rq[i]);
        peers[i] = peer_client;
        if (rc != MPI_SUCCESS)
            st = dt__error(DT_ERR_COMM, "dt_memckpt_fetch: MPI failed");
    }
    if (st == DT_OK && np > 0)
        st = dt__wait_watched(rq, peers, np, 0.0, "dt_memckpt_fetch");
    free(rq);
    free(peers);
    if (a)
        munmap(a, len);
    if (recv && st == DT_OK && rename(part, path) != 0)
        st = dt__error(DT_ERR_IO, "dt_memckpt_fetch: rename %s: %s", part, strerror(errno));
    if (recv && st != DT_OK)
        unlink(part);
    return st;
}

/* Every root's leader without the step's index gets it from the lowest client having it. */
static dt_status fetch_index(dt_memckpt *mc, const char *dir)
{
    char idx[CK_PATH_MAX + 32];
    snprintf(idx, sizeof idx, "%s/%s", dir, DT_CKPT_INDEX_NAME);
    int n = mc->g.size, me = mc->g.rank;
    int mine = access(idx, R_OK) == 0, *have = calloc((size_t)n + 1, sizeof *have);
    if (!have)
        return dt__error(DT_ERR_NO_MEMORY, "dt_memckpt_fetch: no memory");
    have[me] = mine;
    dt_status st = allreduce(mc, have, n, MPI_INT, MPI_MAX, "dt_memckpt_fetch: indexes");
    int holder = 0;
    while (st == DT_OK && holder < n && !have[holder])
        holder++;
    if (st == DT_OK && holder == n)
        st = dt__error(DT_ERR_NOT_FOUND, "dt_memckpt_fetch: no client holds the step's index");
    if (st == DT_OK && mc->leader && !mine)
        st = dt__memckpt_mkdirs(dir);
    for (int r = 0; st == DT_OK && r < n; r++) {
        int lead = 1; /* r leads its root */
        for (int k = 0; k < r && lead; k++)
            lead = mc->dir_ids[k] != mc->dir_ids[r];
        if (!lead || have[r])
            continue;
        if (me == holder)
            st = move_file(mc, idx, 0, 1, r, -1);
        else if (me == r)
            st = move_file(mc, idx, 0, 1, -1, holder);
    }
    free(have);
    return st;
}

dt_status dt_memckpt_fetch(dt_memckpt *mc, int64_t step, char *dir_buf, size_t len)
{
    if (!mc || !dir_buf)
        return dt__error(DT_ERR_INVALID_ARGUMENT, "dt_memckpt_fetch: NULL argument");
    char dir[CK_PATH_MAX];
    dt_status st = dt_memckpt_step_dir(mc, step, dir, sizeof dir);
    if (st == DT_OK)
        st = fetch_index(mc, dir);
    if ((st = dt__ckpt_agree(&mc->g, st)) != DT_OK)
        return st;
    int n = mc->g.size, me = mc->g.rank;
    dt_ckpt *ck = NULL;
    st = dt_ckpt_open(dir, &ck);
    int64_t F = st == DT_OK ? dt_ckpt_num_files(ck) : 0;
    unsigned char *bits = calloc((size_t)(F * n + 1), 1), *all = NULL;
    if (st == DT_OK && !bits)
        st = dt__error(DT_ERR_NO_MEMORY, "dt_memckpt_fetch: no memory");
    for (int64_t f = 0; st == DT_OK && f < F; f++) {
        int buddy;
        bits[me * F + f] = (unsigned char)have_file(ck, f, &buddy);
    }
    if ((st = dt__ckpt_agree(&mc->g, st)) != DT_OK)
        goto out;
    st = allreduce(mc, bits, (int)(F * n), MPI_UNSIGNED_CHAR, MPI_MAX, "dt_memckpt_fetch: files");
    all = bits;
    /* For each file, each root's leader lacking it receives it from the lowest client
     * holding it, in one order every client follows. */
    for (int64_t f = 0; st == DT_OK && f < F; f++) {
        int holder = 0;
        while (holder < n && !all[holder * F + f])
            holder++;
        if (holder == n) {
            st = dt__error(DT_ERR_NOT_FOUND, "dt_memckpt_fetch: step %lld is not complete in "
                           "memory", (long long)step);
            break;
        }
        dt_ckpt_file_info fi;
        dt_ckpt_file(ck, f, &fi);
        char path[CK_PATH_MAX + 300];
        snprintf(path, sizeof path, "%s/%s", dir, fi.name);
        for (int r = 0; st == DT_OK && r < n; r++) {
            int lead = 1;
            for (int k = 0; k < r && lead; k++)
                lead = mc->dir_ids[k] != mc->dir_ids[r];
            if (!lead || all[r * F + f])
                continue;
            if (me == holder)
                st = move_file(mc, path, fi.bytes, 0, r, -1);
            else if (me == r)
                st = move_file(mc, path, fi.bytes, 0, -1, holder);
        }
    }
    st = dt__ckpt_agree(&mc->g, st);
    if (st == DT_OK && (size_t)snprintf(dir_buf, len, "%s", dir) >= len)
        st = dt__error(DT_ERR_INVALID_ARGUMENT, "dt_memckpt_fetch: buffer too small");
out:
    free(bits);
    dt_ckpt_close(ck);
    return st;
}
