/* bench_gpt2_optim: dt_zero_step alone on GPT-2's parameters (f32, the trainer's groups: the
 * embeddings, per block its weights and its biases and norms, the final norm; AdamW with
 * clipping), one process, mesh 1x1, stage 1, the gradients given as the trainer gives them:
 * the optimizer's share of a train_gpt2 step without the forward and backward passes around
 * it. Prints the median wall seconds of REPS steps after one untimed, and the process's CPU
 * seconds per step, as key=value.
 *   bench_gpt2_optim [LAYERS WIDTH VOCAB [REPS]]   (default 12 768 50304 5: 124M) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <dtensor/dtensor.h>

static double now(clockid_t c)
{
    struct timespec ts;
    clock_gettime(c, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

#define MAXP 400

static int ok(dt_status st, const char *what)
{
    if (st != DT_OK)
        fprintf(stderr, "bench_gpt2_optim: %s: %s\n", what, dt_last_error());
    return st == DT_OK;
}

int main(int argc, char **argv)
{
    int L = argc > 1 ? atoi(argv[1]) : 12, reps = argc > 4 ? atoi(argv[4]) : 5;
    int64_t C = argc > 2 ? atoll(argv[2]) : 768, V = argc > 3 ? atoll(argv[3]) : 50304;
    if (L < 1 || L > 64 || C < 1 || V < 1 || reps < 1 || reps > 100) {
        fprintf(stderr, "usage: bench_gpt2_optim [LAYERS WIDTH VOCAB [REPS]]\n");
        return 2;
    }
    if (!ok(dt_init(&argc, &argv, NULL), "dt_init"))
        return 1;
    dt_mesh *mesh = NULL;
    const char *dn[2] = {"batch", "model"};
    int64_t ds[2] = {1, 1};
    dt_layout *l1 = NULL, *l2 = NULL;
    int good = ok(dt_mesh_create("bench", 2, dn, ds, DT_DEVICE_CPU, &mesh), "mesh") &&
               ok(dt_layout_replicated(mesh, 1, &l1), "layout") &&
               ok(dt_layout_replicated(mesh, 2, &l2), "layout");
    /* Shapes of the parameters, in the trainer's groups. */
    int64_t shape[MAXP][2];
    int rank[MAXP], group_of[MAXP], n = 0;
    static char names[MAXP][16];
#define ADD(g, r, a, b) (shape[n][0] = (a), shape[n][1] = (b), rank[n] = (r), group_of[n] = (g), n++)
    ADD(0, 2, V, C);
    ADD(0, 2, 1024, C);
    for (int l = 0; l < L; l++) {
        int gw = 1 + 2 * l, gb = 2 + 2 * l;
        for (int q = 0; q < 4; q++)
            ADD(gw, 2, C, C);
        ADD(gw, 2, C, 4 * C);
        ADD(gw, 2, 4 * C, C);
        for (int q = 0; q < 4; q++)
            ADD(gb, 1, C, 0);
        ADD(gb, 1, 4 * C, 0);
        ADD(gb, 1, C, 0);
        for (int q = 0; q < 4; q++)
            ADD(gb, 1, C, 0);
    }
    ADD(2 * L + 1, 1, C, 0);
    ADD(2 * L + 1, 1, C, 0);
    int ngroups = 2 * L + 2;
    dt_tensor *p[MAXP] = {NULL}, *g[MAXP] = {NULL};
    int64_t total = 0;
    for (int i = 0; good && i < n; i++) {
        snprintf(names[i], sizeof names[i], "p%d", i);
        const dt_layout *l = rank[i] == 2 ? l2 : l1;
        good = ok(dt_tensor_zeros(l, DT_DTYPE_F32, shape[i], &p[i]), "parameter") &&
               ok(dt_tensor_zeros(l, DT_DTYPE_F32, shape[i], &g[i]), "gradient");
        int64_t e = rank[i] == 2 ? shape[i][0] * shape[i][1] : shape[i][0];
        total += e;
        float *x = good ? dt_tensor_local(g[i], 0)->data : NULL;
        for (int64_t j = 0; x && j < e; j++)
            x[j] = (float)((j * 7 + i) % 13 - 6) * 1e-3f;
    }
    dt_zero *z = NULL;
    dt_zero_opts zo = DT_ZERO_OPTS_INIT;
    zo.stage = 1;
    zo.clip_norm = 1.0;
    good = good && ok(dt_zero_create(mesh, &zo, &z), "dt_zero_create");
    /* The optimizer's order: group by group, in model order within each. */
    dt_tensor *gp[MAXP], *gg[MAXP];
    const char *gn[MAXP];
    int k = 0;
    for (int gi = 0; good && gi < ngroups; gi++) {
        int first = k;
        for (int i = 0; i < n; i++)
            if (group_of[i] == gi) {
                gp[k] = p[i];
                gg[k] = g[i];
                gn[k] = names[i];
                k++;
            }
        dt_optim_hparams hp = DT_OPTIM_ADAMW_INIT;
        hp.lr = 1e-4f;
        hp.weight_decay = gi % 2 == 1 || gi == 0 ? 0.1f : 0.0f;
        good = ok(dt_zero_add_group(z, k - first, gn + first, gp + first, &hp, NULL), "group");
    }
    double wall[100], cpu0 = 0.0;
    for (int r = 0; good && r <= reps; r++) {
        if (r == 1)
            cpu0 = now(CLOCK_PROCESS_CPUTIME_ID);
        double t0 = now(CLOCK_MONOTONIC);
        good = ok(dt_zero_step(z, gg, NULL), "dt_zero_step");
        if (r > 0)
            wall[r - 1] = now(CLOCK_MONOTONIC) - t0;
    }
    if (good) {
        double cpu = (now(CLOCK_PROCESS_CPUTIME_ID) - cpu0) / reps;
        qsort(wall, (size_t)reps, sizeof *wall, cmp);
        printf("optim_params=%lld step_s=%.4f cpu_s=%.4f\n", (long long)total, wall[reps / 2],
               cpu);
    }
    dt_zero_destroy(z);
    for (int i = 0; i < n; i++) {
        dt_tensor_destroy(p[i]);
        dt_tensor_destroy(g[i]);
    }
    dt_layout_destroy(l1);
    dt_layout_destroy(l2);
    dt_mesh_destroy(mesh);
    dt_finalize();
    return good ? 0 : 1;
}
