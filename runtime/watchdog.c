/* The watchdog on every wait for other clients (relayout exchanges, dt_barrier): a wait that
 * sees none of its requests complete for DT_COMM_TIMEOUT seconds pings the clients it still
 * waits for; those that answer are alive (waiting on someone else), those that do not are
 * reported lost, with their hosts. A lost host or a cut link thus becomes DT_ERR_TIMEOUT
 * instead of a hang (docs/multihost.md). */
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "runtime/comm.h"
#include "runtime/error.h"

enum {
    PING_TAG = 7301,
    PONG_TAG = 7302,
    DEFAULT_COMM_TIMEOUT = 300,
    PROBE_EVERY = 256,    /* spins between looks for pings */
    CLOCK_EVERY = 32,     /* idle spins between looks at the clock */
    SPIN_FREE = 16,       /* idle spins before a wait yields its core */
    SPIN_YIELD = 256,     /* idle spins (yielding) before it naps, when the host is full */
    NAP_NS = 20000,       /* one nap (the kernel's timer slack adds ~50 us) */
    ALIVE_ROUNDS = 3,     /* stalls with every waited-for client alive before giving up */
};

double dt__comm_timeout(const char **bad_out)
{
    const char *v = getenv("DT_COMM_TIMEOUT");
    if (bad_out)
        *bad_out = NULL;
    if (!v || !*v)
        return DEFAULT_COMM_TIMEOUT;
    char *end = NULL;
    double t = strtod(v, &end);
    if (end == v || *end != '\0' || !(t > 0.0) || t > 1e9) {
        if (bad_out)
            *bad_out = v;
        return DEFAULT_COMM_TIMEOUT;
    }
    return t;
}

static double now_seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* More clients on this host than cores this process may run on: a waiting client then
 * naps instead of only yielding, so that the ones computing get the cores. */
static int host_full(void)
{
    static _Thread_local int known = -1;
    if (known < 0) {
        int mine, cores;
        dt__host_clients_and_cores(&mine, &cores);
        known = mine > cores;
    }
    return known;
}

/* One idle round of a wait: spin a little (an answer may be microseconds away), then give
 * the core away: yield, and once clearly idle on a full host, nap. */
static void idle_wait(unsigned idle)
{
    if (idle < SPIN_FREE)
        return;
    if (idle < SPIN_YIELD || !host_full())
        sched_yield();
    else
        nanosleep(&(struct timespec){0, NAP_NS}, NULL);
}

/* Answers every ping that has arrived: this client is alive. */
static void answer_pings(MPI_Comm comm)
{
    for (;;) {
        int flag = 0;
        MPI_Status s;
        MPI_Message msg;
        /* A matched probe: another thread's wait cannot take this ping in between. */
        if (MPI_Improbe(MPI_ANY_SOURCE, PING_TAG, comm, &flag, &msg, &s) != MPI_SUCCESS ||
            !flag)
            return;
        MPI_Request r;
        MPI_Mrecv(NULL, 0, MPI_BYTE, &msg, MPI_STATUS_IGNORE);
        if (MPI_Isend(NULL, 0, MPI_BYTE, s.MPI_SOURCE, PONG_TAG, comm, &r) == MPI_SUCCESS)
            MPI_Request_free(&r);
    }
}

double dt__now_seconds(void)
{
    return now_seconds();
}

void dt__watchdog_answer(void)
{
    if (dt__comm() != MPI_COMM_NULL)
        answer_pings(dt__comm());
}

static void append(char *buf, size_t len, int client)
{
    size_t used = strlen(buf);
    if (used < len)
        snprintf(buf + used, len - used, "%s%d (host %s)", used ? ", " : "", client,
                 dt__client_hostname(client));
}

/* The distinct clients of the pending requests, into peers_out (n entries of room). */
static int pending_peers(const MPI_Request *reqs, const int *peers, int n, int *out)
{
    int k = 0;
    for (int i = 0; i < n; i++) {
        if (reqs[i] == MPI_REQUEST_NULL)
            continue;
        int seen = 0;
        for (int j = 0; j < k && !seen; j++)
            seen = out[j] == peers[i];
        if (!seen)
            out[k++] = peers[i];
    }
    return k;
}

/* Pings the k stalled peers and waits up to `seconds` for their answers, still answering
 * pings itself; alive[j] set for those that answered. Returns 1 if the main requests made
 * progress meanwhile (the stall is over), else 0. */
static int ping_peers(MPI_Comm comm, const int *who, int k, int *alive, double seconds,
                      MPI_Request *reqs, int n, int *done)
{
    MPI_Request *preq = malloc(2 * (size_t)k * sizeof *preq);
    int progressed = 0;
    if (!preq)
        return 0;
    /* Empty messages: nothing for MPI to write into after a pong is given up on. */
    for (int j = 0; j < k; j++) {
        alive[j] = 0;
        preq[j] = preq[k + j] = MPI_REQUEST_NULL;
        MPI_Irecv(NULL, 0, MPI_BYTE, who[j], PONG_TAG, comm, &preq[j]);
        MPI_Isend(NULL, 0, MPI_BYTE, who[j], PING_TAG, comm, &preq[k + j]);
    }
    double end = now_seconds() + seconds;
    int answered = 0;
    while (answered < k && now_seconds() < end) {
        answer_pings(comm);
        for (int j = 0; j < k; j++) {
            int flag = 0;
            if (preq[j] != MPI_REQUEST_NULL && MPI_Test(&preq[j], &flag, MPI_STATUS_IGNORE) ==
                MPI_SUCCESS && flag) {
                alive[j] = 1;
                answered++;
            }
        }
        int outcount = 0;
        if (n > 0 && MPI_Testsome(n, reqs, &outcount, done, MPI_STATUSES_IGNORE) == MPI_SUCCESS &&
            outcount > 0 && outcount != MPI_UNDEFINED) {
            progressed = outcount;
            break;
        }
    }
    for (int j = 0; j < 2 * k; j++) {
        if (preq[j] == MPI_REQUEST_NULL)
            continue;
        if (j < k)
            MPI_Cancel(&preq[j]);
        MPI_Request_free(&preq[j]);
    }
    free(preq);
    return progressed;
}

/* The clients of `group` (ngroup of them) other than this one, into out. */
static int group_peers(const int *group, int ngroup, int *out)
{
    int k = 0, me = dt_client_id();
    for (int i = 0; i < ngroup; i++)
        if (group[i] != me)
            out[k++] = group[i];
    return k;
}

/* dt__wait_watched (group NULL) and dt__wait_watched_group (the stalled peers are then the
 * group's other clients, and the requests, collective, are left pending on a timeout). */
static dt_status watch(MPI_Request *reqs, const int *peers, int n, const int *group,
                       int ngroup, double timeout, const char *what, MPI_Status *statuses)
{
    MPI_Comm comm = dt__comm();
    if (!(timeout > 0))
        timeout = dt__comm_timeout(NULL);  /* callers check the variable before posting */
    int room = (group ? ngroup : n) + 1;
    int *done = malloc(((size_t)n + 1) * sizeof *done);
    MPI_Status *got = statuses ? malloc(((size_t)n + 1) * sizeof *got) : NULL;
    int *who = malloc((size_t)room * sizeof *who);
    int *alive = malloc((size_t)room * sizeof *alive);
    if (!done || !who || !alive || (statuses && !got)) {
        free(got);
        free(done);
        free(who);
        free(alive);
        return dt__error(DT_ERR_NO_MEMORY, "%s: no memory", what);
    }
    dt_status st = DT_OK;
    double last = now_seconds();
    int alive_rounds = 0;
    /* Open MPI reports a failed collective on MPI_COMM_WORLD, and MPICH any failure of a
     * multi-request MPI_Testsome (a truncated receive): errors return there while we wait. */
    dt__world_errors_return(1);
    unsigned idle = 0;
    for (unsigned spins = 1;; spins++) {
        int outcount = 0;
        MPI_Status one, *sts = got ? got : n == 1 ? &one : MPI_STATUSES_IGNORE;
        int rc = MPI_Testsome(n, reqs, &outcount, done, sts);
        for (int k = 0; got && outcount != MPI_UNDEFINED && k < outcount; k++)
            statuses[done[k]] = got[k];  /* the caller checks sources, counts and errors */
        if (rc == MPI_ERR_IN_STATUS && sts != MPI_STATUSES_IGNORE)
            for (int k = outcount; k-- > 0;)
                if (sts[k].MPI_ERROR != MPI_SUCCESS)
                    rc = sts[k].MPI_ERROR;   /* what failed rather than "error in status" */
        if (rc != MPI_SUCCESS) {
            char text[MPI_MAX_ERROR_STRING];
            int tlen = 0;
            MPI_Error_string(rc, text, &tlen);
            st = dt__error(DT_ERR_COMM, "%s: MPI_Testsome failed: %s", what, text);
            break;
        }
        if (outcount == MPI_UNDEFINED)     /* every request done */
            break;
        if (outcount > 0) {
            idle = 0;
            continue;
        }
        /* The stall clock starts at the first idle spin after progress and is read only
         * every CLOCK_EVERY idle spins (the timeout is seconds; the clock read is not free). */
        if (idle++ == 0)
            last = now_seconds();
        if (spins % PROBE_EVERY == 0)
            answer_pings(comm);
        idle_wait(idle);
        if (idle % CLOCK_EVERY != 0 || now_seconds() - last <= timeout)
            continue;
        /* Stalled: who of those we wait for is still there? */
        int k = group ? group_peers(group, ngroup, who) : pending_peers(reqs, peers, n, who);
        double ping_wait = timeout / 2;
        if (ping_peers(comm, who, k, alive, ping_wait, reqs, n, done)) {
            last = now_seconds();
            continue;
        }
        char lost[512] = "", waiting[512] = "";
        for (int j = 0; j < k; j++)
            append(alive[j] ? waiting : lost, sizeof lost, who[j]);
        /* Everyone waited for is alive, so someone further along is stalled: it reports the
         * lost clients itself. Wait on, but not forever (a deadlock of the program's own). */
        if (!lost[0] && ++alive_rounds < ALIVE_ROUNDS) {
            last = now_seconds();
            continue;
        }
        if (lost[0])
            st = dt__error(DT_ERR_TIMEOUT,
                           "%s: lost client(s) %s: nothing came for %.3g s and no answer to a "
                           "ping in %.3g s (DT_COMM_TIMEOUT)%s%s%s", what, lost, timeout,
                           ping_wait, waiting[0] ? "; client(s) " : "", waiting,
                           waiting[0] ? " answered but are waiting too" : "");
        else
            st = dt__error(DT_ERR_TIMEOUT,
                           "%s: nothing came for %.3g s (DT_COMM_TIMEOUT) from client(s) %s, "
                           "which answer pings but are waiting on others", what, timeout,
                           waiting);
        break;
    }
    if (st != DT_OK && !group) {
        /* Cancelled receives complete at once; sends to a lost client may never. */
        for (int i = 0; i < n; i++) {
            if (reqs[i] == MPI_REQUEST_NULL)
                continue;
            MPI_Cancel(&reqs[i]);
            MPI_Request_free(&reqs[i]);
        }
    }
    dt__world_errors_return(0);
    free(got);
    free(done);
    free(who);
    free(alive);
    return st;
}

dt_status dt__wait_watched(MPI_Request *reqs, const int *peers, int n, double timeout,
                           const char *what)
{
    return watch(reqs, peers, n, NULL, 0, timeout, what, NULL);
}

dt_status dt__wait_watched_status(MPI_Request *reqs, const int *peers, int n, double timeout,
                                  const char *what, MPI_Status *statuses)
{
    return watch(reqs, peers, n, NULL, 0, timeout, what, statuses);
}

dt_status dt__wait_watched_group(MPI_Request *req, const int *group, int ngroup,
                                 double timeout, const char *what)
{
    return watch(req, NULL, 1, group, ngroup, timeout, what, NULL);
}

/* Pings every client of the job on another host except those in who[0..k) and appends the
 * ones that do not answer within `seconds` to lost. */
static void find_lost_elsewhere(const int *who, int k, double seconds, char *lost, size_t len)
{
    int n = dt_num_clients(), me = dt_client_id(), m = 0;
    int *ask = malloc(((size_t)n + 1) * sizeof *ask), *answer = malloc(((size_t)n + 1) *
                                                                        sizeof *answer);
    if (!ask || !answer) {
        free(ask);
        free(answer);
        return;
    }
    for (int c = 0; c < n; c++) {
        int known = c == me || dt__client_host(c) == dt__client_host(me);
        for (int j = 0; j < k && !known; j++)
            known = who[j] == c;
        if (!known)
            ask[m++] = c;
    }
    if (m)
        ping_peers(dt__comm(), ask, m, answer, seconds, NULL, 0, NULL);
    for (int j = 0; j < m; j++)
        if (!answer[j])
            append(lost, len, ask[j]);
    free(ask);
    free(answer);
}

dt_status dt__watchdog_stalled(const int *who, const int *state, int k, double timeout,
                               int *rounds, const char *what)
{
    MPI_Comm comm = dt__comm();
    int *alive = malloc(((size_t)k + 1) * sizeof *alive);
    int *ask = malloc(((size_t)k + 1) * sizeof *ask);
    if (!alive || !ask) {
        free(alive);
        free(ask);
        return dt__error(DT_ERR_NO_MEMORY, "%s: no memory", what);
    }
    int nask = 0, ndead = 0;
    for (int j = 0; j < k; j++) {
        alive[j] = 0;
        ndead += state && state[j] < 0;
        if (!state || state[j] >= 0)
            ask[nask++] = who[j];
    }
    /* A peer known gone is lost without asking; else ping those waited for. */
    double ping_wait = timeout / 2;
    if (!ndead && nask) {
        int *answer = malloc((size_t)nask * sizeof *answer);
        if (answer) {
            ping_peers(comm, ask, nask, answer, ping_wait, NULL, 0, NULL);
            /* A process of this host that still runs is alive even when it does not
             * answer: it is busy outside a watched wait (a blocking collective that the
             * lost host stalls), and a client waiting on the lost host will report. */
            for (int j = 0, a = 0; j < k; j++)
                alive[j] = answer[a++] ? 1 : state && state[j] > 0 ? 2 : 0;
            free(answer);
        }
    }
    char lost[512] = "", waiting[512] = "", silent[512] = "";
    for (int j = 0; j < k; j++) {
        if (ndead && !(state && state[j] < 0))
            continue;        /* not asked: neither lost nor known alive */
        append(alive[j] == 1 ? waiting : alive[j] == 2 ? silent : lost, sizeof lost, who[j]);
    }
    free(alive);
    free(ask);
    /* A process of this host that runs but answers no ping is blocked outside a watched
     * wait, most likely on a client that is gone (a collective across a cut link): ask the
     * rest of the job, and name those of other hosts that do not answer. */
    if (silent[0] && !lost[0])
        find_lost_elsewhere(who, k, ping_wait, lost, sizeof lost);
    if (lost[0] && silent[0])
        return dt__error(DT_ERR_TIMEOUT,
                         "%s: lost client(s) %s: no answer to a ping in %.3g s; nothing came "
                         "for %.3g s (DT_COMM_TIMEOUT) from client(s) %s, whose processes on "
                         "this host run but answer no ping (blocked, likely on the lost ones)",
                         what, lost, ping_wait, timeout, silent);
    if (!lost[0] && ++*rounds < ALIVE_ROUNDS)
        return DT_OK;
    if (ndead)
        return dt__error(DT_ERR_TIMEOUT,
                         "%s: lost client(s) %s: its process on this host has ended while "
                         "this client waited on it (DT_COMM_TIMEOUT %.3g s)", what, lost,
                         timeout);
    if (lost[0])
        return dt__error(DT_ERR_TIMEOUT,
                         "%s: lost client(s) %s: nothing came for %.3g s and no answer to a "
                         "ping in %.3g s (DT_COMM_TIMEOUT)%s%s%s", what, lost, timeout,
                         ping_wait, waiting[0] ? "; client(s) " : "", waiting,
                         waiting[0] ? " answered but are waiting too" : "");
    if (silent[0])
        return dt__error(DT_ERR_TIMEOUT,
                         "%s: nothing came for %.3g s (DT_COMM_TIMEOUT) from client(s) %s, "
                         "whose processes on this host run but answer no ping (stopped, or "
                         "blocked outside a watched wait)%s%s%s", what, timeout, silent,
                         waiting[0] ? "; client(s) " : "", waiting,
                         waiting[0] ? " answer pings but are waiting on others" : "");
    return dt__error(DT_ERR_TIMEOUT,
                     "%s: nothing came for %.3g s (DT_COMM_TIMEOUT) from client(s) %s, which "
                     "answer pings but are waiting on others", what, timeout, waiting);
}
