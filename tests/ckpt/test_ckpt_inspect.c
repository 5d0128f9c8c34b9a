/* Local inspection: CRC32C against a bitwise reference, listing a checkpoint's tensors,
 * slices and files, verifying, reading whole tensors and exporting standard safetensors
 * (one file, and split with model.safetensors.index.json), checked by parsing the output. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "ck_test_util.h"
#include "harness.h"

static uint32_t crc_bitwise(const unsigned char *p, size_t n)
{
    uint32_t c = 0xFFFFFFFFu;
    for (size_t i = 0; i < n; i++) {
        c ^= p[i];
        for (int k = 0; k < 8; k++)
            c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
    }
    return ~c;
}

static void test_crc32c_matches_bitwise_reference_at_every_length_and_split(void)
{
    CU_ASSERT_EQUAL(dt_crc32c(0, "123456789", 9), 0xE3069283u);
    CU_ASSERT_EQUAL(dt_crc32c(0, "", 0), 0u);
    size_t n = 3 * 16384 * 2 + 77;
    unsigned char *buf = malloc(n);
    for (size_t i = 0; i < n; i++)
        buf[i] = ck_ref_byte(9, i);
    size_t lens[] = {1, 7, 8, 9, 63, 1023, 1024, 4096, 25599, 25600, 25601, 3 * 16384 - 1, 3 * 16384, 3 * 16384 + 13, n - 1};
    for (size_t k = 0; k < sizeof lens / sizeof lens[0]; k++) {
        /* unaligned start, too */
        CU_ASSERT_EQUAL(dt_crc32c(0, buf + 1, lens[k]), crc_bitwise(buf + 1, lens[k]));
        size_t cut = lens[k] / 3;
        uint32_t a = dt_crc32c(0, buf + 1, cut);
        CU_ASSERT_EQUAL(dt_crc32c(a, buf + 1 + cut, lens[k] - cut),
                        crc_bitwise(buf + 1, lens[k]));
    }
    free(buf);
}

static const char *const names[4] = {"emb", "w/0", "scalar", "tiny"};
static const dt_dtype dtypes[4] = {DT_DTYPE_BF16, DT_DTYPE_F32, DT_DTYPE_I64, DT_DTYPE_U8};
static const int ranks[4] = {2, 2, 0, 1};
static const int64_t shapes[4][2] = {{10, 7}, {5, 9}, {0, 0}, {3, 0}};
static const char *const save_specs[4] = {"b,a", "a,unsharded", "", "b"};

static void save(const char *ck)
{
    int64_t sizes[2] = {2, 4};
    dt_mesh *m = ck_mesh(2, sizes);
    dt_tensor *t[4];
    for (int i = 0; i < 4; i++) {
        dt_layout *l = ck_layout(m, save_specs[i]);
        t[i] = ck_make(l, dtypes[i], shapes[i], (uint64_t)i + 20);
        dt_layout_destroy(l);
    }
    DT_ASSERT_OK(dt_save(m, ck, 4, names, (const dt_tensor *const *)t, NULL));
    for (int i = 0; i < 4; i++)
        dt_tensor_destroy(t[i]);
    dt_mesh_destroy(m);
}

static void test_open_lists_tensors_slices_and_files(void)
{
    char dir[256], ck[300];
    dt_test_scratch_dir(dir, sizeof dir);
    snprintf(ck, sizeof ck, "%s/ck", dir);
    save(ck);
    dt_ckpt *c = NULL;
    DT_ASSERT_OK(dt_ckpt_open(ck, &c));
    CU_ASSERT_EQUAL(dt_ckpt_format_version(c), DT_CKPT_FORMAT_VERSION);
    CU_ASSERT_EQUAL(dt_ckpt_num_tensors(c), 4);
    int64_t expect_slices[4] = {8, 2, 1, 3};   /* emb 4x2 blocks; w 2; scalar 1; tiny 3 of 4 */
    for (int i = 0; i < 4; i++) {
        dt_ckpt_tensor_info ti;
        DT_ASSERT_OK(dt_ckpt_tensor(c, i, &ti));
        CU_ASSERT_STRING_EQUAL(ti.name, names[i]);
        CU_ASSERT_EQUAL(ti.dtype, dtypes[i]);
        CU_ASSERT_EQUAL(ti.rank, ranks[i]);
        CU_ASSERT_EQUAL(ti.num_slices, expect_slices[i]);
        CU_ASSERT_PTR_NOT_NULL(strstr(ti.layout, "sharding_specs:"));
        CU_ASSERT_PTR_NOT_NULL(strstr(ti.mesh, "a=2,b=4"));
        int64_t numel = 0;
        for (int64_t s = 0; s < ti.num_slices; s++) {
            dt_ckpt_slice_info si;
            DT_ASSERT_OK(dt_ckpt_slice(c, i, s, &si));
            CU_ASSERT_STRING_EQUAL(si.key, names[i]);
            int64_t n = 1;
            for (int d = 0; d < si.rank; d++)
                n *= si.sizes[d];
            numel += n;
            CU_ASSERT_EQUAL(si.bytes, (uint64_t)n * dt_dtype_size(dtypes[i]));
            CU_ASSERT_EQUAL(si.file_offset % dt_dtype_size(dtypes[i]), 0);
        }
        int64_t want = 1;
        for (int d = 0; d < ranks[i]; d++)
            want *= shapes[i][d];
        CU_ASSERT_EQUAL(numel, want);
        int64_t idx = -1;
        DT_ASSERT_OK(dt_ckpt_find(c, names[i], &idx));
        CU_ASSERT_EQUAL(idx, i);
    }
    CU_ASSERT(dt_ckpt_num_files(c) >= 2 && dt_ckpt_num_files(c) <= 8);
    for (int64_t f = 0; f < dt_ckpt_num_files(c); f++) {
        dt_ckpt_file_info fi;
        DT_ASSERT_OK(dt_ckpt_file(c, f, &fi));
        char want[64], p[400];
        snprintf(want, sizeof want, "data-%05lld-of-%05lld.safetensors", (long long)f,
                 (long long)dt_ckpt_num_files(c));
        CU_ASSERT_STRING_EQUAL(fi.name, want);
        CU_ASSERT_EQUAL(fi.header_bytes % 8, 0);
        struct stat sb;
        snprintf(p, sizeof p, "%s/%s", ck, fi.name);
        CU_ASSERT_EQUAL(stat(p, &sb), 0);
        CU_ASSERT_EQUAL((uint64_t)sb.st_size, fi.bytes);
    }
    int64_t bad = -1;
    DT_ASSERT_OK(dt_ckpt_verify(c, NULL, NULL, &bad));
    CU_ASSERT_EQUAL(bad, 0);
    for (int i = 0; i < 4; i++) {
        int64_t n = 1;
        for (int d = 0; d < ranks[i]; d++)
            n *= shapes[i][d];
        size_t bytes = (size_t)n * dt_dtype_size(dtypes[i]);
        unsigned char *got = malloc(bytes + 1), *ref = ck_ref_tensor((uint64_t)i + 20, ranks[i],
                                                                      shapes[i], dtypes[i]);
        DT_ASSERT_OK(dt_ckpt_read_tensor(c, i, got, bytes));
        CU_ASSERT_EQUAL(memcmp(got, ref, bytes), 0);
        free(got);
        free(ref);
    }
    dt_ckpt_close(c);
    dt_test_scratch_remove(dir);
}

/* Parses one exported safetensors file and checks each of its tensors against the reference;
 * returns how many tensors it holds. */
static int check_safetensors(const char *path)
{
    FILE *f = fopen(path, "rb");
    CU_ASSERT_FATAL(f != NULL);
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *buf = malloc((size_t)size);
    CU_ASSERT_FATAL(fread(buf, 1, (size_t)size, f) == (size_t)size);
    fclose(f);
    uint64_t h = 0;
    for (int b = 7; b >= 0; b--)
        h = h << 8 | buf[b];
    CU_ASSERT_EQUAL((8 + h) % 8, 0);
    json_error_t err;
    json_t *root = json_loadb((const char *)buf + 8, (size_t)h, 0, &err);
    CU_ASSERT_FATAL(root != NULL);
    int count = 0;
    uint64_t covered = 0;
    const char *key;
    json_t *v;
    json_object_foreach(root, key, v) {
        if (strcmp(key, "__metadata__") == 0)
            continue;
        int i = 0;
        while (i < 4 && strcmp(names[i], key) != 0)
            i++;
        CU_ASSERT_FATAL(i < 4);
        static const char *const st[4] = {"BF16", "F32", "I64", "U8"};
        CU_ASSERT_STRING_EQUAL(json_string_value(json_object_get(v, "dtype")), st[i]);
        json_t *shape = json_object_get(v, "shape");
        CU_ASSERT_EQUAL(json_array_size(shape), (size_t)ranks[i]);
        int64_t n = 1;
        for (int d = 0; d < ranks[i]; d++) {
            CU_ASSERT_EQUAL(json_integer_value(json_array_get(shape, d)), shapes[i][d]);
            n *= shapes[i][d];
        }
        json_t *dof = json_object_get(v, "data_offsets");
        uint64_t b0 = (uint64_t)json_integer_value(json_array_get(dof, 0));
        uint64_t b1 = (uint64_t)json_integer_value(json_array_get(dof, 1));
        size_t bytes = (size_t)n * dt_dtype_size(dtypes[i]);
        CU_ASSERT_EQUAL(b1 - b0, bytes);
        unsigned char *ref = ck_ref_tensor((uint64_t)i + 20, ranks[i], shapes[i], dtypes[i]);
        CU_ASSERT_EQUAL(memcmp(buf + 8 + h + b0, ref, bytes), 0);
        free(ref);
        covered += bytes;
        count++;
    }
    CU_ASSERT_EQUAL(8 + h + covered, (uint64_t)size);   /* no holes, nothing after */
    json_decref(root);
    free(buf);
    return count;
}

static void test_export_writes_standard_safetensors_whole_and_split(void)
{
    char dir[256], ck[300], out[300], p[400];
    dt_test_scratch_dir(dir, sizeof dir);
    snprintf(ck, sizeof ck, "%s/ck", dir);
    save(ck);
    dt_ckpt *c = NULL;
    DT_ASSERT_OK(dt_ckpt_open(ck, &c));
    snprintf(out, sizeof out, "%s/one", dir);
    int files = 0;
    DT_ASSERT_OK(dt_ckpt_export(c, out, NULL, &files));
    CU_ASSERT_EQUAL(files, 1);
    snprintf(p, sizeof p, "%s/model.safetensors", out);
    CU_ASSERT_EQUAL(check_safetensors(p), 4);
    /* Split at 100 bytes: emb (140 B) alone, w (180 B) alone, scalar + tiny together. */
    dt_ckpt_export_opts o = DT_CKPT_EXPORT_OPTS_INIT;
    o.max_file_bytes = 100;
    o.fsync = 0;
    snprintf(out, sizeof out, "%s/split", dir);
    DT_ASSERT_OK(dt_ckpt_export(c, out, &o, &files));
    CU_ASSERT_EQUAL(files, 3);
    int total = 0;
    for (int f = 1; f <= 3; f++) {
        snprintf(p, sizeof p, "%s/model-%05d-of-00003.safetensors", out, f);
        total += check_safetensors(p);
    }
    CU_ASSERT_EQUAL(total, 4);
    snprintf(p, sizeof p, "%s/model.safetensors.index.json", out);
    json_error_t err;
    json_t *idx = json_load_file(p, 0, &err);
    CU_ASSERT_FATAL(idx != NULL);
    json_t *wm = json_object_get(idx, "weight_map");
    CU_ASSERT_STRING_EQUAL(json_string_value(json_object_get(wm, "w/0")),
                           "model-00002-of-00003.safetensors");
    CU_ASSERT_STRING_EQUAL(json_string_value(json_object_get(wm, "tiny")),
                           "model-00003-of-00003.safetensors");
    CU_ASSERT_EQUAL(json_integer_value(json_object_get(json_object_get(idx, "metadata"),
                                                       "total_size")),
                    140 + 180 + 8 + 3);
    json_decref(idx);
    dt_ckpt_close(c);
    dt_test_scratch_remove(dir);
}

int main(int argc, char **argv)
{
    static const dt_test_case cases[] = {
        DT_TEST(test_crc32c_matches_bitwise_reference_at_every_length_and_split),
        DT_TEST(test_open_lists_tensors_slices_and_files),
        DT_TEST(test_export_writes_standard_safetensors_whole_and_split),
        DT_TEST_END,
    };
    return dt_test_main(argc, argv, "ckpt_inspect", cases, 1);
}
