/* The flight recorder of collectives: a ring of this client's last DT_TRACE_OPS operations with
 * a sequence number per communication group, written as JSON to DT_TRACE_DIR/rank-R.json on a
 * failure, a fatal signal, SIGUSR1 or dt_trace_dump (docs/trace.md). */
#include <errno.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "dtensor/runtime.h"
#include "runtime/comm.h"
#include "runtime/error.h"
#include "runtime/trace.h"
#include "runtime/util.h"

enum { DEFAULT_OPS = 2000, MAX_OPS = 1000000, MAX_GROUPS = 64, ERROR_TEXT = 160 };

typedef struct op_rec {
    unsigned long long seq;
    double enter, leave;              /* seconds since the epoch; leave 0 while inside */
    int status, left;
    char group[DT__TRACE_GROUP];
    char call[DT__TRACE_CALL];
    char path[DT__TRACE_PATH];
    char detail[DT__TRACE_DETAIL];
    char error[ERROR_TEXT];
    int has_lazy;                     /* detail is lazy's text, formatted when written */
    dt__trace_lazy lazy;
} op_rec;

typedef struct group_seq {
    char key[DT__TRACE_GROUP];
    unsigned long long next;
} group_seq;

static pthread_once_t once = PTHREAD_ONCE_INIT;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static int recording, checking;
static long cap;
static op_rec *ring;
static long long total;               /* operations recorded; the next one's token */
static group_seq groups[MAX_GROUPS];
static int ngroups;
static char trace_dir[512];
static struct sigaction old_actions[NSIG];

static double wall_seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ---- writing: a small buffered writer on a file descriptor, no allocation (signals) ---- */

typedef struct writer {
    int fd, failed;
    size_t used;
    char buf[4096];
} writer;

static void w_flush(writer *w)
{
    size_t off = 0;
    while (off < w->used && !w->failed) {
        ssize_t n = write(w->fd, w->buf + off, w->used - off);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            w->failed = 1;
        else
            off += (size_t)n;
    }
    w->used = 0;
}

static void w_raw(writer *w, const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (w->used == sizeof w->buf)
            w_flush(w);
        w->buf[w->used++] = s[i];
    }
}

static void w_text(writer *w, const char *s)
{
    w_raw(w, s, strlen(s));
}

static void w_fmt(writer *w, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
static void w_fmt(writer *w, const char *fmt, ...)
{
    char tmp[128];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n > 0)
        w_raw(w, tmp, (size_t)n < sizeof tmp ? (size_t)n : sizeof tmp - 1);
}

/* A JSON string of at most len bytes of s. */
static void w_str(writer *w, const char *s, size_t len)
{
    w_raw(w, "\"", 1);
    for (size_t i = 0; i < len && s[i]; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\') {
            char e[2] = {'\\', (char)c};
            w_raw(w, e, 2);
        } else if (c < 0x20) {
            w_fmt(w, "\\u%04x", c);
        } else {
            w_raw(w, (const char *)&c, 1);
        }
    }
    w_raw(w, "\"", 1);
}

static void write_op(writer *w, const op_rec *o)
{
    w_fmt(w, "    {\"seq\": %llu, \"group\": ", o->seq);
    w_str(w, o->group, sizeof o->group);
    w_text(w, ", \"call\": ");
    w_str(w, o->call, sizeof o->call);
    w_text(w, ", \"path\": ");
    w_str(w, o->path, sizeof o->path);
    w_text(w, ", \"detail\": ");
    if (o->has_lazy) {
        char detail[DT__TRACE_DETAIL];
        o->lazy.format(o->lazy.payload, detail, sizeof detail);
        w_str(w, detail, sizeof detail);
    } else {
        w_str(w, o->detail, sizeof o->detail);
    }
    w_fmt(w, ", \"enter\": %.6f, \"leave\": ", o->enter);
    if (o->left) {
        w_fmt(w, "%.6f, \"status\": ", o->leave);
        w_str(w, dt_status_name((dt_status)o->status), 64);
        w_text(w, ", \"error\": ");
        w_str(w, o->error, sizeof o->error);
    } else {
        w_text(w, "null, \"status\": null, \"error\": \"\"");
    }
    w_text(w, "}");
}

/* Writes the record to fd; locked: 0 from a signal handler (the ring is read as it is). */
static void write_record(int fd, const char *reason)
{
    writer w = {.fd = fd};
    char host[128] = "?";
    gethostname(host, sizeof host - 1);
    w_fmt(&w, "{\n  \"format\": \"dtensor-trace 1\",\n  \"rank\": %d,\n  \"clients\": %d,\n",
          dt_client_id(), dt_num_clients());
    w_fmt(&w, "  \"pid\": %ld,\n  \"host\": ", (long)getpid());
    w_str(&w, host, sizeof host);
    w_fmt(&w, ",\n  \"time\": %.6f,\n  \"reason\": ", wall_seconds());
    w_str(&w, reason ? reason : "", 1024);
    w_fmt(&w, ",\n  \"ops_total\": %lld,\n  \"ops_kept\": %ld,\n  \"groups\": [", total,
          total < cap ? (long)total : cap);
    for (int g = 0; g < ngroups; g++) {
        w_text(&w, g ? ", {\"group\": " : "{\"group\": ");
        w_str(&w, groups[g].key, sizeof groups[g].key);
        w_fmt(&w, ", \"next_seq\": %llu}", groups[g].next);
    }
    w_text(&w, "],\n  \"ops\": [\n");
    long long first = total > cap ? total - cap : 0;
    for (long long t = first; t < total; t++) {
        write_op(&w, &ring[t % cap]);
        w_text(&w, t + 1 < total ? ",\n" : "\n");
    }
    w_text(&w, "  ]\n}\n");
    w_flush(&w);
}

/* Writes DIR/rank-R.json through a temporary name; 0 on success. */
static int dump_to(const char *dir, const char *reason, int locked)
{
    char path[600], tmp[620];
    mkdir(dir, 0777);
    snprintf(path, sizeof path, "%s/rank-%d.json", dir, dt_client_id());
    snprintf(tmp, sizeof tmp, "%s.%ld.tmp", path, (long)getpid());
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0)
        return -1;
    if (locked)
        pthread_mutex_lock(&lock);
    write_record(fd, reason);
    if (locked)
        pthread_mutex_unlock(&lock);
    int bad = fsync(fd) != 0 && errno != EINVAL;
    bad |= close(fd) != 0;
    if (bad || rename(tmp, path) != 0) {
        unlink(tmp);
        return -1;
    }
    return 0;
}

/* ---- signals ---- */

static const int fatal_signals[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT, SIGTERM};

static void on_signal(int sig, siginfo_t *info, void *ctx)
{
    int saved = errno;
    char reason[64];
    snprintf(reason, sizeof reason, "%s %d", sig == SIGUSR1 ? "on request: signal" :
             "fatal signal", sig);
    dump_to(trace_dir, reason, 0);
    errno = saved;
    if (sig == SIGUSR1)
        return;
    /* Then whatever handled the signal before (MPI's backtrace), else the default. */
    struct sigaction *old = &old_actions[sig];
    if ((old->sa_flags & SA_SIGINFO) && old->sa_sigaction) {
        sigaction(sig, old, NULL);
        old->sa_sigaction(sig, info, ctx);
        return;
    }
    if (old->sa_handler != SIG_DFL && old->sa_handler != SIG_IGN && old->sa_handler) {
        sigaction(sig, old, NULL);
        old->sa_handler(sig);
        return;
    }
    signal(sig, SIG_DFL);
    raise(sig);
}

static void install(int sig)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_signal;
    sa.sa_flags = SA_SIGINFO | SA_RESTART;
    sigemptyset(&sa.sa_mask);
    if (sigaction(sig, NULL, &old_actions[sig]) == 0 && old_actions[sig].sa_handler != SIG_IGN)
        sigaction(sig, &sa, NULL);
}

/* ---- configuration ---- */

static void configure(void)
{
    const char *v = getenv("DT_TRACE_OPS");
    long n = DEFAULT_OPS;
    if (v && *v) {
        char *end = NULL;
        long x = strtol(v, &end, 10);
        if (end != v && *end == '\0' && x >= 0)
            n = x > MAX_OPS ? MAX_OPS : x;
    }
    const char *c = getenv("DT_CHECK_COLLECTIVES");
    checking = c && strcmp(c, "1") == 0;
    if (n > 0)
        ring = calloc((size_t)n, sizeof *ring);
    cap = ring ? n : 0;
    recording = cap > 0;
    const char *d = getenv("DT_TRACE_DIR");
    if (recording && d && *d && strlen(d) < sizeof trace_dir) {
        dt__strlcpy(trace_dir, d, sizeof trace_dir);
        install(SIGUSR1);
        for (size_t i = 0; i < sizeof fatal_signals / sizeof fatal_signals[0]; i++)
            install(fatal_signals[i]);
    }
}

int dt__trace_on(void)
{
    pthread_once(&once, configure);
    return recording;
}

int dt__check_on(void)
{
    pthread_once(&once, configure);
    return checking;
}

void dt__trace_group_key(const int *clients, int n, char *buf, size_t len)
{
    size_t used = 0;
    buf[0] = '\0';
    for (int i = 0; i < n && used < len; i++) {
        int j = i;
        while (j + 1 < n && clients[j + 1] == clients[j] + 1)
            j++;
        int w = j > i ? snprintf(buf + used, len - used, "%s%d-%d", i ? "," : "", clients[i],
                                 clients[j])
                      : snprintf(buf + used, len - used, "%s%d", i ? "," : "", clients[i]);
        if (w < 0 || (size_t)w >= len - used) {
            uint64_t h = 1469598103934665603ull;
            for (int k = 0; k < n; k++)
                h = (h ^ (uint64_t)(unsigned)clients[k]) * 1099511628211ull;
            snprintf(buf, len, "%d clients #%016llx", n, (unsigned long long)h);
            return;
        }
        used += (size_t)w;
        i = j;
    }
}

static unsigned long long next_seq(const char *key)
{
    for (int g = 0; g < ngroups; g++)
        if (strcmp(groups[g].key, key) == 0)
            return ++groups[g].next;
    if (ngroups == MAX_GROUPS)       /* the last slot stands for every further group */
        return ++groups[MAX_GROUPS - 1].next;
    dt__strlcpy(groups[ngroups].key, key, sizeof groups[ngroups].key);
    groups[ngroups].next = 1;
    return groups[ngroups++].next;
}

static void write_on_failure(const char *what)
{
    if (trace_dir[0])
        dump_to(trace_dir, what, 1);
}

/* A slot's lazy detail formatted into its text and its payload released. Under lock. */
static void settle(op_rec *o)
{
    if (!o->has_lazy)
        return;
    o->lazy.format(o->lazy.payload, o->detail, sizeof o->detail);
    if (o->lazy.release)
        o->lazy.release(o->lazy.payload);
    o->has_lazy = 0;
}

/* dt_finalize: no payload outlives the runtime (a layout's references), the text stays. */
static void settle_all(void)
{
    pthread_mutex_lock(&lock);
    for (long i = 0; i < cap; i++)
        settle(&ring[i]);
    pthread_mutex_unlock(&lock);
}

/* Records the operation's entry (when recording), with its detail text or lazy (the ring
 * takes lazy's payload over; released here when not recorded); its sequence number into
 * *seq. */
static long enter(const char *key, const char *call, const char *detail,
                  const dt__trace_lazy *lazy, unsigned long long *seq)
{
    long token = -1;
    pthread_mutex_lock(&lock);
    if (recording) {
        op_rec *o = &ring[total % cap];
        if (o->has_lazy && o->lazy.release)
            o->lazy.release(o->lazy.payload);
        o->has_lazy = 0;
        o->seq = *seq = next_seq(key);
        o->enter = wall_seconds();
        o->leave = 0;
        o->status = o->left = 0;
        o->path[0] = o->error[0] = '\0';
        dt__strlcpy(o->group, key, sizeof o->group);
        dt__strlcpy(o->call, call, sizeof o->call);
        if (lazy) {
            o->lazy = *lazy;
            o->has_lazy = 1;
            o->detail[0] = '\0';
        } else {
            dt__strlcpy(o->detail, detail ? detail : "", sizeof o->detail);
        }
        token = (long)total++;
    } else {
        *seq = next_seq(key);
        if (lazy && lazy->release) {
            dt__trace_lazy copy = *lazy;
            lazy->release(copy.payload);
        }
    }
    pthread_mutex_unlock(&lock);
    static atomic_int hooked;
    if (lazy && token >= 0 && !atomic_exchange(&hooked, 1))
        dt__at_finalize(settle_all);
    return token;
}

/* The group key of clients, remembered for the last list this thread asked about (a step
 * makes the same collectives over the same groups). */
static void group_key(const int *clients, int n, char *key, size_t len)
{
    enum { KEEP = 64 };
    static _Thread_local int last_n = -1, last[KEEP];
    static _Thread_local char last_key[DT__TRACE_GROUP];
    if (n == last_n && n <= KEEP && memcmp(clients, last, (size_t)n * sizeof *clients) == 0) {
        dt__strlcpy(key, last_key, len);
        return;
    }
    dt__trace_group_key(clients, n, key, len);
    if (n <= KEEP) {
        memcpy(last, clients, (size_t)n * sizeof *clients);
        last_n = n;
        dt__strlcpy(last_key, key, sizeof last_key);
    }
}

long dt__coll_record(const int *clients, int n, const char *call, const char *detail)
{
    pthread_once(&once, configure);
    if (!recording)
        return -1;
    char key[DT__TRACE_GROUP];
    unsigned long long seq;
    group_key(clients, n, key, sizeof key);
    return enter(key, call, detail, NULL, &seq);
}

static dt_status begin(const int *clients, int n, const char *call, const char *detail,
                       const dt__trace_lazy *lazy, long *token_out)
{
    *token_out = -1;
    pthread_once(&once, configure);
    if (!recording && !checking) {
        if (lazy && lazy->release) {
            dt__trace_lazy copy = *lazy;
            lazy->release(copy.payload);
        }
        return DT_OK;
    }
    char key[DT__TRACE_GROUP], text[DT__TRACE_DETAIL];
    unsigned long long seq = 0;
    group_key(clients, n, key, sizeof key);
    if (lazy && checking) { /* the check compares the text: formatted now */
        lazy->format(lazy->payload, text, sizeof text);
        detail = text;
    }
    *token_out = enter(key, call, detail, lazy, &seq);
    if (!checking)
        return DT_OK;
    dt_status st = dt__trace_check(clients, n, key, seq, call, detail ? detail : "");
    if (st != DT_OK) {
        dt__coll_end(*token_out, "check", st);
        *token_out = -1;
    }
    return st;
}

dt_status dt__coll_begin(const int *clients, int n, const char *call, const char *detail,
                         long *token_out)
{
    return begin(clients, n, call, detail, NULL, token_out);
}

dt_status dt__coll_begin_lazy(const int *clients, int n, const char *call,
                              const dt__trace_lazy *lazy, long *token_out)
{
    return begin(clients, n, call, NULL, lazy, token_out);
}

void dt__coll_end(long token, const char *path, dt_status st)
{
    if (token < 0)
        return;
    pthread_mutex_lock(&lock);
    if ((long long)token >= total - cap) {
        op_rec *o = &ring[token % cap];
        o->leave = wall_seconds();
        o->status = (int)st;
        o->left = 1;
        if (path)
            dt__strlcpy(o->path, path, sizeof o->path);
        if (st != DT_OK)
            dt__strlcpy(o->error, dt_last_error(), sizeof o->error);
    }
    pthread_mutex_unlock(&lock);
    /* A failure the other clients share (a lost client, a mismatch) is what the record is for. */
    if (st == DT_ERR_TIMEOUT || st == DT_ERR_COMM || (st == DT_ERR_STATE && path &&
                                                      strcmp(path, "check") == 0))
        write_on_failure(dt_last_error());
}

dt_status dt_trace_dump(const char *dir, const char *reason)
{
    pthread_once(&once, configure);
    if (!dir || !*dir)
        dir = trace_dir[0] ? trace_dir : getenv("DT_TRACE_DIR");
    if (!dir || !*dir)
        return dt__error(DT_ERR_INVALID_ARGUMENT,
                         "dt_trace_dump: no directory given and DT_TRACE_DIR not set");
    char msg[1024];
    dt__strlcpy(msg, dt_last_error(), sizeof msg);
    if (dump_to(dir, reason ? reason : "on request", 1) != 0)
        return dt__error(DT_ERR_IO, "dt_trace_dump: cannot write %s/rank-%d.json: %s", dir,
                         dt_client_id(), strerror(errno));
    dt__error(DT_OK, "%s", msg);     /* a dump on the way out of a failure keeps its text */
    return DT_OK;
}

long long dt_trace_count(void)
{
    pthread_mutex_lock(&lock);
    long long n = total;
    pthread_mutex_unlock(&lock);
    return n;
}

void dt__trace_set(int record, int check)
{
    pthread_once(&once, configure);
    pthread_mutex_lock(&lock);
    recording = record && cap > 0;
    checking = check != 0;
    pthread_mutex_unlock(&lock);
}
