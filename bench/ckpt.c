/* bench_ckpt: times dt_save, dt_restore_into and a resharding restore (of a checkpoint saved
 * from more devices by an earlier `--cases source` run) against a plain write+fsync and a plain
 * read of the same bytes by the same processes, interleaved in one run; one key=value line per
 * case (docs/bench.md). */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "bench_util.h"
#include "dtensor/dtensor.h"

enum { MAX_TENSORS = 64, MAX_REPS = 100, ROW = 1024 };

typedef struct opts {
    int mib; /* payload over all processes */
    int reps;
    int ntensors;
    const char *dir;
    const char *cases;
    const char *cache;
} opts;

static int g_rank, g_nclients;

/* The benchmark's state: tensors on the mesh of every device (one per process), the
 * reference file of this process, and paths. */
typedef struct bench {
    opts o;
    dt_mesh *mesh;
    int64_t source_devices; /* devices that saved the resharding source */
    int nt;
    char names_buf[MAX_TENSORS][32];
    const char *names[MAX_TENSORS];
    int64_t shapes[MAX_TENSORS][2];
    dt_layout *layouts[MAX_TENSORS];
    dt_tensor *src[MAX_TENSORS], *dst[MAX_TENSORS];
    char ours[4096], ours4[4096], ref[4096];
    double payload; /* bytes over all processes */
} bench;

static float value_of(int k, int64_t g)
{
    return (float)((g + 7 * k) % 4093);
}

/* Fills (check == 0) or checks every element of the local components of t (tensor k). */
static int64_t walk(const dt_tensor *t, int k, int check)
{
    int64_t bad = 0;
    for (int c = 0; c < dt_tensor_num_local(t); c++) {
        const DLTensor *dl = dt_tensor_local(t, c);
        const int64_t *off = dt_tensor_local_offset(t, c);
        float *p = dl->data;
        int64_t rows = dl->shape[0], cols = dl->shape[1], gcols = dt_tensor_shape(t)[1];
        for (int64_t r = 0; r < rows; r++)
            for (int64_t j = 0; j < cols; j++) {
                float want = value_of(k, (off[0] + r) * gcols + off[1] + j);
                if (!check)
                    p[r * cols + j] = want;
                else
                    bad += p[r * cols + j] != want;
            }
    }
    return bad;
}

static double max_all(double t)
{
    double m;
    MPI_Allreduce(&t, &m, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    return m;
}

static int ok_all(int ok)
{
    int all;
    MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    return all;
}

/* ---- the reference: one plain file per process, the same bytes as its slices ------------- */

static int ref_write(const bench *b)
{
    int fd = open(b->ref, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0)
        return -1;
    for (int k = 0; k < b->nt; k++) {
        const DLTensor *dl = dt_tensor_local(b->src[k], 0);
        const char *p = dl->data;
        size_t left = (size_t)(dl->shape[0] * dl->shape[1]) * sizeof(float);
        while (left > 0) {
            ssize_t n = write(fd, p, left);
            if (n < 0 && errno == EINTR)
                continue;
            if (n <= 0) {
                close(fd);
                return -1;
            }
            p += n;
            left -= (size_t)n;
        }
    }
    int rc = fsync(fd);
    return close(fd) == 0 && rc == 0 ? 0 : -1;
}

static int ref_read(const bench *b)
{
    int fd = open(b->ref, O_RDONLY);
    if (fd < 0)
        return -1;
    for (int k = 0; k < b->nt; k++) {
        const DLTensor *dl = dt_tensor_local(b->dst[k], 0);
        char *p = dl->data;
        size_t left = (size_t)(dl->shape[0] * dl->shape[1]) * sizeof(float);
        while (left > 0) {
            ssize_t n = read(fd, p, left);
            if (n < 0 && errno == EINTR)
                continue;
            if (n <= 0) {
                close(fd);
                return -1;
            }
            p += n;
            left -= (size_t)n;
        }
    }
    return close(fd);
}

/* Drops the page cache of a file, or of every file in a directory (clean pages only: all of
 * them were fsynced). */
static void drop_cache(const char *path)
{
    struct stat sb;
    if (stat(path, &sb) != 0)
        return;
    if (S_ISDIR(sb.st_mode)) {
        DIR *d = opendir(path);
        if (!d)
            return;
        struct dirent *e;
        char p[8192];
        while ((e = readdir(d)) != NULL) {
            if (e->d_name[0] == '.')
                continue;
            snprintf(p, sizeof p, "%s/%s", path, e->d_name);
            drop_cache(p);
        }
        closedir(d);
        return;
    }
    int fd = open(path, O_RDONLY);
    if (fd < 0)
        return;
    fdatasync(fd);
    posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    close(fd);
}

/* ---- one case: ours and the reference, interleaved ----------------------------------------- */

typedef enum kind { SAVE, RESTORE, RESHARD } kind;

static int run_ours(bench *b, kind k)
{
    dt_status st;
    if (k == SAVE)
        st = dt_save(b->mesh, b->ours, b->nt, b->names, (const dt_tensor *const *)b->src, NULL);
    else
        st = dt_restore_into(k == RESTORE ? b->ours : b->ours4, b->nt, b->names, b->dst);
    if (st != DT_OK)
        fprintf(stderr, "# client %d: %s failed: %s: %s\n", g_rank,
                k == SAVE ? "dt_save" : "dt_restore_into", dt_status_name(st), dt_last_error());
    return st == DT_OK;
}

static int run_ref(bench *b, kind k)
{
    int rc = k == SAVE ? ref_write(b) : ref_read(b);
    if (rc != 0)
        fprintf(stderr, "# client %d: reference %s of %s failed: %s\n", g_rank,
                k == SAVE ? "write" : "read", b->ref, strerror(errno));
    return rc == 0;
}

/* Times one call (0: ours, 1: reference); cold drops the page cache of both first. */
static double timed(bench *b, kind k, int which, int cold, int *ok)
{
    if (cold) {
        drop_cache(k == RESHARD ? b->ours4 : b->ours);
        drop_cache(b->ref);
    }
    if (k == SAVE && which == 1)
        unlink(b->ref); /* a fresh file, as ours writes fresh files */
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = MPI_Wtime();
    int good = which == 0 ? run_ours(b, k) : run_ref(b, k);
    double t = max_all(MPI_Wtime() - t0);
    *ok = ok_all(good) && *ok;
    return t;
}

static int run_case(bench *b, kind k, const char *cache)
{
    static const char *case_names[] = {"save", "restore", "reshard_restore"};
    int cold = cache && strcmp(cache, "cold") == 0, ok = 1;
    double tours[MAX_REPS], tref[MAX_REPS];
    timed(b, k, 0, 0, &ok); /* warm-up: plans, files, pages */
    timed(b, k, 1, 0, &ok);
    for (int r = 0; r < b->o.reps && ok; r++) {
        int first = r % 2; /* alternate who goes first */
        double t1 = timed(b, k, first, cold, &ok);
        double t2 = timed(b, k, 1 - first, cold, &ok);
        tours[r] = first == 0 ? t1 : t2;
        tref[r] = first == 0 ? t2 : t1;
    }
    bu_line line;
    bu_line_init(&line);
    bu_line_add(&line, "case", "%s", case_names[k]);
    bu_line_add(&line, "np", "%d", g_nclients);
    if (k == RESHARD) {
        bu_line_add(&line, "from_devices", "%lld", (long long)b->source_devices);
        bu_line_add(&line, "to_devices", "%lld", (long long)dt_mesh_size(b->mesh));
    }
    bu_line_add(&line, "mib", "%d", b->o.mib);
    if (k != SAVE)
        bu_line_add(&line, "cache", "%s", cache);
    if (!ok) {
        bu_line_add(&line, "error", "%s_failed", case_names[k]);
        if (g_rank == 0)
            bu_line_print(&line);
        return 0;
    }
    /* Check: ours once more into a destination of NaNs, every element against its formula. */
    int64_t bad = 0;
    if (k != SAVE) {
        for (int t = 0; t < b->nt; t++) {
            const DLTensor *dl = dt_tensor_local(b->dst[t], 0);
            memset(dl->data, 0xFF, (size_t)(dl->shape[0] * dl->shape[1]) * sizeof(float));
        }
        ok = ok_all(run_ours(b, k));
        for (int t = 0; ok && t < b->nt; t++)
            bad += walk(b->dst[t], t, 1);
        long long all = 0, mine = bad;
        MPI_Allreduce(&mine, &all, 1, MPI_LONG_LONG, MPI_SUM, MPI_COMM_WORLD);
        bad = all;
    }
    double mo = bu_median(tours, b->o.reps), mr = bu_median(tref, b->o.reps);
    double go = b->payload / mo / 1e9, gr = b->payload / mr / 1e9;
    bu_line_add(&line, "ours_gbs", "%.3f", go);
    bu_line_add(&line, "ref", "%s", k == SAVE ? "write_fsync" : "read");
    bu_line_add(&line, "ref_gbs", "%.3f", gr);
    bu_line_add(&line, "ratio", "%.3f", go / gr);
    bu_line_add(&line, "ours_ms", "%.1f", mo * 1e3);
    bu_line_add(&line, "ref_ms", "%.1f", mr * 1e3);
    bu_line_add(&line, "reps", "%d", b->o.reps);
    if (!ok)
        bu_line_add(&line, "check", "FAIL_restore");
    else if (bad)
        bu_line_add(&line, "check", "FAIL_%lld_wrong", (long long)bad);
    else
        bu_line_add(&line, "check", "ok");
    if (g_rank == 0)
        bu_line_print(&line);
    return ok && bad == 0;
}

/* ---- set-up ---------------------------------------------------------------------------------- */

static dt_status setup(bench *b)
{
    const char *x = "x";
    int64_t ndev = dt_num_global_devices(DT_DEVICE_CPU);
    dt_status st = dt_mesh_create(NULL, 1, &x, &ndev, DT_DEVICE_CPU, &b->mesh);
    if (st != DT_OK)
        return st;
    int64_t rows = (int64_t)b->o.mib * (1 << 20) / (ROW * (int64_t)sizeof(float));
    b->nt = b->o.ntensors;
    b->payload = (double)rows * ROW * sizeof(float);
    for (int k = 0; k < b->nt; k++) {
        snprintf(b->names_buf[k], sizeof b->names_buf[k], "layer.%d.weight", k);
        b->names[k] = b->names_buf[k];
        b->shapes[k][0] = rows / b->nt + (k < rows % b->nt);
        b->shapes[k][1] = ROW;
        const char *specs[2] = {"x", DT_UNSHARDED};
        st = dt_layout_create(b->mesh, 2, specs, &b->layouts[k]);
        if (st == DT_OK)
            st = dt_tensor_zeros(b->layouts[k], DT_DTYPE_F32, b->shapes[k], &b->src[k]);
        if (st == DT_OK)
            st = dt_tensor_zeros(b->layouts[k], DT_DTYPE_F32, b->shapes[k], &b->dst[k]);
        if (st != DT_OK)
            return st;
        walk(b->src[k], k, 0);
    }
    return DT_OK;
}

/* `--cases source`: saves the resharding source from every device of this run (untimed). */
static dt_status save_source(bench *b)
{
    return dt_save(b->mesh, b->ours4, b->nt, b->names, (const dt_tensor *const *)b->src, NULL);
}

static void teardown(bench *b)
{
    for (int k = 0; k < b->nt; k++) {
        dt_tensor_destroy(b->src[k]);
        dt_tensor_destroy(b->dst[k]);
        dt_layout_destroy(b->layouts[k]);
    }
    dt_mesh_destroy(b->mesh);
}

/* The resharding case, if a source checkpoint saved by more devices is there. */
static int reshard(bench *b)
{
    dt_ckpt *ck = NULL;
    dt_status st = dt_ckpt_open(b->ours4, &ck);
    if (st == DT_OK) {
        b->source_devices = dt_ckpt_num_files(ck);
        dt_ckpt_close(ck);
    }
    if (st != DT_OK || b->source_devices <= dt_mesh_size(b->mesh)) {
        if (g_rank == 0)
            fprintf(stderr,
                    "# no resharding source in %s (%s): run `bench_ckpt --cases source` "
                    "with more devices first (bench/run ckpt does)\n",
                    b->ours4,
                    st != DT_OK ? dt_last_error() : "saved by no more devices than this run");
        return 0;
    }
    int good = 1;
    for (int c = 0; c < 2; c++) {
        const char *cache = c == 0 ? "cold" : "warm";
        if (bu_list_has(b->o.cache, cache))
            good &= run_case(b, RESHARD, cache);
    }
    return good;
}

static int usage(void)
{
    fprintf(stderr, "usage: bench_ckpt [--mib N] [--reps N] [--tensors K] [--dir DIR]\n"
                    "                  [--cases save,restore,reshard | source] [--cache cold,warm]"
                    "\n                  [--quick]\n"
                    "  one device per process (DT_CPU_DEVICES=1); `--cases source` saves the\n"
                    "  resharding source from every device of its run (e.g. 2 x 2 devices)\n");
    return 2;
}

static int parse_args(int argc, char **argv, opts *o)
{
    *o = (opts){1024, 3, 4, NULL, "save,restore,reshard", "cold,warm"};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(a, "--quick") == 0) {
            o->reps = 1;
            continue;
        }
        if (!v)
            return usage();
        i++;
        if (strcmp(a, "--mib") == 0)
            o->mib = atoi(v);
        else if (strcmp(a, "--reps") == 0)
            o->reps = atoi(v);
        else if (strcmp(a, "--tensors") == 0)
            o->ntensors = atoi(v);
        else if (strcmp(a, "--dir") == 0)
            o->dir = v;
        else if (strcmp(a, "--cases") == 0)
            o->cases = v;
        else if (strcmp(a, "--cache") == 0)
            o->cache = v;
        else
            return usage();
    }
    if (o->mib < 1 || o->reps < 1 || o->reps > MAX_REPS || o->ntensors < 1 ||
        o->ntensors > MAX_TENSORS)
        return usage();
    return 0;
}

int main(int argc, char **argv)
{
    bench b;
    memset(&b, 0, sizeof b);
    int rc = parse_args(argc, argv, &b.o);
    if (rc != 0)
        return rc;
    dt_init_opts io = DT_INIT_OPTS_INIT;
    dt_status st = dt_init(&argc, &argv, &io);
    if (st != DT_OK) {
        fprintf(stderr, "bench_ckpt: dt_init: %s: %s\n", dt_status_name(st), dt_last_error());
        return 1;
    }
    g_rank = dt_client_id();
    g_nclients = dt_num_clients();
    const char *dir = b.o.dir ? b.o.dir : "bench-ckpt.tmp";
    if (g_rank == 0)
        mkdir(dir, 0755);
    MPI_Barrier(MPI_COMM_WORLD);
    snprintf(b.ours, sizeof b.ours, "%s/ours", dir);
    snprintf(b.ours4, sizeof b.ours4, "%s/ours_all_devices", dir);
    snprintf(b.ref, sizeof b.ref, "%s/ref-%d.bin", dir, g_rank);

    st = setup(&b);
    if (st != DT_OK) {
        fprintf(stderr, "bench_ckpt: set-up: %s: %s\n", dt_status_name(st), dt_last_error());
        teardown(&b);
        dt_finalize();
        return 1;
    }
    if (g_rank == 0) {
        printf("# bench_ckpt: %d process(es), %d CPU device(s) each; f32, %d tensors, %d MiB in "
               "all, %d per process; files in %s\n",
               g_nclients, dt_num_local_devices(DT_DEVICE_CPU), b.nt, b.o.mib, b.o.mib / g_nclients,
               dir);
        fflush(stdout);
    }
    int good = 1;
    if (bu_list_has(b.o.cases, "source")) {
        st = save_source(&b);
        if (st != DT_OK)
            fprintf(stderr, "# client %d: saving the resharding source: %s: %s\n", g_rank,
                    dt_status_name(st), dt_last_error());
        teardown(&b);
        dt_finalize();
        return st == DT_OK ? 0 : 1;
    }
    if (bu_list_has(b.o.cases, "save"))
        good &= run_case(&b, SAVE, NULL);
    if (bu_list_has(b.o.cases, "restore") || bu_list_has(b.o.cases, "reshard")) {
        /* The restores read the checkpoint of the last save (and the reference its file). */
        if (!bu_list_has(b.o.cases, "save")) {
            int ok = ok_all(run_ours(&b, SAVE)) && ok_all(run_ref(&b, SAVE));
            good &= ok;
        }
        for (int c = 0; c < 2; c++) {
            const char *cache = c == 0 ? "cold" : "warm";
            if (bu_list_has(b.o.cache, cache) && bu_list_has(b.o.cases, "restore"))
                good &= run_case(&b, RESTORE, cache);
        }
        if (bu_list_has(b.o.cases, "reshard"))
            good &= reshard(&b);
    }
    teardown(&b);
    dt_finalize();
    return good ? 0 : 1;
}
