/* The checkpoint manager: steps saved under a root keep the newest N and every K-th, the
 * "latest" pointer names the last saved step, and latest discovery never picks an incomplete
 * or corrupt step (a crashed save, a removed file, an altered index, a damaged pointer), says
 * which damaged steps it passed over, and a later save sets them aside as step-N.damaged
 * instead of deleting them. Each restored step is compared with its single-device reference
 * bit for bit. */
#include <glob.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ck_test_util.h"
#include "harness.h"

static dt_mesh *all_mesh(void)
{
    int64_t n = dt_num_global_devices(DT_DEVICE_CPU);
    int64_t sizes[2] = {2, n / 2};
    return ck_mesh(2, sizes);
}

static const int64_t shape[2] = {6, 5};

/* Saves step `step` (tensor "w", value "step") under root through the manager. */
static void save_step(const char *root, int64_t step, const dt_ckpt_keep *keep)
{
    dt_mesh *m = all_mesh();
    dt_layout *l = ck_layout(m, "a,b");
    dt_tensor *t = ck_make(l, DT_DTYPE_F32, shape, (uint64_t)step);
    const char *name = "w";
    dt_ckpt_value v = {.name = "step", .type = DT_CKPT_VALUE_I64, .i64 = step};
    dt_save_opts o = DT_SAVE_OPTS_INIT;
    o.values = &v;
    o.nvalues = 1;
    DT_ASSERT_OK(dt_save_step(m, root, step, keep, 1, &name, (const dt_tensor *const *)&t, &o));
    dt_tensor_destroy(t);
    dt_layout_destroy(l);
    dt_mesh_destroy(m);
}

/* The latest step under root restores (on other layouts) to exactly its reference. */
static int64_t restore_latest(const char *root)
{
    int64_t step = -1;
    char dir[1024];
    DT_ASSERT_OK(dt_ckpt_latest(root, &step, dir, sizeof dir));
    dt_mesh *m = all_mesh();
    dt_layout *l = ck_layout(m, "b,unsharded");
    dt_tensor *out = NULL;
    const char *name = "w";
    DT_ASSERT_OK(dt_restore(m, dir, 1, &name, (const dt_layout *const *)&l, &out));
    CU_ASSERT_EQUAL(ck_mismatches(out, (uint64_t)step), 0);
    dt_ckpt *c = NULL;
    int64_t saved = -1;
    DT_ASSERT_OK(dt_ckpt_open(dir, &c));
    DT_ASSERT_OK(dt_ckpt_value_i64(c, "step", &saved));
    CU_ASSERT_EQUAL(saved, step);
    dt_ckpt_close(c);
    dt_tensor_destroy(out);
    dt_layout_destroy(l);
    dt_mesh_destroy(m);
    return step;
}

/* The steps under root as "1:c 2:i 3:d 3:a ..." (c complete, i incomplete, d damaged in
 * place, a a damaged step set aside). */
static void steps_text(const char *root, char *buf, size_t len)
{
    dt_ckpt_step *v = NULL;
    int64_t n = 0;
    DT_ASSERT_OK(dt_ckpt_list_steps(root, &v, &n));
    buf[0] = '\0';
    for (int64_t i = 0; i < n; i++)
        snprintf(buf + strlen(buf), len - strlen(buf), "%s%lld:%c", i ? " " : "",
                 (long long)v[i].step,
                 v[i].set_aside ? 'a' : v[i].damaged ? 'd' : v[i].complete ? 'c' : 'i');
    dt_ckpt_steps_free(v);
}

static void test_steps_keep_last_n_and_every_kth_and_latest_is_the_last_saved(void)
{
    char dir[256], root[300], text[256], ptr[400];
    dt_test_scratch_dir(dir, sizeof dir);
    snprintf(root, sizeof root, "%s/run", dir);
    dt_ckpt_keep keep = {.last = 2, .every = 3};
    for (int64_t s = 1; s <= 7; s++) {
        save_step(root, s, &keep);
        CU_ASSERT_EQUAL(restore_latest(root), s);
    }
    /* Newest 2 (6, 7) and the multiples of 3 (3, 6). */
    steps_text(root, text, sizeof text);
    CU_ASSERT_STRING_EQUAL(text, "3:c 6:c 7:c");
    snprintf(ptr, sizeof ptr, "%s/latest", root);
    FILE *f = fopen(ptr, "r");
    CU_ASSERT_FATAL(f != NULL);
    char line[64] = "";
    CU_ASSERT_PTR_NOT_NULL(fgets(line, sizeof line, f));
    fclose(f);
    CU_ASSERT_STRING_EQUAL(line, "step-0000000007\n");
    /* Nothing beside the steps and the pointer (no temporary or old directories). */
    struct stat sb;
    snprintf(ptr, sizeof ptr, "%s/step-0000000007.dtensor-old", root);
    CU_ASSERT_NOT_EQUAL(stat(ptr, &sb), 0);
    snprintf(ptr, sizeof ptr, "%s/latest.dtensor-tmp", root);
    CU_ASSERT_NOT_EQUAL(stat(ptr, &sb), 0);
    /* Without `every`, only the newest `last` stay. */
    keep = (dt_ckpt_keep){.last = 1, .every = 0};
    save_step(root, 8, &keep);
    steps_text(root, text, sizeof text);
    CU_ASSERT_STRING_EQUAL(text, "8:c");
    dt_test_scratch_remove(dir);
}

/* Client 0 alters root: `fn` runs between barriers. */
static void on_client0(void (*fn)(const char *), const char *arg)
{
    MPI_Barrier(MPI_COMM_WORLD);
    if (dt_client_id() == 0)
        fn(arg);
    MPI_Barrier(MPI_COMM_WORLD);
}

static void write_text(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    CU_ASSERT_FATAL(f != NULL);
    fputs(text, f);
    fclose(f);
}

/* A save that crashed before its commit: only the temporary directory of step 5. */
static void crashed_save(const char *root)
{
    char p[400];
    snprintf(p, sizeof p, "%s/step-0000000005.dtensor-tmp", root);
    CU_ASSERT_EQUAL(mkdir(p, 0755), 0);
    snprintf(p, sizeof p, "%s/step-0000000005.dtensor-tmp/data-00000-of-00001.safetensors",
             root);
    write_text(p, "partial");
}

/* Client 0 replaces root/latest by `text`, between barriers. */
static void set_latest(const char *root, const char *text)
{
    char p[400];
    snprintf(p, sizeof p, "%s/latest", root);
    MPI_Barrier(MPI_COMM_WORLD);
    if (dt_client_id() == 0)
        write_text(p, text);
    MPI_Barrier(MPI_COMM_WORLD);
}

static void remove_a_data_file_of_step_4(const char *root)
{
    char p[400];
    glob_t g;
    snprintf(p, sizeof p, "%s/step-0000000004/data-00000-of-*.safetensors", root);
    CU_ASSERT_FATAL(glob(p, 0, NULL, &g) == 0 && g.gl_pathc == 1);
    CU_ASSERT_EQUAL(unlink(g.gl_pathv[0]), 0);
    globfree(&g);
}

static void test_latest_never_picks_an_incomplete_or_corrupt_step(void)
{
    char dir[256], root[300], step3[400], text[256];
    dt_test_scratch_dir(dir, sizeof dir);
    snprintf(root, sizeof root, "%s/run", dir);
    dt_ckpt_keep keep = {.last = 5, .every = 0};
    for (int64_t s = 2; s <= 4; s++)
        save_step(root, s, &keep);
    on_client0(crashed_save, root);
    steps_text(root, text, sizeof text);
    CU_ASSERT_STRING_EQUAL(text, "2:c 3:c 4:c 5:i");
    CU_ASSERT_EQUAL(restore_latest(root), 4);
    /* Step 4 loses a file: the pointer names it, but the newest complete step is 3. */
    on_client0(remove_a_data_file_of_step_4, root);
    CU_ASSERT_EQUAL(restore_latest(root), 3);
    /* Step 3's index altered (checksum broken): step 2. */
    CU_ASSERT_EQUAL(dt_ckpt_step_dir(root, 3, step3, sizeof step3), DT_OK);
    ck_edit_index(step3, "\"num_devices\": ", "\"num_devices\": 1", 0);
    CU_ASSERT_EQUAL(restore_latest(root), 2);
    steps_text(root, text, sizeof text);
    CU_ASSERT_STRING_EQUAL(text, "2:c 3:d 4:d 5:i");
    /* A damaged pointer is ignored. */
    set_latest(root, "step-00000000x");
    CU_ASSERT_EQUAL(restore_latest(root), 2);
    /* The next save removes the incomplete steps below it, sets the damaged ones aside and
     * keeps the rest. */
    save_step(root, 6, &keep);
    steps_text(root, text, sizeof text);
    CU_ASSERT_STRING_EQUAL(text, "2:c 3:a 4:a 6:c");
    CU_ASSERT_EQUAL(restore_latest(root), 6);
    save_step(root, 7, &keep);
    set_latest(root, "step-0000000004\n");   /* a step that no longer exists */
    CU_ASSERT_EQUAL(restore_latest(root), 7);
    /* A pointer at a complete step below the newest is followed (the newer one was saved by
     * a run that did not publish it, or the run went back). */
    set_latest(root, "step-0000000006\n");
    CU_ASSERT_EQUAL(restore_latest(root), 6);
    dt_test_scratch_remove(dir);
}

/* Client 0 cuts 7 bytes off the end of the first data file of root's step 4. */
static void truncate_a_data_file_of_step_4(const char *root)
{
    char p[400];
    glob_t g;
    struct stat sb;
    snprintf(p, sizeof p, "%s/step-0000000004/data-00000-of-*.safetensors", root);
    CU_ASSERT_FATAL(glob(p, 0, NULL, &g) == 0 && g.gl_pathc == 1);
    CU_ASSERT_FATAL(stat(g.gl_pathv[0], &sb) == 0);
    CU_ASSERT_EQUAL(truncate(g.gl_pathv[0], sb.st_size - 7), 0);
    globfree(&g);
}

/* The size of root/name/data-00000-of-*.safetensors, -1 when there is none. */
static long long first_file_size(const char *root, const char *name)
{
    char p[400];
    glob_t g;
    struct stat sb;
    long long size = -1;
    snprintf(p, sizeof p, "%s/%s/data-00000-of-*.safetensors", root, name);
    if (glob(p, 0, NULL, &g) == 0 && g.gl_pathc == 1 && stat(g.gl_pathv[0], &sb) == 0)
        size = (long long)sb.st_size;
    globfree(&g);
    return size;
}

static void test_a_damaged_latest_step_is_reported_and_set_aside_never_deleted(void)
{
    char dir[256], root[300], text[256], sdir[1024];
    dt_test_scratch_dir(dir, sizeof dir);
    snprintf(root, sizeof root, "%s/run", dir);
    dt_ckpt_keep keep = {.last = 1, .every = 0};
    save_step(root, 3, &keep);
    save_step(root, 4, &keep);
    long long full = first_file_size(root, "step-0000000004");
    CU_ASSERT_FATAL(full > 7);
    on_client0(truncate_a_data_file_of_step_4, root);
    /* Restore-latest takes step 3... (keep.last = 1 removed it: step 4 is the only one) */
    dt_ckpt_latest_info info;
    DT_ASSERT_FAILS(dt_ckpt_find_latest(root, &info, sdir, sizeof sdir), DT_ERR_NOT_FOUND);
    DT_ASSERT_ERROR_MENTIONS("step 4 is damaged");
    DT_ASSERT_ERROR_MENTIONS("truncated");
    /* ... so with an older good step kept beside it: */
    dt_test_scratch_remove(dir);
    dt_test_scratch_dir(dir, sizeof dir);
    snprintf(root, sizeof root, "%s/run", dir);
    keep = (dt_ckpt_keep){.last = 3, .every = 0};
    save_step(root, 3, &keep);
    save_step(root, 4, &keep);
    on_client0(truncate_a_data_file_of_step_4, root);
    DT_ASSERT_OK(dt_ckpt_find_latest(root, &info, sdir, sizeof sdir));
    CU_ASSERT_EQUAL(info.step, 3);
    CU_ASSERT_EQUAL(info.skipped, 1);
    CU_ASSERT_EQUAL(info.skipped_step, 4);
    CU_ASSERT_PTR_NOT_NULL(strstr(info.skipped_reason, "step-0000000004/data-00000-of-"));
    CU_ASSERT_PTR_NOT_NULL(strstr(info.skipped_reason, "truncated"));
    CU_ASSERT_PTR_NOT_NULL(strstr(sdir, "step-0000000003"));
    CU_ASSERT_EQUAL(restore_latest(root), 3);
    steps_text(root, text, sizeof text);
    CU_ASSERT_STRING_EQUAL(text, "3:c 4:d");
    dt_ckpt_step *v = NULL;
    int64_t n = 0;
    DT_ASSERT_OK(dt_ckpt_list_steps(root, &v, &n));
    CU_ASSERT_FATAL(n == 2);
    CU_ASSERT_STRING_EQUAL(v[1].name, "step-0000000004");
    CU_ASSERT_STRING_EQUAL(v[1].reason, info.skipped_reason);
    CU_ASSERT_STRING_EQUAL(v[0].reason, "");
    dt_ckpt_steps_free(v);
    /* A run resumed from step 3 saves step 4 again: the damaged one is set aside first, its
     * files as they were; the new step 4 is latest. */
    save_step(root, 4, &keep);
    steps_text(root, text, sizeof text);
    CU_ASSERT_STRING_EQUAL(text, "3:c 4:c 4:a");
    CU_ASSERT_EQUAL(first_file_size(root, "step-0000000004.damaged"), full - 7);
    DT_ASSERT_OK(dt_ckpt_find_latest(root, &info, NULL, 0));
    CU_ASSERT_EQUAL(info.step, 4);
    CU_ASSERT_EQUAL(info.skipped, 0);
    CU_ASSERT_EQUAL(restore_latest(root), 4);
    /* Damaged again and saved over again: a second aside name; later saves prune around the
     * set-aside steps and never remove them. */
    on_client0(truncate_a_data_file_of_step_4, root);
    save_step(root, 5, &keep);
    steps_text(root, text, sizeof text);
    CU_ASSERT_STRING_EQUAL(text, "3:c 4:a 4:a 5:c");
    char p[400];
    struct stat sb;
    snprintf(p, sizeof p, "%s/step-0000000004.damaged.2", root);
    CU_ASSERT_EQUAL(stat(p, &sb), 0);
    keep = (dt_ckpt_keep){.last = 1, .every = 0};
    save_step(root, 6, &keep);
    steps_text(root, text, sizeof text);
    CU_ASSERT_STRING_EQUAL(text, "4:a 4:a 6:c");
    CU_ASSERT_EQUAL(restore_latest(root), 6);
    dt_test_scratch_remove(dir);
}

static void test_steps_reject_bad_input_and_report_an_empty_root(void)
{
    char dir[256], root[300], buf[64];
    dt_test_scratch_dir(dir, sizeof dir);
    snprintf(root, sizeof root, "%s/none", dir);
    DT_ASSERT_FAILS(dt_ckpt_latest(root, NULL, NULL, 0), DT_ERR_NOT_FOUND);
    DT_ASSERT_ERROR_MENTIONS(root);
    DT_ASSERT_FAILS(dt_ckpt_step_dir(root, -1, buf, sizeof buf), DT_ERR_INVALID_ARGUMENT);
    DT_ASSERT_FAILS(dt_ckpt_step_dir("/x", 1, buf, 8), DT_ERR_INVALID_ARGUMENT);
    dt_ckpt_keep bad = {.last = 0, .every = 0};
    dt_mesh *m = all_mesh();
    DT_ASSERT_FAILS(dt_save_step(m, root, 1, &bad, 0, NULL, NULL, NULL),
                    DT_ERR_INVALID_ARGUMENT);
    DT_ASSERT_ERROR_MENTIONS("keep.last");
    dt_mesh_destroy(m);
    dt_test_scratch_remove(dir);
}

int main(int argc, char **argv)
{
    static const dt_test_case cases[] = {
        DT_TEST(test_steps_keep_last_n_and_every_kth_and_latest_is_the_last_saved),
        DT_TEST(test_latest_never_picks_an_incomplete_or_corrupt_step),
        DT_TEST(test_a_damaged_latest_step_is_reported_and_set_aside_never_deleted),
        DT_TEST(test_steps_reject_bad_input_and_report_an_empty_root),
        DT_TEST_END,
    };
    return dt_test_main(argc, argv, "ckpt_steps", cases, 1);
}
