/* data/ on a GPU mesh: batches copied to the GPUs by the prefetch thread (or in
 * dt_dataset_next without prefetch) equal the same dataset's batches on a CPU mesh of the
 * same shape. Runs on CUDA GPUs or the simulated
 * accelerator (DT_GPU=sim); exits 77 (skip) without GPU devices. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

/* Example i: 4 floats i * 4 + j, and the label i % 10. */
static dt_status fill(void *arg, int64_t i, void *const *f)
{
    for (int j = 0; j < 4; j++)
        ((float *)f[0])[j] = (float)(i * 4 + j);
    *(int32_t *)f[1] = (int32_t)(i % 10);
    return DT_OK;
}

/* The global value of a batch, read from a replicated copy on the host mesh. */
static void *host_value(const dt_tensor *t, dt_mesh *host)
{
    dt_layout *rep = NULL;
    DT_ASSERT_OK(dt_layout_replicated(host, dt_tensor_rank(t), &rep));
    dt_tensor *h = NULL;
    DT_ASSERT_OK(dt_copy_to_mesh(t, rep, &h));
    size_t bytes = (size_t)dt_tensor_numel(t) * dt_dtype_size(dt_tensor_dtype(t));
    void *out = malloc(bytes + 1);
    CU_ASSERT_PTR_NOT_NULL_FATAL(out);
    memcpy(out, dt_tensor_local(h, 0)->data, bytes);
    dt_tensor_destroy(h);
    dt_layout_destroy(rep);
    return out;
}

/* Every batch of 2 epochs (the last partial one kept) on the GPU mesh equals the CPU mesh's,
 * element for element, with the batch prepared in dt_dataset_next (prefetch 0) or copied to
 * the devices by the prefetch thread (1 and 3 ahead); the GPU batches live in device memory
 * (kDLCUDA) on each component's own GPU. */
static void test_gpu_batches_equal_cpu_batches(void)
{
    int n = dt_num_global_devices(DT_DEVICE_GPU);
    const char *dim = "batch";
    int64_t size = n;
    dt_mesh *gpu = NULL, *cpu = NULL;
    DT_ASSERT_OK(dt_mesh_create("g", 1, &dim, &size, DT_DEVICE_GPU, &gpu));
    DT_ASSERT_OK(dt_mesh_host_mesh(gpu, &cpu));
    dt_data_field f[2] = {{DT_DTYPE_F32, 1, {4}}, {DT_DTYPE_I32, 0, {0}}};
    dt_data_source *src = NULL;
    DT_ASSERT_OK(dt_data_source_callback(37, 2, f, fill, NULL, &src));
    dt_layout *lg[2] = {dt_test_layout(gpu, 2, "batch", NULL, NULL),
                        dt_test_layout(gpu, 1, "batch", NULL, NULL)};
    dt_layout *lc[2] = {dt_test_layout(cpu, 2, "batch", NULL, NULL),
                        dt_test_layout(cpu, 1, "batch", NULL, NULL)};
    static const int prefetch[] = {0, 1, 3};
    for (size_t p = 0; p < sizeof prefetch / sizeof prefetch[0]; p++) {
        dt_dataset_opts o = DT_DATASET_OPTS_INIT;
        o.global_batch = 2 * n + 1;
        o.seed = 11;
        o.drop_remainder = 0;
        o.epochs = 2;
        o.prefetch = prefetch[p];
        dt_dataset *dg = NULL, *dc = NULL;
        DT_ASSERT_OK(dt_dataset_create(src, 2, (const dt_layout *const *)lg, &o, &dg));
        DT_ASSERT_OK(dt_dataset_create(src, 2, (const dt_layout *const *)lc, &o, &dc));
        int batches = 0;
        for (;;) {
            dt_tensor *tg[2] = {NULL}, *tc[2] = {NULL};
            dt_data_batch_info ig, ic;
            DT_ASSERT_OK(dt_dataset_next(dg, 2, tg, &ig));
            DT_ASSERT_OK(dt_dataset_next(dc, 2, tc, &ic));
            CU_ASSERT_EQUAL_FATAL(ig.end, ic.end);
            if (ig.end)
                break;
            batches++;
            CU_ASSERT_EQUAL(ig.rows, ic.rows);
            for (int k = 0; k < 2; k++) {
                for (int i = 0; i < dt_tensor_num_local(tg[k]); i++) {
                    const DLTensor *x = dt_tensor_local(tg[k], i);
                    CU_ASSERT_EQUAL(x->device.device_type, kDLCUDA);
                }
                CU_ASSERT_EQUAL(dt_tensor_numel(tg[k]), dt_tensor_numel(tc[k]));
                void *vg = host_value(tg[k], cpu), *vc = host_value(tc[k], cpu);
                CU_ASSERT_EQUAL(memcmp(vg, vc, (size_t)dt_tensor_numel(tc[k]) * 4), 0);
                free(vg);
                free(vc);
                dt_tensor_destroy(tg[k]);
                dt_tensor_destroy(tc[k]);
            }
        }
        /* 37 examples in batches of 2n + 1, the partial one kept, twice. */
        CU_ASSERT_EQUAL(batches, 2 * ((37 + 2 * n) / (2 * n + 1)));
        dt_dataset_destroy(dg);
        dt_dataset_destroy(dc);
    }
    for (int k = 0; k < 2; k++) {
        dt_layout_destroy(lg[k]);
        dt_layout_destroy(lc[k]);
    }
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
