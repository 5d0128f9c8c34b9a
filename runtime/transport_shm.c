/* The same-host shared-memory transport (issue 20): a sender offers each box where it lies,
 * in its own segment of the shm pool (runtime/shm_pool.c), by a descriptor in the channel to
 * the receiver; the receiver copies the box straight out of the sender's segment (one copy,
 * strided boxes included) or, for a reduction, reads it in place (exchange_view), then counts
 * it consumed, which the sender waits for before its memory may change. Flags are C11
 * atomics in shared memory; no MPI in this data path. A box outside the pool, or a peer on
 * another host, goes by MPI (packed) inside the same exchange, so the transport composes with
 * the two-level route across hosts. Waits answer pings and name a lost peer through the
 * watchdog like the other transports'. A receiver that finds another box or number of boxes
 * than it expected (clients in different relayouts) drains the whole exchange from that peer
 * before failing, so that the next exchange starts in step. docs/transports.md, "shm". */
#include <errno.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "runtime/device.h"
#include "runtime/comm.h"
#include "runtime/error.h"
#include "runtime/transport.h"
#include "runtime/util.h"
#include "runtime/shm.h"

enum {
    SHM_TAG = 7401, /* its own: the barrier (layout/barrier.c) has 7201 */
    PROBE_EVERY = 256,              /* spins between answers to pings */
    SPIN_IDLE = 64,                 /* idle spins (yielding) before a wait naps, when it does */
    NAP_NS = 20000,                 /* one nap (the kernel's timer slack adds ~50 us) */
};
#define LOOK_EVERY 0.05 /* seconds between looks for a vanished host peer while idle */
#define MPI_PIECE ((size_t)1 << 30) /* bytes per MPI message of a packed box */

/* Descriptors posted to / read from each host peer since dt_init (both sides count alike). */
static uint64_t *sent, *got;
static int ncount;
static int known_over = -1; /* oversubscribed(): -1 until first asked */
/* Bytes this client received: copied from a peer's segment, read there in place, by MPI. */
static _Atomic uint64_t bytes_direct, bytes_viewed, bytes_mpi;
/* Seconds this client spent in the phases of its exchanges (dt__transport_shm_phases). */
static double phase_s[DT__SHM_PHASES];
/* Until when (dt__now_seconds) an idle wait spins without yielding: set by the ragged
 * all-to-all for its run (a time slice lost to a yield on a busy host costs more than the
 * whole exchange of a megabyte), 0 otherwise. */
static double spin_until;

void dt__transport_shm_bytes(uint64_t *direct, uint64_t *viewed, uint64_t *mpi)
{
    *direct = bytes_direct;
    *viewed = bytes_viewed;
    *mpi = bytes_mpi;
}

void dt__transport_shm_phases(double out[DT__SHM_PHASES])
{
    memcpy(out, phase_s, sizeof phase_s);
}

typedef enum { ST_POST, ST_DESC, ST_MPI, ST_DONE } op_state;

typedef struct op {
    const dt__xfer *x;
    int sending;
    int local;            /* the peer's host index, -1: another host */
    op_state st;
    uint64_t seq;         /* its descriptor's number in the channel */
    int via_mpi;
    void *buf;            /* the packed box for MPI */
    size_t bytes;
    size_t req0, nreq;    /* its MPI requests */
    int viewed;           /* a receive read in place: consumed at views_done */
} op;

/* This exchange with one host peer. */
typedef struct pair {
    int client;           /* its client id (when nsend or nrecv) */
    uint32_t nsend, nrecv; /* boxes this client sends it and expects from it */
    uint64_t got0;        /* got[] when the exchange began: its first descriptor's number */
    uint32_t theirs;      /* its nbox, from its first descriptor */
    int draining;         /* its descriptors are read and dropped until got[] reaches end */
    uint64_t end;
    int stranded;         /* it takes none of this client's: they are left (DT_ERR_COMM) */
    dt__xfer mark;        /* the transfer of a marker (no box) posted to it */
} pair;

/* What a run found wrong: 0, DT_ERR_STATE (clients in different calls, everything drained)
 * or DT_ERR_COMM (descriptors left behind); the detail of the first of the worst. */
typedef struct verdict {
    dt_status st;
    char why[512];
} verdict;

typedef struct run {
    op *ops;              /* room for a marker per host peer after the n transfers */
    size_t n, nrecvs;
    MPI_Request *reqs;
    int *req_peer;
    size_t nreq, cap_req;
    dt__region *views;    /* NULL: copy the receives */
    uint64_t *target;     /* per host peer: sent[] once this exchange's posts are in */
    pair *pairs;          /* per host peer */
    verdict v;
} run;

static void disagree(run *r, dt_status st, const char *fmt, ...)
{
    if (r->v.st == DT_ERR_COMM || r->v.st == st)
        return; /* the first of the worst is kept */
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->v.why, sizeof r->v.why, fmt, ap);
    va_end(ap);
    r->v.st = st;
}

/* 1 if the channels with host peer l were left out of step by an earlier exchange. */
static int chan_broken(int l)
{
    return atomic_load_explicit(&dt__shm_chan_of(l, dt__shm_self())->broken,
                                memory_order_acquire) ||
           atomic_load_explicit(&dt__shm_chan_of(dt__shm_self(), l)->broken,
                                memory_order_acquire);
}

static dt_status counters(void)
{
    int n = 0;
    for (int c = 0; c < dt_num_clients(); c++)
        n += dt__shm_local(c) >= 0;
    if (n == ncount && sent)
        return DT_OK;
    free(sent);
    free(got);
    sent = calloc((size_t)n + 1, sizeof *sent);
    got = calloc((size_t)n + 1, sizeof *got);
    ncount = n;
    if (!sent || !got)
        return dt__error(DT_ERR_NO_MEMORY, "shm transport: no memory");
    return DT_OK;
}

/* dt_init (transport.c): the channels start at zero again. */
void dt__transport_shm_reset(void)
{
    free(sent);
    free(got);
    sent = got = NULL;
    ncount = 0;
    known_over = -1;
}

static void copy_run(void *dst, const void *src, int64_t n, void *arg)
{
    dt__copy_large(dst, src, (size_t)n * *(const size_t *)arg);
}

/* Copies the box `count` from the array (base, shape) at `sstart` into the array at dstart. */
static void box_copy(const dt__region *to, const void *sbase, const int64_t *sshape,
                     const int64_t *sstart)
{
    int64_t zero[DT_MAX_RANK] = {0}, soff[DT_MAX_RANK];
    for (int d = 0; d < to->rank; d++)
        soff[d] = to->start[d] - sstart[d];
    dt__box_apply(to->rank, to->elem, to->start, to->count, to->base, zero, to->shape, sbase,
                  soff, sshape, copy_run, (void *)&to->elem);
}

/* Packs (pack 1) the region's box into buf, or unpacks it. */
static void pack(const dt__region *r, void *buf, int to_buf)
{
    dt__region c = *r;
    int64_t zero[DT_MAX_RANK] = {0};
    memcpy(c.shape, r->count, sizeof c.shape);
    memset(c.start, 0, sizeof c.start);
    if (to_buf) {
        c.base = buf;
        box_copy(&c, r->base, r->shape, r->start);
    } else {
        dt__region to = *r;
        box_copy(&to, buf, c.shape, zero);
    }
}

static dt_status mpi_post(run *r, op *o)
{
    size_t pieces = o->bytes ? (o->bytes + MPI_PIECE - 1) / MPI_PIECE : 1;
    if (r->nreq + pieces > r->cap_req) {
        size_t cap = 2 * (r->nreq + pieces);
        MPI_Request *q = realloc(r->reqs, cap * sizeof *q);
        if (q)
            r->reqs = q;
        int *p = q ? realloc(r->req_peer, cap * sizeof *p) : NULL;
        if (!q || !p)
            return dt__error(DT_ERR_NO_MEMORY, "shm transport: no memory for MPI requests");
        r->req_peer = p;
        r->cap_req = cap;
    }
    o->req0 = r->nreq;
    o->nreq = pieces;
    for (size_t k = 0; k < pieces; k++) {
        size_t off = k * MPI_PIECE, len = o->bytes - off < MPI_PIECE ? o->bytes - off : MPI_PIECE;
        if (!o->bytes)
            off = len = 0;
        MPI_Request *q = &r->reqs[r->nreq];
        int rc = o->sending ? MPI_Isend((char *)o->buf + off, (int)len, MPI_BYTE, o->x->peer,
                                        SHM_TAG, dt__comm(), q)
                            : MPI_Irecv((char *)o->buf + off, (int)len, MPI_BYTE, o->x->peer,
                                        SHM_TAG, dt__comm(), q);
        if (rc != MPI_SUCCESS)
            return dt__error(DT_ERR_COMM, "shm transport: MPI %s with client %d failed",
                             o->sending ? "Isend" : "Irecv", o->x->peer);
        r->req_peer[r->nreq++] = o->x->peer;
    }
    o->st = ST_MPI;
    return DT_OK;
}

/* Starts an op: MPI for another host, a packed box outside the pool, or its descriptor. */
static dt_status start(run *r, op *o)
{
    const dt__region *g = &o->x->region;
    o->bytes = dt__region_bytes(g);
    if (o->local < 0 || (o->sending && o->via_mpi)) {
        o->buf = malloc(o->bytes ? o->bytes : 1);
        if (!o->buf)
            return dt__error(DT_ERR_NO_MEMORY, "shm transport: no memory to pack %zu bytes",
                             o->bytes);
        if (o->sending)
            pack(g, o->buf, 1);
        dt_status st = mpi_post(r, o);
        if (st == DT_OK && o->local >= 0)
            o->st = ST_POST; /* its descriptor tells the peer to receive it */
        return st;
    }
    o->st = o->sending ? ST_POST : ST_DESC;
    return DT_OK;
}

/* Writes a send's descriptor (or a marker) when its ring slot is free; 1 if it did. */
static int try_post(const run *r, op *o)
{
    dt__shm_chan *ch = dt__shm_chan_of(dt__shm_self(), o->local);
    if (o->seq - atomic_load_explicit(&ch->taken, memory_order_acquire) >= DT__SHM_RING)
        return 0;
    dt__shm_desc *d = &ch->ring[o->seq % DT__SHM_RING];
    const dt__region *g = &o->x->region;
    int64_t off = o->via_mpi ? -1 : dt__shm_offset(g->base, 0);
    if (!o->via_mpi && off < 0)
        off = 0; /* an empty box of memory outside the pool: nothing is read */
    d->offset = off;
    memcpy(d->shape, g->shape, sizeof d->shape);
    memcpy(d->start, g->start, sizeof d->start);
    memcpy(d->count, g->count, sizeof d->count);
    d->bytes = dt__region_bytes(g);
    d->nbox = r->pairs[o->local].nsend;
    d->nrecv = r->pairs[o->local].nrecv;
    atomic_store_explicit(&ch->posted, o->seq + 1, memory_order_release);
    if (o->via_mpi) {
        o->st = ST_MPI; /* its requests were posted by start() */
        return 1;
    }
    o->st = ST_DONE; /* the channel's consumed count says when the peer read it */
    return 1;
}

/* Receives a box sent packed by MPI that nobody wants (a drained descriptor's) and drops it,
 * so that the sender's request completes and the next MPI receive from it matches its own. */
static dt_status drop_mpi(int peer, uint64_t bytes)
{
    size_t cap = bytes < MPI_PIECE ? (size_t)bytes : MPI_PIECE;
    void *scratch = malloc(cap ? cap : 1);
    if (!scratch)
        return dt__error(DT_ERR_NO_MEMORY, "shm transport: no memory to drain %llu bytes",
                         (unsigned long long)bytes);
    dt_status st = DT_OK;
    uint64_t off = 0;
    do {
        size_t len = bytes - off < MPI_PIECE ? (size_t)(bytes - off) : MPI_PIECE;
        MPI_Request q;
        if (MPI_Irecv(scratch, (int)len, MPI_BYTE, peer, SHM_TAG, dt__comm(), &q) !=
            MPI_SUCCESS)
            st = dt__error(DT_ERR_COMM, "shm transport: MPI Irecv from client %d failed", peer);
        else
            st = dt__wait_watched(&q, &peer, 1, 0, "shm relayout exchange (drain)");
        off += len;
    } while (st == DT_OK && off < bytes);
    free(scratch);
    return st;
}

/* Takes descriptor d of host peer l, read and dropped: counted consumed, so that the sender
 * does not wait for it. */
static dt_status drop(const run *r, int l, const dt__shm_desc *d)
{
    if (d->nbox && d->offset < 0) {
        dt_status st = drop_mpi(r->pairs[l].client, d->bytes);
        if (st != DT_OK)
            return st;
    }
    atomic_fetch_add_explicit(&dt__shm_chan_of(l, dt__shm_self())->consumed, 1,
                              memory_order_release);
    return DT_OK;
}

/* Drains host peer l's remaining descriptors of this exchange as they are posted. */
static int drain_some(run *r, int l, dt_status *st)
{
    pair *p = &r->pairs[l];
    dt__shm_chan *ch = dt__shm_chan_of(l, dt__shm_self());
    int moved = 0;
    while (*st == DT_OK && got[l] < p->end &&
           atomic_load_explicit(&ch->posted, memory_order_acquire) > got[l]) {
        dt__shm_desc d = ch->ring[got[l] % DT__SHM_RING];
        got[l]++;
        atomic_store_explicit(&ch->taken, got[l], memory_order_release);
        *st = drop(r, l, &d);
        moved = 1;
    }
    return moved;
}

/* A marker to host peer l, which expects boxes from this client where it sends none: the
 * peer's wait ends there, and it drains. */
static void post_marker(run *r, int l)
{
    pair *p = &r->pairs[l];
    op *m = &r->ops[r->n++];
    memset(m, 0, sizeof *m);
    memset(&p->mark, 0, sizeof p->mark);
    p->mark.peer = p->client;
    m->x = &p->mark;
    m->sending = 1;
    m->local = l;
    m->seq = sent[l]++;
    r->target[l] = sent[l];
    m->st = ST_POST;
}

/* The first descriptor of this exchange from host peer l: the peer's tally against this
 * client's. 1 if the peer sends another number of boxes than expected (drain it). */
static int check_tally(run *r, int l, const dt__shm_desc *d)
{
    pair *p = &r->pairs[l];
    p->theirs = d->nbox;
    if (d->nrecv == 0 && p->nsend > 0) {
        /* It reads nothing of this client's in this exchange: what this client posted it
         * stays in the channel, where its next exchange would take it for its own. */
        atomic_store_explicit(&dt__shm_chan_of(dt__shm_self(), l)->broken, 1,
                              memory_order_release);
        p->stranded = 1;
        disagree(r, DT_ERR_COMM, "shm transport: client %d expects no box from this client, "
                 "which posted it %u box(es), left in the channel: tear the runtime down; "
                 DT__MISMATCH_HINT, p->client, p->nsend);
    } else if (d->nrecv > 0 && p->nsend == 0) {
        post_marker(r, l);
        disagree(r, DT_ERR_STATE, "shm transport: client %d expects %u box(es) from this "
                 "client, which sends it none: " DT__MISMATCH_HINT, p->client, d->nrecv);
    } else if (d->nrecv != p->nsend) {
        disagree(r, DT_ERR_STATE, "shm transport: client %d expects %u box(es) from this "
                 "client, which sends it %u: " DT__MISMATCH_HINT, p->client, d->nrecv,
                 p->nsend);
    }
    if (d->nbox == p->nrecv)
        return 0;
    if (d->nbox == 0)
        disagree(r, DT_ERR_STATE, "shm transport: client %d sends no box where this client "
                 "expected %u: " DT__MISMATCH_HINT, p->client, p->nrecv);
    else
        disagree(r, DT_ERR_STATE, "shm transport: client %d sends %u box(es) where this "
                 "client expected %u: " DT__MISMATCH_HINT, p->client, d->nbox, p->nrecv);
    return 1;
}

/* Reads a receive's descriptor once posted, in order per peer: copies the box, gives a view
 * of it, or posts the MPI receive of a box sent packed. 1 if it moved on. Another box, or
 * another number of them, than expected: the peer's descriptors of this exchange are all
 * drained instead (its other receives here end unfilled), and the run's verdict says why. */
static int try_read(run *r, op *o, dt_status *st)
{
    pair *p = &r->pairs[o->local];
    if (p->draining) {
        o->st = ST_DONE;
        return 1;
    }
    dt__shm_chan *ch = dt__shm_chan_of(o->local, dt__shm_self());
    if (got[o->local] != o->seq ||
        atomic_load_explicit(&ch->posted, memory_order_acquire) <= o->seq)
        return 0;
    dt__shm_desc d = ch->ring[o->seq % DT__SHM_RING];
    got[o->local]++;
    atomic_store_explicit(&ch->taken, o->seq + 1, memory_order_release);
    const dt__region *g = &o->x->region;
    size_t i = (size_t)(o - r->ops);
    int other_count = o->seq == p->got0 && check_tally(r, o->local, &d);
    int other_box = d.nbox && (d.bytes != dt__region_bytes(g) ||
                               memcmp(d.count, g->count, (size_t)g->rank * sizeof *d.count) != 0);
    if (other_count || other_box) {
        if (other_box && !other_count) {
            char want[96], sent_box[96];
            dt__shape_str(g->rank, g->count, want, sizeof want);
            dt__shape_str(g->rank, d.count, sent_box, sizeof sent_box);
            disagree(r, DT_ERR_STATE, "shm transport: client %d offered a box %s of %llu bytes "
                     "where this client expected %s of %zu: " DT__MISMATCH_HINT, o->x->peer,
                     sent_box, (unsigned long long)d.bytes, want, dt__region_bytes(g));
        }
        p->draining = 1;
        p->end = p->got0 + (p->theirs ? p->theirs : 1); /* a marker is one descriptor */
        o->st = ST_DONE;
        *st = drop(r, o->local, &d);
        return 1;
    }
    if (d.offset < 0) {
        o->bytes = dt__region_bytes(g);
        o->buf = malloc(o->bytes ? o->bytes : 1);
        if (!o->buf) {
            *st = dt__error(DT_ERR_NO_MEMORY, "shm transport: no memory for %zu bytes",
                            o->bytes);
            return 1;
        }
        *st = mpi_post(r, o);
        return 1;
    }
    unsigned char *base = dt__shm_segment(o->local) + d.offset;
    if (r->views) {
        dt__region *v = &r->views[i];
        *v = *g;
        v->base = base;
        v->dev = NULL;
        memcpy(v->shape, d.shape, sizeof v->shape);
        memcpy(v->start, d.start, sizeof v->start);
        o->viewed = 1;
        bytes_viewed += dt__region_bytes(g);
    } else {
        double t0 = dt__now_seconds();
        box_copy(g, base, d.shape, d.start);
        phase_s[DT__SHM_PEER_COPY] += dt__now_seconds() - t0;
        bytes_direct += dt__region_bytes(g);
        atomic_fetch_add_explicit(&ch->consumed, 1, memory_order_release);
    }
    o->st = ST_DONE;
    return 1;
}

/* An op whose MPI requests all completed: a receive is unpacked (or becomes the view). */
static void mpi_done(run *r, op *o)
{
    size_t i = (size_t)(o - r->ops);
    if (!o->sending) {
        bytes_mpi += o->bytes;
        if (r->views) {
            dt__region *v = &r->views[i];
            *v = o->x->region;
            v->base = o->buf;
            v->dev = NULL;
            memcpy(v->shape, v->count, sizeof v->shape);
            memset(v->start, 0, sizeof v->start);
        } else {
            pack(&o->x->region, o->buf, 0);
        }
        if (o->local >= 0) /* a same-host box sent packed: counted like the others */
            atomic_fetch_add_explicit(&dt__shm_chan_of(o->local, dt__shm_self())->consumed, 1,
                                      memory_order_release);
    }
    o->st = ST_DONE;
}

static int requests_done(const run *r, const op *o)
{
    for (size_t k = o->req0; k < o->req0 + o->nreq; k++)
        if (r->reqs[k] != MPI_REQUEST_NULL)
            return 0;
    return 1;
}

/* 1 if every host peer consumed what this client sent it. */
static int sends_consumed(const run *r, int *who_out, int *k_out)
{
    int done = 1;
    for (int l = 0; l < ncount; l++) {
        if (l == dt__shm_self() || !r->target[l] || r->pairs[l].stranded)
            continue;
        dt__shm_chan *ch = dt__shm_chan_of(dt__shm_self(), l);
        if (atomic_load_explicit(&ch->consumed, memory_order_acquire) < r->target[l]) {
            done = 0;
            if (who_out)
                for (int c = 0; c < dt_num_clients(); c++)
                    if (dt__shm_local(c) == l)
                        who_out[(*k_out)++] = c;
        }
    }
    return done;
}

/* 1 if process `pid` (a host peer) has ended: no such process, or a zombie not yet reaped. */
static int gone(pid_t pid)
{
    if (kill(pid, 0) != 0 && errno == ESRCH)
        return 1;
    char path[64], buf[256];
    snprintf(path, sizeof path, "/proc/%ld/stat", (long)pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return 0;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    const char *paren = strrchr(buf, ')'); /* the state follows the command name */
    return paren && paren[1] == ' ' && (paren[2] == 'Z' || paren[2] == 'X');
}

/* The clients this run still waits for, and which of them are known gone. */
static int waited_for(const run *r, int finish, int *who, int *dead)
{
    int k = 0;
    for (size_t i = 0; i < r->n; i++) {
        const op *o = &r->ops[i];
        int waits = o->st != ST_DONE && (finish || !o->sending || o->st == ST_POST);
        if (!waits)
            continue;
        int seen = 0;
        for (int j = 0; j < k && !seen; j++)
            seen = who[j] == o->x->peer;
        if (!seen)
            who[k++] = o->x->peer;
    }
    for (int l = 0; l < ncount; l++) {
        const pair *p = &r->pairs[l];
        int seen = !p->draining || got[l] >= p->end;
        for (int j = 0; j < k && !seen; j++)
            seen = who[j] == p->client;
        if (!seen)
            who[k++] = p->client;
    }
    if (finish) {
        int extra[1024], m = 0;
        if (dt_num_clients() <= 1024)
            sends_consumed(r, extra, &m);
        for (int e = 0; e < m; e++) {
            int seen = 0;
            for (int j = 0; j < k && !seen; j++)
                seen = who[j] == extra[e];
            if (!seen)
                who[k++] = extra[e];
        }
    }
    for (int j = 0; j < k; j++) {
        int l = dt__shm_local(who[j]);
        pid_t pid = l >= 0 ? dt__shm_pid(l) : 0;
        dead[j] = pid <= 0 ? 0 : gone(pid) ? -1 : 1; /* the watchdog's state */
    }
    return k;
}

/* 1 when this host runs more of the job's processes than this process may use cores: then a
 * wait naps once its peer is clearly busy, rather than take the core the peer needs. With a
 * core each, a wait only yields: a nap would give the core to other jobs, and the wake-up
 * waits for one again (docs/transports.md, "Waits"). */
static int oversubscribed(void)
{
    if (known_over < 0) {
        cpu_set_t set;
        int cores = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 0;
        if (cores <= 0)
            cores = (int)sysconf(_SC_NPROCESSORS_ONLN);
        known_over = ncount > cores;
    }
    return known_over;
}

/* Moves the run on until every receive is done and every send posted (finish 0), or also
 * every send consumed and its MPI requests complete (finish 1). */
static dt_status progress(run *r, int finish, const char *what)
{
    const char *bad = NULL;
    double timeout = dt__comm_timeout(&bad), last = dt__now_seconds();
    int rounds = 0, n = dt_num_clients();
    int *who = malloc(((size_t)n + r->n + 1) * sizeof *who);
    int *dead = malloc(((size_t)n + r->n + 1) * sizeof *dead);
    int *done = malloc((r->nreq + r->n + 1) * sizeof *done);
    dt_status st = DT_OK;
    if (!who || !dead || !done)
        st = dt__error(DT_ERR_NO_MEMORY, "%s: no memory", what);
    double last_look = last, t_in = last, t_left = -1;
    unsigned idle_spins = 0;
    for (unsigned spins = 1; st == DT_OK; spins++) {
        int moved = 0, left = 0;
        for (size_t i = 0; i < r->n && st == DT_OK; i++) {
            op *o = &r->ops[i];
            if (o->sending && o->local >= 0 && o->st != ST_DONE && r->pairs[o->local].stranded)
                o->st = ST_DONE; /* never read: its MPI requests are cancelled at the end */
            if (o->st == ST_POST)
                moved |= try_post(r, o);
            else if (o->st == ST_DESC)
                moved |= try_read(r, o, &st);
            else if (o->st == ST_MPI && requests_done(r, o)) {
                mpi_done(r, o);
                moved = 1;
            }
            if (o->st != ST_DONE && (finish || !o->sending || o->st == ST_POST))
                left = 1;
        }
        for (int l = 0; l < ncount && st == DT_OK; l++)
            if (r->pairs[l].draining && got[l] < r->pairs[l].end) {
                moved |= drain_some(r, l, &st);
                left |= got[l] < r->pairs[l].end;
            }
        if (st != DT_OK)
            break;
        if (r->nreq) {
            int outcount = 0;
            if (MPI_Testsome((int)r->nreq, r->reqs, &outcount, done, MPI_STATUSES_IGNORE) !=
                MPI_SUCCESS) {
                st = dt__error(DT_ERR_COMM, "%s: MPI_Testsome failed", what);
                break;
            }
            if (outcount > 0 && outcount != MPI_UNDEFINED)
                moved = 1;
        }
        if (!left && t_left < 0)
            t_left = dt__now_seconds();
        if (!left && (!finish || sends_consumed(r, NULL, NULL)))
            break;
        if (moved) {
            last = dt__now_seconds();
            idle_spins = 0;
            continue;
        }
        if (spins % PROBE_EVERY == 0)
            dt__watchdog_answer();
        if (spin_until > 0 && dt__now_seconds() < spin_until)
            continue; /* a bounded busy spin first (the ragged all-to-all) */
        /* Yield to the one we wait for; with more processes than cores, once it is clearly
         * busy (a copy of megabytes), nap so as not to take its core. */
        if (++idle_spins < SPIN_IDLE || !oversubscribed())
            sched_yield();
        else
            nanosleep(&(struct timespec){0, NAP_NS}, NULL);
        double now = dt__now_seconds(), idle = now - last;
        int look = idle > timeout || (idle > LOOK_EVERY && now - last_look > LOOK_EVERY);
        if (!look)
            continue;
        last_look = now;
        int k = waited_for(r, finish, who, dead), ndead = 0;
        for (int j = 0; j < k; j++)
            ndead += dead[j] < 0;
        if (!ndead && idle <= timeout)
            continue;
        st = dt__watchdog_stalled(who, dead, k, timeout, &rounds, what);
        last = dt__now_seconds();
    }
    double t_out = dt__now_seconds();
    if (t_left < 0)
        t_left = t_out;
    phase_s[DT__SHM_PROGRESS] += t_left - t_in;
    phase_s[DT__SHM_HANDOFF] += t_out - t_left;
    (void)bad;
    free(who);
    free(dead);
    free(done);
    return st;
}

/* Drops a run: cancels what MPI still holds (after an error), frees the buffers. */
static void run_free(run *r)
{
    if (!r)
        return;
    for (size_t k = 0; k < r->nreq; k++)
        if (r->reqs[k] != MPI_REQUEST_NULL) {
            MPI_Cancel(&r->reqs[k]);
            MPI_Request_free(&r->reqs[k]);
        }
    for (size_t i = 0; i < r->n; i++)
        free(r->ops[i].buf);
    free(r->ops);
    free(r->reqs);
    free(r->req_peer);
    free(r->target);
    free(r->pairs);
    free(r);
}

/* Builds and starts the run of one exchange: receives first (ops[0..nrecvs)). */
static dt_status run_start(const dt__xfer *sends, size_t nsends, const dt__xfer *recvs,
                           size_t nrecvs, dt__region *views, run **out)
{
    *out = NULL;
    if (!dt__shm_up())
        return dt__error(DT_ERR_STATE, "shm transport: %s", dt__shm_absence());
    dt_status st = counters();
    if (st != DT_OK)
        return st;
    const char *bad = NULL;
    dt__comm_timeout(&bad);
    if (bad)
        return dt__error(DT_ERR_INVALID_ARGUMENT,
                         "relayout: DT_COMM_TIMEOUT='%s' is not a number of seconds > 0", bad);
    run *r = calloc(1, sizeof *r);
    if (r) {
        r->n = nsends + nrecvs;
        r->nrecvs = nrecvs;
        r->views = views;
        r->ops = calloc(r->n + (size_t)ncount + 1, sizeof *r->ops);
        r->target = calloc((size_t)ncount + 1, sizeof *r->target);
        r->pairs = calloc((size_t)ncount + 1, sizeof *r->pairs);
    }
    if (!r || !r->ops || !r->target || !r->pairs) {
        run_free(r);
        return dt__error(DT_ERR_NO_MEMORY, "shm transport: no memory for %zu transfers",
                         nsends + nrecvs);
    }
    for (size_t i = 0; i < r->n && st == DT_OK; i++) {
        op *o = &r->ops[i];
        o->sending = i >= nrecvs;
        o->x = o->sending ? &sends[i - nrecvs] : &recvs[i];
        if (o->x->peer < 0 || o->x->peer >= dt_num_clients() || o->x->peer == dt_client_id()) {
            st = dt__error(DT_ERR_INVALID_ARGUMENT, "shm transport: no other client %d",
                           o->x->peer);
            break;
        }
        const dt__region *g = &o->x->region;
        if (g->dev && !g->dev->kind->host_visible) {
            st = dt__error(DT_ERR_UNSUPPORTED,
                           "the shm transport moves host memory only, not %s device memory "
                           "(client %d)", g->dev->kind->name, o->x->peer);
            break;
        }
        o->local = dt__shm_local(o->x->peer);
        if (o->local >= 0 && chan_broken(o->local)) {
            st = dt__error(DT_ERR_COMM, "shm transport: the channels with client %d were left "
                           "out of step by an earlier exchange (clients in different relayouts "
                           "whose boxes could not all be drained): tear the runtime down",
                           o->x->peer);
            break;
        }
        if (o->local >= 0) {
            pair *p = &r->pairs[o->local];
            p->client = o->x->peer;
            p->got0 = got[o->local];
            if (o->sending)
                p->nsend++;
            else
                p->nrecv++;
        }
    }
    for (size_t i = 0; i < r->n && st == DT_OK; i++) {
        op *o = &r->ops[i];
        const dt__region *g = &o->x->region;
        if (o->local >= 0) {
            o->seq = o->sending ? sent[o->local]++ : got[o->local] + 0;
            if (o->sending) {
                size_t bytes = dt__region_bytes(g);
                /* The whole array must lie in the segment (the box is read through its
                 * shape); a box of a user's buffer goes by MPI. */
                size_t extent = g->elem;
                for (int d = 0; d < g->rank; d++)
                    extent *= (size_t)g->shape[d];
                o->via_mpi = bytes && dt__shm_offset(g->base, extent) < 0;
                r->target[o->local] = sent[o->local];
            }
        }
        st = start(r, o);
    }
    /* Receives from one peer take its descriptors in list order. */
    for (int l = 0; l < ncount; l++) {
        uint64_t s = got[l];
        for (size_t i = 0; i < nrecvs; i++)
            if (r->ops[i].local == l)
                r->ops[i].seq = s++;
    }
    if (st != DT_OK) {
        run_free(r);
        return st;
    }
    *out = r;
    return DT_OK;
}

/* The run's outcome once its progress ended with st: a hard failure first, else what it
 * found wrong (everything drained: DT_ERR_STATE; descriptors left: DT_ERR_COMM). */
static dt_status outcome(const run *r, dt_status st)
{
    if (st != DT_OK || !r || r->v.st == DT_OK)
        return st;
    return dt__error(r->v.st, "%s", r->v.why);
}

/* Counts consumed the receives read in place (their views are no longer read). */
static void release_views(run *r)
{
    for (size_t i = 0; i < r->nrecvs; i++)
        if (r->ops[i].viewed) {
            r->ops[i].viewed = 0;
            atomic_fetch_add_explicit(&dt__shm_chan_of(r->ops[i].local, dt__shm_self())->consumed,
                                      1, memory_order_release);
        }
}

static dt_status shm_exchange(const dt__xfer *sends, size_t nsends, const dt__xfer *recvs,
                              size_t nrecvs, void (*local_work)(void *), void *arg)
{
    run *r = NULL;
    double t0 = dt__now_seconds();
    dt_status st = nsends + nrecvs ? run_start(sends, nsends, recvs, nrecvs, NULL, &r) : DT_OK;
    /* Posts first, so the peers can start copying; then the local copies while they do, not
     * a wait for a peer that is late; the receives after. */
    for (size_t i = 0; st == DT_OK && r && i < r->n; i++)
        if (r->ops[i].st == ST_POST)
            try_post(r, &r->ops[i]);
    double t1 = dt__now_seconds();
    phase_s[DT__SHM_SETUP] += t1 - t0;
    if (st == DT_OK && local_work)
        local_work(arg);
    phase_s[DT__SHM_LOCAL] += dt__now_seconds() - t1;
    if (st == DT_OK && r)
        st = outcome(r, progress(r, 1, "shm relayout exchange"));
    t0 = dt__now_seconds();
    run_free(r);
    phase_s[DT__SHM_SETUP] += dt__now_seconds() - t0;
    return st;
}

static dt_status shm_exchange_view(const dt__xfer *sends, size_t nsends, const dt__xfer *recvs,
                                   size_t nrecvs, dt__region *views,
                                   void (*local_work)(void *), void *arg, void **token)
{
    run *r = NULL;
    *token = NULL;
    dt_status st = run_start(sends, nsends, recvs, nrecvs, views, &r);
    if (st == DT_OK && local_work)
        local_work(arg);
    if (st == DT_OK)
        st = progress(r, 0, "shm relayout exchange");
    if (st == DT_OK && r->v.st != DT_OK) {
        /* No views_done follows a failure: the sends are seen consumed here. */
        release_views(r);
        st = outcome(r, progress(r, 1, "shm relayout exchange"));
    }
    if (st != DT_OK) {
        run_free(r);
        return st;
    }
    *token = r;
    return DT_OK;
}

static dt_status shm_views_done(void *token)
{
    run *r = token;
    if (!r)
        return DT_OK;
    release_views(r);
    dt_status st = outcome(r, progress(r, 1, "shm relayout exchange"));
    run_free(r);
    return st;
}

/* ---- the ragged all-to-all (dt_alltoallv) ----
 * Native on the channels: each member offers its block for member j where it lies (a
 * descriptor of bytes at send + send_displs[j] in its own segment), and member j copies it
 * straight into its receive buffer (one copy, no staging, no MPI for the data); pairs with
 * no bytes post nothing, the caller having agreed every size. Its own block is copied, then
 * the caller's local work runs, while the peers copy out of this member's segment. A block
 * outside the pool or a member on another host goes by MPI inside the same run, as in
 * exchange(). */

typedef struct a2av_local {
    const dt__coll *colls;
    size_t n;
} a2av_local;

static void a2av_self(void *arg)
{
    const a2av_local *a = arg;
    for (size_t i = 0; i < a->n; i++) {
        const dt__coll *c = &a->colls[i];
        size_t b = c->send_bytes[c->rank];
        if (b)
            dt__copy_large((char *)c->recv + c->recv_displs[c->rank],
                           (const char *)c->send + c->send_displs[c->rank], b);
    }
    if (a->n > 0 && a->colls[0].local_work)
        a->colls[0].local_work(a->colls[0].arg);
}

/* bytes at base as a box of one dim (1-byte elements) */
static void flat_region(dt__region *r, void *base, size_t bytes, const dt__device *dev)
{
    memset(r, 0, sizeof *r);
    r->base = base;
    r->dev = dev;
    r->rank = 1;
    r->elem = 1;
    r->shape[0] = r->count[0] = (int64_t)bytes;
}

static dt_status shm_collective(const dt__coll *colls, size_t n)
{
    size_t cap = 0;
    for (size_t i = 0; i < n; i++) {
        const dt__coll *c = &colls[i];
        if (c->kind != DT__COLL_ALLTOALLV)
            return dt__error(DT_ERR_UNSUPPORTED, "the shm transport runs only the ragged "
                             "all-to-all as a collective (kind %d)", (int)c->kind);
        if (c->dev && !c->dev->kind->host_visible)
            return dt__error(DT_ERR_UNSUPPORTED, "the shm transport moves host memory only, "
                             "not %s device memory", c->dev->kind->name);
        if (c->rank < 0 || c->rank >= c->nmembers || c->clients[c->rank] != dt_client_id())
            return dt__error(DT_ERR_INVALID_ARGUMENT, "shm ragged all-to-all: this client is "
                             "not member %d of its line", c->rank);
        cap += (size_t)c->nmembers;
    }
    dt__xfer *sends = calloc(2 * cap + 1, sizeof *sends), *recvs = sends + cap;
    if (!sends)
        return dt__error(DT_ERR_NO_MEMORY, "shm transport: no memory for %zu transfers", cap);
    size_t ns = 0, nr = 0;
    /* line (collective) order, then member order: both clients of a pair list alike */
    for (size_t i = 0; i < n; i++) {
        const dt__coll *c = &colls[i];
        for (int j = 0; j < c->nmembers; j++) {
            if (j == c->rank)
                continue;
            if (c->send_bytes[j]) {
                sends[ns].peer = c->clients[j];
                flat_region(&sends[ns++].region, (char *)c->send + c->send_displs[j],
                            c->send_bytes[j], c->dev);
            }
            if (c->recv_bytes[j]) {
                recvs[nr].peer = c->clients[j];
                flat_region(&recvs[nr++].region, (char *)c->recv + c->recv_displs[j],
                            c->recv_bytes[j], c->dev);
            }
        }
    }
    /* Spin rather than yield while waiting, for at most 1 ms plus the bytes at 1 GB/s (as
     * the mpi transport's wait), then wait as exchange() does: the watchdog still catches a
     * lost peer. */
    size_t moved = 0;
    for (size_t i = 0; i < n; i++)
        for (int j = 0; j < colls[i].nmembers; j++)
            moved += colls[i].send_bytes[j] + colls[i].recv_bytes[j];
    a2av_local lw = {colls, n};
    spin_until = dt__now_seconds() + 1e-3 + (double)moved * 1e-9;
    dt_status st = shm_exchange(sends, ns, recvs, nr, a2av_self, &lw);
    spin_until = 0;
    free(sends);
    return st;
}

static void shm_release(dt__xfer_cache *cache)
{
    (void)cache; /* nothing is cached */
}

static int shm_moves(const dt__device_kind *kind)
{
    return !kind || kind->host_visible;
}

static int shm_can_connect(int peer)
{
    (void)peer; /* same host through the segments, other hosts through MPI */
    return dt__shm_up();
}

static const dt__transport shm_transport = {
    .name = "shm",
    .exchange = shm_exchange,
    .release = shm_release,
    .moves = shm_moves,
    .can_connect = shm_can_connect,
    .exchange_view = shm_exchange_view,
    .views_done = shm_views_done,
    .coll_kinds = DT__COLL_BIT(DT__COLL_ALLTOALLV) | DT__COLL_LOCAL_WORK,
    .collective = shm_collective,
};

const dt__transport *dt__transport_shm(void)
{
    return dt__shm_up() ? &shm_transport : NULL;
}
