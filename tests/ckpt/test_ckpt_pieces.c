/* Tensors saved as explicitly placed pieces (dt_save_opts.pieces) beside layouted tensors:
 * 1-D and 2-D pieces, several per device (of one tensor too), uneven and empty ones, f32,
 * bf16 and i64; restored through dt_restore and dt_restore_into with several layouts and
 * read back with dt_ckpt_read_box over arbitrary boxes, compared bit for bit with the
 * reference computed here. Invalid tilings fail on every client and leave the previous
 * checkpoint; a corrupted piece is caught by dt_ckpt_read_box. */
#include <inttypes.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ck_test_util.h"
#include "harness.h"

typedef struct ptensor {
    const char *name;
    dt_dtype dtype;
    int rank;
    int64_t shape[2];
    uint64_t seed;
} ptensor;

/* The tensors given as pieces; how each is cut is in build_pieces. */
static const ptensor PT[] = {
    {"zero/m", DT_DTYPE_F32, 1, {103, 0}, 101},  /* flat ranges, one empty, one split */
    {"zero/v.w", DT_DTYPE_BF16, 2, {9, 7}, 102}, /* flat ranges cut into row boxes */
    {"zero/step", DT_DTYPE_I64, 2, {5, 6}, 103}, /* a 2-D grid of uneven blocks */
    {"zero/scalar", DT_DTYPE_F32, 0, {0, 0}, 104}, {"zero/empty", DT_DTYPE_F32, 2, {0, 4}, 105},
    {"zero/big", DT_DTYPE_F32, 1, {5000, 0}, 106}, /* several 4 KiB chunks per piece */
};
enum { NPT = sizeof PT / sizeof PT[0], MAXP = 256 };

/* Tensors with layouts saved beside them (on the 2-D save mesh). */
static const char *const LNAMES[2] = {"w", "b"};
static const dt_dtype LDTYPES[2] = {DT_DTYPE_F32, DT_DTYPE_I64};
static const int LRANKS[2] = {2, 1};
static const int64_t LSHAPES[2][2] = {{10, 6}, {7, 0}};
static const char *const LSPECS[2] = {"a,b", "unsharded"};
static const uint64_t LSEEDS[2] = {1, 2};

typedef struct gpiece {
    int tensor; /* index into PT */
    int64_t position;
    dt_dtype dtype; /* normally PT's; changed by the invalid cases */
    int64_t shape[2];
    int64_t off[2], size[2];
} gpiece;

static int64_t ndev(void)
{
    return dt_num_global_devices(DT_DEVICE_CPU);
}

static dt_mesh *save_mesh(void)
{
    int64_t sizes[2] = {2, ndev() / 2};
    return ck_mesh(2, sizes);
}

static void add(gpiece *g, int *n, int t, int64_t pos, const int64_t *off, const int64_t *size)
{
    CU_ASSERT_FATAL(*n < MAXP);
    gpiece *p = &g[(*n)++];
    memset(p, 0, sizeof *p);
    p->tensor = t;
    p->position = pos;
    p->dtype = PT[t].dtype;
    for (int d = 0; d < PT[t].rank; d++) {
        p->shape[d] = PT[t].shape[d];
        p->off[d] = off[d];
        p->size[d] = size[d];
    }
}

/* The flat range [lo, hi) of a [rows, cols] tensor as at most three row boxes. */
static void add_flat_range(gpiece *g, int *n, int t, int64_t pos, int64_t lo, int64_t hi)
{
    int64_t cols = PT[t].shape[1];
    while (lo < hi) {
        int64_t r = lo / cols, c = lo % cols, off[2] = {r, c}, size[2];
        if (c != 0 || hi - lo < cols) { /* a partial row */
            size[0] = 1;
            size[1] = (hi - lo < cols - c) ? hi - lo : cols - c;
        } else { /* full rows */
            size[0] = (hi - lo) / cols;
            size[1] = cols;
        }
        add(g, n, t, pos, off, size);
        lo += size[0] * size[1];
    }
}

/* Every client's pieces (the same list everywhere); returns the count. */
static int build_pieces(gpiece *g)
{
    int n = 0;
    int64_t N = ndev();
    /* zero/m: device r holds [c_r, c_{r+1}), c quadratic; device 0 empty, the last split. */
    for (int64_t r = 0; r < N; r++) {
        int64_t lo = r < 2 ? 0 : 103 * r * r / (N * N);
        int64_t hi = r + 1 < 2 ? 0 : r + 1 == N ? 103 : 103 * (r + 1) * (r + 1) / (N * N);
        if (r == N - 1) {
            int64_t mid = (lo + hi) / 2, s1 = mid - lo, s2 = hi - mid;
            add(g, &n, 0, r, &lo, &s1);
            add(g, &n, 0, r, &mid, &s2);
        } else {
            int64_t s = hi - lo;
            add(g, &n, 0, r, &lo, &s);
        }
    }
    /* zero/v.w: uneven flat ranges of its 63 elements, each as row boxes. */
    for (int64_t r = 0; r < N; r++) {
        int64_t lo = r == 0 ? 0 : 63 * r / N + (r % 2) * 3;
        int64_t hi = r + 1 == N ? 63 : 63 * (r + 1) / N + ((r + 1) % 2) * 3;
        add_flat_range(g, &n, 1, r, lo, hi);
    }
    /* zero/step: row cuts {0,2,5} x column cuts {0,1,4,6}, block k on device 3k mod N. */
    static const int64_t rc[3] = {0, 2, 5}, cc[4] = {0, 1, 4, 6};
    for (int i = 0, k = 0; i < 2; i++)
        for (int j = 0; j < 3; j++, k++) {
            int64_t off[2] = {rc[i], cc[j]}, size[2] = {rc[i + 1] - rc[i], cc[j + 1] - cc[j]};
            add(g, &n, 2, (3 * k) % N, off, size);
        }
    int64_t none[2] = {0, 0}, empty[2] = {0, 4};
    add(g, &n, 3, N - 1, none, none);
    add(g, &n, 4, 0, none, empty);
    /* zero/big: device r holds [c_r, c_{r+1}), c_r = 5000 r (r+1) / (N (N+1)). */
    for (int64_t r = 0; r < N; r++) {
        int64_t lo = 5000 * r * (r + 1) / (N * (N + 1));
        int64_t hi = 5000 * (r + 1) * (r + 2) / (N * (N + 1)), s = hi - lo;
        add(g, &n, 5, r, &lo, &s);
    }
    return n;
}

static int64_t box_numel(int rank, const int64_t *size)
{
    int64_t n = 1;
    for (int d = 0; d < rank; d++)
        n *= size[d];
    return n;
}

/* The reference values of box (off, size) of a tensor, compact row-major, into dst. */
static void ref_box(uint64_t seed, dt_dtype dtype, int rank, const int64_t *shape,
                    const int64_t *off, const int64_t *size, unsigned char *dst)
{
    size_t elem = dt_dtype_size(dtype);
    int64_t n = box_numel(rank, size);
    for (int64_t k = 0; k < n; k++) {
        int64_t g = dt_test_global_index(rank, shape, off, size, k);
        for (size_t b = 0; b < elem; b++)
            dst[(size_t)k * elem + b] = ck_ref_byte(seed, (uint64_t)g * elem + b);
    }
}

/* Local index in `mesh` of the device at `position`, or -1 when another client holds it. */
static int local_index(const dt_mesh *mesh, int64_t position)
{
    int id = dt_mesh_device_id(mesh, position);
    for (int i = 0; i < dt_mesh_num_local_devices(mesh); i++)
        if (dt_mesh_local_device_id(mesh, i) == id)
            return i;
    return -1;
}

/* This client's pieces of the global list, with their data. */
typedef struct local_set {
    int n;
    dt_ckpt_piece p[MAXP];
    void *data[MAXP];
    const gpiece *src[MAXP];
} local_set;

static void make_local(const dt_mesh *mesh, const gpiece *g, int ng, local_set *ls)
{
    memset(ls, 0, sizeof *ls);
    for (int i = 0; i < ng; i++) {
        int li = local_index(mesh, g[i].position);
        if (li < 0)
            continue;
        const ptensor *t = &PT[g[i].tensor];
        int64_t n = box_numel(t->rank, g[i].size);
        unsigned char *buf = malloc((size_t)n * 8 + 1);
        CU_ASSERT_FATAL(buf != NULL);
        ref_box(t->seed, t->dtype, t->rank, t->shape, g[i].off, g[i].size, buf);
        ls->src[ls->n] = &g[i];
        ls->data[ls->n] = buf;
        ls->p[ls->n] = (dt_ckpt_piece){.name = t->name,
                                       .dtype = g[i].dtype,
                                       .rank = t->rank,
                                       .shape = g[i].shape,
                                       .offsets = g[i].off,
                                       .sizes = g[i].size,
                                       .device = li,
                                       .data = buf};
        ls->n++;
    }
}

static void free_local(local_set *ls)
{
    for (int i = 0; i < ls->n; i++)
        free(ls->data[i]);
}

/* dt_save of the layouted tensors (nl of them) and the pieces g; returns the status. */
static dt_status save_with(const char *dir, int nl, const gpiece *g, int ng,
                           const char *const *lnames, uint64_t chunk_bytes)
{
    dt_mesh *m = save_mesh();
    dt_tensor *t[2] = {NULL, NULL};
    for (int i = 0; i < nl; i++) {
        dt_layout *l = ck_layout(m, LSPECS[i]);
        t[i] = ck_make(l, LDTYPES[i], LSHAPES[i], LSEEDS[i]);
        dt_layout_destroy(l);
    }
    local_set ls;
    make_local(m, g, ng, &ls);
    dt_save_opts o = DT_SAVE_OPTS_INIT;
    o.fsync = 0;
    o.chunk_bytes = chunk_bytes;
    o.npieces = ls.n;
    o.pieces = ls.p;
    dt_status st = dt_save(m, dir, nl, lnames, (const dt_tensor *const *)t, &o);
    free_local(&ls);
    for (int i = 0; i < nl; i++)
        dt_tensor_destroy(t[i]);
    dt_mesh_destroy(m);
    return st;
}

static void save_mix(const char *dir)
{
    gpiece g[MAXP];
    int ng = build_pieces(g);
    DT_ASSERT_OK(save_with(dir, 2, g, ng, LNAMES, 4096));
}

/* Restores every tensor onto `mesh` with specs chosen by `variant` and checks the values. */
static void restore_check(const char *dir, const dt_mesh *mesh, int variant)
{
    enum { NA = NPT + 2 };
    const char *names[NA];
    int ranks[NA];
    uint64_t seeds[NA];
    for (int i = 0; i < NPT; i++) {
        names[i] = PT[i].name;
        ranks[i] = PT[i].rank;
        seeds[i] = PT[i].seed;
    }
    for (int i = 0; i < 2; i++) {
        names[NPT + i] = LNAMES[i];
        ranks[NPT + i] = LRANKS[i];
        seeds[NPT + i] = LSEEDS[i];
    }
    const char *dim0 = dt_mesh_dim_name(mesh, 0);
    const char *dim1 = dt_mesh_rank(mesh) > 1 ? dt_mesh_dim_name(mesh, 1) : DT_UNSHARDED;
    dt_layout *l[NA];
    dt_tensor *out[NA];
    for (int i = 0; i < NA; i++) {
        const char *specs[2] = {DT_UNSHARDED, DT_UNSHARDED};
        if (variant == 0 && ranks[i] >= 1)
            specs[0] = dim0;
        if (variant == 0 && ranks[i] == 2)
            specs[1] = dim1;
        if (variant == 1 && ranks[i] >= 1)
            specs[ranks[i] - 1] = dim0;
        DT_ASSERT_OK(dt_layout_create(mesh, ranks[i], specs, &l[i]));
    }
    DT_ASSERT_OK(dt_restore(mesh, dir, NA, names, (const dt_layout *const *)l, out));
    for (int i = 0; i < NA; i++) {
        int64_t bad = ck_mismatches(out[i], seeds[i]);
        if (bad)
            fprintf(stderr, "[rank %d] variant %d, mesh of %lld: '%s': %lld wrong\n",
                    dt_client_id(), variant, (long long)dt_mesh_size(mesh), names[i],
                    (long long)bad);
        CU_ASSERT_EQUAL(bad, 0);
        if (i < NPT) {
            CU_ASSERT_EQUAL(dt_tensor_dtype(out[i]), PT[i].dtype);
            CU_ASSERT_EQUAL(dt_tensor_rank(out[i]), PT[i].rank);
            for (int d = 0; d < PT[i].rank; d++)
                CU_ASSERT_EQUAL(dt_tensor_shape(out[i])[d], PT[i].shape[d]);
        }
        dt_tensor_destroy(out[i]);
        dt_layout_destroy(l[i]);
    }
}

static void test_pieces_restore_with_several_layouts_and_meshes(void)
{
    char dir[256], ck[300];
    ck_scratch(dir, sizeof dir, ck, sizeof ck);
    save_mix(ck);
    int64_t all[1] = {ndev()}, three[1] = {3}, grid[2] = {ndev() / 2, 2};
    dt_mesh *m1 = ck_mesh(1, all), *m3 = ck_mesh(1, three), *m2 = ck_mesh(2, grid);
    for (int v = 0; v < 3; v++) {
        restore_check(ck, m1, v);
        restore_check(ck, m2, v);
    }
    restore_check(ck, m3, 0);
    restore_check(ck, m3, 1);
    dt_mesh_destroy(m1);
    dt_mesh_destroy(m2);
    dt_mesh_destroy(m3);

    /* dt_restore_into existing tensors of another layout. */
    dt_mesh *sm = save_mesh();
    dt_layout *l2 = ck_layout(sm, "b,a"), *l1 = ck_layout(sm, "b");
    dt_tensor *tg[3] = {NULL, NULL, NULL};
    DT_ASSERT_OK(dt_tensor_zeros(l2, PT[1].dtype, PT[1].shape, &tg[0]));
    DT_ASSERT_OK(dt_tensor_zeros(l2, PT[2].dtype, PT[2].shape, &tg[1]));
    DT_ASSERT_OK(dt_tensor_zeros(l1, PT[5].dtype, PT[5].shape, &tg[2]));
    const char *nm[3] = {PT[1].name, PT[2].name, PT[5].name};
    DT_ASSERT_OK(dt_restore_into(ck, 3, nm, tg));
    CU_ASSERT_EQUAL(ck_mismatches(tg[0], PT[1].seed), 0);
    CU_ASSERT_EQUAL(ck_mismatches(tg[1], PT[2].seed), 0);
    CU_ASSERT_EQUAL(ck_mismatches(tg[2], PT[5].seed), 0);
    for (int i = 0; i < 3; i++)
        dt_tensor_destroy(tg[i]);
    dt_layout_destroy(l1);
    dt_layout_destroy(l2);
    dt_mesh_destroy(sm);
    dt_test_scratch_remove(dir);
}

/* The index: no layout, the saving mesh, one slice per non-empty piece, in the file of its
 * device, under the name or name#k when a file holds several slices of the tensor. */
static void test_pieces_in_the_index_and_their_keys(void)
{
    char dir[256], ck[300];
    ck_scratch(dir, sizeof dir, ck, sizeof ck);
    save_mix(ck);
    gpiece g[MAXP];
    int ng = build_pieces(g);
    dt_ckpt *c = NULL;
    DT_ASSERT_OK(dt_ckpt_open(ck, &c));
    CU_ASSERT_EQUAL(dt_ckpt_num_tensors(c), 2 + NPT);
    dt_mesh *m = save_mesh();
    /* Tensors of pieces follow the layouted ones in order of first appearance: client 0's
     * pieces first, each client's in the order it passed them. */
    int order[NPT], norder = 0;
    for (int cl = 0; cl < dt_num_clients(); cl++)
        for (int k = 0; k < ng; k++) {
            int seen = dt_device_client(DT_DEVICE_CPU, dt_mesh_device_id(m, g[k].position)) != cl;
            for (int j = 0; j < norder; j++)
                seen |= order[j] == g[k].tensor;
            if (!seen)
                order[norder++] = g[k].tensor;
        }
    CU_ASSERT_EQUAL_FATAL(norder, NPT);
    dt_ckpt_tensor_info wi;
    DT_ASSERT_OK(dt_ckpt_tensor(c, 0, &wi));
    for (int i = 0; i < NPT; i++) {
        int64_t t = -1;
        DT_ASSERT_OK(dt_ckpt_find(c, PT[i].name, &t));
        int pos = 0;
        while (order[pos] != i)
            pos++;
        CU_ASSERT_EQUAL(t, 2 + pos);
        dt_ckpt_tensor_info ti;
        DT_ASSERT_OK(dt_ckpt_tensor(c, t, &ti));
        CU_ASSERT_STRING_EQUAL(ti.layout, "");
        CU_ASSERT_STRING_EQUAL(ti.mesh, wi.mesh); /* the saving (host) mesh */
        CU_ASSERT_EQUAL(ti.dtype, PT[i].dtype);
        int64_t want = 0;
        for (int k = 0; k < ng; k++)
            want += g[k].tensor == i && box_numel(PT[i].rank, g[k].size) > 0;
        CU_ASSERT_EQUAL(ti.num_slices, want);
        int seen_key = 0;
        for (int64_t s = 0; s < ti.num_slices; s++) {
            dt_ckpt_slice_info si;
            DT_ASSERT_OK(dt_ckpt_slice(c, t, s, &si));
            /* The file was written by the device the piece named. */
            int found = 0;
            for (int k = 0; k < ng && !found; k++) {
                if (g[k].tensor != i)
                    continue;
                int same = 1;
                for (int d = 0; d < PT[i].rank; d++)
                    same &= g[k].off[d] == si.offsets[d] && g[k].size[d] == si.sizes[d];
                if (!same)
                    continue;
                for (int64_t f = 0; f < dt_ckpt_num_files(c); f++) {
                    dt_ckpt_file_info fi;
                    DT_ASSERT_OK(dt_ckpt_file(c, f, &fi));
                    if (!strcmp(fi.name, si.file))
                        found = fi.device_id == dt_mesh_device_id(m, g[k].position);
                }
            }
            CU_ASSERT(found);
            if (strcmp(si.key, PT[i].name) != 0) {
                char want_key[64];
                snprintf(want_key, sizeof want_key, "%s#", PT[i].name);
                CU_ASSERT_EQUAL(strncmp(si.key, want_key, strlen(want_key)), 0);
                seen_key = 1;
            }
        }
        if (i == 1) /* zero/v.w: some device holds two or three of its row boxes */
            CU_ASSERT(seen_key);
    }
    DT_ASSERT_OK(dt_ckpt_verify(c, NULL, NULL, NULL));
    dt_ckpt_close(c);

    /* Only pieces: exactly the devices with a non-empty piece write a file. */
    char only[320];
    snprintf(only, sizeof only, "%s/only", dir);
    gpiece h[MAXP];
    int nh = 0;
    for (int k = 0; k < ng; k++)
        if (g[k].tensor == 0 || g[k].tensor == 4)
            h[nh++] = g[k];
    DT_ASSERT_OK(save_with(only, 0, h, nh, NULL, 0));
    DT_ASSERT_OK(dt_ckpt_open(only, &c));
    int64_t nfiles = 0;
    for (int64_t p = 0; p < ndev(); p++) {
        int any = 0;
        for (int k = 0; k < nh; k++)
            any |= h[k].position == p && box_numel(PT[h[k].tensor].rank, h[k].size) > 0;
        nfiles += any;
    }
    CU_ASSERT_EQUAL(dt_ckpt_num_files(c), nfiles);
    CU_ASSERT_EQUAL(dt_ckpt_num_tensors(c), 2);
    dt_ckpt_close(c);
    dt_mesh_destroy(m);
    dt_test_scratch_remove(dir);
}

/* Reads box (off, size) of the saved tensor `name` and compares it with the reference. */
static void check_box(const dt_ckpt *c, const char *name, uint64_t seed, dt_dtype dtype, int rank,
                      const int64_t *shape, const int64_t *off, const int64_t *size)
{
    int64_t t = -1;
    DT_ASSERT_OK(dt_ckpt_find(c, name, &t));
    size_t bytes = (size_t)box_numel(rank, size) * dt_dtype_size(dtype);
    unsigned char *got = malloc(bytes + 1), *want = malloc(bytes + 1);
    CU_ASSERT_FATAL(got && want);
    memset(got, 0xAB, bytes);
    ref_box(seed, dtype, rank, shape, off, size, want);
    DT_ASSERT_OK(dt_ckpt_read_box(c, t, off, size, got, bytes));
    int same = memcmp(got, want, bytes) == 0;
    if (!same)
        fprintf(stderr, "[rank %d] read_box '%s' [%lld,%lld]+[%lld,%lld] differs\n", dt_client_id(),
                name, (long long)off[0], (long long)(rank > 1 ? off[1] : 0), (long long)size[0],
                (long long)(rank > 1 ? size[1] : 0));
    CU_ASSERT(same);
    free(got);
    free(want);
}

/* A tensor really called name#1 beside several pieces of `name` in one file: keys skip it. An
 * index whose key is not name or name#digits, or repeats a key in a file, is corrupt. */
static void test_piece_keys_avoid_names_and_bad_keys_are_corrupt(void)
{
    char dir[256], ck[300];
    ck_scratch(dir, sizeof dir, ck, sizeof ck);
    gpiece g[MAXP];
    int ng = build_pieces(g);
    const char *lnames[2] = {"zero/v.w#1", "b"};
    DT_ASSERT_OK(save_with(ck, 2, g, ng, lnames, 0));
    dt_ckpt *c = NULL;
    DT_ASSERT_OK(dt_ckpt_open(ck, &c));
    int64_t t = -1;
    DT_ASSERT_OK(dt_ckpt_find(c, "zero/v.w", &t));
    dt_ckpt_tensor_info ti;
    DT_ASSERT_OK(dt_ckpt_tensor(c, t, &ti));
    int renamed = 0;
    for (int64_t s = 0; s < ti.num_slices; s++) {
        dt_ckpt_slice_info si;
        DT_ASSERT_OK(dt_ckpt_slice(c, t, s, &si));
        CU_ASSERT_STRING_NOT_EQUAL(si.key, "zero/v.w#1");
        renamed |= strcmp(si.key, "zero/v.w#2") == 0;
    }
    CU_ASSERT(renamed);
    DT_ASSERT_OK(dt_ckpt_verify(c, NULL, NULL, NULL));
    int64_t zero[2] = {0, 0};
    check_box(c, "zero/v.w#1", LSEEDS[0], LDTYPES[0], 2, LSHAPES[0], zero, LSHAPES[0]);
    check_box(c, "zero/v.w", PT[1].seed, PT[1].dtype, 2, PT[1].shape, zero, PT[1].shape);
    dt_ckpt_close(c);

    ck_edit_index(ck, "\"key\": \"zero/v.w#2\"", "\"key\": \"zero/v.w#x\"", 1);
    DT_ASSERT_FAILS(dt_ckpt_open(ck, &c), DT_ERR_CORRUPT);
    DT_ASSERT_ERROR_MENTIONS("zero/v.w");
    ck_edit_index(ck, "\"key\": \"zero/v.w#x\"", "\"key\": \"zero/v.w\"", 1);
    DT_ASSERT_FAILS(dt_ckpt_open(ck, &c), DT_ERR_CORRUPT);
    DT_ASSERT_ERROR_MENTIONS("used twice");
    dt_test_scratch_remove(dir);
}

static uint64_t lcg(uint64_t *s)
{
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return *s >> 33;
}

static void test_read_box_of_arbitrary_boxes_matches_reference(void)
{
    char dir[256], ck[300];
    ck_scratch(dir, sizeof dir, ck, sizeof ck);
    save_mix(ck);
    dt_ckpt *c = NULL;
    DT_ASSERT_OK(dt_ckpt_open(ck, &c));
    uint64_t rng = 12345 + (uint64_t)dt_client_id();
    for (int i = 0; i < NPT + 2; i++) {
        const char *name = i < NPT ? PT[i].name : LNAMES[i - NPT];
        uint64_t seed = i < NPT ? PT[i].seed : LSEEDS[i - NPT];
        dt_dtype dtype = i < NPT ? PT[i].dtype : LDTYPES[i - NPT];
        int rank = i < NPT ? PT[i].rank : LRANKS[i - NPT];
        const int64_t *shape = i < NPT ? PT[i].shape : LSHAPES[i - NPT];
        int64_t zero[2] = {0, 0};
        check_box(c, name, seed, dtype, rank, shape, zero, shape); /* whole */
        for (int k = 0; k < 40; k++) {
            int64_t off[2] = {0, 0}, size[2] = {0, 0};
            for (int d = 0; d < rank; d++) {
                if (shape[d] == 0)
                    continue;
                off[d] = (int64_t)(lcg(&rng) % (uint64_t)shape[d]);
                size[d] = 1 + (int64_t)(lcg(&rng) % (uint64_t)(shape[d] - off[d]));
            }
            check_box(c, name, seed, dtype, rank, shape, off, size);
        }
    }
    /* Boxes across several pieces and files of zero/big, across chunk boundaries. */
    int64_t off = 1000, size = 3500;
    check_box(c, PT[5].name, PT[5].seed, PT[5].dtype, 1, PT[5].shape, &off, &size);
    int64_t t = -1;
    DT_ASSERT_OK(dt_ckpt_find(c, "zero/v.w", &t));
    /* A zero-size box reads nothing; a box outside or a short buffer is DT_ERR_SHAPE. */
    int64_t zo[2] = {9, 7}, zs[2] = {0, 0}, bo[2] = {8, 0}, bs[2] = {2, 1};
    DT_ASSERT_OK(dt_ckpt_read_box(c, t, zo, zs, NULL, 0));
    unsigned char buf[64];
    DT_ASSERT_FAILS(dt_ckpt_read_box(c, t, bo, bs, buf, sizeof buf), DT_ERR_SHAPE);
    DT_ASSERT_ERROR_MENTIONS("zero/v.w");
    int64_t no[2] = {-1, 0}, ns[2] = {1, 1};
    DT_ASSERT_FAILS(dt_ckpt_read_box(c, t, no, ns, buf, sizeof buf), DT_ERR_SHAPE);
    int64_t ok_off[2] = {1, 1}, ok_size[2] = {3, 5};
    DT_ASSERT_FAILS(dt_ckpt_read_box(c, t, ok_off, ok_size, buf, 29), DT_ERR_SHAPE);
    DT_ASSERT_FAILS(dt_ckpt_read_box(c, 99, ok_off, ok_size, buf, sizeof buf),
                    DT_ERR_INVALID_ARGUMENT);
    /* A scalar takes NULL offsets and sizes. */
    DT_ASSERT_OK(dt_ckpt_find(c, "zero/scalar", &t));
    unsigned char sv[4], sw[4];
    DT_ASSERT_OK(dt_ckpt_read_box(c, t, NULL, NULL, sv, sizeof sv));
    ref_box(PT[3].seed, PT[3].dtype, 0, NULL, NULL, NULL, sw);
    CU_ASSERT_EQUAL(memcmp(sv, sw, 4), 0);
    dt_ckpt_close(c);
    dt_test_scratch_remove(dir);
}

/* Each bad input fails on every client with DT_ERR_INVALID_ARGUMENT naming the tensor, and
 * the checkpoint saved before stays whole. */
static void expect_invalid(const char *ck, const gpiece *g, int ng, int nl,
                           const char *const *lnames, const char *mention)
{
    dt_status st = save_with(ck, nl, g, ng, lnames, 0);
    if (st != DT_ERR_INVALID_ARGUMENT)
        fprintf(stderr, "[rank %d] case '%s': %s (%s)\n", dt_client_id(), mention,
                dt_status_name(st), dt_last_error());
    CU_ASSERT_EQUAL(st, DT_ERR_INVALID_ARGUMENT);
    DT_ASSERT_ERROR_MENTIONS(mention);
}

static int find_piece(const gpiece *g, int ng, int tensor, int64_t position)
{
    for (int k = ng - 1; k >= 0; k--)
        if (g[k].tensor == tensor && g[k].position == position &&
            box_numel(PT[tensor].rank, g[k].size) > 0)
            return k;
    return -1;
}

static void test_invalid_pieces_fail_everywhere_and_keep_previous(void)
{
    char dir[256], ck[300], path[400];
    ck_scratch(dir, sizeof dir, ck, sizeof ck);
    save_mix(ck);
    gpiece g[MAXP], h[MAXP];
    int ng = build_pieces(g);
    int64_t last = ndev() - 1;
    int k = find_piece(g, ng, 0, last); /* zero/m on the last device (another client) */
    CU_ASSERT_FATAL(k >= 0);

    memcpy(h, g, sizeof g); /* overlap: one element earlier */
    h[k].off[0] -= 1;
    h[k].size[0] += 1;
    expect_invalid(ck, h, ng, 2, LNAMES, "overlap");
    DT_ASSERT_ERROR_MENTIONS("zero/m");

    memcpy(h, g, sizeof g); /* 2-D: a block moved right, volumes still add up */
    for (int j = 0; j < ng; j++)
        if (h[j].tensor == 2 && h[j].off[0] == 0 && h[j].off[1] == 1)
            h[j].off[1] = 2;
    expect_invalid(ck, h, ng, 2, LNAMES, "overlap");
    DT_ASSERT_ERROR_MENTIONS("zero/step");

    memcpy(h, g, sizeof g); /* gap: one element short */
    h[k].size[0] -= 1;
    expect_invalid(ck, h, ng, 2, LNAMES, "gap");
    DT_ASSERT_ERROR_MENTIONS("zero/m");

    memcpy(h, g, sizeof g); /* dtype differs on the last device's client */
    h[k].dtype = DT_DTYPE_I32;
    expect_invalid(ck, h, ng, 2, LNAMES, "disagree");
    DT_ASSERT_ERROR_MENTIONS("zero/m");

    memcpy(h, g, sizeof g); /* shape differs */
    h[k].shape[0] = 104;
    expect_invalid(ck, h, ng, 2, LNAMES, "zero/m");

    memcpy(h, g, sizeof g); /* outside the tensor */
    h[k].size[0] += 5;
    expect_invalid(ck, h, ng, 2, LNAMES, "outside");
    DT_ASSERT_ERROR_MENTIONS("zero/m");

    const char *clash[2] = {"w", "zero/step"}; /* a layouted tensor of a pieces' name */
    expect_invalid(ck, g, ng, 2, clash, "zero/step");

    {
        /* A bad device index on the last client alone. */
        dt_mesh *m = save_mesh();
        local_set ls;
        make_local(m, g, ng, &ls);
        if (dt_client_id() == dt_num_clients() - 1)
            ls.p[ls.n - 1].device = 99;
        dt_save_opts o = DT_SAVE_OPTS_INIT;
        o.fsync = 0;
        o.npieces = ls.n;
        o.pieces = ls.p;
        DT_ASSERT_FAILS(dt_save(m, ck, 0, NULL, NULL, &o), DT_ERR_INVALID_ARGUMENT);
        DT_ASSERT_ERROR_MENTIONS("zero/big");
        free_local(&ls);
        dt_mesh_destroy(m);
    }

    /* Nothing was written: the first checkpoint restores whole, no temporary left. */
    snprintf(path, sizeof path, "%s.dtensor-tmp", ck);
    CU_ASSERT_NOT_EQUAL(access(path, F_OK), 0);
    int64_t all[1] = {ndev()};
    dt_mesh *m1 = ck_mesh(1, all);
    restore_check(ck, m1, 0);
    dt_mesh_destroy(m1);
    dt_test_scratch_remove(dir);
}

/* A flipped byte in a piece: read_box of a box over it is DT_ERR_CORRUPT naming the tensor
 * and the file; boxes elsewhere still read; verify and dt_restore see it too. */
static void test_corrupted_piece_is_caught_by_read_box(void)
{
    char dir[256], ck[300];
    ck_scratch(dir, sizeof dir, ck, sizeof ck);
    save_mix(ck);
    dt_ckpt *c = NULL;
    int64_t t = -1;
    DT_ASSERT_OK(dt_ckpt_open(ck, &c));
    DT_ASSERT_OK(dt_ckpt_find(c, "zero/big", &t));
    dt_ckpt_slice_info si;
    int64_t last = -1;
    dt_ckpt_tensor_info ti;
    DT_ASSERT_OK(dt_ckpt_tensor(c, t, &ti));
    last = ti.num_slices - 1;
    DT_ASSERT_OK(dt_ckpt_slice(c, t, last, &si));
    char file[128];
    snprintf(file, sizeof file, "%s", si.file);
    int64_t bad_elem = si.offsets[0] + si.sizes[0] - 3; /* near the end of the last piece */
    uint64_t at = si.file_offset + (uint64_t)(si.sizes[0] - 3) * 4;
    dt_ckpt_close(c);
    MPI_Barrier(MPI_COMM_WORLD);
    if (dt_client_id() == 0) {
        char path[512];
        ck_path(path, sizeof path, ck, file);
        FILE *f = fopen(path, "r+b");
        CU_ASSERT_FATAL(f != NULL);
        fseek(f, (long)at, SEEK_SET);
        int b = fgetc(f);
        fseek(f, (long)at, SEEK_SET);
        fputc(b ^ 0x10, f);
        fclose(f);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    DT_ASSERT_OK(dt_ckpt_open(ck, &c));
    int64_t off = bad_elem - 1, size = 2;
    float v[2];
    DT_ASSERT_FAILS(dt_ckpt_read_box(c, t, &off, &size, v, sizeof v), DT_ERR_CORRUPT);
    DT_ASSERT_ERROR_MENTIONS("zero/big");
    DT_ASSERT_ERROR_MENTIONS(file);
    int64_t good = 10, n = 20; /* in the first piece, another file */
    check_box(c, PT[5].name, PT[5].seed, PT[5].dtype, 1, PT[5].shape, &good, &n);
    int64_t nbad = 0;
    DT_ASSERT_FAILS(dt_ckpt_verify(c, NULL, NULL, &nbad), DT_ERR_CORRUPT);
    CU_ASSERT_EQUAL(nbad, 1);
    dt_ckpt_close(c);
    int64_t all[1] = {ndev()};
    dt_mesh *m1 = ck_mesh(1, all);
    dt_layout *l = ck_layout(m1, "a");
    const char *name = "zero/big";
    dt_tensor *out = NULL;
    DT_ASSERT_FAILS(dt_restore(m1, ck, 1, &name, (const dt_layout *const *)&l, &out),
                    DT_ERR_CORRUPT);
    CU_ASSERT_PTR_NULL(out);
    dt_layout_destroy(l);
    dt_mesh_destroy(m1);
    dt_test_scratch_remove(dir);
}

/* dt_ckpt_export writes pieces' tensors whole (their bytes checked against the reference). */
static void test_export_builds_global_tensors_from_pieces(void)
{
    char dir[256], ck[300], out[320];
    ck_scratch(dir, sizeof dir, ck, sizeof ck);
    snprintf(out, sizeof out, "%s/hf", dir);
    save_mix(ck);
    if (dt_client_id() == 0) {
        dt_ckpt *c = NULL;
        DT_ASSERT_OK(dt_ckpt_open(ck, &c));
        int files = 0;
        DT_ASSERT_OK(dt_ckpt_export(c, out, NULL, &files));
        CU_ASSERT_EQUAL(files, 1);
        dt_ckpt_close(c);
        char path[400];
        ck_path(path, sizeof path, out, "model.safetensors");
        FILE *f = fopen(path, "rb");
        CU_ASSERT_FATAL(f != NULL);
        fseek(f, 0, SEEK_END);
        long len = ftell(f);
        fseek(f, 0, SEEK_SET);
        unsigned char *raw = malloc((size_t)len + 1);
        CU_ASSERT_FATAL(raw && fread(raw, 1, (size_t)len, f) == (size_t)len);
        fclose(f);
        uint64_t hlen = 0;
        for (int b = 7; b >= 0; b--)
            hlen = hlen << 8 | raw[b];
        char *hdr = malloc(hlen + 1);
        memcpy(hdr, raw + 8, hlen);
        hdr[hlen] = '\0';
        for (int i = 0; i < NPT; i++) {
            char key[96];
            snprintf(key, sizeof key, "\"%s\":{", PT[i].name);
            char *e = strstr(hdr, key), *dof = e ? strstr(e, "\"data_offsets\":[") : NULL;
            unsigned long long b0 = 0, b1 = 0;
            CU_ASSERT_FATAL(dof && sscanf(dof, "\"data_offsets\":[%llu,%llu]", &b0, &b1) == 2);
            size_t bytes = (size_t)box_numel(PT[i].rank, PT[i].shape) * dt_dtype_size(PT[i].dtype);
            CU_ASSERT_EQUAL(b1 - b0, bytes);
            unsigned char *want = malloc(bytes + 1);
            int64_t zero[2] = {0, 0};
            ref_box(PT[i].seed, PT[i].dtype, PT[i].rank, PT[i].shape, zero, PT[i].shape, want);
            CU_ASSERT(memcmp(raw + 8 + hlen + b0, want, bytes) == 0);
            free(want);
        }
        free(hdr);
        free(raw);
    }
    dt_test_scratch_remove(dir);
}

int main(int argc, char **argv)
{
    static const dt_test_case cases[] = {
        DT_TEST(test_pieces_restore_with_several_layouts_and_meshes),
        DT_TEST(test_pieces_in_the_index_and_their_keys),
        DT_TEST(test_read_box_of_arbitrary_boxes_matches_reference),
        DT_TEST(test_piece_keys_avoid_names_and_bad_keys_are_corrupt),
        DT_TEST(test_invalid_pieces_fail_everywhere_and_keep_previous),
        DT_TEST(test_corrupted_piece_is_caught_by_read_box),
        DT_TEST(test_export_builds_global_tensors_from_pieces),
        DT_TEST_END,
    };
    return dt_test_main(argc, argv, "ckpt_pieces", cases, 1);
}
