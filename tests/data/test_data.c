/* Tests of data/: global batches on CPU meshes against a single-device reference on client 0,
 * shuffling and epochs, prefetch, resume, the record, CSV and line readers and their errors.
 * Runs with 8 CPU devices in one process and under mpiexec (2 and 4 processes of 2). */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>

#include "harness.h"

#define FEATURES 3

/* ---- helpers --------------------------------------------------------------------------------- */

static int ndev(void)
{
    return dt_num_global_devices(DT_DEVICE_CPU);
}

/* Example i: x = {i, i + 0.25, i + 0.5}, y = 7 * i + 1. Counts the examples it fills. */
typedef struct synth {
    int64_t filled;
    int64_t fail_at; /* return DT_ERR_IO for this example (-1: never) */
} synth;

static dt_status synth_fill(void *arg, int64_t i, void *const *f)
{
    synth *s = arg;
    if (i == s->fail_at)
        return DT_ERR_IO;
    s->filled++;
    if (f[0])
        for (int j = 0; j < FEATURES; j++)
            ((float *)f[0])[j] = (float)i + 0.25f * (float)j;
    if (f[1])
        *(int32_t *)f[1] = (int32_t)(7 * i + 1);
    return DT_OK;
}

static const dt_data_field synth_fields[2] = {{DT_DTYPE_F32, 1, {FEATURES}},
                                              {DT_DTYPE_I32, 0, {0}}};

static dt_data_source *synth_source(int64_t n, synth *s)
{
    s->filled = 0;
    s->fail_at = -1;
    dt_data_source *src = NULL;
    DT_ASSERT_OK(dt_data_source_callback(n, 2, synth_fields, synth_fill, s, &src));
    return src;
}

/* A mesh over every device: 1-D "batch", or "batch" x "model" with model = 2. */
static dt_mesh *all_mesh(int two_d)
{
    dt_mesh *m = NULL;
    const char *names[2] = {"batch", "model"};
    int64_t sizes[2] = {ndev(), 1};
    if (two_d) {
        sizes[0] = ndev() / 2;
        sizes[1] = 2;
    }
    DT_ASSERT_OK(dt_mesh_create("data", two_d ? 2 : 1, names, sizes, DT_DEVICE_CPU, &m));
    return m;
}

/* Layouts: x [batch-sharded, unsharded], y batch-sharded (or replicated). */
static void xy_layouts(const dt_mesh *m, int y_replicated, dt_layout *l[2])
{
    l[0] = dt_test_layout(m, 2, "batch", NULL, NULL);
    l[1] = y_replicated ? dt_test_layout(m, 1, NULL, NULL, NULL)
                        : dt_test_layout(m, 1, "batch", NULL, NULL);
}

static dt_dataset *make_dataset(dt_data_source *src, dt_layout *l[2], int64_t batch, uint64_t seed,
                                int shuffle, int drop, int64_t epochs, int prefetch)
{
    dt_dataset_opts o = DT_DATASET_OPTS_INIT;
    o.global_batch = batch;
    o.seed = seed;
    o.shuffle = shuffle;
    o.drop_remainder = drop;
    o.epochs = epochs;
    o.prefetch = prefetch;
    dt_dataset *ds = NULL;
    DT_ASSERT_OK(dt_dataset_create(src, 2, (const dt_layout *const *)l, &o, &ds));
    return ds;
}

/* A synthetic source of n examples, a mesh over every device (2-D when two_d and the device
 * count is even) and the x/y layouts on it. */
typedef struct fixture {
    synth s;
    dt_data_source *src;
    dt_mesh *m;
    dt_layout *l[2];
} fixture;

static void fx_open(fixture *f, int64_t n, int two_d, int y_replicated)
{
    f->src = synth_source(n, &f->s);
    f->m = all_mesh(two_d && ndev() % 2 == 0);
    xy_layouts(f->m, y_replicated, f->l);
}

static void fx_close(fixture *f)
{
    dt_layout_destroy(f->l[0]);
    dt_layout_destroy(f->l[1]);
    dt_mesh_destroy(f->m);
    dt_data_source_destroy(f->src);
}

/* The global value of t on every client (collective): a replicated copy's first component. */
static void *gather(const dt_tensor *t)
{
    dt_layout *rep = NULL;
    DT_ASSERT_OK(dt_layout_replicated(dt_layout_mesh(dt_tensor_layout(t)), dt_tensor_rank(t), &rep));
    dt_tensor *all = NULL;
    DT_ASSERT_OK(dt_relayout(t, rep, &all));
    size_t bytes = (size_t)dt_tensor_numel(t) * dt_dtype_size(dt_tensor_dtype(t));
    void *out = malloc(bytes ? bytes : 1);
    CU_ASSERT_PTR_NOT_NULL_FATAL(out);
    memcpy(out, dt_tensor_local(all, 0)->data, bytes);
    dt_tensor_destroy(all);
    dt_layout_destroy(rep);
    return out;
}

/* Checks that batch t (x, y) holds the synthetic examples first .. first + rows - 1, and
 * destroys it (collective). */
static void check_consecutive(dt_tensor *t[2], int64_t first, int64_t rows)
{
    CU_ASSERT_EQUAL(dt_tensor_shape(t[0])[0], rows);
    CU_ASSERT_EQUAL(dt_tensor_shape(t[0])[1], FEATURES);
    float *x = gather(t[0]);
    int32_t *y = gather(t[1]);
    for (int64_t r = 0; r < rows; r++) {
        int64_t i = first + r;
        CU_ASSERT_EQUAL(y[r], 7 * i + 1);
        for (int j = 0; j < FEATURES; j++)
            CU_ASSERT_EQUAL(x[r * FEATURES + j], (float)i + 0.25f * (float)j);
    }
    free(x);
    free(y);
    dt_tensor_destroy(t[0]);
    dt_tensor_destroy(t[1]);
}

/* The labels (y) of the next `nb` batches, rows each (collective). */
static void next_labels(dt_dataset *ds, int nb, int64_t rows, int32_t *out)
{
    for (int b = 0; b < nb; b++) {
        dt_tensor *t[2] = {NULL, NULL};
        dt_data_batch_info info;
        DT_ASSERT_OK(dt_dataset_next(ds, 2, t, &info));
        CU_ASSERT_FATAL(!info.end && info.rows == rows);
        int32_t *y = gather(t[1]);
        float *x = gather(t[0]);
        for (int64_t r = 0; r < rows; r++) {
            /* x and y of a row are the same example's. */
            int64_t i = (y[r] - 1) / 7;
            CU_ASSERT_EQUAL(x[r * FEATURES + 2], (float)i + 0.5f);
        }
        memcpy(out + b * rows, y, (size_t)rows * sizeof *y);
        free(x);
        free(y);
        dt_tensor_destroy(t[0]);
        dt_tensor_destroy(t[1]);
    }
}

/* Writes `len` bytes to path (client 0) between two world barriers, so no client still reads
 * the file's previous contents and all see the new ones. */
static void write_file(const char *path, const void *data, size_t len, int gzip)
{
    MPI_Barrier(MPI_COMM_WORLD);
    if (dt_client_id() == 0) {
        if (gzip) {
            gzFile g = gzopen(path, "wb");
            CU_ASSERT_FATAL(g != NULL);
            CU_ASSERT_EQUAL(gzwrite(g, data, (unsigned)len), (int)len);
            gzclose(g);
        } else {
            FILE *f = fopen(path, "wb");
            CU_ASSERT_FATAL(f != NULL);
            CU_ASSERT_EQUAL(fwrite(data, 1, len, f), len);
            fclose(f);
        }
    }
    MPI_Barrier(MPI_COMM_WORLD);
}

/* ---- batches --------------------------------------------------------------------------------- */

static void test_unshuffled_batches_hold_consecutive_examples_and_keep_the_remainder(void)
{
    fixture f;
    fx_open(&f, 20, 0, 0);
    dt_dataset *ds = make_dataset(f.src, f.l, 6, 0, 0, 0, 1, 2);
    CU_ASSERT_EQUAL(dt_dataset_batches_per_epoch(ds), 4);
    for (int b = 0; b < 4; b++) {
        dt_tensor *t[2];
        dt_data_batch_info info;
        DT_ASSERT_OK(dt_dataset_next(ds, 2, t, &info));
        int64_t rows = b < 3 ? 6 : 2;
        CU_ASSERT(info.epoch == 0 && info.batch == b && info.rows == rows && !info.end);
        check_consecutive(t, 6 * b, rows);
    }
    for (int again = 0; again < 2; again++) {
        dt_tensor *t[2] = {(dt_tensor *)1, (dt_tensor *)1};
        dt_data_batch_info info;
        DT_ASSERT_OK(dt_dataset_next(ds, 2, t, &info));
        CU_ASSERT(info.end && t[0] == NULL && t[1] == NULL);
    }
    dt_dataset_destroy(ds);
    fx_close(&f);
}

static void test_shuffled_epochs_are_permutations_that_differ_and_drop_the_remainder(void)
{
    fixture f;
    fx_open(&f, 26, 0, 0);
    dt_dataset *ds = make_dataset(f.src, f.l, 8, 42, 1, 1, 0, 2);
    CU_ASSERT_EQUAL(dt_dataset_batches_per_epoch(ds), 3);
    int32_t y[2][24];
    next_labels(ds, 3, 8, y[0]);
    next_labels(ds, 3, 8, y[1]);
    for (int e = 0; e < 2; e++) {
        int seen[26] = {0};
        for (int r = 0; r < 24; r++) {
            int64_t i = (y[e][r] - 1) / 7;
            CU_ASSERT_FATAL(i >= 0 && i < 26);
            seen[i]++;
        }
        int twice = 0;
        for (int i = 0; i < 26; i++)
            twice += seen[i] > 1;
        CU_ASSERT_EQUAL(twice, 0); /* 24 distinct examples of 26: 2 dropped */
    }
    CU_ASSERT(memcmp(y[0], y[1], sizeof y[0]) != 0);
    int sorted = 1;
    for (int r = 1; r < 24; r++)
        sorted &= y[0][r] > y[0][r - 1];
    CU_ASSERT_FALSE(sorted);
    dt_data_position p;
    DT_ASSERT_OK(dt_dataset_position(ds, &p));
    CU_ASSERT(p.epoch == 2 && p.batch == 0);
    dt_dataset_destroy(ds);
    fx_close(&f);
}

/* Client 0 alone, one device: the reference every sharded run must equal. */
static void reference_labels(int64_t n, int64_t batch, uint64_t seed, int nb, int32_t *out)
{
    if (dt_client_id() == 0) {
        dt_mesh *one = NULL;
        DT_ASSERT_OK(dt_mesh_parse("|batch=1|0|0|/job:localhost/replica:0/task:0/device:CPU:0",
                                   &one));
        synth s;
        dt_data_source *src = synth_source(n, &s);
        dt_layout *l[2];
        xy_layouts(one, 0, l);
        dt_dataset *ds = make_dataset(src, l, batch, seed, 1, 1, 0, 0);
        for (int b = 0; b < nb; b++) {
            dt_tensor *t[2];
            DT_ASSERT_OK(dt_dataset_next(ds, 2, t, NULL));
            memcpy(out + b * batch, dt_tensor_local(t[1], 0)->data, (size_t)batch * sizeof *out);
            dt_tensor_destroy(t[0]);
            dt_tensor_destroy(t[1]);
        }
        dt_dataset_destroy(ds);
        dt_layout_destroy(l[0]);
        dt_layout_destroy(l[1]);
        dt_mesh_destroy(one);
        dt_data_source_destroy(src);
    }
    MPI_Bcast(out, (int)(nb * batch), MPI_INT32_T, 0, MPI_COMM_WORLD);
}

static void test_sharded_batches_equal_a_single_device_reference_on_any_mesh(void)
{
    enum { N = 45, B = 10, NB = 9 }; /* 4 batches an epoch: the run crosses two epochs */
    int32_t want[NB * B], got[NB * B];
    reference_labels(N, B, 1234, NB, want);
    for (int shape = 0; shape < 3; shape++) {
        if (shape > 0 && ndev() % 2 != 0)
            continue;
        fixture f;
        fx_open(&f, N, shape > 0, shape == 2); /* 2: labels replicated, features sharded */
        dt_dataset *ds = make_dataset(f.src, f.l, B, 1234, 1, 1, 0, 2);
        next_labels(ds, NB, B, got);
        CU_ASSERT_EQUAL(memcmp(got, want, sizeof want), 0);
        dt_dataset_destroy(ds);
        fx_close(&f);
    }
}

static void test_each_client_reads_only_the_rows_of_its_devices(void)
{
    enum { N = 64, B = 16 };
    fixture f;
    fx_open(&f, N, 0, 0);
    dt_dataset *ds = make_dataset(f.src, f.l, B, 5, 1, 1, 0, 0);
    int64_t mine = 0;
    int nl = dt_mesh_num_local_devices(f.m);
    for (int d = 0; d < nl; d++) {
        int64_t size = 0;
        int64_t pos = dt_mesh_position(f.m, dt_mesh_local_device_id(f.m, d));
        dt_shard_range(B, ndev(), pos, NULL, &size);
        mine += size;
    }
    for (int b = 0; b < 3; b++) {
        dt_tensor *t[2];
        DT_ASSERT_OK(dt_dataset_next(ds, 2, t, NULL));
        dt_tensor_destroy(t[0]);
        dt_tensor_destroy(t[1]);
    }
    CU_ASSERT_EQUAL(f.s.filled, 3 * mine);
    int64_t total = 0;
    MPI_Allreduce(&f.s.filled, &total, 1, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
    CU_ASSERT_EQUAL(total, 3 * B);
    dt_dataset_destroy(ds);
    fx_close(&f);
}

static void test_prefetch_changes_nothing_but_time(void)
{
    enum { N = 30, B = 4, NB = 17 };
    int32_t want[NB * B], got[NB * B];
    const int depth[3] = {0, 1, 5};
    for (int i = 0; i < 3; i++) {
        fixture f;
        fx_open(&f, N, 0, 0);
        dt_dataset *ds = make_dataset(f.src, f.l, B, 99, 1, 1, 0, depth[i]);
        next_labels(ds, NB, B, i == 0 ? want : got);
        if (i > 0)
            CU_ASSERT_EQUAL(memcmp(got, want, sizeof want), 0);
        dt_dataset_destroy(ds);
        fx_close(&f);
    }
}

static void test_resume_from_a_checkpoint_on_another_mesh_continues_with_the_next_batch(void)
{
    enum { N = 50, B = 8, SAVED = 5, NB = 10 };
    int32_t want[NB * B], got[NB * B];
    char dir[512], ck[600];
    dt_test_scratch_dir(dir, sizeof dir);
    snprintf(ck, sizeof ck, "%s/ck", dir);

    fixture f;
    fx_open(&f, N, 0, 0);
    dt_dataset *ds = make_dataset(f.src, f.l, B, 77, 1, 1, 0, 3);
    next_labels(ds, NB, B, want);
    DT_ASSERT_OK(dt_dataset_seek(ds, &(dt_data_position){0, 0}));
    next_labels(ds, SAVED, B, got);
    CU_ASSERT_EQUAL(memcmp(got, want, SAVED * B * sizeof *got), 0);
    dt_ckpt_value v[DT_DATASET_STATE_VALUES];
    DT_ASSERT_OK(dt_dataset_state_values(ds, "data/", v));
    dt_save_opts so = DT_SAVE_OPTS_INIT;
    so.fsync = 0;
    so.nvalues = DT_DATASET_STATE_VALUES;
    so.values = v;
    DT_ASSERT_OK(dt_save(f.m, ck, 0, NULL, NULL, &so));
    dt_dataset_destroy(ds);

    /* Restore onto a 2-D mesh with replicated labels and no prefetch. */
    dt_mesh *m2 = all_mesh(ndev() % 2 == 0);
    dt_layout *l2[2];
    xy_layouts(m2, 1, l2);
    ds = make_dataset(f.src, l2, B, 77, 1, 1, 0, 0);
    dt_ckpt *c = NULL;
    DT_ASSERT_OK(dt_ckpt_open(ck, &c));
    DT_ASSERT_OK(dt_dataset_load_state(ds, c, "data/"));
    dt_data_position p;
    DT_ASSERT_OK(dt_dataset_position(ds, &p));
    CU_ASSERT(p.epoch == 0 && p.batch == SAVED); /* 6 batches an epoch: resumes mid-epoch */
    next_labels(ds, NB - SAVED, B, got + SAVED * B);
    CU_ASSERT_EQUAL(memcmp(got, want, sizeof want), 0);
    DT_ASSERT_FAILS(dt_dataset_load_state(ds, c, "other/"), DT_ERR_NOT_FOUND);
    dt_dataset_destroy(ds);

    /* Another seed is another data order: refused, position kept. */
    ds = make_dataset(f.src, l2, B, 78, 1, 1, 0, 0);
    DT_ASSERT_FAILS(dt_dataset_load_state(ds, c, "data/"), DT_ERR_INVALID_ARGUMENT);
    DT_ASSERT_ERROR_MENTIONS("seed");
    DT_ASSERT_OK(dt_dataset_position(ds, &p));
    CU_ASSERT(p.epoch == 0 && p.batch == 0);
    dt_dataset_destroy(ds);
    dt_ckpt_close(c);

    dt_layout_destroy(l2[0]);
    dt_layout_destroy(l2[1]);
    dt_mesh_destroy(m2);
    fx_close(&f);
    dt_test_scratch_remove(dir);
}

static void test_a_failing_example_fails_every_client_and_delivers_nothing(void)
{
    fixture f;
    fx_open(&f, 40, 0, 0);
    f.s.fail_at = 13; /* batch 1 (rows 8..15) unshuffled, held by one client only */
    dt_dataset *ds = make_dataset(f.src, f.l, 8, 0, 0, 1, 0, 2);
    int32_t y[8];
    next_labels(ds, 1, 8, y);
    for (int again = 0; again < 2; again++) {
        dt_tensor *t[2] = {NULL, NULL};
        DT_ASSERT_FAILS(dt_dataset_next(ds, 2, t, NULL), DT_ERR_IO);
        DT_ASSERT_ERROR_MENTIONS("example 13");
        CU_ASSERT(t[0] == NULL && t[1] == NULL);
        dt_data_position p;
        DT_ASSERT_OK(dt_dataset_position(ds, &p));
        CU_ASSERT(p.epoch == 0 && p.batch == 1);
    }
    f.s.fail_at = -1; /* the fault is gone: the same batch comes */
    next_labels(ds, 1, 8, y);
    CU_ASSERT_EQUAL(y[0], 7 * 8 + 1);
    dt_dataset_destroy(ds);
    fx_close(&f);
}

static void test_create_rejects_bad_layouts_and_options(void)
{
    fixture f;
    fx_open(&f, 10, 1, 0);
    dt_dataset *ds = NULL;
    dt_dataset_opts o = DT_DATASET_OPTS_INIT;
    o.global_batch = 11;
    DT_ASSERT_FAILS(dt_dataset_create(f.src, 2, (const dt_layout *const *)f.l, &o, &ds),
                    DT_ERR_INVALID_ARGUMENT);
    DT_ASSERT_ERROR_MENTIONS("drop_remainder");
    o.global_batch = 4;
    DT_ASSERT_FAILS(dt_dataset_create(f.src, 1, (const dt_layout *const *)f.l, &o, &ds),
                    DT_ERR_INVALID_ARGUMENT);
    dt_layout *bad[2] = {f.l[1], f.l[1]};
    DT_ASSERT_FAILS(dt_dataset_create(f.src, 2, (const dt_layout *const *)bad, &o, &ds),
                    DT_ERR_SHAPE);
    if (ndev() % 2 == 0) {
        bad[0] = dt_test_layout(f.m, 2, "batch", "model", NULL);
        bad[1] = f.l[1];
        DT_ASSERT_FAILS(dt_dataset_create(f.src, 2, (const dt_layout *const *)bad, &o, &ds),
                        DT_ERR_UNSUPPORTED);
        DT_ASSERT_ERROR_MENTIONS("model");
        dt_layout_destroy(bad[0]);
    }
    CU_ASSERT_PTR_NULL(ds);
    fx_close(&f);
}

/* ---- readers --------------------------------------------------------------------------------- */

static void test_record_reader_reads_fields_at_their_offsets_and_rejects_truncated_files(void)
{
    enum { N = 13, REC = 16, HDR = 8 };
    char dir[512], path[600];
    dt_test_scratch_dir(dir, sizeof dir);
    snprintf(path, sizeof path, "%s/rec.bin", dir);
    unsigned char buf[HDR + N * REC];
    memset(buf, 0xee, sizeof buf);
    for (int i = 0; i < N; i++) {
        int32_t y = 100 + i;
        float x[FEATURES] = {(float)i, -(float)i, 0.5f * (float)i};
        memcpy(buf + HDR + i * REC, &y, 4); /* label first, features after */
        memcpy(buf + HDR + i * REC + 4, x, sizeof x);
    }
    write_file(path, buf, sizeof buf, 0);
    uint64_t offs[2] = {4, 0};
    dt_data_records_opts ro = DT_DATA_RECORDS_OPTS_INIT;
    ro.header_bytes = HDR;
    ro.record_bytes = REC;
    ro.field_offsets = offs;
    dt_data_source *src = NULL;
    DT_ASSERT_OK(dt_data_source_records(path, 2, synth_fields, &ro, &src));
    CU_ASSERT_EQUAL(dt_data_source_num_examples(src), N);
    fixture f; /* its mesh and layouts */
    fx_open(&f, 1, 0, 0);
    dt_dataset *ds = make_dataset(src, f.l, 5, 3, 1, 1, 0, 1);
    for (int b = 0; b < 4; b++) {
        dt_tensor *t[2];
        DT_ASSERT_OK(dt_dataset_next(ds, 2, t, NULL));
        float *x = gather(t[0]);
        int32_t *y = gather(t[1]);
        for (int r = 0; r < 5; r++) {
            int i = y[r] - 100;
            CU_ASSERT(i >= 0 && i < N);
            CU_ASSERT(x[r * FEATURES] == (float)i && x[r * FEATURES + 1] == -(float)i &&
                      x[r * FEATURES + 2] == 0.5f * (float)i);
        }
        free(x);
        free(y);
        dt_tensor_destroy(t[0]);
        dt_tensor_destroy(t[1]);
    }
    dt_dataset_destroy(ds);
    dt_data_source_destroy(src);

    /* One record, whole, read in place. */
    dt_data_field whole = {DT_DTYPE_U8, 1, {REC}};
    ro.field_offsets = NULL;
    DT_ASSERT_OK(dt_data_source_records(path, 1, &whole, &ro, &src));
    unsigned char rec[REC];
    void *fp[1] = {rec};
    DT_ASSERT_OK(dt_data_source_read(src, 7, fp));
    CU_ASSERT_EQUAL(memcmp(rec, buf + HDR + 7 * REC, REC), 0);
    dt_data_source_destroy(src);

    write_file(path, buf, sizeof buf - 3, 0);
    DT_ASSERT_FAILS(dt_data_source_records(path, 1, &whole, &ro, &src), DT_ERR_CORRUPT);
    DT_ASSERT_ERROR_MENTIONS("rec.bin: record 12 is truncated (13 of 16 bytes)");
    snprintf(path, sizeof path, "%s/missing.bin", dir);
    DT_ASSERT_FAILS(dt_data_source_records(path, 1, &whole, &ro, &src), DT_ERR_IO);
    DT_ASSERT_ERROR_MENTIONS("missing.bin");
    fx_close(&f);
    dt_test_scratch_remove(dir);
}

/* "x0,x1,x2,y" lines for examples 0..n-1 with a header line. */
static size_t csv_text(char *buf, size_t cap, int n)
{
    size_t len = (size_t)snprintf(buf, cap, "a,b,c,label\n");
    for (int i = 0; i < n; i++)
        len += (size_t)snprintf(buf + len, cap - len, "%d,%g, %g ,%d%s\n", i, i + 0.25, i + 0.5,
                                7 * i + 1, i % 3 == 0 ? "\r" : "");
    return len;
}

static void test_csv_reader_reads_plain_and_gzip_files_alike(void)
{
    enum { N = 23 };
    char dir[512], path[600], text[4096];
    dt_test_scratch_dir(dir, sizeof dir);
    size_t len = csv_text(text, sizeof text, N);
    fixture f; /* its mesh and layouts */
    fx_open(&f, 1, 0, 0);
    for (int gz = 0; gz < 2; gz++) {
        snprintf(path, sizeof path, "%s/d.csv%s", dir, gz ? ".gz" : "");
        write_file(path, text, len - (gz ? 1 : 0), gz); /* gzip: no newline at the end */
        dt_data_csv_opts co = DT_DATA_CSV_OPTS_INIT;
        co.skip_lines = 1;
        dt_data_source *src = NULL;
        DT_ASSERT_OK(dt_data_source_csv(path, 2, synth_fields, &co, &src));
        CU_ASSERT_EQUAL(dt_data_source_num_examples(src), N);
        dt_dataset *ds = make_dataset(src, f.l, 7, 0, 0, 0, 1, 2);
        for (int b = 0; b < 4; b++) {
            dt_tensor *t[2];
            DT_ASSERT_OK(dt_dataset_next(ds, 2, t, NULL));
            check_consecutive(t, 7 * b, b < 3 ? 7 : 2);
        }
        dt_dataset_destroy(ds);
        dt_data_source_destroy(src);
    }
    /* A truncated gzip file. */
    write_file(path, text, len, 1);
    if (dt_client_id() == 0)
        CU_ASSERT_EQUAL(truncate(path, 30), 0); /* cut the compressed stream */
    MPI_Barrier(MPI_COMM_WORLD);
    dt_data_source *src = NULL;
    DT_ASSERT_FAILS(dt_data_source_csv(path, 2, synth_fields, NULL, &src), DT_ERR_CORRUPT);
    DT_ASSERT_ERROR_MENTIONS("d.csv.gz: gzip");
    fx_close(&f);
    dt_test_scratch_remove(dir);
}

static void test_csv_errors_name_file_and_line_on_every_client(void)
{
    char dir[512], path[600], text[4096];
    dt_test_scratch_dir(dir, sizeof dir);
    snprintf(path, sizeof path, "%s/bad.csv", dir);
    fixture f; /* its mesh and layouts */
    fx_open(&f, 1, 0, 0);
    /* Line 7 (example 6, batch 1 of 4 rows) has a word; line 14 (example 13, batch 3) too few
     * columns; line 12 a label beyond i32. */
    const char *bad[3] = {"1,2,abc,4", "1,2,3", "1,2,3,99999999999"};
    const int line[3] = {7, 14, 12};
    const char *want[3] = {"bad.csv:7: column 3 ('abc') is not a f32 number",
                           "bad.csv:14: 3 columns, expected 4",
                           "bad.csv:12: column 4 ('99999999999') is not a i32 number"};
    for (int c = 0; c < 3; c++) {
        size_t len = 0;
        for (int i = 1; i <= 16; i++)
            len += (size_t)snprintf(text + len, sizeof text - len, "%s\n",
                                    i == line[c] ? bad[c] : "1,2,3,4");
        write_file(path, text, len, 0);
        dt_data_source *src = NULL;
        DT_ASSERT_OK(dt_data_source_csv(path, 2, synth_fields, NULL, &src));
        dt_dataset *ds = make_dataset(src, f.l, 4, 0, 0, 1, 0, 2);
        int bad_batch = (line[c] - 1) / 4;
        for (int b = 0; b < bad_batch; b++) {
            dt_tensor *t[2];
            DT_ASSERT_OK(dt_dataset_next(ds, 2, t, NULL));
            dt_tensor_destroy(t[0]);
            dt_tensor_destroy(t[1]);
        }
        dt_tensor *t[2] = {NULL, NULL};
        DT_ASSERT_FAILS(dt_dataset_next(ds, 2, t, NULL), DT_ERR_PARSE);
        DT_ASSERT_ERROR_MENTIONS(want[c]);
        CU_ASSERT(t[0] == NULL && t[1] == NULL);
        dt_dataset_destroy(ds);
        dt_data_source_destroy(src);
    }
    fx_close(&f);
    dt_test_scratch_remove(dir);
}

static void test_line_reader_pads_lines_and_rejects_long_ones(void)
{
    char dir[512], path[600];
    dt_test_scratch_dir(dir, sizeof dir);
    snprintf(path, sizeof path, "%s/t.txt", dir);
    const char text[] = "alpha\r\n\nbeta gamma\nomega"; /* last line without a newline */
    write_file(path, text, sizeof text - 1, 0);
    dt_data_source *src = NULL;
    DT_ASSERT_OK(dt_data_source_lines(path, 10, &src));
    CU_ASSERT_EQUAL(dt_data_source_num_examples(src), 4);
    const char *want[4] = {"alpha", "", "beta gamma", "omega"};
    for (int i = 0; i < 4; i++) {
        char line[10];
        void *f[1] = {line};
        DT_ASSERT_OK(dt_data_source_read(src, i, f));
        CU_ASSERT_EQUAL(memcmp(line, want[i], strlen(want[i])), 0);
        for (size_t j = strlen(want[i]); j < 10; j++)
            CU_ASSERT_EQUAL(line[j], 0);
    }
    dt_data_source_destroy(src);
    DT_ASSERT_OK(dt_data_source_lines(path, 9, &src));
    char line[9];
    void *f[1] = {line};
    DT_ASSERT_FAILS(dt_data_source_read(src, 2, f), DT_ERR_PARSE);
    DT_ASSERT_ERROR_MENTIONS("t.txt:3: 10 bytes, longer than the 9 bytes allowed");
    dt_data_source_destroy(src);
    dt_test_scratch_remove(dir);
}

int main(int argc, char **argv)
{
    static const dt_test_case cases[] = {
        DT_TEST(test_unshuffled_batches_hold_consecutive_examples_and_keep_the_remainder),
        DT_TEST(test_shuffled_epochs_are_permutations_that_differ_and_drop_the_remainder),
        DT_TEST(test_sharded_batches_equal_a_single_device_reference_on_any_mesh),
        DT_TEST(test_each_client_reads_only_the_rows_of_its_devices),
        DT_TEST(test_prefetch_changes_nothing_but_time),
        DT_TEST(test_resume_from_a_checkpoint_on_another_mesh_continues_with_the_next_batch),
        DT_TEST(test_a_failing_example_fails_every_client_and_delivers_nothing),
        DT_TEST(test_create_rejects_bad_layouts_and_options),
        DT_TEST(test_record_reader_reads_fields_at_their_offsets_and_rejects_truncated_files),
        DT_TEST(test_csv_reader_reads_plain_and_gzip_files_alike),
        DT_TEST(test_csv_errors_name_file_and_line_on_every_client),
        DT_TEST(test_line_reader_pads_lines_and_rejects_long_ones),
        DT_TEST_END,
    };
    return dt_test_main(argc, argv, "data", cases, 1);
}
