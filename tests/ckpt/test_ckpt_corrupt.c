/* Corruption: a truncated, deleted or altered data file (data bytes or header) and an edited
 * index each make dt_restore fail on every client with DT_ERR_CORRUPT naming the file and the
 * tensor, and dt_ckpt_verify name the bad slice; never a crash or wrong data. */
#include <fcntl.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ck_test_util.h"
#include "harness.h"

static const char *const names[3] = {"w", "layer/b", "s"};
static const dt_dtype dtypes[3] = {DT_DTYPE_F32, DT_DTYPE_BF16, DT_DTYPE_I64};
static const int64_t shapes[3][2] = {{9, 6}, {11, 0}, {0, 0}};
static const char *const save_specs[3] = {"a,b", "b", ""};

static dt_mesh *all_mesh(void)
{
    int64_t n = dt_num_global_devices(DT_DEVICE_CPU);
    int64_t sizes[2] = {2, n / 2};
    return ck_mesh(2, sizes);
}

static void save(const char *ck)
{
    dt_mesh *m = all_mesh();
    dt_tensor *t[3];
    for (int i = 0; i < 3; i++) {
        dt_layout *l = ck_layout(m, save_specs[i]);
        t[i] = ck_make(l, dtypes[i], shapes[i], (uint64_t)i + 1);
        dt_layout_destroy(l);
    }
    DT_ASSERT_OK(dt_save(m, ck, 3, names, (const dt_tensor *const *)t, NULL));
    for (int i = 0; i < 3; i++)
        dt_tensor_destroy(t[i]);
    dt_mesh_destroy(m);
}

/* Every client restores everything replicated on all devices: every client reads every
 * slice. Returns the status; checks the data when it succeeds. */
static dt_status restore_all(const char *ck)
{
    dt_mesh *m = all_mesh();
    dt_layout *l[3];
    dt_tensor *out[3] = {NULL, NULL, NULL};
    const char *rep[3] = {"unsharded,unsharded", "unsharded", ""};
    for (int i = 0; i < 3; i++)
        l[i] = ck_layout(m, rep[i]);
    dt_status st = dt_restore(m, ck, 3, names, (const dt_layout *const *)l, out);
    for (int i = 0; i < 3; i++) {
        if (st == DT_OK) {
            CU_ASSERT_EQUAL(ck_mismatches(out[i], (uint64_t)i + 1), 0);
        } else {
            CU_ASSERT_PTR_NULL(out[i]);
        }
        dt_tensor_destroy(out[i]);
        dt_layout_destroy(l[i]);
    }
    dt_mesh_destroy(m);
    return st;
}

/* File name and absolute data offset of slice `s` of tensor `name`. */
static void locate(const char *ck, const char *name, int64_t s, char *file, size_t len,
                   uint64_t *off, uint64_t *bytes)
{
    dt_ckpt *c = NULL;
    int64_t t = -1;
    DT_ASSERT_OK(dt_ckpt_open(ck, &c));
    DT_ASSERT_OK(dt_ckpt_find(c, name, &t));
    dt_ckpt_slice_info si;
    DT_ASSERT_OK(dt_ckpt_slice(c, t, s, &si));
    snprintf(file, len, "%s", si.file);
    *off = si.file_offset;
    *bytes = si.bytes;
    dt_ckpt_close(c);
}

static void flip_byte(const char *path, uint64_t off)
{
    int fd = open(path, O_RDWR);
    CU_ASSERT_FATAL(fd >= 0);
    unsigned char b;
    CU_ASSERT_EQUAL(pread(fd, &b, 1, (off_t)off), 1);
    b ^= 0x20;
    CU_ASSERT_EQUAL(pwrite(fd, &b, 1, (off_t)off), 1);
    close(fd);
}

typedef enum { TRUNCATE, FLIP_DATA, FLIP_HEADER, DELETE } damage;

/* Saves, lets client 0 damage the file holding slice 1 of "w", restores on every client. */
static void check_damage(damage what, const char *expect)
{
    char dir[256], ck[300], file[96], path[420];
    ck_scratch(dir, sizeof dir, ck, sizeof ck);
    save(ck);
    uint64_t off, bytes;
    locate(ck, "w", 1, file, sizeof file, &off, &bytes);
    snprintf(path, sizeof path, "%s/%s", ck, file);
    MPI_Barrier(MPI_COMM_WORLD);
    if (dt_client_id() == 0) {
        if (what == TRUNCATE)
            CU_ASSERT_EQUAL(truncate(path, (off_t)(off + bytes / 2)), 0);
        if (what == FLIP_DATA)
            flip_byte(path, off + bytes - 1);
        if (what == FLIP_HEADER)
            flip_byte(path, 12);    /* inside the JSON header */
        if (what == DELETE)
            CU_ASSERT_EQUAL(unlink(path), 0);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    DT_ASSERT_FAILS(restore_all(ck), DT_ERR_CORRUPT);
    DT_ASSERT_ERROR_MENTIONS(file);
    DT_ASSERT_ERROR_MENTIONS("tensor '");
    DT_ASSERT_ERROR_MENTIONS(expect);
    if (what == FLIP_DATA)
        DT_ASSERT_ERROR_MENTIONS("tensor 'w'");
    /* verify names the slice's file too, and counts it. */
    dt_ckpt *c = NULL;
    DT_ASSERT_OK(dt_ckpt_open(ck, &c));
    int64_t bad = 0;
    DT_ASSERT_FAILS(dt_ckpt_verify(c, NULL, NULL, &bad), DT_ERR_CORRUPT);
    DT_ASSERT_ERROR_MENTIONS(file);
    CU_ASSERT(bad >= 1);
    dt_ckpt_close(c);
    dt_test_scratch_remove(dir);
}

static void test_truncated_file_is_corrupt(void) { check_damage(TRUNCATE, "truncated"); }
static void test_flipped_data_byte_is_corrupt(void) { check_damage(FLIP_DATA, "CRC32C"); }
static void test_flipped_header_byte_is_corrupt(void) { check_damage(FLIP_HEADER, "header"); }
static void test_deleted_file_is_corrupt(void) { check_damage(DELETE, "missing"); }

/* Client 0 rewrites the index with one substitution (resealing its checksum or not); restore
 * fails on every client naming `expect`. */
static void check_index_edit(const char *from, const char *to, int reseal, const char *expect)
{
    char dir[256], ck[300];
    ck_scratch(dir, sizeof dir, ck, sizeof ck);
    save(ck);
    ck_edit_index(ck, from, to, reseal);
    DT_ASSERT_FAILS(restore_all(ck), DT_ERR_CORRUPT);
    DT_ASSERT_ERROR_MENTIONS(expect);
    dt_test_scratch_remove(dir);
}

static void test_edited_index_is_corrupt(void)
{
    /* Any edit, even one the other checks would let through, breaks the index checksum. */
    check_index_edit("\"num_devices\": ", "\"num_devices\": 1", 0, "index_crc32c");
    check_index_edit("\"chunk_bytes\": 1048576", "\"chunk_bytes\": 2097152", 0, "index_crc32c");
    check_index_edit("\"values\": [", "\"values\": [], \"x\": [", 0, "index_crc32c");
    /* The checksum member itself altered or dropped. */
    check_index_edit("\"index_crc32c\": \"", "\"index_crc32c\": \"0", 0, "index_crc32c");
    check_index_edit("\"index_crc32c\"", "\"index_crc32d\"", 0, "index_crc32c");
    /* Resealed edits reach the checks behind the checksum. A slice's box moved: the file
     * header disagrees, or the tiling breaks. */
    check_index_edit("\"offsets\": [\n", "\"offsets\": [\n1,", 1, "tensor 'w'");
    /* A CRC edited: it no longer matches its chunks. */
    check_index_edit("\"crc32c\": ", "\"crc32c\": 1", 1, "tensor '");
    /* A file name pointing outside the directory. */
    check_index_edit("\"name\": \"data-00000", "\"name\": \"../data-00000", 1, "data-00000");
    /* Not JSON at all. */
    check_index_edit("{", "{{", 1, DT_CKPT_INDEX_NAME);
    /* A dtype changed: the file header disagrees, naming the field. */
    check_index_edit("\"dtype\": \"F32\"", "\"dtype\": \"I32\"", 1, "field 'dtype'");
}

static void test_missing_checkpoint_is_not_found(void)
{
    char dir[256], ck[300];
    dt_test_scratch_dir(dir, sizeof dir);
    snprintf(ck, sizeof ck, "%s/none", dir);
    DT_ASSERT_FAILS(restore_all(ck), DT_ERR_NOT_FOUND);
    DT_ASSERT_ERROR_MENTIONS("none");
    dt_test_scratch_remove(dir);
}

/* Two replicated tensors land in different files; with the second's file gone the first
 * still restores (its reader never opens that file) and the second names it. */
static void test_restore_opens_only_the_files_it_needs(void)
{
    char dir[256], ck[300], file[96], path[420];
    ck_scratch(dir, sizeof dir, ck, sizeof ck);
    dt_mesh *m = all_mesh();
    dt_layout *l = ck_layout(m, "unsharded");
    int64_t shape[1] = {33};
    dt_tensor *t[2] = {ck_make(l, DT_DTYPE_F32, shape, 1), ck_make(l, DT_DTYPE_F32, shape, 2)};
    const char *nm[2] = {"first", "second"};
    DT_ASSERT_OK(dt_save(m, ck, 2, nm, (const dt_tensor *const *)t, NULL));
    uint64_t off, bytes;
    char file0[96];
    locate(ck, "first", 0, file0, sizeof file0, &off, &bytes);
    locate(ck, "second", 0, file, sizeof file, &off, &bytes);
    CU_ASSERT_STRING_NOT_EQUAL(file0, file);
    snprintf(path, sizeof path, "%s/%s", ck, file);
    MPI_Barrier(MPI_COMM_WORLD);
    if (dt_client_id() == 0)
        CU_ASSERT_EQUAL(unlink(path), 0);
    MPI_Barrier(MPI_COMM_WORLD);
    dt_tensor *out = NULL;
    DT_ASSERT_OK(dt_restore(m, ck, 1, &nm[0], (const dt_layout *const *)&l, &out));
    CU_ASSERT_EQUAL(ck_mismatches(out, 1), 0);
    dt_tensor_destroy(out);
    out = NULL;
    DT_ASSERT_FAILS(dt_restore(m, ck, 1, &nm[1], (const dt_layout *const *)&l, &out),
                    DT_ERR_CORRUPT);
    DT_ASSERT_ERROR_MENTIONS(file);
    DT_ASSERT_ERROR_MENTIONS("tensor 'second'");
    for (int i = 0; i < 2; i++)
        dt_tensor_destroy(t[i]);
    dt_layout_destroy(l);
    dt_mesh_destroy(m);
    dt_test_scratch_remove(dir);
}

int main(int argc, char **argv)
{
    static const dt_test_case cases[] = {
        DT_TEST(test_truncated_file_is_corrupt),
        DT_TEST(test_flipped_data_byte_is_corrupt),
        DT_TEST(test_flipped_header_byte_is_corrupt),
        DT_TEST(test_deleted_file_is_corrupt),
        DT_TEST(test_edited_index_is_corrupt),
        DT_TEST(test_missing_checkpoint_is_not_found),
        DT_TEST(test_restore_opens_only_the_files_it_needs),
        DT_TEST_END,
    };
    return dt_test_main(argc, argv, "ckpt_corrupt", cases, 1);
}
