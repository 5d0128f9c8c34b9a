/* bench_data: the input pipeline (docs/bench.md). Case `wait`: the time a training loop waits
 * in dt_dataset_next for a source made slow on purpose, with prefetching against without.
 * Case `read`: a record file read through a dataset (batches delivered as tensors) against a
 * plain read() of the same file, interleaved. One key=value line per case. One process. */
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "bench_util.h"
#include "dtensor/dtensor.h"

enum { MAX_REPS = 50, RECORD = 4096 };

typedef struct opts {
    const char *cases;
    const char *dir;
    int mib;       /* read: file size */
    int reps;      /* read: timed passes of each */
    int steps;     /* wait: training steps per run */
    double src_ms; /* wait: source time per batch */
    double step_ms; /* wait: compute time per step */
    int gpu;       /* wait: on a GPU mesh (--device gpu; DT_GPU=sim works) */
    int floats;    /* wait: f32 values per example */
} opts;

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void sleep_ms(double ms)
{
    struct timespec ts = {(time_t)(ms / 1000), (long)(ms * 1e6) % 1000000000L};
    nanosleep(&ts, NULL);
}

static int fail(const char *what, dt_status st)
{
    fprintf(stderr, "bench_data: %s: %s: %s\n", what, dt_status_name(st), dt_last_error());
    return 1;
}

/* ---- wait: a slow source ---------------------------------------------------------------------- */

typedef struct slow {
    double ms_per_example;
    int floats;
} slow;

static dt_status slow_fill(void *arg, int64_t i, void *const *f)
{
    const slow *s = arg;
    sleep_ms(s->ms_per_example);
    for (int j = 0; j < s->floats; j++)
        ((float *)f[0])[j] = (float)i;
    return DT_OK;
}

/* Seconds spent in dt_dataset_next over o->steps steps of o->step_ms each; *ok whether every
 * batch held the examples expected. With `to` set (a GPU layout), the dataset is on the host
 * mesh and each batch is copied to `to` in the timed part: the pipeline as it was before the
 * prefetch thread uploaded batches itself. */
static int wait_run(const opts *o, const dt_layout *l, int prefetch, const dt_layout *to,
                    double *wait_s, int *ok)
{
    enum { B = 8 };
    slow s = {o->src_ms / B, o->floats};
    dt_data_field f = {DT_DTYPE_F32, 1, {o->floats}};
    size_t bytes = (size_t)B * (size_t)o->floats * sizeof(float);
    float *first = malloc(bytes);
    dt_data_source *src = NULL;
    dt_dataset *ds = NULL;
    dt_status st = first ? dt_data_source_callback(1 << 20, 1, &f, slow_fill, &s, &src)
                         : DT_ERR_NO_MEMORY;
    dt_dataset_opts d = DT_DATASET_OPTS_INIT;
    d.global_batch = B;
    d.shuffle = 0;
    d.prefetch = prefetch;
    if (st == DT_OK)
        st = dt_dataset_create(src, 1, &l, &d, &ds);
    double waited = 0;
    for (int step = 0; st == DT_OK && step < o->steps; step++) {
        dt_tensor *t = NULL;
        double t0 = now();
        st = dt_dataset_next(ds, 1, &t, NULL);
        if (st == DT_OK && to) {
            dt_tensor *h = t;
            st = dt_copy_to_mesh(h, to, &t);
            dt_tensor_destroy(h);
        }
        waited += now() - t0;
        if (st != DT_OK)
            break;
        /* Read back through the device layer (device memory on a GPU mesh), outside the
         * timed call. */
        st = dt_tensor_local_read(t, 0, first, bytes);
        *ok &= st == DT_OK && first[0] == (float)(step * B) &&
               first[(size_t)B * (size_t)o->floats - 1] == (float)(step * B + B - 1);
        dt_tensor_destroy(t);
        sleep_ms(o->step_ms); /* the training step */
    }
    dt_dataset_destroy(ds);
    dt_data_source_destroy(src);
    free(first);
    if (st != DT_OK)
        return fail("wait", st);
    *wait_s = waited;
    return 0;
}

static int case_wait(const opts *o, const dt_mesh *m)
{
    dt_layout *l = NULL;
    dt_status st = dt_layout_batch_sharded(m, "batch", 2, 0, &l);
    if (st != DT_OK)
        return fail("layout", st);
    double without = 0, with = 0, copied = 0;
    int ok = 1, rc = wait_run(o, l, 0, NULL, &without, &ok) ||
                     wait_run(o, l, 2, NULL, &with, &ok);
    if (!rc && o->gpu) {
        /* The reference of a GPU mesh: prefetched on the host mesh, copied in the loop. */
        dt_mesh *host = NULL;
        dt_layout *hl = NULL;
        st = dt_mesh_host_mesh(m, &host);
        if (st == DT_OK)
            st = dt_layout_batch_sharded(host, "batch", 2, 0, &hl);
        rc = st != DT_OK ? fail("host layout", st) : wait_run(o, hl, 2, l, &copied, &ok);
        dt_layout_destroy(hl);
        dt_mesh_destroy(host);
    }
    dt_layout_destroy(l);
    if (rc)
        return 1;
    bu_line line;
    bu_line_init(&line);
    bu_line_add(&line, "case", "wait");
    bu_line_add(&line, "device", "%s", o->gpu ? "gpu" : "cpu");
    bu_line_add(&line, "batch_bytes", "%zu", (size_t)8 * (size_t)o->floats * sizeof(float));
    bu_line_add(&line, "steps", "%d", o->steps);
    bu_line_add(&line, "source_ms", "%.2f", o->src_ms);
    bu_line_add(&line, "step_ms", "%.2f", o->step_ms);
    bu_line_add(&line, "prefetch_wait_ms", "%.3f", 1e3 * with / o->steps);
    bu_line_add(&line, "ref", "no_prefetch");
    bu_line_add(&line, "ref_wait_ms", "%.3f", 1e3 * without / o->steps);
    bu_line_add(&line, "hidden", "%.3f", without > 0 ? 1 - with / without : 0.0);
    if (o->gpu)
        bu_line_add(&line, "host_prefetch_copy_wait_ms", "%.3f", 1e3 * copied / o->steps);
    bu_line_add(&line, "check", "%s", ok ? "ok" : "BAD");
    bu_line_print(&line);
    return !ok;
}

/* ---- read: a record file --------------------------------------------------------------------- */

/* Writes the file: record i starts with i (u32), the rest a pattern. */
static int write_records(const char *path, int64_t n)
{
    FILE *f = fopen(path, "wb");
    unsigned char rec[RECORD];
    if (!f)
        return -1;
    for (int j = 0; j < RECORD; j++)
        rec[j] = (unsigned char)(j * 31);
    for (int64_t i = 0; i < n; i++) {
        uint32_t v = (uint32_t)i;
        memcpy(rec, &v, sizeof v);
        if (fwrite(rec, 1, RECORD, f) != RECORD) {
            fclose(f);
            return -1;
        }
    }
    return fclose(f);
}

/* One plain pass: read() in 1 MiB pieces. */
static double plain_pass(const char *path, void *buf, size_t *bytes_out)
{
    double t0 = now();
    int fd = open(path, O_RDONLY);
    size_t total = 0;
    ssize_t got;
    while (fd >= 0 && (got = read(fd, buf, 1 << 20)) > 0)
        total += (size_t)got;
    if (fd >= 0)
        close(fd);
    *bytes_out = total;
    return now() - t0;
}

/* One pass through a dataset over the file: every batch delivered as a tensor (one epoch). */
static double dataset_pass(dt_data_source *src, const dt_layout *l, int prefetch, int *ok)
{
    enum { B = 256 }; /* 1 MiB a batch */
    dt_dataset_opts d = DT_DATASET_OPTS_INIT;
    d.global_batch = B;
    d.shuffle = 0;
    d.epochs = 1;
    d.prefetch = prefetch;
    dt_dataset *ds = NULL;
    double t0 = now();
    dt_status st = dt_dataset_create(src, 1, &l, &d, &ds);
    for (int64_t b = 0; st == DT_OK; b++) {
        dt_tensor *t = NULL;
        dt_data_batch_info info;
        if ((st = dt_dataset_next(ds, 1, &t, &info)) != DT_OK || info.end)
            break;
        uint32_t first;
        memcpy(&first, dt_tensor_local(t, 0)->data, sizeof first);
        *ok &= first == (uint32_t)(b * B);
        dt_tensor_destroy(t);
    }
    dt_dataset_destroy(ds);
    if (st != DT_OK) {
        fail("read", st);
        *ok = 0;
    }
    return now() - t0;
}

static int case_read(const opts *o, const dt_mesh *m)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/bench_data.%d.bin", o->dir, (int)getpid());
    int64_t n = (int64_t)o->mib * (1 << 20) / RECORD;
    void *buf = malloc(1 << 20);
    if (!buf || write_records(path, n) != 0) {
        fprintf(stderr, "bench_data: cannot write %s\n", path);
        free(buf);
        unlink(path);
        return 1;
    }
    dt_data_field f = {DT_DTYPE_U8, 1, {RECORD}};
    dt_data_source *src = NULL;
    dt_layout *l = NULL;
    dt_status st = dt_data_source_records(path, 1, &f, NULL, &src);
    if (st == DT_OK)
        st = dt_layout_batch_sharded(m, "batch", 2, 0, &l);
    int rc = st != DT_OK ? fail("source", st) : 0;
    for (int prefetch = 0; rc == 0 && prefetch <= 2; prefetch += 2) {
        double ours[MAX_REPS], ref[MAX_REPS];
        size_t bytes = 0;
        int ok = 1;
        plain_pass(path, buf, &bytes); /* warm the page cache */
        for (int r = 0; r < o->reps; r++) {
            /* Alternate which goes first, so neither always follows the other. */
            if (r % 2) {
                ref[r] = plain_pass(path, buf, &bytes);
                ours[r] = dataset_pass(src, l, prefetch, &ok);
            } else {
                ours[r] = dataset_pass(src, l, prefetch, &ok);
                ref[r] = plain_pass(path, buf, &bytes);
            }
        }
        ok &= bytes == (size_t)n * RECORD;
        double to = bu_median(ours, o->reps), tr = bu_median(ref, o->reps);
        bu_line line;
        bu_line_init(&line);
        bu_line_add(&line, "case", "read");
        bu_line_add(&line, "mib", "%d", o->mib);
        bu_line_add(&line, "record", "%d", RECORD);
        bu_line_add(&line, "prefetch", "%d", prefetch);
        bu_line_add(&line, "ours_gbs", "%.3f", (double)bytes / to / 1e9);
        bu_line_add(&line, "ref", "read");
        bu_line_add(&line, "ref_gbs", "%.3f", (double)bytes / tr / 1e9);
        bu_line_add(&line, "ratio", "%.3f", tr / to);
        bu_line_add(&line, "reps", "%d", o->reps);
        bu_line_add(&line, "check", "%s", ok ? "ok" : "BAD");
        bu_line_print(&line);
        rc = !ok;
    }
    dt_layout_destroy(l);
    dt_data_source_destroy(src);
    unlink(path);
    free(buf);
    return rc;
}

static int usage(void)
{
    fprintf(stderr, "usage: bench_data [--cases wait,read] [--mib N] [--reps N] [--steps N] "
                    "[--source-ms MS] [--step-ms MS] [--dir DIR]\n"
                    "                  [--device cpu|gpu] [--floats N]\n"
                    "  --device gpu: the wait case on a one-GPU mesh (DT_GPU=sim works),\n"
                    "  --floats N: f32 values per example of the wait case (default 1)\n");
    return 2;
}

int main(int argc, char **argv)
{
    opts o = {"wait,read", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp", 64, 7, 100, 2.0, 3.0,
              0, 1};
    for (int i = 1; i < argc; i++) {
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v)
            return usage();
        if (!strcmp(argv[i], "--cases"))
            o.cases = v;
        else if (!strcmp(argv[i], "--dir"))
            o.dir = v;
        else if (!strcmp(argv[i], "--mib"))
            o.mib = atoi(v);
        else if (!strcmp(argv[i], "--reps"))
            o.reps = atoi(v);
        else if (!strcmp(argv[i], "--steps"))
            o.steps = atoi(v);
        else if (!strcmp(argv[i], "--source-ms"))
            o.src_ms = atof(v);
        else if (!strcmp(argv[i], "--step-ms"))
            o.step_ms = atof(v);
        else if (!strcmp(argv[i], "--device") && (!strcmp(v, "cpu") || !strcmp(v, "gpu")))
            o.gpu = !strcmp(v, "gpu");
        else if (!strcmp(argv[i], "--floats"))
            o.floats = atoi(v);
        else
            return usage();
        i++;
    }
    if (o.mib < 1 || o.reps < 1 || o.reps > MAX_REPS || o.steps < 1 || o.src_ms < 0 ||
        o.step_ms < 0 || o.floats < 1 || o.floats > (1 << 24))
        return usage();
    dt_init_opts io = DT_INIT_OPTS_INIT;
    io.cpu_devices = 1;
    io.use_gpus = o.gpu;
    io.gpu_devices = o.gpu;
    dt_status st = dt_init(&argc, &argv, &io);
    if (st != DT_OK)
        return fail("dt_init", st);
    const char *dim = "batch";
    int64_t size = 1;
    dt_mesh *m = NULL;
    int rc = 0;
    if ((st = dt_mesh_create("bench", 1, &dim, &size, o.gpu ? DT_DEVICE_GPU : DT_DEVICE_CPU,
                             &m)) != DT_OK)
        rc = fail("mesh", st);
    printf("# bench_data: one process, one %s device%s\n", o.gpu ? "GPU" : "CPU",
           o.gpu && getenv("DT_GPU") ? (strcmp(getenv("DT_GPU"), "sim") ? "" : " (DT_GPU=sim)")
                                     : "");
    if (!rc && bu_list_has(o.cases, "wait"))
        rc |= case_wait(&o, m);
    if (!rc && bu_list_has(o.cases, "read") && o.gpu)
        printf("# read: CPU meshes only (its reference is a plain read into host memory)\n");
    else if (!rc && bu_list_has(o.cases, "read"))
        rc |= case_read(&o, m);
    dt_mesh_destroy(m);
    dt_finalize();
    return rc;
}
