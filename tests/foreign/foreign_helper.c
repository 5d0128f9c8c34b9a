/* Driver of the Python tests of tests/foreign: `save-gpt2 SRC CKPT VOCAB_ROWS` restores a GPT-2
 * source through dt_foreign_gpt2_map onto all devices and saves it as our checkpoint (for the
 * hf-gpt2 export round trip); `probe FILE` opens a (possibly mutated) file and prints each
 * tensor's name, dtype, shape and CRC32C of its bytes as restored, or the status the library
 * returned (for the fuzzer: many files in one process). Exit status: 0 ok (probe: always, the
 * outcome is printed), 1 a status from the library (printed), 2 usage. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dtensor/dtensor.h"

static int fail(const char *what, dt_status st)
{
    printf("ERROR %s %s: %s\n", what, dt_status_name(st), dt_last_error());
    return 1;
}

static int save_gpt2(const char *path, const char *ckpt, int64_t vocab_rows)
{
    dt_foreign *src = NULL;
    dt_status st = dt_foreign_open(path, &src);
    if (st != DT_OK)
        return fail("open", st);
    dt_foreign_map_entry *map = NULL;
    int n = 0;
    if ((st = dt_foreign_gpt2_map(src, vocab_rows, &map, &n, NULL)) != DT_OK)
        return fail("map", st);
    const char *dim = "a";
    int64_t size = dt_num_global_devices(DT_DEVICE_CPU);
    dt_mesh *mesh = NULL;
    if ((st = dt_mesh_create(NULL, 1, &dim, &size, DT_DEVICE_CPU, &mesh)) != DT_OK)
        return fail("mesh", st);
    dt_tensor **t = calloc((size_t)n, sizeof *t);
    dt_foreign_view *views = calloc((size_t)n, sizeof *views);
    const char **names = calloc((size_t)n, sizeof *names);
    for (int i = 0; st == DT_OK && i < n; i++) {
        const char *specs[2] = {"unsharded", "a"};
        dt_layout *l = NULL;
        st = dt_layout_create(mesh, map[i].rank, map[i].rank == 2 ? specs : specs + 1, &l);
        if (st == DT_OK)
            st = dt_tensor_zeros(l, DT_DTYPE_F32, map[i].shape, &t[i]);
        dt_layout_destroy(l);
        views[i] = map[i].view;
        names[i] = map[i].name;
    }
    if (st == DT_OK)
        st = dt_foreign_restore(src, n, views, t);
    if (st == DT_OK)
        st = dt_save(mesh, ckpt, n, names, (const dt_tensor *const *)t, NULL);
    int rc = st == DT_OK ? 0 : fail("restore/save", st);
    for (int i = 0; i < n; i++)
        dt_tensor_destroy(t[i]);
    free(t);
    free(views);
    free(names);
    dt_mesh_destroy(mesh);
    dt_foreign_map_free(map, n);
    dt_foreign_close(src);
    return rc;
}

static int probe(const char *path)
{
    dt_foreign *src = NULL;
    printf("== %s\n", path);
    dt_status st = dt_foreign_open(path, &src);
    if (st != DT_OK)
        return fail("open", st);
    const char *dims[1] = {"a"};
    int64_t one = 1;
    dt_mesh *mesh = NULL;
    if ((st = dt_mesh_create(NULL, 1, dims, &one, DT_DEVICE_CPU, &mesh)) != DT_OK)
        return fail("mesh", st);
    int rc = 0;
    for (int64_t i = 0; rc == 0 && i < dt_foreign_num_tensors(src); i++) {
        dt_foreign_tensor_info ti;
        dt_foreign_tensor(src, i, &ti);
        const char *un[DT_MAX_RANK];
        for (int d = 0; d < ti.rank; d++)
            un[d] = "unsharded";
        dt_layout *l = NULL;
        dt_tensor *t = NULL;
        st = dt_layout_create(mesh, ti.rank, un, &l);
        if (st == DT_OK)
            st = dt_tensor_zeros(l, ti.dtype, ti.shape, &t);
        dt_foreign_view v = DT_FOREIGN_VIEW_INIT;
        v.source = ti.name;
        if (st == DT_OK)
            st = dt_foreign_restore(src, 1, &v, &t);
        if (st != DT_OK) {
            rc = fail("restore", st);
        } else {
            uint32_t crc = 0;
            if (dt_tensor_num_local(t) > 0 && ti.bytes > 0)
                crc = dt_crc32c(0, dt_tensor_local(t, 0)->data, (size_t)ti.bytes);
            printf("%s %s [", ti.name, dt_dtype_name(ti.dtype));
            for (int d = 0; d < ti.rank; d++)
                printf("%s%" PRId64, d ? "," : "", ti.shape[d]);
            printf("] %08" PRIx32 "\n", crc);
        }
        dt_tensor_destroy(t);
        dt_layout_destroy(l);
    }
    dt_mesh_destroy(mesh);
    dt_foreign_close(src);
    return rc;
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: foreign_helper save-gpt2 SRC CKPT VOCAB_ROWS\n"
                        "       foreign_helper probe FILE...\n");
        return 2;
    }
    dt_init_opts io = DT_INIT_OPTS_INIT;
    io.bind_cores = 0;
    dt_status st = dt_init(&argc, &argv, &io);
    if (st != DT_OK)
        return fail("dt_init", st);
    int rc = 2;
    if (strcmp(argv[1], "save-gpt2") == 0 && argc == 5)
        rc = save_gpt2(argv[2], argv[3], atoll(argv[4]));
    else if (strcmp(argv[1], "probe") == 0)
        for (int i = 2; i < argc; i++)
            rc = probe(argv[i]) == 2 ? 2 : 0;
    fflush(stdout);
    dt_finalize();
    return rc;
}
