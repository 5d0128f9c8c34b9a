/* Shard math of layouts: every position of 1-D, 2-D and 3-D meshes under every layout of
 * rank 0..3, uneven and tiny shapes, checked against a brute-force reference. */
#include <stdlib.h>
#include <string.h>

#include "harness.h"

/* ---- an independent reference ---------------------------------------------------------- */

/* Deals n elements round-robin to k shards, then assigns element indices to shards by
 * walking the cumulative counts; the box of shard j is its first owned index and count. An
 * empty shard starts where the elements of the earlier shards end. */
static void ref_range(int64_t n, int64_t k, int64_t j, int64_t *off, int64_t *size)
{
    int64_t count[64] = {0};
    int64_t owner[64];
    CU_ASSERT_FATAL(k <= 64 && n <= 64);
    for (int64_t e = 0; e < n; e++)
        count[e % k]++;
    int64_t s = 0, cum = count[0];
    for (int64_t e = 0; e < n; e++) {
        while (e >= cum)
            cum += count[++s];
        owner[e] = s;
    }
    int64_t first = -1, cnt = 0;
    for (int64_t e = 0; e < n; e++) {
        if (owner[e] == j) {
            if (first < 0)
                first = e;
            cnt++;
        }
    }
    if (first < 0) {
        first = 0;
        for (int64_t i = 0; i < j; i++)
            first += count[i];
    }
    *off = first;
    *size = cnt;
}

/* Row-major coordinates of a position, computed here rather than asked of the mesh. */
static void ref_coords(int mrank, const int64_t *msize, int64_t p, int64_t *coord)
{
    for (int d = mrank - 1; d >= 0; d--) {
        coord[d] = p % msize[d];
        p /= msize[d];
    }
}

/* ---- helpers ------------------------------------------------------------------------- */

static const char *const dim_names[] = {"x", "y", "z"};

static dt_mesh *make_mesh(int mrank, const int64_t *sizes)
{
    dt_mesh *m = NULL;
    DT_ASSERT_OK(dt_mesh_create(NULL, mrank, dim_names, sizes, DT_DEVICE_CPU, &m));
    return m;
}

/* Checks one layout over one shape against the reference at every position. */
static void check_layout(const dt_layout *l, int mrank, const int64_t *msize,
                         const int *spec_dim, const int64_t *shape)
{
    int rank = dt_layout_rank(l);
    int64_t size = 1, nblocks = 1, numel = 1;
    for (int d = 0; d < mrank; d++)
        size *= msize[d];
    for (int i = 0; i < rank; i++) {
        int64_t k = spec_dim[i] < 0 ? 1 : msize[spec_dim[i]];
        CU_ASSERT_EQUAL(dt_layout_num_shards(l, i), k);
        nblocks *= k;
        numel *= shape[i];
    }
    int64_t replication = size / nblocks;
    int64_t *cover = calloc((size_t)(numel ? numel : 1), sizeof *cover);
    int64_t(*boxes)[2][DT_MAX_RANK] = calloc((size_t)nblocks, sizeof *boxes);
    int *seen = calloc((size_t)nblocks, sizeof *seen);
    CU_ASSERT_FATAL(cover && boxes && seen);

    for (int64_t p = 0; p < size; p++) {
        int64_t coord[8], mcoord[8], off[DT_MAX_RANK], shp[DT_MAX_RANK];
        ref_coords(mrank, msize, p, coord);
        DT_ASSERT_OK(dt_mesh_coords(dt_layout_mesh(l), p, mcoord));
        CU_ASSERT_EQUAL(memcmp(coord, mcoord, (size_t)mrank * sizeof *coord), 0);

        /* Box of this position from the reference. */
        int64_t want_off[DT_MAX_RANK], want_shp[DT_MAX_RANK], block = 0;
        for (int i = 0; i < rank; i++) {
            int64_t k = spec_dim[i] < 0 ? 1 : msize[spec_dim[i]];
            int64_t j = spec_dim[i] < 0 ? 0 : coord[spec_dim[i]];
            ref_range(shape[i], k, j, &want_off[i], &want_shp[i]);
            block = block * k + j;
        }
        DT_ASSERT_OK(dt_layout_shard(l, shape, p, off, shp));
        for (int i = 0; i < rank; i++) {
            CU_ASSERT_EQUAL(off[i], want_off[i]);
            CU_ASSERT_EQUAL(shp[i], want_shp[i]);
        }
        CU_ASSERT_EQUAL(dt_layout_block_index(l, p), block);

        /* Positions of one block hold the same box. */
        if (seen[block]) {
            CU_ASSERT_EQUAL(memcmp(boxes[block][0], off, (size_t)rank * sizeof *off), 0);
            CU_ASSERT_EQUAL(memcmp(boxes[block][1], shp, (size_t)rank * sizeof *shp), 0);
        }
        seen[block] = 1;
        memcpy(boxes[block][0], off, (size_t)rank * sizeof *off);
        memcpy(boxes[block][1], shp, (size_t)rank * sizeof *shp);

        /* Count how many positions hold each element of the global tensor. */
        for (int64_t e = 0; e < numel; e++) {
            int64_t rem = e, inside = 1;
            for (int i = rank - 1; i >= 0; i--) {
                int64_t c = rem % shape[i];
                rem /= shape[i];
                if (c < off[i] || c >= off[i] + shp[i])
                    inside = 0;
            }
            cover[e] += inside;
        }

        /* Replicas: every q agreeing with p on each mesh dim that shards a tensor dim. */
        int64_t want[64], nwant = 0, got[64], count = -1;
        for (int64_t q = 0; q < size; q++) {
            int64_t qc[8];
            int same = 1;
            ref_coords(mrank, msize, q, qc);
            for (int i = 0; i < rank; i++)
                if (spec_dim[i] >= 0 && qc[spec_dim[i]] != coord[spec_dim[i]])
                    same = 0;
            if (same)
                want[nwant++] = q;
        }
        DT_ASSERT_OK(dt_layout_replicas(l, p, 64, got, &count));
        CU_ASSERT_EQUAL(count, nwant);
        CU_ASSERT_EQUAL(count, replication);
        CU_ASSERT_EQUAL(memcmp(got, want, (size_t)nwant * sizeof *got), 0);
        /* A short output array gets the first entries and the full count. */
        int64_t first = -1;
        count = -1;
        DT_ASSERT_OK(dt_layout_replicas(l, p, 1, &first, &count));
        CU_ASSERT_EQUAL(first, want[0]);
        CU_ASSERT_EQUAL(count, nwant);
    }
    /* Every block appears, and the blocks tile the tensor once per replica. */
    for (int64_t b = 0; b < nblocks; b++)
        CU_ASSERT(seen[b]);
    for (int64_t e = 0; e < numel; e++)
        CU_ASSERT_EQUAL(cover[e], replication);
    free(cover);
    free(boxes);
    free(seen);
}

/* Runs check_layout for every layout of rank 0..3 on the mesh (each tensor dim unsharded or
 * on an unused mesh dim) over every shape drawn from `sizes`. */
static void check_all_layouts(int mrank, const int64_t *msize, const int64_t *sizes, int nsizes)
{
    dt_mesh *mesh = make_mesh(mrank, msize);
    int nlayouts = 0;
    for (int rank = 0; rank <= 3; rank++) {
        int choices = mrank + 1, total = 1;
        for (int i = 0; i < rank; i++)
            total *= choices;
        for (int c = 0; c < total; c++) {
            int spec_dim[3], used = 0, ok = 1, cc = c;
            const char *specs[3];
            for (int i = 0; i < rank; i++) {
                spec_dim[i] = cc % choices - 1;
                cc /= choices;
                if (spec_dim[i] >= 0) {
                    ok &= !(used & (1 << spec_dim[i]));
                    used |= 1 << spec_dim[i];
                }
                specs[i] = spec_dim[i] < 0 ? DT_UNSHARDED : dim_names[spec_dim[i]];
            }
            if (!ok)
                continue;
            dt_layout *l = NULL;
            DT_ASSERT_OK(dt_layout_create(mesh, rank, specs, &l));
            int nshapes = 1;
            for (int i = 0; i < rank; i++)
                nshapes *= nsizes;
            for (int s = 0; s < nshapes; s++) {
                int64_t shape[3];
                int ss = s;
                for (int i = 0; i < rank; i++) {
                    shape[i] = sizes[ss % nsizes];
                    ss /= nsizes;
                }
                check_layout(l, mrank, msize, spec_dim, shape);
            }
            dt_layout_destroy(l);
            nlayouts++;
        }
    }
    CU_ASSERT(nlayouts > 1);
    dt_mesh_destroy(mesh);
}

/* ---- tests ----------------------------------------------------------------------------- */

static void test_shard_range_matches_hand_worked_splits(void)
{
    /* {n, k, j, offset, size}, worked by hand from "first n % k shards get one more". */
    static const int64_t cases[][5] = {
        {7, 2, 0, 0, 4}, {7, 2, 1, 4, 3}, {5, 3, 0, 0, 2}, {5, 3, 1, 2, 2}, {5, 3, 2, 4, 1},
        {3, 3, 0, 0, 1}, {3, 3, 2, 2, 1}, {2, 3, 0, 0, 1}, {2, 3, 1, 1, 1}, {2, 3, 2, 2, 0},
        {0, 2, 0, 0, 0}, {0, 2, 1, 0, 0}, {1, 4, 3, 1, 0}, {10, 4, 1, 3, 3}, {10, 4, 3, 8, 2},
        {6, 1, 0, 0, 6},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int64_t off = -1, size = -1;
        dt_shard_range(cases[i][0], cases[i][1], cases[i][2], &off, &size);
        CU_ASSERT_EQUAL(off, cases[i][3]);
        CU_ASSERT_EQUAL(size, cases[i][4]);
    }
}

static void test_shard_range_matches_reference_for_all_small_splits(void)
{
    for (int64_t n = 0; n <= 20; n++)
        for (int64_t k = 1; k <= 9; k++)
            for (int64_t j = 0; j < k; j++) {
                int64_t off, size, roff, rsize;
                dt_shard_range(n, k, j, &off, &size);
                ref_range(n, k, j, &roff, &rsize);
                CU_ASSERT_EQUAL(off, roff);
                CU_ASSERT_EQUAL(size, rsize);
            }
}

static void test_shard_math_on_1d_mesh_every_position(void)
{
    const int64_t msize[] = {3};
    const int64_t sizes[] = {7, 5, 2, 0};
    check_all_layouts(1, msize, sizes, 4);
}

static void test_shard_math_on_2d_mesh_every_position(void)
{
    const int64_t msize[] = {2, 3};
    const int64_t sizes[] = {7, 5, 3, 1};
    check_all_layouts(2, msize, sizes, 4);
}

static void test_shard_math_on_3d_mesh_every_position(void)
{
    const int64_t msize[] = {2, 3, 2};
    const int64_t sizes[] = {7, 5, 2};
    check_all_layouts(3, msize, sizes, 3);
}

static void test_partial_dims_count_as_replicas_of_a_block(void)
{
    const int64_t msize[] = {2, 3, 2};
    dt_mesh *mesh = make_mesh(3, msize);
    const char *specs[] = {"z", DT_UNSHARDED};
    const char *pdims[] = {"x"};
    const dt_reduce_op ops[] = {DT_REDUCE_SUM};
    dt_layout *l = NULL;
    DT_ASSERT_OK(dt_layout_create_partial(mesh, 2, specs, 1, pdims, ops, &l));
    const int spec_dim[] = {2, -1};
    const int64_t shape[] = {5, 3};
    /* The partial mesh dim x shards nothing: the shards are as for z,unsharded. */
    check_layout(l, 3, msize, spec_dim, shape);
    dt_layout_destroy(l);
    dt_mesh_destroy(mesh);
}

static void test_layout_shard_rejects_negative_shape_and_bad_position(void)
{
    const int64_t msize[] = {2, 3};
    dt_mesh *mesh = make_mesh(2, msize);
    dt_layout *l = NULL;
    DT_ASSERT_OK(dt_layout_batch_sharded(mesh, "y", 2, 0, &l));
    int64_t off[2] = {-7, -7}, shp[2] = {-7, -7};

    const int64_t bad_shape[] = {4, -3};
    DT_ASSERT_FAILS(dt_layout_shard(l, bad_shape, 0, off, shp), DT_ERR_INVALID_ARGUMENT);
    DT_ASSERT_ERROR_MENTIONS("shape[1] = -3");
    const int64_t shape[] = {4, 3};
    DT_ASSERT_FAILS(dt_layout_shard(l, shape, 6, off, shp), DT_ERR_INVALID_ARGUMENT);
    DT_ASSERT_ERROR_MENTIONS("position 6");
    DT_ASSERT_FAILS(dt_layout_shard(l, shape, -1, off, shp), DT_ERR_INVALID_ARGUMENT);
    DT_ASSERT_ERROR_MENTIONS("position -1");
    /* Outputs untouched on failure. */
    CU_ASSERT_EQUAL(off[0], -7);
    CU_ASSERT_EQUAL(shp[1], -7);

    int64_t reps[6], count = -5;
    DT_ASSERT_FAILS(dt_layout_replicas(l, 6, 6, reps, &count), DT_ERR_INVALID_ARGUMENT);
    DT_ASSERT_ERROR_MENTIONS("position 6");
    CU_ASSERT_EQUAL(count, -5);
    CU_ASSERT_EQUAL(dt_layout_block_index(l, 6), -1);
    CU_ASSERT_EQUAL(dt_layout_block_index(l, -1), -1);
    CU_ASSERT_EQUAL(dt_layout_num_shards(l, 2), 0);
    dt_layout_destroy(l);
    dt_mesh_destroy(mesh);
}

static void test_rank0_layout_has_one_block_everywhere(void)
{
    const int64_t msize[] = {2, 2};
    dt_mesh *mesh = make_mesh(2, msize);
    dt_layout *l = NULL;
    DT_ASSERT_OK(dt_layout_replicated(mesh, 0, &l));
    for (int64_t p = 0; p < 4; p++) {
        int64_t reps[4], count = 0;
        CU_ASSERT_EQUAL(dt_layout_block_index(l, p), 0);
        DT_ASSERT_OK(dt_layout_shard(l, NULL, p, NULL, NULL));
        DT_ASSERT_OK(dt_layout_replicas(l, p, 4, reps, &count));
        CU_ASSERT_EQUAL(count, 4);
        for (int64_t q = 0; q < 4; q++)
            CU_ASSERT_EQUAL(reps[q], q);
    }
    dt_layout_destroy(l);
    dt_mesh_destroy(mesh);
}

int main(int argc, char **argv)
{
    static const dt_test_case cases[] = {
        DT_TEST(test_shard_range_matches_hand_worked_splits),
        DT_TEST(test_shard_range_matches_reference_for_all_small_splits),
        DT_TEST(test_shard_math_on_1d_mesh_every_position),
        DT_TEST(test_shard_math_on_2d_mesh_every_position),
        DT_TEST(test_shard_math_on_3d_mesh_every_position),
        DT_TEST(test_partial_dims_count_as_replicas_of_a_block),
        DT_TEST(test_layout_shard_rejects_negative_shape_and_bad_position),
        DT_TEST(test_rank0_layout_has_one_block_everywhere),
        DT_TEST_END,
    };
    return dt_test_main(argc, argv, "layout_shard", cases, 0);
}
