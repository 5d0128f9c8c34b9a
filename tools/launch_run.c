/* `dtensor launch`: runs the launcher command, passing its output through while reading it
 * for hosts reported lost; forwards SIGINT/SIGTERM/SIGHUP; returns the job's exit status. */
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "launch.h"

/* After the job reported a lost host, how long the launcher may take to end by itself before it
 * is stopped (SIGTERM to its process group, SIGKILL 10 s later): Open MPI's mpirun waits for an
 * unreachable daemon until TCP gives up on the abort it sent there (minutes; keepalive cannot
 * help once data is unacknowledged). */
#define LOST_GRACE_S 10.0

static volatile sig_atomic_t child_pid;

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static void forward(int sig)
{
    if (child_pid > 0)
        kill((pid_t)child_pid, sig);
}

static void add_lost(const char *name, size_t len, const launch_hosts *hosts, launch_hosts *lost)
{
    if (hosts->n == 0) { /* no host list (this host only): take the name as it comes */
        for (int k = 0; k < lost->n; k++)
            if (strlen(lost->h[k].name) == len && strncmp(lost->h[k].name, name, len) == 0)
                return;
        if (lost->n < LAUNCH_MAX_HOSTS && len > 0 && len < LAUNCH_HOST_MAX) {
            memcpy(lost->h[lost->n].name, name, len);
            lost->h[lost->n].name[len] = '\0';
            lost->h[lost->n++].slots = 0;
        }
        return;
    }
    for (int i = 0; i < hosts->n; i++) {
        const char *h = hosts->h[i].name;
        if (strlen(h) != len || strncmp(h, name, len) != 0)
            continue;
        for (int k = 0; k < lost->n; k++)
            if (strcmp(lost->h[k].name, h) == 0)
                return;
        if (lost->n < LAUNCH_MAX_HOSTS)
            lost->h[lost->n++] = hosts->h[i];
        return;
    }
}

void launch_scan_line(const char *line, const launch_hosts *hosts, launch_hosts *lost)
{
    /* The runtime's watchdog: "...: lost client(s) 2 (host h2), 3 (host h2): nothing came
     * ...; client(s) 1 (host h1) answered but ..." (only the list before the ':'). */
    const char *p = strstr(line, "lost client(s) ");
    if (p) {
        p += strlen("lost client(s) ");
        const char *end = strchr(p, ':');
        if (!end)
            end = p + strlen(p);
        for (const char *h = strstr(p, "(host "); h && h < end; h = strstr(h, "(host ")) {
            h += strlen("(host ");
            size_t len = strcspn(h, ")");
            add_lost(h, len, hosts, lost);
            h += len;
        }
    }
    /* Open MPI: "ORTE has lost communication with a remote daemon. ... Remote daemon:
     * [[52149,0],1] on node h2". */
    if ((p = strstr(line, "Remote daemon")) && (p = strstr(p, " on node "))) {
        p += strlen(" on node ");
        add_lost(p, strcspn(p, " \t\r\n"), hosts, lost);
    }
}

typedef struct stream {
    int from, to;
    int seen; /* some output came */
    char buf[8192];
    size_t used;
} stream;

/* Writes len bytes to fd (what the job printed, passed through). */
static void put(int fd, const char *p, size_t len)
{
    for (size_t o = 0; o < len;) {
        ssize_t w = write(fd, p + o, len - o);
        if (w < 0 && errno != EINTR)
            break;
        o += w > 0 ? (size_t)w : 0;
    }
}

/* Open MPI's mpirun says so for each --hang-timeout probe (SIGUSR1): not passed through. */
static int probe_noise(const char *line)
{
    return strstr(line, "Forwarding signal 10 to job") != NULL;
}

/* Passes what came on s->from through to s->to line by line (a partial line once it ends, or
 * fills the buffer) and scans every whole line. 0 at EOF. */
static int pump(stream *s, const launch_hosts *hosts, launch_hosts *lost)
{
    ssize_t got = read(s->from, s->buf + s->used, sizeof s->buf - 1 - s->used);
    if (got < 0)
        return errno == EINTR || errno == EAGAIN ? 1 : 0;
    if (got == 0) {
        s->buf[s->used] = '\0';
        put(s->to, s->buf, s->used);
        launch_scan_line(s->buf, hosts, lost);
        return 0;
    }
    s->seen = 1;
    s->used += (size_t)got;
    char *start = s->buf, *nl;
    s->buf[s->used] = '\0';
    while ((nl = memchr(start, '\n', s->used - (size_t)(start - s->buf)))) {
        *nl = '\0';
        if (!probe_noise(start)) {
            *nl = '\n';
            put(s->to, start, (size_t)(nl - start) + 1);
            *nl = '\0';
        }
        launch_scan_line(start, hosts, lost);
        start = nl + 1;
    }
    size_t left = s->used - (size_t)(start - s->buf);
    if (left == sizeof s->buf - 1) { /* a line longer than the buffer: pass and scan it */
        put(s->to, start, left);
        launch_scan_line(start, hosts, lost);
        left = 0;
    }
    memmove(s->buf, start, left);
    s->used = left;
    return 1;
}

static double wall_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* --hang-timeout: probes (SIGUSR1 to the launcher, which passes it on to the clients) and
 * reads their flight records; 1 when a hung client was named (printed, its host in *lost). */
typedef struct prober {
    double first_output, last_probe, probe_wall;
    int checked;
} prober;

static int probe(prober *p, const launch_hang *hang, pid_t pid, int seen, launch_hosts *lost)
{
    double t = now_s();
    if (!seen)
        return 0;
    if (p->first_output == 0)
        p->first_output = t;
    if (t - p->first_output < hang->bound)
        return 0;
    double every = hang->bound / 2 < 1 ? 1 : hang->bound / 2;
    if (p->last_probe == 0 || t - p->last_probe >= every) {
        p->probe_wall = wall_s();
        p->last_probe = t;
        p->checked = 0;
        kill(pid, SIGUSR1);
        return 0;
    }
    if (p->checked || t - p->last_probe < 0.5)
        return 0;
    p->checked = 1;
    char msg[2048];
    launch_hosts hung = {.n = 0};
    if (!launch_hang_check(hang->dir, wall_s(), hang->bound, p->probe_wall - 0.001, msg,
                           sizeof msg, &hung))
        return 0;
    fprintf(stderr, "dtensor launch: %s: stopping the job\n", msg);
    for (int i = 0; i < hung.n && lost->n < LAUNCH_MAX_HOSTS; i++)
        lost->h[lost->n++] = hung.h[i];
    return 1;
}

int launch_run(char *const *argv, const launch_hosts *hosts, launch_hosts *lost,
               const launch_hang *hang, char *err, size_t errlen)
{
    int out[2], errp[2];
    if (pipe(out) != 0 || pipe(errp) != 0) {
        snprintf(err, errlen, "pipe: %s", strerror(errno));
        return -1;
    }
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0) {
        snprintf(err, errlen, "fork: %s", strerror(errno));
        return -1;
    }
    if (pid == 0) {
        setpgid(0, 0); /* its own group, so that a stuck launcher is stopped with its children */
        dup2(out[1], 1);
        dup2(errp[1], 2);
        close(out[0]), close(out[1]), close(errp[0]), close(errp[1]);
        execvp(argv[0], argv);
        fprintf(stderr, "dtensor launch: cannot run %s: %s\n", argv[0], strerror(errno));
        _exit(127);
    }
    close(out[1]);
    close(errp[1]);
    setpgid(pid, pid);
    child_pid = pid;
    struct sigaction sa, old[3];
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = forward;
    sigemptyset(&sa.sa_mask);
    int sigs[3] = {SIGINT, SIGTERM, SIGHUP};
    for (int i = 0; i < 3; i++)
        sigaction(sigs[i], &sa, &old[i]);
    static stream s[2];
    s[0] = (stream){.from = out[0], .to = 1};
    s[1] = (stream){.from = errp[0], .to = 2};
    int open_n = 2, status = 0, exited = 0;
    double grace = 0; /* seconds of output read after the launcher exited */
    double lost_at = 0;
    int stopped = 0;
    prober pr = {0};
    while (open_n > 0) {
        struct pollfd fds[2];
        int map[2], n = 0;
        for (int i = 0; i < 2; i++)
            if (s[i].from >= 0) {
                fds[n] = (struct pollfd){.fd = s[i].from, .events = POLLIN};
                map[n++] = i;
            }
        int r = poll(fds, (nfds_t)n, 250);
        if (r < 0 && errno != EINTR)
            break;
        for (int k = 0; r > 0 && k < n; k++)
            if (fds[k].revents && !pump(&s[map[k]], hosts, lost)) {
                close(s[map[k]].from);
                s[map[k]].from = -1;
                open_n--;
            }
        /* A process the launcher left behind may hold the pipes open: read on for 2 s after
         * the launcher itself exited, then stop. */
        if (!exited && waitpid(pid, &status, WNOHANG) == pid)
            exited = 1;
        else if (!exited && !stopped && hang && hang->bound > 0 &&
                 probe(&pr, hang, pid, s[0].seen || s[1].seen, lost)) {
            kill(-pid, SIGTERM); /* hung: nothing will end by itself */
            stopped = 1;
            lost_at = now_s() - LOST_GRACE_S;
        }
        else if (!exited && lost->n > 0) {
            double t = now_s();
            if (lost_at == 0)
                lost_at = t;
            if (stopped == 0 && t - lost_at > LOST_GRACE_S) {
                fprintf(stderr, "dtensor launch: %s had not ended %.0f s after the job reported "
                        "a lost host: stopping it\n", argv[0], LOST_GRACE_S);
                kill(-pid, SIGTERM);
                stopped = 1;
            } else if (stopped == 1 && t - lost_at > LOST_GRACE_S + 10) {
                kill(-pid, SIGKILL);
                stopped = 2;
            }
        }
        else if (exited && r == 0 && (grace += 0.25) >= 2)
            break;
    }
    while (!exited && waitpid(pid, &status, 0) < 0 && errno == EINTR)
        ;
    child_pid = 0;
    for (int i = 0; i < 3; i++)
        sigaction(sigs[i], &old[i], NULL);
    for (int i = 0; i < 2; i++)
        if (s[i].from >= 0)
            close(s[i].from);
    if (stopped) /* whatever the stopped launcher then did (Open MPI's may crash) */
        return 128 + SIGTERM;
    if (WIFSIGNALED(status))
        return 128 + WTERMSIG(status);
    return WEXITSTATUS(status);
}
