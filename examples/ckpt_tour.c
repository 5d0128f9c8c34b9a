/* ckpt_tour: saves a handful of tensors (f32, bf16, i64; replicated, sharded on one and on two
 * dims, uneven sizes, a scalar) plus small named values from a YAML mesh into a checkpoint
 * directory, shows the shard files and the index, then restores them onto other meshes
 * (1 device, 3 devices, all devices) with other layouts and checks every element.
 * Usage: ckpt_tour MESHES.yaml DIR [MESH_NAME]   (runs alone or under mpirun). */
#include <dtensor/dtensor.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { NT = 5 };

typedef struct tensor_spec {
    const char *name;
    dt_dtype dtype;
    int rank;
    int64_t shape[2];
    const char *specs[2];  /* on the saving mesh: its dims are called x and y */
} tensor_spec;

static const tensor_spec tensors[NT] = {
    {"model/w", DT_DTYPE_F32, 2, {6, 5}, {"x", "y"}},
    {"model/emb", DT_DTYPE_BF16, 2, {7, 4}, {"y", DT_UNSHARDED}},
    {"model/b", DT_DTYPE_F32, 1, {9, 0}, {"x", NULL}},
    {"opt/counts", DT_DTYPE_I64, 1, {5, 0}, {DT_UNSHARDED, NULL}},
    {"loss", DT_DTYPE_F32, 0, {0, 0}, {NULL, NULL}},
};

static int me;

/* Value of element g (row-major global index) of tensor t: exact in every dtype used. */
static double value_of(int t, int64_t g)
{
    return t == 3 ? 1e12 + 7.0 * (double)g : (double)(t * 50 + g) + (t == 1 ? 0 : 0.5);
}

static uint16_t f32_to_bf16_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return (uint16_t)(u >> 16);  /* the values used are exact in bf16 */
}

static void store(dt_dtype dtype, void *base, int64_t k, double v)
{
    if (dtype == DT_DTYPE_F32)
        ((float *)base)[k] = (float)v;
    else if (dtype == DT_DTYPE_BF16)
        ((uint16_t *)base)[k] = f32_to_bf16_bits((float)v);
    else
        ((int64_t *)base)[k] = (int64_t)v;
}

static int same(dt_dtype dtype, const void *base, int64_t k, double v)
{
    if (dtype == DT_DTYPE_F32)
        return ((const float *)base)[k] == (float)v;
    if (dtype == DT_DTYPE_BF16)
        return ((const uint16_t *)base)[k] == f32_to_bf16_bits((float)v);
    return ((const int64_t *)base)[k] == (int64_t)v;
}

/* Global index of local element k of a component. */
static int64_t global_index(int rank, const int64_t *shape, const int64_t *off,
                            const int64_t *local, int64_t k)
{
    int64_t g = 0, stride = 1;
    for (int d = rank - 1; d >= 0; d--) {
        g += (off[d] + k % local[d]) * stride;
        k /= local[d];
        stride *= shape[d];
    }
    return g;
}

static int64_t numel(int rank, const int64_t *shape)
{
    int64_t n = 1;
    for (int d = 0; d < rank; d++)
        n *= shape[d];
    return n;
}

/* Fills (check == 0) or counts mismatches (check == 1) over every local component. */
static int64_t visit(dt_tensor *x, int t, int check)
{
    int64_t bad = 0;
    for (int i = 0; i < dt_tensor_num_local(x); i++) {
        const DLTensor *c = dt_tensor_local(x, i);
        const int64_t *off = dt_tensor_local_offset(x, i);
        for (int64_t k = 0; k < numel(tensors[t].rank, c->shape); k++) {
            double v = value_of(t, global_index(tensors[t].rank, tensors[t].shape, off,
                                                c->shape, k));
            if (!check)
                store(tensors[t].dtype, c->data, k, v);
            else
                bad += !same(tensors[t].dtype, c->data, k, v);
        }
    }
    return bad;
}

static int fail(const char *what, dt_status st)
{
    fprintf(stderr, "ckpt_tour[%d]: %s: %s: %s\n", me, what, dt_status_name(st),
            dt_last_error());
    return 1;
}

static void shape_text(int t, char *buf, size_t len)
{
    buf[0] = '\0';
    for (int d = 0; d < tensors[t].rank; d++)
        snprintf(buf + strlen(buf), len - strlen(buf), "%s%lld", d ? "," : "",
                 (long long)tensors[t].shape[d]);
}

/* Restores every tensor onto a 1-D mesh of `size` devices named `dim`, each with specs from
 * `pick` (0: shard dim 0, 1: shard the last dim, 2: replicated). Returns mismatches. */
static int restore_onto(const char *dir, int64_t size, int pick)
{
    const char *dim = "r";
    dt_mesh *mesh = NULL;
    dt_status st = dt_mesh_create("restore", 1, &dim, &size, DT_DEVICE_CPU, &mesh);
    if (st != DT_OK)
        return fail("restore mesh", st);
    dt_layout *layouts[NT] = {NULL};
    dt_tensor *out[NT] = {NULL};
    const char *names[NT];
    int rc = 0;
    for (int t = 0; t < NT && st == DT_OK; t++) {
        const char *specs[2] = {DT_UNSHARDED, DT_UNSHARDED};
        int r = tensors[t].rank;
        if (r > 0 && pick == 0)
            specs[0] = dim;
        if (r > 0 && pick == 1)
            specs[r - 1] = dim;
        names[t] = tensors[t].name;
        st = dt_layout_create(mesh, r, specs, &layouts[t]);
    }
    if (st == DT_OK)
        st = dt_restore(mesh, dir, NT, names, (const dt_layout *const *)layouts, out);
    if (st != DT_OK) {
        rc = fail("dt_restore", st);
    } else {
        for (int t = 0; t < NT; t++) {
            long long bad = (long long)visit(out[t], t, 1), all = 0;
            MPI_Allreduce(&bad, &all, 1, MPI_LONG_LONG, MPI_SUM, MPI_COMM_WORLD);
            char lbuf[512] = "";
            dt_layout_format(layouts[t], lbuf, sizeof lbuf);
            char *cut = strstr(lbuf, " mesh:");
            if (cut)
                *cut = '\0';
            if (me == 0)
                printf("  %-11s -> %-32s %s\n", tensors[t].name, lbuf,
                       all ? "MISMATCH" : "every element equal");
            rc |= all != 0;
        }
    }
    for (int t = 0; t < NT; t++) {
        dt_tensor_destroy(out[t]);
        dt_layout_destroy(layouts[t]);
    }
    dt_mesh_destroy(mesh);
    return rc;
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: ckpt_tour MESHES.yaml DIR [MESH_NAME]\n");
        return 2;
    }
    dt_status st = dt_init(&argc, &argv, NULL);
    if (st != DT_OK)
        return fail("dt_init", st);
    me = dt_client_id();
    const char *dir = argv[2];
    int rc = 1;
    dt_mesh *mesh = NULL;
    dt_tensor *x[NT] = {NULL};
    const char *names[NT];
    dt_ckpt_shard *shards = NULL;
    int nshards = 0;
    if ((st = dt_mesh_from_yaml_file(argv[1], argc > 3 ? argv[3] : "tour", &mesh)) != DT_OK ||
        (st = dt_mesh_check_devices(mesh)) != DT_OK) {
        fail("mesh", st);
        goto out;
    }
    if (me == 0) {
        char mbuf[256];
        dt_mesh_format(mesh, mbuf, sizeof mbuf);
        printf("== %d process(es), %d devices; saving from mesh %.60s...\n", dt_num_clients(),
               dt_num_global_devices(DT_DEVICE_CPU), mbuf);
    }
    for (int t = 0; t < NT; t++) {
        dt_layout *l = NULL;
        const char *specs[2];
        for (int d = 0; d < tensors[t].rank; d++)
            specs[d] = tensors[t].specs[d];
        names[t] = tensors[t].name;
        if ((st = dt_layout_create(mesh, tensors[t].rank, specs, &l)) != DT_OK ||
            (st = dt_tensor_zeros(l, tensors[t].dtype, tensors[t].shape, &x[t])) != DT_OK) {
            dt_layout_destroy(l);
            fail("tensor", st);
            goto out;
        }
        dt_layout_destroy(l);
        visit(x[t], t, 0);
        if (me == 0) {
            char sbuf[64];
            shape_text(t, sbuf, sizeof sbuf);
            printf("  %-11s %-4s [%s] sharded as (%s, %s)\n", names[t],
                   dt_dtype_name(tensors[t].dtype), sbuf,
                   tensors[t].rank > 0 ? tensors[t].specs[0] : "-",
                   tensors[t].rank > 1 ? tensors[t].specs[1] : "-");
        }
    }
    /* Who writes what: one file per saving device, replicas written once. */
    if ((st = dt_sharded_prefix(mesh, dir, NT, names, (const dt_tensor *const *)x, &shards,
                                &nshards)) != DT_OK) {
        fail("dt_sharded_prefix", st);
        goto out;
    }
    for (int i = 0; me == 0 && i < nshards; i++)
        printf("  device %d writes %s (%lld slices, %llu bytes)\n", shards[i].device_id,
               shards[i].path, (long long)shards[i].num_slices,
               (unsigned long long)shards[i].data_bytes);
    unsigned char rng[16];
    for (int i = 0; i < 16; i++)
        rng[i] = (unsigned char)(i * 17 + 1);
    dt_ckpt_value values[3] = {
        {.name = "step", .type = DT_CKPT_VALUE_I64, .i64 = 1200},
        {.name = "loss_scale", .type = DT_CKPT_VALUE_F64, .f64 = 65536.0},
        {.name = "rng", .type = DT_CKPT_VALUE_BYTES, .bytes = rng, .nbytes = sizeof rng},
    };
    dt_save_opts opts = DT_SAVE_OPTS_INIT;
    opts.values = values;
    opts.nvalues = 3;
    if ((st = dt_save(mesh, dir, NT, names, (const dt_tensor *const *)x, &opts)) != DT_OK) {
        fail("dt_save", st);
        goto out;
    }
    MPI_Barrier(MPI_COMM_WORLD);
    if (me == 0) {
        dt_ckpt *ck = NULL;
        int64_t step = 0, bad = 0;
        if ((st = dt_ckpt_open(dir, &ck)) != DT_OK ||
            (st = dt_ckpt_value_i64(ck, "step", &step)) != DT_OK ||
            (st = dt_ckpt_verify(ck, NULL, NULL, &bad)) != DT_OK) {
            dt_ckpt_close(ck);
            fail("inspect", st);
            goto out;
        }
        printf("saved %s: %lld files, %lld tensors, step %lld, every CRC32C verified\n", dir,
               (long long)dt_ckpt_num_files(ck), (long long)dt_ckpt_num_tensors(ck),
               (long long)step);
        dt_ckpt_close(ck);
    }
    int64_t ndev = dt_num_global_devices(DT_DEVICE_CPU);
    int64_t sizes[3] = {1, 3, ndev};
    rc = 0;
    for (int k = 0; k < 3; k++) {
        if (sizes[k] > ndev)
            continue;
        if (me == 0)
            printf("restore onto %lld device(s):\n", (long long)sizes[k]);
        rc |= restore_onto(dir, sizes[k], k == 0 ? 2 : k == 1 ? 1 : 0);
    }
    if (me == 0)
        printf("%s\n", rc ? "FAILED" : "ok");
out:
    dt_ckpt_shards_free(shards, nshards);
    for (int t = 0; t < NT; t++)
        dt_tensor_destroy(x[t]);
    dt_mesh_destroy(mesh);
    dt_finalize();
    return rc;
}
