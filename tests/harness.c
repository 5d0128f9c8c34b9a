/* Test harness: runs one CUnit suite on every rank and reduces the failures. */
#include "harness.h"

#include <CUnit/Basic.h>
#include <dirent.h>
#include <mpi.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

const char *dt_test_srcdir(void)
{
    const char *d = getenv("DT_TEST_SRCDIR");
    return d ? d : ".";
}

static int run_suite(const char *suite, const dt_test_case *cases, int rank)
{
    if (CU_initialize_registry() != CUE_SUCCESS)
        return 1;
    CU_pSuite s = CU_add_suite(suite, NULL, NULL);
    for (const dt_test_case *c = cases; s && c->name; c++)
        if (!CU_add_test(s, c->name, c->fn))
            s = NULL;
    if (!s) {
        fprintf(stderr, "harness: cannot register tests: %s\n", CU_get_error_msg());
        CU_cleanup_registry();
        return 1;
    }
    /* Rank 0 prints the usual CUnit report; every rank prints its own failures. */
    CU_basic_set_mode(rank == 0 ? CU_BRM_VERBOSE : CU_BRM_SILENT);
    CU_basic_run_tests();
    int failed = (int)(CU_get_number_of_failures() + CU_get_number_of_tests_failed() > 0);
    if (failed && rank != 0) {
        for (CU_pFailureRecord f = CU_get_failure_list(); f; f = f->pNext)
            fprintf(stderr, "[rank %d] %s: %s:%u: %s\n", rank,
                    f->pTest ? f->pTest->pName : "?", f->strFileName ? f->strFileName : "?",
                    f->uiLineNumber, f->strCondition ? f->strCondition : "?");
    }
    CU_cleanup_registry();
    return failed;
}

int dt_test_main(int argc, char **argv, const char *suite, const dt_test_case *cases,
                 int init_runtime)
{
    int rank = 0, failed;
    if (init_runtime) {
        dt_init_opts opts = DT_INIT_OPTS_INIT;
        opts.bind_cores = 0;
        dt_status st = dt_init(&argc, &argv, &opts);
        if (st != DT_OK) {
            fprintf(stderr, "harness: dt_init: %s: %s\n", dt_status_name(st), dt_last_error());
            return 1;
        }
        rank = dt_client_id();
    }
    failed = run_suite(suite, cases, rank);
    if (init_runtime) {
        int any = 0;
        MPI_Allreduce(&failed, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
        failed = any;
        dt_finalize();
    }
    return failed ? 1 : 0;
}

int dt_test_main_gpu(int argc, char **argv, const char *suite, const dt_test_case *cases)
{
    dt_init_opts opts = DT_INIT_OPTS_INIT;
    opts.bind_cores = 0;
    dt_status st = dt_init(&argc, &argv, &opts);
    if (st != DT_OK) {
        fprintf(stderr, "harness: dt_init: %s: %s\n", dt_status_name(st), dt_last_error());
        return 1;
    }
    int mine = dt_num_local_devices(DT_DEVICE_GPU) > 0, all = 0;
    MPI_Allreduce(&mine, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    if (!all) {
        if (dt_client_id() == 0)
            fprintf(stderr, "%s: no GPU devices here (DT_GPU=%s), skipped\n", suite,
                    getenv("DT_GPU") ? getenv("DT_GPU") : "auto");
        dt_finalize();
        return 77;
    }
    if (dt_client_id() == 0)
        printf("%s: GPU devices run on '%s', %d per process\n", suite,
               dt_device_kind_name(DT_DEVICE_GPU), dt_num_local_devices(DT_DEVICE_GPU));
    int failed = run_suite(suite, cases, dt_client_id()), any = 0;
    MPI_Allreduce(&failed, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    dt_finalize();
    return any ? 1 : 0;
}

void dt_test_scratch_dir(char *buf, size_t len)
{
    char path[256] = "";
    if (dt_client_id() == 0) {
        const char *t = getenv("TMPDIR");
        snprintf(path, sizeof path, "%s/dtest-XXXXXX", t && *t ? t : "/tmp");
        if (!mkdtemp(path))
            path[0] = '\0';
    }
    MPI_Bcast(path, sizeof path, MPI_CHAR, 0, MPI_COMM_WORLD);
    CU_ASSERT_FATAL(path[0] != '\0');
    snprintf(buf, len, "%s", path);
}

static void remove_tree(const char *path)
{
    DIR *d = opendir(path);
    if (!d) {
        unlink(path);
        return;
    }
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
            continue;
        char sub[1024];
        snprintf(sub, sizeof sub, "%s/%s", path, e->d_name);
        remove_tree(sub);
    }
    closedir(d);
    rmdir(path);
}

void dt_test_scratch_remove(const char *dir)
{
    MPI_Barrier(MPI_COMM_WORLD);
    if (dt_client_id() == 0)
        remove_tree(dir);
    MPI_Barrier(MPI_COMM_WORLD);
}

dt_layout *dt_test_layout(const dt_mesh *mesh, int rank, const char *s0, const char *s1,
                          const char *partial)
{
    const char *specs[2] = {s0 ? s0 : DT_UNSHARDED, s1 ? s1 : DT_UNSHARDED};
    dt_reduce_op op = DT_REDUCE_SUM;
    dt_layout *l = NULL;
    CU_ASSERT_FATAL(rank >= 0 && rank <= 2);
    DT_ASSERT_OK(dt_layout_create_partial(mesh, rank, specs, partial ? 1 : 0, &partial, &op,
                                          &l));
    return l;
}

void dt_test_round(float *x, int64_t n, dt_dtype dtype)
{
    if (dtype == DT_DTYPE_F32 || n <= 0)
        return;
    void *tmp = malloc((size_t)n * dt_dtype_size(dtype));
    CU_ASSERT_FATAL(tmp != NULL);
    DT_ASSERT_OK(dt_kernel_cast(n, x, DT_DTYPE_F32, tmp, dtype));
    DT_ASSERT_OK(dt_kernel_cast(n, tmp, dtype, x, DT_DTYPE_F32));
    free(tmp);
}

int64_t dt_test_global_index(int rank, const int64_t *shape, const int64_t *off,
                             const int64_t *len, int64_t k)
{
    int64_t g = 0, stride = 1;
    for (int d = rank - 1; d >= 0; d--) {
        g += (off[d] + k % len[d]) * stride;
        k /= len[d];
        stride *= shape[d];
    }
    return g;
}

dt_device_type dt_test_device_type(void)
{
    const char *d = getenv("DT_TEST_DEVICE");
    return d && !strcasecmp(d, "gpu") ? DT_DEVICE_GPU : DT_DEVICE_CPU;
}

int dt_test_num_devices(void)
{
    return dt_num_global_devices(dt_test_device_type());
}

int dt_test_num_local_devices(void)
{
    return dt_num_local_devices(dt_test_device_type());
}

int dt_test_main_device(int argc, char **argv, const char *suite, const dt_test_case *cases)
{
    if (dt_test_device_type() == DT_DEVICE_GPU)
        return dt_test_main_gpu(argc, argv, suite, cases);
    return dt_test_main(argc, argv, suite, cases, 1);
}

size_t dt_test_local_bytes(const dt_tensor *t, int i)
{
    const DLTensor *dl = dt_tensor_local(t, i);
    CU_ASSERT_FATAL(dl != NULL);
    size_t n = dt_dtype_size(dt_tensor_dtype(t));
    for (int d = 0; d < dl->ndim; d++)
        n *= (size_t)dl->shape[d];
    return n;
}

void *dt_test_local_get(const dt_tensor *t, int i)
{
    size_t bytes = dt_test_local_bytes(t, i);
    void *buf = malloc(bytes + 1);
    CU_ASSERT_FATAL(buf != NULL);
    DT_ASSERT_OK(dt_tensor_local_read(t, i, buf, bytes));
    return buf;
}

void dt_test_local_set(dt_tensor *t, int i, const void *src)
{
    DT_ASSERT_OK(dt_tensor_local_write(t, i, src, dt_test_local_bytes(t, i)));
}

dt_status dt_test_pack_host(const dt_layout *layout, dt_dtype dtype, const int64_t *shape,
                            const void *const *bufs, dt_tensor **out)
{
    dt_tensor *t = NULL;
    dt_status st = dt_tensor_zeros(layout, dtype, shape, &t);
    for (int i = 0; st == DT_OK && i < dt_tensor_num_local(t); i++)
        st = dt_tensor_local_write(t, i, bufs[i], dt_test_local_bytes(t, i));
    if (st != DT_OK) {
        dt_tensor_destroy(t);
        return st;
    }
    *out = t;
    return DT_OK;
}
