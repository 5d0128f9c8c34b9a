/* Tests of the llm.c token-shard source: the batch sequence of a hand-written shard, llm.c's
 * batches (the B*T+1 tokens from k*B*T) on every mesh against a reading of the file here, and
 * the header checks. Runs with 8 CPU devices in one process and under mpiexec. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

/* Writes an llm.c token file (client 0) between two barriers: header magic/version/count as
 * given, then the tokens. */
static void write_shard(const char *path, int32_t magic, int32_t version, int32_t count,
                        const uint16_t *tok, int64_t ntok)
{
    MPI_Barrier(MPI_COMM_WORLD);
    if (dt_client_id() == 0) {
        int32_t head[256] = {0};
        head[0] = magic;
        head[1] = version;
        head[2] = count;
        FILE *f = fopen(path, "wb");
        CU_ASSERT_FATAL(f != NULL);
        CU_ASSERT_EQUAL(fwrite(head, 4, 256, f), 256);
        CU_ASSERT_EQUAL(fwrite(tok, 2, (size_t)ntok, f), (size_t)ntok);
        fclose(f);
    }
    MPI_Barrier(MPI_COMM_WORLD);
}

static dt_dataset *llmc_dataset(dt_data_source *src, dt_layout *l[2], int64_t batch,
                                int prefetch)
{
    dt_dataset_opts o = DT_DATASET_OPTS_INIT;
    o.global_batch = batch;
    o.shuffle = 0;
    o.drop_remainder = 1;
    o.prefetch = prefetch;
    dt_dataset *ds = NULL;
    DT_ASSERT_OK(dt_dataset_create(src, 2, (const dt_layout *const *)l, &o, &ds));
    return ds;
}

/* The global value of t on every client (collective). */
static int32_t *gather(const dt_tensor *t)
{
    dt_layout *rep = NULL;
    DT_ASSERT_OK(dt_layout_replicated(dt_layout_mesh(dt_tensor_layout(t)), dt_tensor_rank(t),
                                      &rep));
    dt_tensor *all = NULL;
    DT_ASSERT_OK(dt_relayout(t, rep, &all));
    size_t bytes = (size_t)dt_tensor_numel(t) * sizeof(int32_t);
    int32_t *out = malloc(bytes);
    CU_ASSERT_PTR_NOT_NULL_FATAL(out);
    memcpy(out, dt_tensor_local(all, 0)->data, bytes);
    dt_tensor_destroy(all);
    dt_layout_destroy(rep);
    return out;
}

/* The next batch as host arrays (collective); returns info. */
static dt_data_batch_info next_batch(dt_dataset *ds, int32_t **in, int32_t **tg)
{
    dt_tensor *t[2] = {NULL, NULL};
    dt_data_batch_info info;
    DT_ASSERT_OK(dt_dataset_next(ds, 2, t, &info));
    *in = gather(t[0]);
    *tg = gather(t[1]);
    dt_tensor_destroy(t[0]);
    dt_tensor_destroy(t[1]);
    return info;
}

static void test_a_hand_written_shard_gives_llmc_batches_then_starts_again(void)
{
    char dir[512], path[600];
    dt_test_scratch_dir(dir, sizeof dir);
    snprintf(path, sizeof path, "%s/t.bin", dir);
    /* 11 tokens, B = 2, T = 2: (11 - 1) / 4 = 2 batches, tokens 8..10 never start one. */
    static const uint16_t tok[11] = {10, 11, 12, 13, 14, 15, 16, 17, 65535, 40000, 7};
    write_shard(path, 20240520, 1, 11, tok, 11);
    dt_data_source *src = NULL;
    DT_ASSERT_OK(dt_data_source_llmc(path, 2, &src));
    CU_ASSERT_EQUAL(dt_data_source_num_examples(src), 5);
    dt_mesh *m = NULL;
    /* Two rows over every device: most shards are empty. */
    DT_ASSERT_OK(dt_mesh_create("all", 1, (const char *[]){"batch"},
                                (int64_t[]){dt_num_global_devices(DT_DEVICE_CPU)},
                                DT_DEVICE_CPU, &m));
    dt_layout *l[2] = {dt_test_layout(m, 2, "batch", NULL, NULL),
                       dt_test_layout(m, 2, "batch", NULL, NULL)};
    dt_dataset *ds = llmc_dataset(src, l, 2, 0);
    CU_ASSERT_EQUAL(dt_dataset_batches_per_epoch(ds), 2);
    /* Batch 0: tokens 0..4; batch 1: tokens 4..8 (uint16 read unsigned); then batch 0 again. */
    static const int32_t want_in[3][4] = {{10, 11, 12, 13}, {14, 15, 16, 17}, {10, 11, 12, 13}};
    static const int32_t want_tg[3][4] = {{11, 12, 13, 14}, {15, 16, 17, 65535},
                                          {11, 12, 13, 14}};
    for (int b = 0; b < 3; b++) {
        int32_t *in, *tg;
        dt_data_batch_info info = next_batch(ds, &in, &tg);
        CU_ASSERT_EQUAL(info.epoch, b / 2);
        CU_ASSERT_EQUAL(info.batch, b % 2);
        CU_ASSERT_EQUAL(memcmp(in, want_in[b], sizeof want_in[b]), 0);
        CU_ASSERT_EQUAL(memcmp(tg, want_tg[b], sizeof want_tg[b]), 0);
        free(in);
        free(tg);
    }
    /* One example read on its own: example 3 is tokens 6..8. */
    int32_t x[2], y[2];
    DT_ASSERT_OK(dt_data_source_read(src, 3, (void *[]){x, y}));
    CU_ASSERT(x[0] == 16 && x[1] == 17 && y[0] == 17 && y[1] == 65535);
    dt_dataset_destroy(ds);
    dt_layout_destroy(l[0]);
    dt_layout_destroy(l[1]);
    dt_mesh_destroy(m);
    dt_data_source_destroy(src);
    dt_test_scratch_remove(dir);
}

static void test_batches_on_every_mesh_are_the_tokens_from_k_times_b_times_t(void)
{
    char dir[512], path[600];
    dt_test_scratch_dir(dir, sizeof dir);
    snprintf(path, sizeof path, "%s/t.bin", dir);
    enum { NTOK = 1000, T = 8 };
    uint16_t *tok = malloc(NTOK * sizeof *tok);
    CU_ASSERT_PTR_NOT_NULL_FATAL(tok);
    for (int i = 0; i < NTOK; i++)
        tok[i] = (uint16_t)((i * 40503u + 17u) & 0xffffu);
    write_shard(path, 20240520, 1, NTOK, tok, NTOK);
    int nd = dt_num_global_devices(DT_DEVICE_CPU);
    for (int two_d = 0; two_d < 2; two_d++) {
        if (two_d && nd % 2)
            continue;
        int64_t sizes[2] = {two_d ? nd / 2 : nd, two_d ? 2 : 1};
        dt_mesh *m = NULL;
        DT_ASSERT_OK(dt_mesh_create("m", 2, (const char *[]){"batch", "model"}, sizes,
                                    DT_DEVICE_CPU, &m));
        int64_t B = 2 * sizes[0] + 1; /* uneven over batch */
        dt_data_source *src = NULL;
        DT_ASSERT_OK(dt_data_source_llmc(path, T, &src));
        dt_layout *l[2] = {dt_test_layout(m, 2, "batch", NULL, NULL),
                           dt_test_layout(m, 2, "batch", NULL, NULL)};
        dt_dataset *ds = llmc_dataset(src, l, B, 2);
        int64_t nb = (NTOK - 1) / (B * T);
        CU_ASSERT_EQUAL(dt_dataset_batches_per_epoch(ds), nb);
        for (int64_t k = 0; k < nb + 2; k++) {
            int32_t *in, *tg;
            next_batch(ds, &in, &tg);
            int64_t base = (k % nb) * B * T;
            for (int64_t i = 0; i < B * T; i++) {
                CU_ASSERT_EQUAL_FATAL(in[i], tok[base + i]);
                CU_ASSERT_EQUAL_FATAL(tg[i], tok[base + i + 1]);
            }
            free(in);
            free(tg);
        }
        dt_dataset_destroy(ds);
        dt_layout_destroy(l[0]);
        dt_layout_destroy(l[1]);
        dt_data_source_destroy(src);
        dt_mesh_destroy(m);
    }
    free(tok);
    dt_test_scratch_remove(dir);
}

static void test_bad_magic_version_or_size_is_refused_with_the_file_named(void)
{
    char dir[512], path[600];
    dt_test_scratch_dir(dir, sizeof dir);
    snprintf(path, sizeof path, "%s/bad.bin", dir);
    uint16_t tok[20] = {0};
    dt_data_source *src = NULL;
    write_shard(path, 20240522, 1, 20, tok, 20);
    DT_ASSERT_FAILS(dt_data_source_llmc(path, 4, &src), DT_ERR_CORRUPT);
    DT_ASSERT_ERROR_MENTIONS("not an llm.c token file");
    write_shard(path, 20240520, 2, 20, tok, 20);
    DT_ASSERT_FAILS(dt_data_source_llmc(path, 4, &src), DT_ERR_CORRUPT);
    DT_ASSERT_ERROR_MENTIONS("version 2");
    write_shard(path, 20240520, 1, 21, tok, 20);
    DT_ASSERT_FAILS(dt_data_source_llmc(path, 4, &src), DT_ERR_CORRUPT);
    DT_ASSERT_ERROR_MENTIONS("bad.bin: the header says 21 tokens");
    write_shard(path, 20240520, 1, 4, tok, 4);
    DT_ASSERT_FAILS(dt_data_source_llmc(path, 4, &src), DT_ERR_INVALID_ARGUMENT);
    int64_t n = 0;
    DT_ASSERT_OK(dt_data_llmc_tokens(path, &n));
    CU_ASSERT_EQUAL(n, 4);
    CU_ASSERT_PTR_NULL(src);
    dt_test_scratch_remove(dir);
}

int main(int argc, char **argv)
{
    static const dt_test_case cases[] = {
        DT_TEST(test_a_hand_written_shard_gives_llmc_batches_then_starts_again),
        DT_TEST(test_batches_on_every_mesh_are_the_tokens_from_k_times_b_times_t),
        DT_TEST(test_bad_magic_version_or_size_is_refused_with_the_file_named),
        DT_TEST_END,
    };
    return dt_test_main(argc, argv, "data_llmc", cases, 1);
}
