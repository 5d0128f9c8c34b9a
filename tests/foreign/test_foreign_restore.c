/* Foreign files written by numpy (make_foreign.py: safetensors by the spec, HF's sharded set,
 * llm.c GPT-2 checkpoints) restored through views onto 1x1, 2x1, 1x2 and 2x2 meshes in every
 * layout, each element compared with numpy's result; bytes read per device against its box;
 * the GPT-2 mapping from llm.c (f32, bf16) and HF; bad files and bad views. Also on GPU meshes
 * of the simulated accelerator (components filled through host buffers). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "foreign_data.h"
#include "harness.h"

static unsigned char *load_file(const char *path, size_t *len_out)
{
    FILE *f = fopen(path, "rb");
    CU_ASSERT_FATAL(f != NULL);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *buf = malloc((size_t)n + 1);
    CU_ASSERT_FATAL(fread(buf, 1, (size_t)n, f) == (size_t)n);
    fclose(f);
    *len_out = (size_t)n;
    return buf;
}

static dt_mesh *mesh2(int64_t a, int64_t b)
{
    const char *names[2] = {"a", "b"};
    int64_t sizes[2] = {a, b};
    dt_mesh *m = NULL;
    DT_ASSERT_OK(dt_mesh_create(NULL, 2, names, sizes, dt_test_device_type(), &m));
    return m;
}

/* Elements of local components of t that differ (bytewise) from the global array `want`. */
static int64_t mismatches(const dt_tensor *t, const unsigned char *want)
{
    int rank = dt_tensor_rank(t);
    size_t es = dt_dtype_size(dt_tensor_dtype(t));
    int64_t bad = 0;
    for (int i = 0; i < dt_tensor_num_local(t); i++) {
        const DLTensor *x = dt_tensor_local(t, i);
        int64_t n = 1;
        for (int d = 0; d < rank; d++)
            n *= x->shape[d];
        unsigned char *got = dt_test_local_get(t, i);
        for (int64_t k = 0; k < n; k++) {
            int64_t g = dt_test_global_index(rank, dt_tensor_shape(t),
                                             dt_tensor_local_offset(t, i), x->shape, k);
            bad += memcmp(got + (size_t)k * es, want + (size_t)g * es, es) != 0;
        }
        free(got);
    }
    return bad;
}

typedef struct view_case {
    int id;
    char source[256], tensor[128], target[16];
    dt_foreign_view view;
    int rank;
    int64_t shape[DT_MAX_RANK];
} view_case;

static int read_cases(view_case *cases, int max)
{
    char path[512];
    snprintf(path, sizeof path, "%s/manifest.txt", FOREIGN_DIR);
    FILE *f = fopen(path, "r");
    CU_ASSERT_FATAL(f != NULL);
    int n = 0;
    char shape[128];
    view_case c;
    while (n < max) {
        long long rb, re, pad;
        int sd, sp, si, tr;
        if (fscanf(f, "%d %255s %127s %lld %lld %d %d %d %d %lld %15s %127s", &c.id, c.source,
                   c.tensor, &rb, &re, &sd, &sp, &si, &tr, &pad, c.target, shape) != 12)
            break;
        c.view = (dt_foreign_view)DT_FOREIGN_VIEW_INIT;
        c.view.row_begin = rb;
        c.view.row_end = re;
        c.view.split_dim = sd;
        c.view.split_parts = sp;
        c.view.split_index = si;
        c.view.transpose = tr;
        c.view.pad_rows = pad;
        c.rank = 0;
        if (strcmp(shape, "-") != 0)
            for (char *s = strtok(shape, ","); s; s = strtok(NULL, ","))
                c.shape[c.rank++] = atoll(s);
        cases[n++] = c;
    }
    fclose(f);
    return n;
}

static dt_foreign *open_src(const char *rel)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s", FOREIGN_DIR, rel);
    dt_foreign *src = NULL;
    DT_ASSERT_OK(dt_foreign_open(path, &src));
    return src;
}

static const int64_t meshes[4][2] = {{1, 1}, {2, 1}, {1, 2}, {2, 2}};
static const char *const specs2[5][2] = {
    {NULL, NULL}, {"a", NULL}, {NULL, "b"}, {"a", "b"}, {"b", "a"}};
static const char *const specs1[3] = {NULL, "a", "b"};

/* Bytes of view c's stored data that component (off, shape) needs: its rows inside the
 * unpadded rows, times the row length, times the stored element size. */
static uint64_t box_bytes(const dt_foreign *src, const view_case *c, const int64_t *off,
                          const int64_t *shape)
{
    dt_foreign_view v = c->view;
    v.source = c->tensor;
    v.pad_rows = 0;
    int rank;
    int64_t un[DT_MAX_RANK];
    DT_ASSERT_OK(dt_foreign_view_shape(src, &v, &rank, un));
    int64_t idx;
    dt_foreign_tensor_info ti;
    DT_ASSERT_OK(dt_foreign_find(src, c->tensor, &idx));
    DT_ASSERT_OK(dt_foreign_tensor(src, idx, &ti));
    int64_t n = 1;
    for (int d = 0; d < rank; d++) {
        int64_t len = shape[d];
        if (d == 0) {
            int64_t end = off[0] + shape[0] < un[0] ? off[0] + shape[0] : un[0];
            len = end > off[0] ? end - off[0] : 0;
        }
        n *= len;
    }
    return (uint64_t)n * dt_dtype_size(ti.dtype);
}

static void run_case(const view_case *c, int64_t *checked)
{
    dt_foreign *src = open_src(c->source);
    dt_dtype dt;
    DT_ASSERT_OK(dt_dtype_parse(c->target, &dt));
    char path[512];
    snprintf(path, sizeof path, "%s/expect_%d.bin", FOREIGN_DIR, c->id);
    size_t len;
    unsigned char *want = load_file(path, &len);
    int rank;
    int64_t shape[DT_MAX_RANK];
    dt_foreign_view v = c->view;
    v.source = c->tensor;
    DT_ASSERT_OK(dt_foreign_view_shape(src, &v, &rank, shape));
    CU_ASSERT_EQUAL_FATAL(rank, c->rank);
    for (int d = 0; d < rank; d++)
        CU_ASSERT_EQUAL(shape[d], c->shape[d]);
    int nl = rank == 2 ? 5 : rank == 1 ? 3 : 1;
    for (int m = 0; m < 4; m++) {
        if (meshes[m][0] * meshes[m][1] > dt_test_num_devices())
            continue;
        dt_mesh *mesh = mesh2(meshes[m][0], meshes[m][1]);
        for (int s = 0; s < nl; s++) {
            dt_layout *l = rank == 2 ? dt_test_layout(mesh, 2, specs2[s][0], specs2[s][1], NULL)
                           : rank == 1 ? dt_test_layout(mesh, 1, specs1[s], NULL, NULL)
                                       : dt_test_layout(mesh, 0, NULL, NULL, NULL);
            dt_tensor *t = NULL;
            DT_ASSERT_OK(dt_tensor_zeros(l, dt, shape, &t));
            uint64_t before[16] = {0};
            int nloc = dt_tensor_num_local(t);
            for (int i = 0; i < nloc && i < 16; i++)
                before[i] = dt_foreign_bytes_read(
                    src, dt_mesh_device_id(mesh, dt_tensor_local_position(t, i)));
            DT_ASSERT_OK(dt_foreign_restore(src, 1, &v, &t));
            int64_t bad = mismatches(t, want);
            if (bad)
                fprintf(stderr, "case %d (%s %s) mesh %lldx%lld layout %d: %lld bad\n", c->id,
                        c->source, c->tensor, (long long)meshes[m][0],
                        (long long)meshes[m][1], s, (long long)bad);
            CU_ASSERT_EQUAL(bad, 0);
            for (int i = 0; i < nloc && i < 16; i++) {
                int dev = dt_mesh_device_id(mesh, dt_tensor_local_position(t, i));
                uint64_t got = dt_foreign_bytes_read(src, dev) - before[i];
                uint64_t exp = box_bytes(src, c, dt_tensor_local_offset(t, i),
                                         dt_tensor_local(t, i)->shape);
                if (got != exp)
                    fprintf(stderr, "case %d device %d: read %llu bytes, its box has %llu\n",
                            c->id, dev, (unsigned long long)got, (unsigned long long)exp);
                CU_ASSERT_EQUAL(got, exp);
            }
            (*checked)++;
            dt_tensor_destroy(t);
            dt_layout_destroy(l);
        }
        dt_mesh_destroy(mesh);
    }
    free(want);
    dt_foreign_close(src);
}

static void test_views_restore_exactly_as_numpy_computes_on_every_mesh_and_layout(void)
{
    view_case cases[64];
    int n = read_cases(cases, 64);
    CU_ASSERT_FATAL(n >= 20);
    int64_t checked = 0;
    for (int k = 0; k < n; k++)
        run_case(&cases[k], &checked);
    CU_ASSERT(checked >= n);
}

static void test_open_lists_tensors_dtypes_and_metadata_of_each_source_kind(void)
{
    dt_foreign *src = open_src("single.safetensors");
    CU_ASSERT_EQUAL(dt_foreign_format_of(src), DT_FOREIGN_SAFETENSORS);
    CU_ASSERT_EQUAL(dt_foreign_num_tensors(src), 9);
    int64_t i;
    dt_foreign_tensor_info ti;
    DT_ASSERT_OK(dt_foreign_find(src, "h.bf16", &i));
    DT_ASSERT_OK(dt_foreign_tensor(src, i, &ti));
    CU_ASSERT_EQUAL(ti.dtype, DT_DTYPE_BF16);
    CU_ASSERT_EQUAL(ti.rank, 2);
    CU_ASSERT_EQUAL(ti.shape[0], 7);
    CU_ASSERT_EQUAL(ti.bytes, 7 * 6 * 2);
    CU_ASSERT_STRING_EQUAL(dt_foreign_metadata(src, "format"), "pt");
    CU_ASSERT_PTR_NULL(dt_foreign_metadata(src, "absent"));
    CU_ASSERT_EQUAL(dt_foreign_find(src, "nope", &i), DT_ERR_NOT_FOUND);
    dt_foreign_close(src);
    src = open_src("sharded");
    CU_ASSERT_EQUAL(dt_foreign_num_tensors(src), 4);
    DT_ASSERT_OK(dt_foreign_find(src, "b.bias", &i));
    DT_ASSERT_OK(dt_foreign_tensor(src, i, &ti));
    CU_ASSERT_PTR_NOT_NULL(strstr(ti.file, "model-00002-of-00002.safetensors"));
    dt_foreign_close(src);
    src = open_src("llmc_bf16.bin");
    CU_ASSERT_EQUAL(dt_foreign_format_of(src), DT_FOREIGN_LLMC_GPT2);
    CU_ASSERT_EQUAL(dt_foreign_num_tensors(src), 2 + 12 * 2 + 2);
    DT_ASSERT_OK(dt_foreign_find(src, "h.1.fcprojw", &i));
    DT_ASSERT_OK(dt_foreign_tensor(src, i, &ti));
    CU_ASSERT_EQUAL(ti.dtype, DT_DTYPE_BF16);
    CU_ASSERT_EQUAL(ti.shape[0], 8);
    CU_ASSERT_EQUAL(ti.shape[1], 32);
    dt_foreign_close(src);
}

/* ---- GPT-2 ---------------------------------------------------------------------------------- */

static void check_gpt2(const char *rel, int64_t vocab_rows, const char *expect_dir,
                       int64_t am, int64_t bm)
{
    dt_foreign *src = open_src(rel);
    dt_foreign_map_entry *map = NULL;
    int n = 0;
    dt_foreign_gpt2_config cfg;
    DT_ASSERT_OK(dt_foreign_gpt2_map(src, vocab_rows, &map, &n, &cfg));
    CU_ASSERT_EQUAL_FATAL(n, 2 + 16 * 2 + 2);
    CU_ASSERT_EQUAL(cfg.n_layer, 2);
    CU_ASSERT_EQUAL(cfg.n_embd, 8);
    CU_ASSERT_EQUAL(cfg.n_head, 2);
    CU_ASSERT_EQUAL(cfg.n_ctx, 6);
    CU_ASSERT_EQUAL(cfg.vocab, 10);
    CU_ASSERT_STRING_EQUAL(map[0].name, "wte");
    CU_ASSERT_STRING_EQUAL(map[4].name, "h.0.q.w");
    CU_ASSERT_STRING_EQUAL(map[n - 1].name, "lnf.b");
    dt_mesh *mesh = mesh2(am, bm);
    dt_tensor **t = calloc((size_t)n, sizeof *t);
    dt_foreign_view *views = calloc((size_t)n, sizeof *views);
    for (int i = 0; i < n; i++) {
        /* weights sharded by columns (heads) over b and rows over a; vectors over b */
        dt_layout *l = map[i].rank == 2 ? dt_test_layout(mesh, 2, "a", "b", NULL)
                                        : dt_test_layout(mesh, 1, "b", NULL, NULL);
        DT_ASSERT_OK(dt_tensor_zeros(l, DT_DTYPE_F32, map[i].shape, &t[i]));
        dt_layout_destroy(l);
        views[i] = map[i].view;
    }
    DT_ASSERT_OK(dt_foreign_restore(src, n, views, t));
    for (int i = 0; i < n; i++) {
        char path[512];
        snprintf(path, sizeof path, "%s/%s/%s.bin", FOREIGN_DIR, expect_dir, map[i].name);
        size_t len;
        unsigned char *want = load_file(path, &len);
        CU_ASSERT_EQUAL(len, (size_t)dt_tensor_numel(t[i]) * 4);
        int64_t bad = mismatches(t[i], want);
        if (bad)
            fprintf(stderr, "%s: %s: %lld bad\n", rel, map[i].name, (long long)bad);
        CU_ASSERT_EQUAL(bad, 0);
        free(want);
        dt_tensor_destroy(t[i]);
    }
    free(t);
    free(views);
    dt_mesh_destroy(mesh);
    dt_foreign_map_free(map, n);
    dt_foreign_close(src);
}

static void test_gpt2_mapping_from_llmc_and_hf_gives_our_parameters(void)
{
    for (int m = 0; m < 4; m++) {
        if (meshes[m][0] * meshes[m][1] > dt_test_num_devices())
            continue;
        check_gpt2("llmc_f32.bin", 12, "gpt2_expect_f32", meshes[m][0], meshes[m][1]);
        check_gpt2("llmc_bf16.bin", 12, "gpt2_expect_bf16", meshes[m][0], meshes[m][1]);
        check_gpt2("hf_gpt2", 0, "gpt2_expect_hf", meshes[m][0], meshes[m][1]);
    }
}

/* ---- bad input ------------------------------------------------------------------------------ */

static void expect_open_fails(const char *rel, dt_status want, const char *w1, const char *w2)
{
    char path[512];
    snprintf(path, sizeof path, "%s/bad/%s", FOREIGN_DIR, rel);
    dt_foreign *src = NULL;
    dt_status st = dt_foreign_open(path, &src);
    if (st != want || (w1 && !strstr(dt_last_error(), w1)) ||
        (w2 && !strstr(dt_last_error(), w2)))
        fprintf(stderr, "%s: %s: %s\n", rel, dt_status_name(st), dt_last_error());
    CU_ASSERT_EQUAL(st, want);
    CU_ASSERT_PTR_NULL(src);
    if (w1)
        CU_ASSERT_PTR_NOT_NULL(strstr(dt_last_error(), w1));
    if (w2)
        CU_ASSERT_PTR_NOT_NULL(strstr(dt_last_error(), w2));
    dt_foreign_close(src);
}

static void test_bad_files_fail_to_open_with_a_status_naming_file_and_tensor(void)
{
    expect_open_fails("truncated.safetensors", DT_ERR_CORRUPT, "truncated.safetensors", "'y'");
    expect_open_fails("lying_offsets.safetensors", DT_ERR_CORRUPT, "lying_offsets.safetensors",
                      "'y'");
    expect_open_fails("overlap.safetensors", DT_ERR_CORRUPT, "overlap.safetensors", "'y'");
    expect_open_fails("wrong_span.safetensors", DT_ERR_CORRUPT, "wrong_span.safetensors", "'y'");
    expect_open_fails("bad_json.safetensors", DT_ERR_CORRUPT, "bad_json.safetensors", "JSON");
    expect_open_fails("header_length.safetensors", DT_ERR_CORRUPT, "header_length.safetensors",
                      "header length");
    expect_open_fails("dtype.safetensors", DT_ERR_UNSUPPORTED, "dtype.safetensors", "'x'");
    expect_open_fails("index_ghost", DT_ERR_CORRUPT, "model.safetensors.index.json", "'ghost'");
    expect_open_fails("index_nofile", DT_ERR_CORRUPT, "model.safetensors.index.json",
                      "gone.safetensors");
    expect_open_fails("llmc_version.bin", DT_ERR_UNSUPPORTED, "llmc_version.bin", "version 4");
    expect_open_fails("llmc_truncated.bin", DT_ERR_CORRUPT, "llmc_truncated.bin", "truncated");
    expect_open_fails("absent.safetensors", DT_ERR_NOT_FOUND, "absent.safetensors", NULL);
    expect_open_fails("", DT_ERR_NOT_FOUND, "neither", NULL); /* the bad/ directory itself */
}

static void test_bad_views_and_targets_fail_with_a_status_naming_file_and_tensor(void)
{
    dt_foreign *src = open_src("single.safetensors");
    dt_mesh *mesh = mesh2(1, 1);
    dt_layout *l = dt_test_layout(mesh, 2, NULL, NULL, NULL);
    int64_t shape[2] = {6, 9};
    dt_tensor *t = NULL;
    DT_ASSERT_OK(dt_tensor_zeros(l, DT_DTYPE_F32, shape, &t));
    dt_foreign_view v = DT_FOREIGN_VIEW_INIT;
    v.source = "nope";
    CU_ASSERT_EQUAL(dt_foreign_restore(src, 1, &v, &t), DT_ERR_NOT_FOUND);
    CU_ASSERT_PTR_NOT_NULL(strstr(dt_last_error(), "'nope'"));
    CU_ASSERT_PTR_NOT_NULL(strstr(dt_last_error(), "single.safetensors"));
    v.source = "a.f32"; /* [6, 10] into [6, 9] */
    CU_ASSERT_EQUAL(dt_foreign_restore(src, 1, &v, &t), DT_ERR_SHAPE);
    CU_ASSERT_PTR_NOT_NULL(strstr(dt_last_error(), "'a.f32'"));
    CU_ASSERT_PTR_NOT_NULL(strstr(dt_last_error(), "single.safetensors"));
    CU_ASSERT_PTR_NOT_NULL(strstr(dt_last_error(), "[6,9]"));
    int rank;
    int64_t s[DT_MAX_RANK];
    v.split_parts = 4; /* 6 rows do not divide in 4 */
    CU_ASSERT_EQUAL(dt_foreign_view_shape(src, &v, &rank, s), DT_ERR_SHAPE);
    v = (dt_foreign_view)DT_FOREIGN_VIEW_INIT;
    v.source = "b.bias";
    v.transpose = 1;
    CU_ASSERT_EQUAL(dt_foreign_view_shape(src, &v, &rank, s), DT_ERR_SHAPE);
    CU_ASSERT_PTR_NOT_NULL(strstr(dt_last_error(), "'b.bias'"));
    v = (dt_foreign_view)DT_FOREIGN_VIEW_INIT;
    v.source = "a.f32";
    v.row_end = 7;
    CU_ASSERT_EQUAL(dt_foreign_view_shape(src, &v, &rank, s), DT_ERR_SHAPE);
    v.row_end = 4;
    v.pad_rows = 3;
    CU_ASSERT_EQUAL(dt_foreign_view_shape(src, &v, &rank, s), DT_ERR_SHAPE);
    v = (dt_foreign_view)DT_FOREIGN_VIEW_INIT;
    v.source = "i.i32"; /* integers are not converted to f32 */
    int64_t s44[2] = {4, 4};
    dt_tensor *t44 = NULL;
    DT_ASSERT_OK(dt_tensor_zeros(l, DT_DTYPE_F32, s44, &t44));
    CU_ASSERT_EQUAL(dt_foreign_restore(src, 1, &v, &t44), DT_ERR_INVALID_ARGUMENT);
    CU_ASSERT_PTR_NOT_NULL(strstr(dt_last_error(), "'i.i32'"));
    dt_tensor_destroy(t44);
    dt_tensor_destroy(t);
    dt_layout_destroy(l);
    dt_mesh_destroy(mesh);
    dt_foreign_close(src);
}

/* A file cut short after it was opened: every client reads its own copy, cut before the
 * restore; the restore fails with DT_ERR_CORRUPT naming the file and the tensor. */
static void test_a_file_truncated_after_open_fails_the_restore_naming_file_and_tensor(void)
{
    char dir[256], path[512], good[512];
    dt_test_scratch_dir(dir, sizeof dir);
    snprintf(path, sizeof path, "%s/cut-%d.safetensors", dir, dt_client_id());
    snprintf(good, sizeof good, "%s/single.safetensors", FOREIGN_DIR);
    size_t len;
    unsigned char *bytes = load_file(good, &len);
    FILE *f = fopen(path, "wb");
    CU_ASSERT_FATAL(f && fwrite(bytes, 1, len, f) == len);
    fclose(f);
    free(bytes);
    dt_foreign *src = NULL;
    DT_ASSERT_OK(dt_foreign_open(path, &src));
    int64_t i;
    dt_foreign_tensor_info ti;
    DT_ASSERT_OK(dt_foreign_find(src, "a.f32", &i));
    DT_ASSERT_OK(dt_foreign_tensor(src, i, &ti));
    CU_ASSERT_EQUAL(truncate(path, (off_t)(ti.file_offset + ti.bytes / 2)), 0);
    int64_t n = dt_test_num_devices();
    const char *names[1] = {"a"};
    dt_mesh *mesh = NULL;
    DT_ASSERT_OK(dt_mesh_create(NULL, 1, names, &n, dt_test_device_type(), &mesh));
    dt_layout *l = dt_test_layout(mesh, 2, NULL, NULL, NULL);
    dt_tensor *t = NULL;
    DT_ASSERT_OK(dt_tensor_zeros(l, DT_DTYPE_F32, ti.shape, &t));
    dt_foreign_view v = DT_FOREIGN_VIEW_INIT;
    v.source = "a.f32";
    CU_ASSERT_EQUAL(dt_foreign_restore(src, 1, &v, &t), DT_ERR_CORRUPT);
    CU_ASSERT_PTR_NOT_NULL(strstr(dt_last_error(), "cut-"));
    CU_ASSERT_PTR_NOT_NULL(strstr(dt_last_error(), "'a.f32'"));
    dt_tensor_destroy(t);
    dt_layout_destroy(l);
    dt_mesh_destroy(mesh);
    dt_foreign_close(src);
    dt_test_scratch_remove(dir);
}

int main(int argc, char **argv)
{
    static const dt_test_case cases[] = {
        DT_TEST(test_open_lists_tensors_dtypes_and_metadata_of_each_source_kind),
        DT_TEST(test_views_restore_exactly_as_numpy_computes_on_every_mesh_and_layout),
        DT_TEST(test_gpt2_mapping_from_llmc_and_hf_gives_our_parameters),
        DT_TEST(test_bad_files_fail_to_open_with_a_status_naming_file_and_tensor),
        DT_TEST(test_bad_views_and_targets_fail_with_a_status_naming_file_and_tensor),
        DT_TEST(test_a_file_truncated_after_open_fails_the_restore_naming_file_and_tensor),
        DT_TEST_END,
    };
    return dt_test_main_device(argc, argv, "foreign", cases);
}
