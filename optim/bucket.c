/* Background reduction of gradient buckets (DeepSpeed's overlap_comm): each chunk of the flat
 * gradient buffer is cut into buckets of at most reduce_bucket_size bytes; when the last
 * parameter of a bucket is in, its values go to host staging memory and non-blocking
 * point-to-point messages on the optimizer's own communicator send every dp peer its part
 * (a reduce-scatter); later dt_zero_grad_ready calls progress them with MPI_Test, and
 * dt_zero_step waits for the rest. Each rank sums its part in dp-coordinate order, as the
 * relayout from the partial layout does, so the bits equal the synchronous path's. Stage 0
 * then all-gathers the reduced parts. docs/optim.md, "Overlapped reduction". */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "optim/optim_impl.h"
#include "runtime/comm.h"
#include "runtime/error.h"
#include "runtime/trace.h"

double dt__zero_cpu_seconds(void)
{
    struct timespec ts;
    if (clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts) != 0)
        return 0.0;
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

dt_status dt__zero_overlap_init(dt_zero *z)
{
    static const char fn[] = "dt_zero_create";
    z->comm = MPI_COMM_NULL;
    if (z->dp_size < 2)
        return DT_OK;
    int nclients = dt_num_clients();
    dt_device_type type = dt_mesh_device_type(z->mesh);
    size_t npeer = (size_t)z->nlocal * (size_t)z->dp_size;
    int *member = calloc((size_t)nclients, sizeof *member);
    int *ranks = calloc((size_t)nclients, sizeof *ranks);
    z->dp_rank = calloc(npeer, sizeof *z->dp_rank);
    z->dp_client = calloc(npeer, sizeof *z->dp_client);
    z->dp_pos = calloc(npeer, sizeof *z->dp_pos);
    dt_status st = DT_OK;
    if (!member || !ranks || !z->dp_rank || !z->dp_client || !z->dp_pos)
        st = dt__error(DT_ERR_NO_MEMORY, "%s: no memory", fn);
    for (int64_t pos = 0; st == DT_OK && pos < dt_mesh_size(z->mesh); pos++) {
        int c = dt_device_client(type, dt_mesh_device_id(z->mesh, pos));
        if (c < 0 || c >= nclients)
            st = dt__error(DT_ERR_STATE, "%s: mesh position %lld has no client", fn,
                           (long long)pos);
        else
            member[c] = 1;
    }
    /* The comm's ranks are the mesh's clients in ascending order. */
    int n = 0;
    for (int c = 0; st == DT_OK && c < nclients; c++)
        if (member[c]) {
            member[c] = n;
            ranks[n++] = c;
        } else {
            member[c] = -1;
        }
    for (int i = 0; st == DT_OK && i < z->nlocal; i++)
        for (int64_t q = 0; st == DT_OK && q < z->dp_size; q++) {
            int64_t coords[DT_MESH_MAX_DIMS], pos;
            size_t e = (size_t)i * (size_t)z->dp_size + (size_t)q;
            memcpy(coords, z->coords[i], sizeof coords);
            coords[z->dp] = q;
            st = dt_mesh_position_of(z->mesh, coords, &pos);
            if (st == DT_OK) {
                z->dp_pos[e] = pos;
                z->dp_client[e] = dt_device_client(type, dt_mesh_device_id(z->mesh, pos));
                z->dp_rank[e] = member[z->dp_client[e]];
            }
        }
    if (st == DT_OK) {
        MPI_Group world = MPI_GROUP_NULL, grp = MPI_GROUP_NULL;
        int rc = MPI_Comm_group(dt__comm(), &world);
        if (rc == MPI_SUCCESS)
            rc = MPI_Group_incl(world, n, ranks, &grp);
        if (rc == MPI_SUCCESS)
            rc = MPI_Comm_create_group(dt__comm(), grp, 0x7a30, &z->comm);
        if (rc == MPI_SUCCESS) /* errors become statuses, never end the process */
            rc = MPI_Comm_set_errhandler(z->comm, MPI_ERRORS_RETURN);
        if (grp != MPI_GROUP_NULL)
            MPI_Group_free(&grp);
        if (world != MPI_GROUP_NULL)
            MPI_Group_free(&world);
        if (rc != MPI_SUCCESS)
            st = dt__error(DT_ERR_COMM, "%s: the reduction's communicator could not be made "
                           "(MPI error %d)", fn, rc);
    }
    /* A tag per (phase, sending device, receiving dp coordinate). */
    int *ub = NULL, flag = 0;
    if (st == DT_OK)
        MPI_Comm_get_attr(z->comm, MPI_TAG_UB, &ub, &flag);
    free(member);
    free(ranks);
    if (st == DT_OK)
        z->overlap = flag && ub && 2 * dt_mesh_size(z->mesh) * z->dp_size <= (int64_t)*ub;
    return st;
}

void dt__zero_overlap_fini(dt_zero *z)
{
    dt__zero_buckets_free(z);
    if (z->comm != MPI_COMM_NULL)
        MPI_Comm_free(&z->comm);
    free(z->dp_rank);
    free(z->dp_client);
    free(z->dp_pos);
    z->dp_rank = NULL;
    z->dp_client = NULL;
    z->dp_pos = NULL;
    z->overlap = 0;
}

/* Dp coordinate q's part [*off, *off + *len) of a chunk of `len` elements (the layout's
 * split: the first len % N parts one longer). */
static void part_of(const dt_zero *z, int64_t chunk_len, int64_t q, int64_t *off, int64_t *len)
{
    int64_t n = z->dp_size, base = chunk_len / n, rem = chunk_len % n;
    *off = q * base + (q < rem ? q : rem);
    *len = base + (q < rem);
}

/* The intersection of dp coordinate q's part with bucket b, chunk-relative; *len 0 if none. */
static void piece_of(const dt_zero *z, const dt__zbucket *b, int64_t q, int64_t *off,
                     int64_t *len)
{
    int64_t po, pl, a = b->lo - b->chunk->start, e = b->hi - b->chunk->start;
    part_of(z, b->chunk->len, q, &po, &pl);
    int64_t s = po > a ? po : a, t = po + pl < e ? po + pl : e;
    *off = s;
    *len = t > s ? t - s : 0;
}

/* Elements of group g per bucket: reduce_bucket_size bytes, at least one element, and at most
 * what one message's int count of bytes can say. */
static int64_t bucket_elems(const dt_zero *z, const dt__zgroup *g)
{
    int64_t bytes = z->reduce_bucket_size < INT_MAX ? z->reduce_bucket_size : INT_MAX;
    int64_t per = bytes / (int64_t)dt_dtype_size(g->gdtype);
    return per < 1 ? 1 : per;
}

dt_status dt__zero_buckets_begin(dt_zero *z)
{
    dt__zero_buckets_free(z);
    z->comm_failed = 0;
    z->prog_status = DT_OK;
    int64_t count = 0;
    for (int g = 0; g < z->ngroups; g++) {
        int64_t per = bucket_elems(z, &z->groups[g]);
        for (int c = 0; c < z->groups[g].nchunks; c++)
            count += (z->groups[g].chunks[c].len + per - 1) / per;
    }
    z->buckets = calloc((size_t)(count ? count : 1), sizeof *z->buckets);
    z->order = calloc((size_t)(count ? count : 1), sizeof *z->order);
    if (!z->buckets || !z->order)
        return dt__error(DT_ERR_NO_MEMORY, "dt_zero_grad_ready: no memory for %lld buckets",
                         (long long)count);
    int nb = 0;
    for (int g = 0; g < z->ngroups; g++) {
        dt__zgroup *gr = &z->groups[g];
        int64_t per = bucket_elems(z, gr);
        for (int c = 0; c < gr->nchunks; c++) {
            dt__zchunk *ch = &gr->chunks[c];
            for (int64_t lo = ch->start; lo < ch->start + ch->len; lo += per) {
                dt__zbucket *b = &z->buckets[nb++];
                b->group = gr;
                b->chunk = ch;
                b->lo = lo;
                b->hi = lo + per < ch->start + ch->len ? lo + per : ch->start + ch->len;
                for (int j = 0; j < gr->nparams; j++) {
                    const dt__zparam *p = &gr->params[j];
                    b->waiting += p->offset < b->hi && p->offset + p->n > b->lo;
                }
            }
        }
    }
    z->nbuckets = nb;
    return DT_OK;
}

static dt_status mpi_fail(int rc, const char *what)
{
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(rc, msg, &len);
    return dt__error(DT_ERR_COMM, "dt_zero_grad_ready: %s: %s", what, msg);
}

/* The tag of phase `phase`'s message from the device at mesh position src to dp coordinate
 * dst_q: messages between two clients with one tag pair up in posting order, which is the
 * bucket order on both sides. */
static int tag_of(const dt_zero *z, int phase, int64_t src, int64_t dst_q)
{
    return (int)(((int64_t)phase * dt_mesh_size(z->mesh) + src) * z->dp_size + dst_q);
}

/* Posts a send (to) or receive (from) between local device i and its dp peer q. */
static dt_status post(dt_zero *z, dt__zbucket *b, int send, void *buf, int64_t elems, int i,
                      int64_t q, int phase)
{
    size_t bytes = (size_t)elems * dt_dtype_size(b->group->gdtype);
    size_t e = (size_t)i * (size_t)z->dp_size;
    int64_t me = z->coords[i][z->dp];
    MPI_Request *r = &b->reqs[b->nreq];
    int rc = send ? MPI_Isend(buf, (int)bytes, MPI_BYTE, z->dp_rank[e + (size_t)q],
                              tag_of(z, phase, z->dp_pos[e + (size_t)me], q), z->comm, r)
                  : MPI_Irecv(buf, (int)bytes, MPI_BYTE, z->dp_rank[e + (size_t)q],
                              tag_of(z, phase, z->dp_pos[e + (size_t)q], me), z->comm, r);
    if (rc != MPI_SUCCESS)
        return mpi_fail(rc, send ? "MPI_Isend" : "MPI_Irecv");
    b->isrecv[b->nreq] = (unsigned char)!send;
    b->peers[b->nreq++] = z->dp_client[e + (size_t)q];
    return DT_OK;
}

/* Peer q's summand of local device i's part in its receive buffer: the dp_size - 1 slots hold
 * the peers other than the device itself (me), in dp-coordinate order. */
static char *slot(const dt__zbucket *b, int i, int64_t q, int64_t me, int64_t mlen, size_t dsz)
{
    return (char *)b->recv[i] + (size_t)((q < me ? q : q - 1) * mlen) * dsz;
}

/* Phase 1: each device's summand to host memory, each peer's piece sent, its own received. */
static dt_status start(dt_zero *z, dt__zbucket *b)
{
    size_t dsz = dt_dtype_size(b->group->gdtype), nl = (size_t)z->nlocal;
    int64_t n = b->hi - b->lo, a = b->lo - b->chunk->start;
    b->reqs = malloc(nl * (size_t)(2 * z->dp_size) * sizeof *b->reqs);
    b->peers = malloc(nl * (size_t)(2 * z->dp_size) * sizeof *b->peers);
    b->isrecv = malloc(nl * (size_t)(2 * z->dp_size));
    b->vals = calloc(nl, sizeof *b->vals);
    b->recv = calloc(nl, sizeof *b->recv);
    b->phase = 1;
    /* Where the devices' memory is the host's and the chunk is the persistent flat buffer
     * (stages 0 and 1), its bucket range is sent from and summed into in place: it is not
     * written again in this step once the bucket starts. */
    b->borrowed = b->chunk->filling == b->chunk->flat;
    for (int i = 0; i < z->nlocal; i++)
        b->borrowed = b->borrowed && z->devs[i]->kind->host_visible;
    if (!b->reqs || !b->peers || !b->isrecv || !b->vals || !b->recv)
        return dt__error(DT_ERR_NO_MEMORY, "dt_zero_grad_ready: no memory");
    if (dt__trace_on()) {  /* the flight recorder notes the bucket as it starts */
        char what[96];
        snprintf(what, sizeof what, "%s [%lld, %lld) of %lld bytes", dt_dtype_name(b->group->dtype),
                 (long long)b->lo, (long long)b->hi, (long long)((size_t)n * dsz));
        dt__coll_end(dt__coll_record(z->dp_client, (int)z->dp_size, "zero bucket", what), "mpi", DT_OK);
    }
    dt_status st = DT_OK;
    for (int i = 0; st == DT_OK && i < z->nlocal; i++) {
        const dt__device *dev = z->devs[i];
        int64_t me = z->coords[i][z->dp], moff, mlen;
        piece_of(z, b, me, &moff, &mlen);
        char *src = (char *)dt_tensor_local(b->chunk->filling, i)->data + (size_t)a * dsz;
        if (b->borrowed)
            b->vals[i] = src;
        else
            st = dev->kind->host_alloc((size_t)n * dsz, &b->vals[i]);
        if (st == DT_OK)
            st = dev->kind->host_alloc((size_t)((mlen ? mlen : 1) * (z->dp_size - 1)) * dsz,
                                       &b->recv[i]);
        if (st == DT_OK && !b->borrowed) {
            double t0 = dt__zero_cpu_seconds();
            st = dev->kind->copy(dev, DT__COPY_D2H, b->vals[i], src, (size_t)n * dsz);
            z->t_copy += dt__zero_cpu_seconds() - t0;
        }
        for (int64_t q = 0; st == DT_OK && q < z->dp_size; q++) {
            int64_t off, len;
            piece_of(z, b, q, &off, &len);
            if (q != me && mlen > 0)
                st = post(z, b, 0, slot(b, i, q, me, mlen, dsz), mlen, i, q, 0);
            if (q != me && len > 0 && st == DT_OK)
                st = post(z, b, 1, (char *)b->vals[i] + (size_t)(off - a) * dsz, len, i, q, 0);
        }
    }
    return st;
}

/* The requests of b are complete: the next phase, for every local device. */
static dt_status advance(dt_zero *z, dt__zbucket *b)
{
    double t0 = dt__zero_cpu_seconds(), t_sum = 0;
    const dt__zgroup *g = b->group;
    dt__zchunk *ch = b->chunk;
    size_t dsz = dt_dtype_size(g->gdtype);
    int64_t a = b->lo - ch->start;
    int phase = b->phase;
    b->nreq = 0;
    b->phase = phase == 1 && z->stage == 0 ? 2 : 3;
    dt_status st = DT_OK;
    for (int i = 0; st == DT_OK && i < z->nlocal; i++) {
        const dt__device *dev = z->devs[i];
        int64_t me = z->coords[i][z->dp], moff, mlen;
        piece_of(z, b, me, &moff, &mlen);
        if (phase == 2) {
            if (b->borrowed)
                continue; /* received in place */
            st = dev->kind->copy(dev, DT__COPY_H2D,
                                 (char *)dt_tensor_local(ch->flat, i)->data + (size_t)a * dsz,
                                 b->vals[i], (size_t)(b->hi - b->lo) * dsz);
            continue;
        }
        /* Sum in dp-coordinate order (the device's own summand from vals), in place in the
         * first summand's buffer: the same additions as into a separate accumulator. */
        char *own = (char *)b->vals[i] + (size_t)(moff - a) * dsz;
        char *sum = me == 0 ? own : slot(b, i, 0, me, mlen, dsz);
        double ts = dt__zero_cpu_seconds();
        for (int64_t q = 1; q < z->dp_size && mlen > 0; q++)
            dt__host_reduce(DT_REDUCE_SUM, g->gdtype, sum,
                            q == me ? own : slot(b, i, q, me, mlen, dsz), mlen);
        t_sum += dt__zero_cpu_seconds() - ts;
        if (z->stage == 0) {
            /* Stage 0: every device needs the whole sum: send ours, receive the others'. */
            if (mlen > 0 && sum != own)
                memcpy(own, sum, (size_t)mlen * dsz);
            for (int64_t q = 0; st == DT_OK && q < z->dp_size; q++) {
                int64_t off, len;
                piece_of(z, b, q, &off, &len);
                if (q != me && len > 0)
                    st = post(z, b, 0, (char *)b->vals[i] + (size_t)(off - a) * dsz, len, i, q,
                              1);
                if (q != me && mlen > 0 && st == DT_OK)
                    st = post(z, b, 1, own, mlen, i, q, 1);
            }
            continue;
        }
        char *dst;
        if (z->stage == 2) {
            int64_t po, pl;
            part_of(z, ch->len, me, &po, &pl);
            dst = (char *)dt_tensor_local(ch->gpart, i)->data + (size_t)(moff - po) * dsz;
        } else {
            dst = (char *)dt_tensor_local(ch->flat, i)->data + (size_t)moff * dsz;
        }
        if (mlen > 0 && dst != sum)
            st = dev->kind->copy(dev, DT__COPY_H2D, dst, sum, (size_t)mlen * dsz);
    }
    /* Everything but the sums is copies (posting the next messages costs next to nothing). */
    z->t_sum += t_sum;
    z->t_copy += dt__zero_cpu_seconds() - t0 - t_sum;
    return st;
}

static void release(const dt_zero *z, dt__zbucket *b)
{
    for (int i = 0; i < z->nlocal; i++) {
        const dt__device *dev = z->devs[i];
        if (b->vals && b->vals[i] && !b->borrowed)
            dev->kind->host_free(b->vals[i]);
        if (b->recv && b->recv[i])
            dev->kind->host_free(b->recv[i]);
    }
    free(b->vals);
    free(b->recv);
    free(b->reqs);
    free(b->peers);
    free(b->isrecv);
    b->vals = b->recv = NULL;
    b->reqs = NULL;
    b->peers = NULL;
    b->isrecv = NULL;
    b->nreq = 0;
}

/* Tests (wait 0) or waits for bucket b's requests; advances it when they are done. 1 in
 * *busy_out when it is still in flight. */
static dt_status progress(dt_zero *z, dt__zbucket *b, int wait, int *busy_out)
{
    dt_status st = DT_OK;
    *busy_out = 0;
    while (st == DT_OK && (b->phase == 1 || b->phase == 2)) {
        if (wait) {
            st = dt__wait_watched(b->reqs, b->peers, b->nreq, 0, "dt_zero gradient reduction");
            z->comm_failed = st != DT_OK;
        } else {
            int flag = 0;
            int rc = MPI_Testall(b->nreq, b->reqs, &flag, MPI_STATUSES_IGNORE);
            if (rc != MPI_SUCCESS) {
                z->comm_failed = 1;
                return mpi_fail(rc, "MPI_Testall");
            }
            if (!flag) {
                *busy_out = 1;
                return DT_OK;
            }
        }
        if (st == DT_OK)
            st = advance(z, b);
    }
    if (b->phase == 3 && b->vals)
        release(z, b);
    return st;
}

/* Whether the progress thread may complete the buckets' phases itself: when every local device's
 * memory is the host's, the next phase is host sums, memcpy and (stage 0) the next messages,
 * none of which allocates or touches device memory (the runtime's memory cache and device
 * contexts are the caller's thread's). */
static int thread_may_advance(const dt_zero *z)
{
    for (int i = 0; i < z->nlocal; i++)
        if (!z->devs[i]->kind->host_visible)
            return 0;
    return 1;
}

/* The progress thread: while buckets are in flight, tests their requests for a burst of about
 * 100 us and then sleeps 50 us; with none in flight it sleeps 500 us. A shared memory transport
 * moves a large message a few fragments per MPI call, and under load a sleeping thread may
 * wait milliseconds for a core, so one test per wake-up would move the data slowly; the burst
 * lets each wake-up drain what is ready. On host devices it also completes the phases (the
 * sums, the copies into the flat buffer, stage 0's second messages) in start order, as the
 * caller's thread does, so that they run beside the backward pass where a core is free; the
 * staging is freed by the caller's thread (release() goes through the memory cache). A failure
 * is kept for the caller's next call (thread_failure). */
static void *progress_main(void *arg)
{
    dt_zero *z = arg;
    const struct timespec nap = {0, 50000}, idle = {0, 500000};
    int may_advance = thread_may_advance(z);
    while (!atomic_load(&z->prog_stop)) {
        int flying = 0;
        double until = MPI_Wtime() + 100e-6;
        pthread_mutex_lock(&z->lock);
        do {
            flying = 0;
            int in_order = may_advance && z->prog_status == DT_OK;
            for (int k = 0; k < z->nstarted; k++) {
                dt__zbucket *b = &z->buckets[z->order[k]];
                int flag = b->nreq == 0; /* a phase with nothing to move for this client */
                if (b->phase == 1 || b->phase == 2) {
                    if (!flag)
                        MPI_Testall(b->nreq, b->reqs, &flag, MPI_STATUSES_IGNORE);
                    if (flag && in_order) {
                        dt_status st = advance(z, b);
                        if (st != DT_OK) {
                            z->prog_status = st;
                            snprintf(z->prog_error, sizeof z->prog_error, "%s",
                                     dt_last_error());
                            in_order = 0;
                        }
                        flag = b->phase == 3;
                    }
                    flying += !flag;
                }
                in_order = in_order && b->phase == 3;
            }
        } while (flying && MPI_Wtime() < until);
        pthread_mutex_unlock(&z->lock);
        nanosleep(flying ? &nap : &idle, NULL);
    }
    return NULL;
}

/* A phase the progress thread failed to complete, raised on the caller's thread (under the
 * lock or after the thread stopped). */
static dt_status thread_failure(dt_zero *z)
{
    if (z->prog_status == DT_OK)
        return DT_OK;
    z->comm_failed = z->prog_status == DT_ERR_COMM;
    return dt__error(z->prog_status, "%s", z->prog_error);
}

static void progress_stop(dt_zero *z)
{
    if (!z->prog_on)
        return;
    atomic_store(&z->prog_stop, 1);
    pthread_join(z->prog, NULL);
    pthread_mutex_destroy(&z->lock);
    z->prog_on = 0;
}

/* Starts the progress thread for this step when MPI allows calls from several threads (else
 * the buckets move on in the caller's calls only). */
static void progress_start(dt_zero *z)
{
    if (z->prog_on || dt__mpi_thread_level() != MPI_THREAD_MULTIPLE)
        return;
    if (pthread_mutex_init(&z->lock, NULL) != 0)
        return;
    atomic_store(&z->prog_stop, 0);
    if (pthread_create(&z->prog, NULL, progress_main, z) != 0) {
        pthread_mutex_destroy(&z->lock);
        return;
    }
    z->prog_on = 1;
}

/* Gradient bytes of the buckets started and not yet done. */
static int64_t live_bytes(const dt_zero *z)
{
    int64_t sum = 0;
    for (int k = 0; k < z->nstarted; k++) {
        const dt__zbucket *b = &z->buckets[z->order[k]];
        if (b->phase == 1 || b->phase == 2)
            sum += (b->hi - b->lo) * (int64_t)dt_dtype_size(b->group->gdtype);
    }
    return sum;
}

/* Makes room for bucket b under max_live_bytes: completes the oldest buckets in flight (in
 * start order, as every client does, so the waits match up) until b fits or none is left. */
static dt_status make_room(dt_zero *z, const dt__zbucket *b)
{
    int64_t need = (b->hi - b->lo) * (int64_t)dt_dtype_size(b->group->gdtype);
    dt_status st = DT_OK;
    int busy = 0;
    for (int k = 0; st == DT_OK && k < z->nstarted; k++) {
        if (live_bytes(z) + need <= z->max_live_bytes)
            break;
        st = progress(z, &z->buckets[z->order[k]], 1, &busy);
    }
    return st;
}

dt_status dt__zero_buckets_take(dt_zero *z, const dt__zgroup *g, const dt__zparam *p)
{
    progress_start(z);
    if (z->prog_on)
        pthread_mutex_lock(&z->lock);
    dt_status st = thread_failure(z);
    /* The buckets done by now first, so that their staging goes before new staging comes. */
    int busy = 0;
    for (int k = 0; st == DT_OK && !busy && k < z->nstarted; k++)
        st = progress(z, &z->buckets[z->order[k]], 0, &busy);
    for (int k = 0; st == DT_OK && k < z->nbuckets; k++) {
        dt__zbucket *b = &z->buckets[k];
        if (b->group == g && p->offset < b->hi && p->offset + p->n > b->lo &&
            --b->waiting == 0) {
            st = make_room(z, b);
            if (st == DT_OK) {
                z->order[z->nstarted++] = k;
                st = start(z, b);
            }
        }
    }
    /* In the order they were started (the same on every client), stopping at the first still
     * in flight: every client posts the messages of the second phase in the same order. */
    busy = 0;
    for (int k = 0; st == DT_OK && !busy && k < z->nstarted; k++)
        st = progress(z, &z->buckets[z->order[k]], 0, &busy);
    if (z->prog_on)
        pthread_mutex_unlock(&z->lock);
    return st;
}

dt_status dt__zero_buckets_wait(dt_zero *z)
{
    progress_stop(z);
    dt_status st = thread_failure(z);
    int busy = 0;
    for (int k = 0; st == DT_OK && k < z->nstarted; k++)
        st = progress(z, &z->buckets[z->order[k]], 1, &busy);
    return st;
}

void dt__zero_buckets_free(dt_zero *z)
{
    progress_stop(z);
    for (int k = 0; k < z->nbuckets; k++) {
        dt__zbucket *b = &z->buckets[k];
        int flying = b->nreq > 0 && (b->phase == 1 || b->phase == 2);
        if (flying && z->comm_failed) {
            /* A peer is lost or MPI failed: waiting would only take the timeout again per
             * bucket, delaying the error. The receives are cancelled and every request
             * dropped; MPI may still touch the buffers, so they are left allocated (after
             * such an error the job can only end). */
            for (int j = 0; j < b->nreq; j++)
                if (b->reqs[j] != MPI_REQUEST_NULL) {
                    if (b->isrecv[j])
                        MPI_Cancel(&b->reqs[j]);
                    MPI_Request_free(&b->reqs[j]);
                }
            free(b->reqs);
            free(b->isrecv);
            free(b->peers);
            free(b->vals);
            free(b->recv);
            memset(b, 0, sizeof *b);
            continue;
        }
        if (flying)
            (void)dt__wait_watched(b->reqs, b->peers, b->nreq, 0,
                                   "dt_zero gradient reduction (dropped step)");
        release(z, b);
    }
    free(z->buckets);
    free(z->order);
    z->buckets = NULL;
    z->order = NULL;
    z->nbuckets = 0;
    z->nstarted = 0;
}
