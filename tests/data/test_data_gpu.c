/* data/ on a GPU mesh: batches staged on the host mesh and copied to the GPUs equal the same
 * dataset's batches on a CPU mesh of the same shape. Runs on CUDA GPUs or the simulated
 * accelerator (DT_GPU=sim); exits 77 (skip) without GPU devices. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

/* Example i: 4 floats i * 4 + j. */
static dt_status fill(void *arg, int64_t i, void *const *f)
{
    for (int j = 0; j < 4; j++)
        ((float *)f[0])[j] = (float)(i * 4 + j);
    return DT_OK;
}

/* The global value of a batch, read from a replicated copy on the host mesh. */
static float *host_value(const dt_tensor *t, dt_mesh *host)
{
    dt_layout *rep = NULL;
    DT_ASSERT_OK(dt_layout_replicated(host, 2, &rep));
    dt_tensor *h = NULL;
    DT_ASSERT_OK(dt_copy_to_mesh(t, rep, &h));
    size_t bytes = (size_t)dt_tensor_numel(t) * sizeof(float);
    float *out = malloc(bytes);
    CU_ASSERT_PTR_NOT_NULL_FATAL(out);
    memcpy(out, dt_tensor_local(h, 0)->data, bytes);
    dt_tensor_destroy(h);
    dt_layout_destroy(rep);
    return out;
}

static void test_gpu_batches_equal_cpu_batches(void)
{
    int n = dt_num_global_devices(DT_DEVICE_GPU);
    const char *dim = "batch";
    int64_t size = n;
    dt_mesh *gpu = NULL, *cpu = NULL;
    DT_ASSERT_OK(dt_mesh_create("g", 1, &dim, &size, DT_DEVICE_GPU, &gpu));
    DT_ASSERT_OK(dt_mesh_host_mesh(gpu, &cpu));
    dt_data_field f = {DT_DTYPE_F32, 1, {4}};
    dt_data_source *src = NULL;
    DT_ASSERT_OK(dt_data_source_callback(37, 1, &f, fill, NULL, &src));
    dt_layout *lg = dt_test_layout(gpu, 2, "batch", NULL, NULL);
    dt_layout *lc = dt_test_layout(cpu, 2, "batch", NULL, NULL);
    dt_dataset_opts o = DT_DATASET_OPTS_INIT;
    o.global_batch = 2 * n + 1;
    o.seed = 11;
    dt_dataset *dg = NULL, *dc = NULL;
    DT_ASSERT_OK(dt_dataset_create(src, 1, (const dt_layout *const *)&lg, &o, &dg));
    DT_ASSERT_OK(dt_dataset_create(src, 1, (const dt_layout *const *)&lc, &o, &dc));
    for (int b = 0; b < 12; b++) {
        dt_tensor *tg = NULL, *tc = NULL;
        DT_ASSERT_OK(dt_dataset_next(dg, 1, &tg, NULL));
        DT_ASSERT_OK(dt_dataset_next(dc, 1, &tc, NULL));
        CU_ASSERT_EQUAL(dt_tensor_local(tg, 0)->device.device_type, kDLCUDA);
        float *vg = host_value(tg, cpu), *vc = host_value(tc, cpu);
        CU_ASSERT_EQUAL(memcmp(vg, vc, (size_t)dt_tensor_numel(tc) * sizeof(float)), 0);
        free(vg);
        free(vc);
        dt_tensor_destroy(tg);
        dt_tensor_destroy(tc);
    }
    dt_dataset_destroy(dg);
    dt_dataset_destroy(dc);
    dt_layout_destroy(lg);
    dt_layout_destroy(lc);
    dt_data_source_destroy(src);
    dt_mesh_destroy(gpu);
    dt_mesh_destroy(cpu);
}

int main(int argc, char **argv)
{
    static const dt_test_case cases[] = {
        DT_TEST(test_gpu_batches_equal_cpu_batches),
        DT_TEST_END,
    };
    return dt_test_main_gpu(argc, argv, "data_gpu", cases);
}
