/* Helpers of the ckpt tests (see ck_test_util.h). */
#include "ck_test_util.h"

#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

unsigned char ck_ref_byte(uint64_t seed, uint64_t i)
{
    uint64_t x = seed * 0x9E3779B97F4A7C15ull + i * 0xBF58476D1CE4E5B9ull + 1;
    x ^= x >> 31;
    x *= 0x94D049BB133111EBull;
    x ^= x >> 29;
    return (unsigned char)x;
}

unsigned char *ck_ref_tensor(uint64_t seed, int rank, const int64_t *shape, dt_dtype dtype)
{
    int64_t n = 1;
    for (int d = 0; d < rank; d++)
        n *= shape[d];
    size_t bytes = (size_t)n * dt_dtype_size(dtype);
    unsigned char *p = malloc(bytes + 1);
    for (size_t i = 0; p && i < bytes; i++)
        p[i] = ck_ref_byte(seed, i);
    return p;
}

/* 1 if the component at position p is on coordinate 0 of every partial dim. */
static int holds_value(const dt_layout *l, int64_t p)
{
    const dt_mesh *m = dt_layout_mesh(l);
    int64_t coords[DT_MESH_MAX_DIMS];
    dt_mesh_coords(m, p, coords);
    for (int i = 0; i < dt_layout_num_partial(l); i++) {
        int md;
        dt_reduce_op op;
        dt_layout_partial(l, i, &md, &op);
        if (coords[md] != 0)
            return 0;
    }
    return 1;
}

dt_tensor *ck_make(const dt_layout *layout, dt_dtype dtype, const int64_t *shape,
                   uint64_t seed)
{
    dt_tensor *t = NULL;
    DT_ASSERT_OK(dt_tensor_zeros(layout, dtype, shape, &t));
    int rank = dt_layout_rank(layout);
    size_t elem = dt_dtype_size(dtype);
    for (int i = 0; i < dt_tensor_num_local(t); i++) {
        const DLTensor *x = dt_tensor_local(t, i);
        if (!holds_value(layout, dt_tensor_local_position(t, i)))
            continue;
        const int64_t *off = dt_tensor_local_offset(t, i);
        int64_t n = 1;
        for (int d = 0; d < rank; d++)
            n *= x->shape[d];
        unsigned char *dst = malloc((size_t)n * elem + 1);
        CU_ASSERT_FATAL(dst != NULL);
        for (int64_t k = 0; k < n; k++) {
            int64_t g = dt_test_global_index(rank, shape, off, x->shape, k);
            for (size_t b = 0; b < elem; b++)
                dst[(size_t)k * elem + b] = ck_ref_byte(seed, (uint64_t)g * elem + b);
        }
        /* Through the device layer: a GPU component is not host memory. */
        DT_ASSERT_OK(dt_tensor_local_write(t, i, dst, (size_t)n * elem));
        free(dst);
    }
    return t;
}

int64_t ck_mismatches(const dt_tensor *t, uint64_t seed)
{
    int rank = dt_tensor_rank(t);
    const int64_t *shape = dt_tensor_shape(t);
    size_t elem = dt_dtype_size(dt_tensor_dtype(t));
    int64_t bad = 0;
    for (int i = 0; i < dt_tensor_num_local(t); i++) {
        const DLTensor *x = dt_tensor_local(t, i);
        const int64_t *off = dt_tensor_local_offset(t, i);
        int64_t n = 1;
        for (int d = 0; d < rank; d++)
            n *= x->shape[d];
        unsigned char *p = malloc((size_t)n * elem + 1);
        CU_ASSERT_FATAL(p != NULL);
        DT_ASSERT_OK(dt_tensor_local_read(t, i, p, (size_t)n * elem));
        for (int64_t k = 0; k < n; k++) {
            int64_t g = dt_test_global_index(rank, shape, off, x->shape, k);
            for (size_t b = 0; b < elem; b++)
                if (p[(size_t)k * elem + b] != ck_ref_byte(seed, (uint64_t)g * elem + b)) {
                    bad++;
                    break;
                }
        }
        free(p);
    }
    return bad;
}

dt_mesh *ck_mesh_of(dt_device_type type, int ndims, const int64_t *sizes)
{
    static const char *const names[] = {"a", "b", "c", "d"};
    dt_mesh *m = NULL;
    DT_ASSERT_OK(dt_mesh_create(NULL, ndims, names, sizes, type, &m));
    return m;
}

dt_mesh *ck_mesh(int ndims, const int64_t *sizes)
{
    return ck_mesh_of(DT_DEVICE_CPU, ndims, sizes);
}

dt_layout *ck_layout(const dt_mesh *mesh, const char *specs)
{
    char buf[256];
    const char *v[DT_MAX_RANK];
    int rank = 0;
    snprintf(buf, sizeof buf, "%s", specs);
    for (char *s = strtok(buf, ","); s && rank < DT_MAX_RANK; s = strtok(NULL, ","))
        v[rank++] = s;
    dt_layout *l = NULL;
    DT_ASSERT_OK(dt_layout_create(mesh, rank, v, &l));
    return l;
}

void ck_path(char *buf, size_t len, const char *dir, const char *name)
{
    snprintf(buf, len, "%s/%s", dir, name);
}

void ck_edit_index(const char *ck, const char *from, const char *to, int reseal)
{
    MPI_Barrier(MPI_COMM_WORLD); /* nobody reads the index any more */
    if (dt_client_id() == 0) {
        char path[4200];
        ck_path(path, sizeof path, ck, DT_CKPT_INDEX_NAME);
        FILE *f = fopen(path, "rb");
        CU_ASSERT_FATAL(f != NULL);
        fseek(f, 0, SEEK_END);
        long len = ftell(f);
        fseek(f, 0, SEEK_SET);
        size_t cap = (size_t)len + strlen(to) + 64;
        char *text = calloc(cap, 1);
        CU_ASSERT_FATAL(text && fread(text, 1, (size_t)len, f) == (size_t)len);
        fclose(f);
        char *at = strstr(text, from);
        CU_ASSERT_FATAL(at != NULL);
        size_t fl = strlen(from), tl = strlen(to);
        memmove(at + tl, at + fl, strlen(at + fl) + 1);
        memcpy(at, to, tl);
        if (reseal) {
            /* The trailer of docs/ckpt-format.md: the CRC32C of all text before the member. */
            char *key = strstr(text, "\"index_crc32c\": \"");
            CU_ASSERT_FATAL(key != NULL);
            uint32_t crc = dt_crc32c(0, text, (size_t)(key - text));
            snprintf(key, cap - (size_t)(key - text), "\"index_crc32c\": \"%08x\"\n}\n",
                     (unsigned)crc);
        }
        f = fopen(path, "wb");
        CU_ASSERT_FATAL(f != NULL);
        fwrite(text, 1, strlen(text), f);
        fclose(f);
        free(text);
    }
    MPI_Barrier(MPI_COMM_WORLD);
}

void ck_scratch(char *dir, size_t dlen, char *ck, size_t clen)
{
    dt_test_scratch_dir(dir, dlen);
    snprintf(ck, clen, "%s/ckpt", dir);
}

int64_t ck_restored_mismatches(const dt_mesh *m, const char *ck, const char *name,
                               const char *specs, uint64_t seed)
{
    dt_layout *l = ck_layout(m, specs);
    dt_tensor *out = NULL;
    int64_t bad = -1;
    DT_ASSERT_OK(dt_restore(m, ck, 1, &name, (const dt_layout *const *)&l, &out));
    if (out)
        bad = ck_mismatches(out, seed);
    dt_tensor_destroy(out);
    dt_layout_destroy(l);
    return bad;
}
