/* bench_zero: the ZeRO optimizer's memory per rank against the paper's formulas for
 * mixed-precision Adam, the step time of stages 1 and 2 against stage 0 on the same model
 * and ranks, interleaved in one run, and (case overlap) how much of the gradient reduction
 * dt_zero_grad_ready hides behind a backward pass (docs/bench.md). One CPU device per
 * process. */
#include <mpi.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_util.h"
#include "dtensor/dtensor.h"

enum { NT = 4, ROW = 1024, MAX_REPS = 1000, NSTAGES = 3 };

typedef struct opts {
    int64_t params;
    int64_t allgather; /* elements; 0: params / 16 */
    int64_t bucket;    /* reduce_bucket_size bytes; 0: the default */
    int reps;
    const char *cases;
} opts;

static int g_rank, g_nclients;

/* One stage's model: NT bf16 parameters [rows, ROW] replicated over the mesh, their bf16
 * gradients partial over `batch` (the caller's, kept for every step), and the optimizer. */
typedef struct model {
    int stage;
    dt_tensor *p[NT], *g[NT];
    dt_zero *z;
    /* This rank's measurements (bytes), in the order of the memory line. */
    uint64_t param_bytes, opt_bytes, held_bytes, temp_bytes, input_grad_bytes;
    dt_zero_memory api;
    int ok;
    double times[MAX_REPS];
} model;

static uint64_t requested(void)
{
    dt_pool_stats s;
    dt_host_pool_stats(&s);
    return s.bytes_requested;
}

/* ---- a sampler of the pool's requested bytes while one step runs ------------------------- */

static atomic_int g_sampling;
static _Atomic uint64_t g_peak;

static void *sampler(void *arg)
{
    (void)arg;
    while (atomic_load(&g_sampling)) {
        uint64_t r = requested();
        if (r > atomic_load(&g_peak))
            atomic_store(&g_peak, r);
    }
    return NULL;
}

static int report(const char *what, dt_status st)
{
    if (st != DT_OK)
        fprintf(stderr, "# client %d: %s: %s: %s\n", g_rank, what, dt_status_name(st),
                dt_last_error());
    return st == DT_OK;
}

/* Fills a bf16 component of n elements: element e of tensor k on dp rank j is
 * ((e * 7 + 3 * k + j) % 9 - 4) / 64 (gradients: exact sums in any order), or a parameter
 * value ((e * 13 + k) % 255 - 127) / 256. */
static dt_status fill(void *dst, int64_t n, int k, int j, int grad)
{
    float buf[4096];
    for (int64_t s = 0; s < n; s += 4096) {
        int64_t m = n - s < 4096 ? n - s : 4096;
        for (int64_t i = 0; i < m; i++) {
            int64_t e = s + i;
            buf[i] = grad ? (float)((e * 7 + 3 * k + j) % 9 - 4) / 64.0f
                          : (float)((e * 13 + k) % 255 - 127) / 256.0f;
        }
        dt_status st = dt_kernel_cast(m, buf, DT_DTYPE_F32, (uint16_t *)dst + s, DT_DTYPE_BF16);
        if (st != DT_OK)
            return st;
    }
    return DT_OK;
}

/* The NT tensors' names, "layer0.w" on. */
static void layer_names(const char *names[NT])
{
    static char buf[NT][16];
    for (int k = 0; k < NT; k++) {
        snprintf(buf[k], sizeof buf[k], "layer%d.w", k);
        names[k] = buf[k];
    }
}

/* The models' two 2-D layouts: replicated (parameters) and partial over batch (gradients). */
static int model_layouts(const dt_mesh *mesh, dt_layout **rep, dt_layout **part)
{
    const char *specs[2] = {DT_UNSHARDED, DT_UNSHARDED};
    const char *pd[1] = {"batch"};
    dt_reduce_op op = DT_REDUCE_SUM;
    return report("layout", dt_layout_create(mesh, 2, specs, rep)) &&
           report("layout", dt_layout_create_partial(mesh, 2, specs, 1, pd, &op, part));
}

/* Creates the stage's model and measures it: parameters, optimizer, a warm-up step, then one
 * step with the sampler on. */
/* dt_zero_opts.reduce_dtype of the models model_setup makes (the reduce case sets it). */
static int g_reduce_dtype = DT_ZERO_REDUCE_PARAM;

static int model_setup(model *m, int stage, const dt_mesh *mesh, const opts *o)
{
    memset(m, 0, sizeof *m);
    m->stage = stage;
    int64_t shape[2] = {o->params / NT / ROW, ROW};
    dt_layout *rep = NULL, *part = NULL;
    int ok = model_layouts(mesh, &rep, &part);
    uint64_t b0 = requested();
    for (int k = 0; ok && k < NT; k++) {
        ok = report("parameter", dt_tensor_zeros(rep, DT_DTYPE_BF16, shape, &m->p[k]));
        for (int i = 0; ok && i < dt_tensor_num_local(m->p[k]); i++)
            ok = report("parameter",
                        fill(dt_tensor_local(m->p[k], i)->data, o->params / NT, k, 0, 0));
    }
    uint64_t b1 = requested();
    m->param_bytes = b1 - b0;
    dt_zero_opts zo = DT_ZERO_OPTS_INIT;
    zo.stage = stage;
    zo.allgather_size = o->allgather;
    zo.reduce_dtype = g_reduce_dtype;
    if (o->bucket > 0)
        zo.reduce_bucket_size = o->bucket;
    dt_optim_hparams hp = DT_OPTIM_ADAM_INIT;
    const char *names[NT];
    layer_names(names);
    if (ok)
        ok = report("dt_zero_create", dt_zero_create(mesh, &zo, &m->z));
    if (ok)
        ok = report("dt_zero_add_group", dt_zero_add_group(m->z, NT, names, m->p, &hp, NULL));
    uint64_t b2 = requested();
    for (int k = 0; ok && k < NT; k++) {
        ok = report("gradient", dt_tensor_zeros(part, DT_DTYPE_BF16, shape, &m->g[k]));
        for (int i = 0; ok && i < dt_tensor_num_local(m->g[k]); i++) {
            int64_t j = dt_tensor_local_position(m->g[k], i);
            ok = report("gradient",
                        fill(dt_tensor_local(m->g[k], i)->data, o->params / NT, k, (int)j, 1));
        }
    }
    uint64_t b3 = requested();
    m->input_grad_bytes = b3 - b2;
    ok = bu_ok_all(ok);
    if (ok)
        ok = bu_ok_all(report("warm-up step", dt_zero_step(m->z, m->g, NULL)));
    if (ok) {
        /* Steady state: everything but the caller's gradients is what the optimizer keeps
         * between steps. Then the peak of one step above it. */
        uint64_t before = requested();
        m->held_bytes = before - b0 - m->input_grad_bytes;
        m->opt_bytes = m->held_bytes - m->param_bytes;
        atomic_store(&g_peak, before);
        atomic_store(&g_sampling, 1);
        pthread_t th;
        int have = pthread_create(&th, NULL, sampler, NULL) == 0;
        ok = report("measured step", dt_zero_step(m->z, m->g, NULL));
        atomic_store(&g_sampling, 0);
        if (have)
            pthread_join(th, NULL);
        uint64_t after = requested();
        m->temp_bytes = atomic_load(&g_peak) - before;
        if (after != before)
            fprintf(stderr,
                    "# client %d: stage %d: %lld bytes more held after the second step "
                    "than after the first\n",
                    g_rank, stage, (long long)(after - before));
        ok = bu_ok_all(ok && report("dt_zero_memory_usage", dt_zero_memory_usage(m->z, &m->api)));
    }
    dt_layout_destroy(rep);
    dt_layout_destroy(part);
    m->ok = ok;
    return ok;
}

/* Frees an optimizer and the n parameters and gradients of a model of these cases. */
static void model_free(dt_zero *z, dt_tensor **p, dt_tensor **g, int n)
{
    dt_zero_destroy(z);
    for (int k = 0; k < n; k++) {
        dt_tensor_destroy(p[k]);
        dt_tensor_destroy(g[k]);
    }
}

static void model_destroy(model *m)
{
    model_free(m->z, m->p, m->g, NT);
}

/* The paper's bytes per rank for mixed-precision Adam (2 + 2 + 12 bytes per parameter):
 * stage 0 16P, stage 1 4P + 12P/N, stage 2 2P + 14P/N. */
static double formula(int stage, double p, double n)
{
    return stage == 0 ? 16.0 * p : stage == 1 ? 4.0 * p + 12.0 * p / n : 2.0 * p + 14.0 * p / n;
}

/* CRC32C of this rank's parameters, and whether every rank has the same one. */
static uint32_t params_crc(const model *m, const opts *o)
{
    uint32_t c = 0;
    for (int k = 0; k < NT; k++)
        c = dt_crc32c(c, dt_tensor_local(m->p[k], 0)->data, (size_t)(o->params / NT) * 2);
    return c;
}

enum { NFIELDS = 10 };

static void memory_lines(const model *ms, const opts *o, const char *check)
{
    for (int s = 0; s < NSTAGES; s++) {
        const model *m = &ms[s];
        uint64_t mine[NFIELDS] = {m->held_bytes,       m->param_bytes,
                                  m->opt_bytes,        m->temp_bytes,
                                  m->input_grad_bytes, m->api.param_bytes,
                                  m->api.grad_bytes,   m->api.state_bytes,
                                  m->api.gather_bytes, 0};
        uint64_t *all = malloc(sizeof(uint64_t) * NFIELDS * (size_t)g_nclients);
        MPI_Gather(mine, NFIELDS, MPI_UINT64_T, all, NFIELDS, MPI_UINT64_T, 0, MPI_COMM_WORLD);
        if (g_rank == 0) {
            double p = (double)o->params, n = g_nclients;
            double chunk = 2.0 * (double)(o->allgather < o->params ? o->allgather : o->params);
            double f = formula(m->stage, p, n);
            for (int r = 0; r < g_nclients; r++) {
                const uint64_t *v = all + NFIELDS * r;
                double held = (double)v[0], temp = (double)v[3];
                double api = (double)(v[5] + v[6] + v[7]);
                bu_line line;
                bu_line_init(&line);
                bu_line_add(&line, "case", "memory");
                bu_line_add(&line, "stage", "%d", m->stage);
                bu_line_add(&line, "np", "%d", g_nclients);
                bu_line_add(&line, "rank", "%d", r);
                bu_line_add(&line, "params", "%lld", (long long)o->params);
                bu_line_add(&line, "mem_ratio", "%.4f", (held + temp) / (f + chunk));
                bu_line_add(&line, "steady_ratio", "%.4f", held / f);
                bu_line_add(&line, "held_bytes", "%llu", (unsigned long long)v[0]);
                bu_line_add(&line, "temp_bytes", "%llu", (unsigned long long)v[3]);
                bu_line_add(&line, "formula_bytes", "%.0f", f);
                bu_line_add(&line, "chunk_bytes", "%.0f", chunk);
                bu_line_add(&line, "param_bytes", "%llu", (unsigned long long)v[1]);
                bu_line_add(&line, "opt_bytes", "%llu", (unsigned long long)v[2]);
                bu_line_add(&line, "input_grad_bytes", "%llu", (unsigned long long)v[4]);
                bu_line_add(&line, "api_param_bytes", "%llu", (unsigned long long)v[5]);
                bu_line_add(&line, "api_grad_bytes", "%llu", (unsigned long long)v[6]);
                bu_line_add(&line, "api_state_bytes", "%llu", (unsigned long long)v[7]);
                bu_line_add(&line, "api_gather_bytes", "%llu", (unsigned long long)v[8]);
                bu_line_add(&line, "api_ratio", "%.4f", (api + (double)v[8]) / (f + chunk));
                bu_line_add(&line, "check", "%s", check);
                bu_line_print(&line);
                /* The API's count of what it holds must be what the allocator saw. */
                if (api != held) {
                    fprintf(stderr,
                            "# stage %d rank %d: dt_zero_memory_usage says %.0f bytes "
                            "(params + grads + state), the pool %.0f\n",
                            m->stage, r, api, held);
                }
            }
        }
        free(all);
    }
}

/* Times reps steps of every stage, interleaved (the first stage of a round rotates), each
 * step's time the slowest rank's; medians into med. */
static int time_steps(model *ms, const opts *o, double *med)
{
    int good = 1;
    for (int rep = 0; rep < o->reps && good; rep++) {
        for (int i = 0; i < NSTAGES && good; i++) {
            model *m = &ms[(rep + i) % NSTAGES];
            MPI_Barrier(MPI_COMM_WORLD);
            double t0 = MPI_Wtime();
            int ok = report("timed step", dt_zero_step(m->z, m->g, NULL));
            m->times[rep] = bu_max_all(MPI_Wtime() - t0);
            good = bu_ok_all(ok);
        }
    }
    for (int s = 0; s < NSTAGES; s++)
        med[s] = bu_median(ms[s].times, o->reps);
    return good;
}

static void speed_lines(const model *ms, const opts *o, const double *med, const char *check)
{
    if (g_rank != 0)
        return;
    for (int s = 0; s < NSTAGES; s++) {
        bu_line line;
        bu_line_init(&line);
        bu_line_add(&line, "case", "speed");
        bu_line_add(&line, "stage", "%d", ms[s].stage);
        bu_line_add(&line, "np", "%d", g_nclients);
        bu_line_add(&line, "params", "%lld", (long long)o->params);
        bu_line_add(&line, "step_ratio", "%.3f", med[s] / med[0]);
        bu_line_add(&line, "step_ms", "%.2f", med[s] * 1e3);
        bu_line_add(&line, "stage0_ms", "%.2f", med[0] * 1e3);
        bu_line_add(&line, "reps", "%d", o->reps);
        bu_line_add(&line, "check", "%s", check);
        bu_line_print(&line);
    }
}

/* ---- case reduce: bf16 gradients summed in f32 (dt_zero_opts.reduce_dtype) ------------------ */

/* Per stage, the step with the bf16 sum against the step with the f32 sum (interleaved, the
 * slowest rank's time, medians) and the optimizer's gradient bytes of each. */
static int reduce_case(const dt_mesh *mesh, const opts *o)
{
    int good = 1;
    for (int stage = 0; stage < NSTAGES && good; stage++) {
        model ms[2];
        memset(ms, 0, sizeof ms);
        for (int r = 0; r < 2 && good; r++) {
            g_reduce_dtype = r ? DT_ZERO_REDUCE_F32 : DT_ZERO_REDUCE_PARAM;
            good = model_setup(&ms[r], stage, mesh, o);
        }
        g_reduce_dtype = DT_ZERO_REDUCE_PARAM;
        for (int rep = 0; rep < o->reps && good; rep++)
            for (int i = 0; i < 2 && good; i++) {
                model *m = &ms[(rep + i) % 2];
                MPI_Barrier(MPI_COMM_WORLD);
                double t0 = MPI_Wtime();
                int ok = report("timed step", dt_zero_step(m->z, m->g, NULL));
                m->times[rep] = bu_max_all(MPI_Wtime() - t0);
                good = bu_ok_all(ok);
            }
        if (good && g_rank == 0) {
            double t16 = bu_median(ms[0].times, o->reps), t32 = bu_median(ms[1].times, o->reps);
            bu_line line;
            bu_line_init(&line);
            bu_line_add(&line, "case", "reduce");
            bu_line_add(&line, "stage", "%d", stage);
            bu_line_add(&line, "np", "%d", g_nclients);
            bu_line_add(&line, "params", "%lld", (long long)o->params);
            bu_line_add(&line, "bf16_sum_ms", "%.2f", t16 * 1e3);
            bu_line_add(&line, "f32_sum_ms", "%.2f", t32 * 1e3);
            bu_line_add(&line, "cost_ratio", "%.3f", t32 / t16);
            bu_line_add(&line, "grad_bytes_bf16", "%llu", (unsigned long long)ms[0].api.grad_bytes);
            bu_line_add(&line, "grad_bytes_f32", "%llu", (unsigned long long)ms[1].api.grad_bytes);
            bu_line_add(&line, "reps", "%d", o->reps);
            bu_line_print(&line);
        }
        for (int r = 0; r < 2; r++)
            model_destroy(&ms[r]);
    }
    return good;
}

/* Every stage took the same steps on the same gradients: parameters must be identical over
 * stages and ranks. */
static const char *check_params(model *ms, const opts *o)
{
    uint32_t c0 = params_crc(&ms[0], o);
    int same = 1;
    for (int s = 1; s < NSTAGES; s++)
        same &= params_crc(&ms[s], o) == c0;
    unsigned lo = c0, hi = c0;
    unsigned mlo, mhi;
    MPI_Allreduce(&lo, &mlo, 1, MPI_UNSIGNED, MPI_MIN, MPI_COMM_WORLD);
    MPI_Allreduce(&hi, &mhi, 1, MPI_UNSIGNED, MPI_MAX, MPI_COMM_WORLD);
    same = bu_ok_all(same) && mlo == mhi;
    return same ? "ok" : "FAIL_params_differ";
}

/* ---- overlap: the reduction behind a backward pass ------------------------------------- */

/* The 1-minute load average (/proc/loadavg), -1 where there is none: the case's figures depend
 * on the cores the other processes leave. */
static double load1(void)
{
    double v = -1;
    FILE *f = fopen("/proc/loadavg", "r");
    if (f) {
        if (fscanf(f, "%lf", &v) != 1)
            v = -1;
        fclose(f);
    }
    return v;
}

/* The stand-in for one layer's backward pass: `iters` sweeps of arithmetic over a host
 * buffer (the same work on every rank). */
static float g_sink;
static void layer_compute(float *buf, int64_t n, int64_t iters)
{
    for (int64_t it = 0; it < iters; it++)
        for (int64_t i = 0; i < n; i++)
            buf[i] = buf[i] * 0.999f + 0.001f;
    g_sink += buf[n / 2];
}

enum { OV_BUF = 1 << 16 };

/* One step of the overlap case; mode 0: the optimizer alone (every gradient handed over,
 * then the step), 1: the compute alone, 2: compute, then the gradients and the step (no
 * overlap), 3: each layer's compute followed by its gradient (overlap). *t_out: the slowest
 * rank's seconds; *comm_out: the slowest rank's seconds of exposed reduction (in
 * dt_zero_grad_ready calls plus the step's wait for the buckets, dt_zero_step_info's
 * reduce_wait_s). */
static double g_ov_wait; /* the last step's reduce_wait_s, the slowest rank's */
static double g_ov_copy, g_ov_sum; /* its reduce_copy_s and reduce_sum_s, the slowest rank's */
static int ov_step(model *m, int mode, float *buf, int64_t iters, double *t_out,
                   double *comm_out)
{
    int ok = 1;
    double comm = 0, wait = 0, copy = 0, sum = 0;
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = MPI_Wtime();
    if (mode == 1 || mode == 2)
        for (int k = NT - 1; k >= 0; k--)
            layer_compute(buf, OV_BUF, iters);
    if (mode != 1) {
        for (int k = NT - 1; k >= 0 && ok; k--) {
            if (mode == 3)
                layer_compute(buf, OV_BUF, iters);
            double t1 = MPI_Wtime();
            ok = report("dt_zero_grad_ready", dt_zero_grad_ready(m->z, k, m->g[k]));
            comm += MPI_Wtime() - t1;
        }
        dt_zero_step_info info;
        ok = ok && report("overlap step", dt_zero_step(m->z, NULL, &info));
        comm += ok ? info.reduce_wait_s : 0;
        wait = ok ? info.reduce_wait_s : 0;
        copy = ok ? info.reduce_copy_s : 0;
        sum = ok ? info.reduce_sum_s : 0;
    }
    *t_out = bu_max_all(MPI_Wtime() - t0);
    *comm_out = bu_max_all(comm);
    if (mode != 1) {
        g_ov_wait = bu_max_all(wait);
        g_ov_copy = bu_max_all(copy);
        g_ov_sum = bu_max_all(sum);
    }
    return bu_ok_all(ok);
}

static double thread_cpu(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* References for the reduction's breakdown, in the same run: the bare MPI exchange of the
 * reduce-scatter's bytes (each bucket's part to every peer, on MPI_COMM_WORLD, no copies or
 * sums of ours; the slowest rank's wall and CPU seconds) and memcpy of the bytes
 * the reduction copies (the gradients into the flat buffer, and what Open MPI's shared memory
 * transport copies in and out without a single-copy mechanism: twice the bytes sent). */
static int ov_refs(const opts *o, int64_t bucket, double *mpi_out, double *mpi_cpu_out,
                   double *memcpy_out)
{
    /* Devices in dp order, nl per process: device g = rank * nl + d; the message from device
     * g to device q carries tag g * ndp + q. */
    int nl = dt_num_local_devices(DT_DEVICE_CPU), ndp = nl * g_nclients;
    int64_t total = o->params * 2, nb = total / bucket, part = bucket / ndp;
    int64_t sent = nl * nb * part * (ndp - 1); /* by this process */
    int64_t src_bytes = sent > total ? sent : total;
    char *send = malloc((size_t)src_bytes), *recv = malloc((size_t)(sent ? sent : 1));
    char *copy = malloc((size_t)(nl * total + 2 * sent));
    MPI_Request *reqs = malloc((size_t)(2 * nl * nb * ndp) * sizeof *reqs);
    int ok = send && recv && copy && reqs;
    double *w = calloc((size_t)o->reps, sizeof *w), *cpu = calloc((size_t)o->reps, sizeof *cpu);
    double *mc = calloc((size_t)o->reps, sizeof *mc);
    ok = bu_ok_all(ok && w && cpu && mc);
    if (ok) {
        memset(send, 1, (size_t)src_bytes);
        memset(recv, 0, (size_t)(sent ? sent : 1));
        memset(copy, 0, (size_t)(nl * total + 2 * sent));
    }
    for (int r = 0; r < o->reps && ok; r++) {
        MPI_Barrier(MPI_COMM_WORLD);
        double t0 = MPI_Wtime(), c0 = thread_cpu();
        int n = 0;
        char *in = recv;
        for (int64_t b = 0; b < nb; b++)
            for (int d = 0; d < nl; d++)
                for (int q = 0; q < ndp; q++) {
                    int g = g_rank * nl + d;
                    if (q == g)
                        continue;
                    MPI_Irecv(in, (int)part, MPI_BYTE, q / nl, q * ndp + g, MPI_COMM_WORLD,
                              &reqs[n++]);
                    in += part;
                    MPI_Isend(send + b * bucket + q * part, (int)part, MPI_BYTE, q / nl,
                              g * ndp + q, MPI_COMM_WORLD, &reqs[n++]);
                }
        MPI_Waitall(n, reqs, MPI_STATUSES_IGNORE);
        cpu[r] = bu_max_all(thread_cpu() - c0);
        w[r] = bu_max_all(MPI_Wtime() - t0);
        MPI_Barrier(MPI_COMM_WORLD);
        t0 = MPI_Wtime();
        for (int d = 0; d < nl; d++)
            memcpy(copy + d * total, send, (size_t)total);
        memcpy(copy + nl * total, send, (size_t)sent);
        memcpy(copy + nl * total + sent, send, (size_t)sent);
        mc[r] = bu_max_all(MPI_Wtime() - t0);
    }
    if (ok) {
        *mpi_out = bu_median(w, o->reps);
        *mpi_cpu_out = bu_median(cpu, o->reps);
        *memcpy_out = bu_median(mc, o->reps);
    }
    free(send);
    free(recv);
    free(copy);
    free(reqs);
    free(w);
    free(cpu);
    free(mc);
    return ok;
}

/* A stage 1 model with buckets of half a layer: the reduction alone (C: every gradient handed
 * over with no compute between, the time in dt_zero_grad_ready plus the step's wait), a
 * backward stand-in calibrated to take about C (K), the step without overlap (compute, then
 * every gradient) and with it (each layer's gradient right after its compute), and the
 * reduction's exposed part E in the overlapped step. hidden = 1 - E / C. */
static int overlap_case(const dt_mesh *mesh, const opts *o)
{
    opts ob = *o;
    ob.bucket = o->params / NT * 2 / 2;
    model m;
    int good = model_setup(&m, 1, mesh, &ob);
    float *buf = calloc(OV_BUF, sizeof *buf);
    double *t[4], *c[4];
    for (int i = 0; i < 4; i++) {
        t[i] = calloc((size_t)o->reps, sizeof(double));
        c[i] = calloc((size_t)o->reps, sizeof(double));
        good = good && t[i] && c[i];
    }
    good = good && buf;
    double med[4] = {0}, cmed[4] = {0}, wmed = 0, w[MAX_REPS] = {0};
    double cp[2][MAX_REPS] = {{0}}, sm[2][MAX_REPS] = {{0}}, cpmed[2] = {0}, smmed[2] = {0};
    for (int r = 0; r < o->reps && good; r++) {
        good = ov_step(&m, 0, buf, 0, &t[0][r], &c[0][r]);
        cp[0][r] = g_ov_copy;
        sm[0][r] = g_ov_sum;
    }
    if (good) {
        med[0] = bu_median(t[0], o->reps);
        cmed[0] = bu_median(c[0], o->reps);
        cpmed[0] = bu_median(cp[0], o->reps);
        smmed[0] = bu_median(sm[0], o->reps);
    }
    double mpi_ms = 0, mpi_cpu = 0, memcpy_s = 0;
    good = good && ov_refs(o, ob.bucket, &mpi_ms, &mpi_cpu, &memcpy_s);
    double sweep = 0;
    for (int r = 0; r < 3 && good; r++) {
        double t0 = MPI_Wtime();
        layer_compute(buf, OV_BUF, 4);
        double d = bu_max_all((MPI_Wtime() - t0) / 4);
        sweep = r == 0 || d < sweep ? d : sweep;
    }
    int64_t iters = sweep > 0 ? (int64_t)(cmed[0] / NT / sweep + 0.5) : 1;
    if (iters < 1)
        iters = 1;
    /* Compute alone, no overlap and overlap, interleaved. */
    for (int r = 0; r < o->reps && good; r++)
        for (int i = 0; i < 3 && good; i++) {
            int mode = 1 + (r + i) % 3;
            good = ov_step(&m, mode, buf, iters, &t[mode][r], &c[mode][r]);
            if (mode == 3) {
                w[r] = g_ov_wait;
                cp[1][r] = g_ov_copy;
                sm[1][r] = g_ov_sum;
            }
        }
    for (int i = 1; good && i < 4; i++) {
        if (i == 3) {
            wmed = bu_median(w, o->reps);
            cpmed[1] = bu_median(cp[1], o->reps);
            smmed[1] = bu_median(sm[1], o->reps);
        }
        med[i] = bu_median(t[i], o->reps);
        cmed[i] = bu_median(c[i], o->reps);
    }
    if (good && g_rank == 0) {
        bu_line line;
        bu_line_init(&line);
        bu_line_add(&line, "case", "overlap");
        bu_line_add(&line, "stage", "1");
        bu_line_add(&line, "np", "%d", g_nclients);
        bu_line_add(&line, "devices_per_process", "%d", dt_num_local_devices(DT_DEVICE_CPU));
        bu_line_add(&line, "params", "%lld", (long long)o->params);
        bu_line_add(&line, "bucket_bytes", "%lld", (long long)ob.bucket);
        bu_line_add(&line, "hidden", "%.3f", cmed[0] > 0 ? 1.0 - cmed[3] / cmed[0] : 0.0);
        /* From wall times (a peer's slower compute counts in neither): the time the overlapped
         * step saves over compute-then-step, as a fraction of the reduction alone. */
        bu_line_add(&line, "hidden_wall", "%.3f", cmed[0] > 0 ? (med[2] - med[3]) / cmed[0] : 0.0);
        bu_line_add(&line, "comm_ms", "%.2f", cmed[0] * 1e3);
        bu_line_add(&line, "exposed_ms", "%.2f", cmed[3] * 1e3);
        bu_line_add(&line, "exposed_wait_ms", "%.2f", wmed * 1e3);
        bu_line_add(&line, "compute_ms", "%.2f", med[1] * 1e3);
        bu_line_add(&line, "no_overlap_ms", "%.2f", med[2] * 1e3);
        bu_line_add(&line, "overlap_ms", "%.2f", med[3] * 1e3);
        bu_line_add(&line, "optimizer_ms", "%.2f", med[0] * 1e3);
        /* Where comm_ms goes: our copies and sums (CPU time, whichever thread ran them), and
         * the bare MPI exchange of the same bytes (its wall and its CPU time: shared memory
         * copies carry it). work_ms is the CPU work of the reduction: with every core
         * computing, an overlapped step cannot hide more than 1 - work_ms / comm_ms
         * (hidden_bound). */
        double work = cpmed[0] + smmed[0] + mpi_cpu;
        bu_line_add(&line, "copy_ms", "%.2f", cpmed[0] * 1e3);
        bu_line_add(&line, "sum_ms", "%.2f", smmed[0] * 1e3);
        bu_line_add(&line, "mpi_alone_ms", "%.2f", mpi_ms * 1e3);
        bu_line_add(&line, "mpi_alone_cpu_ms", "%.2f", mpi_cpu * 1e3);
        bu_line_add(&line, "memcpy_ms", "%.2f", memcpy_s * 1e3);
        bu_line_add(&line, "work_ms", "%.2f", work * 1e3);
        bu_line_add(&line, "hidden_bound", "%.3f", cmed[0] > 0 ? 1.0 - work / cmed[0] : 0.0);
        bu_line_add(&line, "overlap_copy_ms", "%.2f", cpmed[1] * 1e3);
        bu_line_add(&line, "overlap_sum_ms", "%.2f", smmed[1] * 1e3);
        bu_line_add(&line, "load1", "%.2f", load1());
        bu_line_add(&line, "reps", "%d", o->reps);
        bu_line_print(&line);
    } else if (!good && g_rank == 0) {
        printf("case=overlap np=%d params=%lld error=step_failed\n", g_nclients,
               (long long)o->params);
    }
    for (int i = 0; i < 4; i++) {
        free(t[i]);
        free(c[i]);
    }
    free(buf);
    model_destroy(&m);
    return good;
}

/* ---- case offload: the optimizer on the host, on one GPU per process ---------------------- */

/* One optimizer of the offload case on the GPU mesh: bf16 parameters filled as fill() does
 * (through host buffers: the GPU's memory is not the host's), gradients partial over batch. */
typedef struct omodel {
    dt_tensor *p[NT], *g[NT];
    dt_zero *z;
    dt_zero_memory api;
    uint64_t host_measured; /* host pool bytes the optimizer holds after its warm-up step */
    double times[MAX_REPS];
} omodel;

static int omodel_setup(omodel *m, int stage, int offload, const dt_mesh *mesh, const opts *o)
{
    memset(m, 0, sizeof *m);
    int64_t n = o->params / NT, shape[2] = {n / ROW, ROW};
    dt_layout *rep = NULL, *part = NULL;
    int ok = model_layouts(mesh, &rep, &part);
    uint16_t *buf = malloc((size_t)n * 2);
    ok = ok && buf;
    int j = g_rank; /* one device per process: dp coordinate = client */
    for (int k = 0; ok && k < NT; k++) {
        ok = report("parameter", dt_tensor_zeros(rep, DT_DTYPE_BF16, shape, &m->p[k])) &&
             report("parameter", fill(buf, n, k, 0, 0)) &&
             report("parameter", dt_tensor_local_write(m->p[k], 0, buf, (size_t)n * 2)) &&
             report("gradient", dt_tensor_zeros(part, DT_DTYPE_BF16, shape, &m->g[k])) &&
             report("gradient", fill(buf, n, k, j, 1)) &&
             report("gradient", dt_tensor_local_write(m->g[k], 0, buf, (size_t)n * 2));
    }
    free(buf);
    dt_zero_opts zo = DT_ZERO_OPTS_INIT;
    zo.stage = stage;
    zo.allgather_size = o->allgather;
    zo.offload = offload;
    dt_optim_hparams hp = DT_OPTIM_ADAM_INIT;
    const char *names[NT];
    layer_names(names);
    uint64_t b0 = requested();
    if (ok)
        ok = report("dt_zero_create", dt_zero_create(mesh, &zo, &m->z));
    if (ok)
        ok = report("dt_zero_add_group", dt_zero_add_group(m->z, NT, names, m->p, &hp, NULL));
    ok = bu_ok_all(ok);
    if (ok)
        ok = bu_ok_all(report("warm-up step", dt_zero_step(m->z, m->g, NULL)));
    m->host_measured = requested() - b0;
    if (ok)
        ok = report("dt_zero_memory_usage", dt_zero_memory_usage(m->z, &m->api));
    dt_layout_destroy(rep);
    dt_layout_destroy(part);
    return bu_ok_all(ok);
}

static void omodel_destroy(omodel *m)
{
    model_free(m->z, m->p, m->g, NT);
}

/* CRC32C of this rank's parameters (read back from the device). */
static uint32_t oparams_crc(const omodel *m, const opts *o)
{
    size_t bytes = (size_t)(o->params / NT) * 2;
    void *buf = malloc(bytes);
    uint32_t c = 0;
    for (int k = 0; buf && k < NT; k++)
        if (dt_tensor_local_read(m->p[k], 0, buf, bytes) == DT_OK)
            c = dt_crc32c(c, buf, bytes);
    free(buf);
    return c;
}

/* Stages 1 and 2 with and without offload: device bytes held (the optimizer's report) against
 * the formula, host bytes (report and host pool), step times interleaved, and the same
 * parameters after the same steps. */
static int offload_case(const dt_mesh *mesh, const opts *o)
{
    int good = 1;
    for (int stage = 1; stage <= 2 && good; stage++) {
        omodel m[2];
        memset(m, 0, sizeof m);
        good = omodel_setup(&m[0], stage, 0, mesh, o) && omodel_setup(&m[1], stage, 1, mesh, o);
        for (int r = 0; r < o->reps && good; r++)
            for (int i = 0; i < 2 && good; i++) {
                omodel *x = &m[(r + i) % 2];
                MPI_Barrier(MPI_COMM_WORLD);
                double t0 = MPI_Wtime();
                int ok = report("timed step", dt_zero_step(x->z, x->g, NULL));
                x->times[r] = bu_max_all(MPI_Wtime() - t0);
                good = bu_ok_all(ok);
            }
        uint32_t c0 = good ? oparams_crc(&m[0], o) : 0, c1 = good ? oparams_crc(&m[1], o) : 1;
        int same = bu_ok_all(c0 == c1);
        if (good && g_rank == 0) {
            double p = (double)o->params, n = g_nclients;
            const dt_zero_memory *a = &m[0].api, *b = &m[1].api;
            double dev0 = (double)(a->param_bytes + a->grad_bytes + a->state_bytes);
            double dev1 = (double)(b->param_bytes + b->grad_bytes + b->state_bytes);
            double t0 = bu_median(m[0].times, o->reps), t1 = bu_median(m[1].times, o->reps);
            bu_line line;
            bu_line_init(&line);
            bu_line_add(&line, "case", "offload");
            bu_line_add(&line, "stage", "%d", stage);
            bu_line_add(&line, "np", "%d", g_nclients);
            bu_line_add(&line, "params", "%lld", (long long)o->params);
            bu_line_add(&line, "device_saved_bytes", "%.0f", dev0 - dev1);
            bu_line_add(&line, "formula_bytes", "%.0f", 12.0 * p / n);
            bu_line_add(&line, "saved_ratio", "%.4f", (dev0 - dev1) / (12.0 * p / n));
            bu_line_add(&line, "device_bytes", "%.0f", dev1);
            bu_line_add(&line, "device_bytes_no_offload", "%.0f", dev0);
            bu_line_add(&line, "host_bytes", "%llu", (unsigned long long)b->host_bytes);
            bu_line_add(&line, "host_pool_bytes", "%llu",
                        (unsigned long long)m[1].host_measured);
            bu_line_add(&line, "step_ratio", "%.3f", t1 / t0);
            bu_line_add(&line, "step_ms", "%.2f", t1 * 1e3);
            bu_line_add(&line, "no_offload_ms", "%.2f", t0 * 1e3);
            bu_line_add(&line, "reps", "%d", o->reps);
            bu_line_add(&line, "check", "%s", same ? "ok" : "FAIL_params_differ");
            bu_line_print(&line);
        } else if (!good && g_rank == 0) {
            printf("case=offload stage=%d np=%d params=%lld error=step_failed\n", stage,
                   g_nclients, (long long)o->params);
        }
        good = good && same;
        omodel_destroy(&m[0]);
        omodel_destroy(&m[1]);
    }
    return good;
}

/* The offload case alone, on one GPU per process (DT_GPU=sim where there is none). */
static int offload_main(const opts *o)
{
    const char *names[1] = {"batch"};
    int64_t size = dt_num_global_devices(DT_DEVICE_GPU);
    dt_mesh *mesh = NULL;
    int good = dt_num_local_devices(DT_DEVICE_GPU) == 1;
    if (!bu_ok_all(good)) {
        if (g_rank == 0)
            fprintf(stderr, "bench_zero: case offload needs one GPU device per process "
                            "(DT_GPU_DEVICES=1; DT_GPU=sim simulates one)\n");
        return 0;
    }
    good = bu_ok_all(report("mesh", dt_mesh_create("dp", 1, names, &size, DT_DEVICE_GPU, &mesh)));
    if (good && g_rank == 0) {
        printf("# bench_zero offload: %d process(es), 1 GPU device each; mixed-precision Adam, "
               "%lld parameters in %d tensors, all-gather chunk %lld elements\n",
               g_nclients, (long long)o->params, NT, (long long)o->allgather);
        fflush(stdout);
    }
    good = good && offload_case(mesh, o);
    dt_mesh_destroy(mesh);
    return good;
}

/* ---- stage 3: sharded parameters gathered layer by layer ------------------------------- */

enum { S3_LAYERS = 8 };

/* One training loop's model for the stage 3 case: S3_LAYERS bf16 layers [rows, ROW], one
 * group each, and their gradients (partial over batch, kept: the caller's inputs). */
typedef struct s3model {
    int stage;
    dt_tensor *p[S3_LAYERS], *g[S3_LAYERS];
    dt_zero *z;
    uint64_t base_bytes, held_bytes, peak_bytes, fwd_peak_bytes;
    double times[MAX_REPS];
} s3model;

/* One iteration: the forward pass (layer k gathered, k + 1 prefetched, the stand-in compute,
 * k released), the backward pass in reverse (gathered again, k - 1 prefetched, compute,
 * released, its gradient to dt_zero_grad_ready), the step. In stage 0 the gather calls are
 * no-ops: the same loop. */
static int s3_forward(s3model *m, float *buf, int64_t iters)
{
    int ok = 1;
    for (int k = 0; k < S3_LAYERS && ok; k++) {
        ok = report("gather", dt_zero_gather(m->z, k));
        if (ok && k + 1 < S3_LAYERS)
            ok = report("prefetch", dt_zero_prefetch(m->z, k + 1));
        layer_compute(buf, OV_BUF, iters);
        ok = ok && report("release", dt_zero_release(m->z, k));
    }
    return ok;
}

static int s3_backward_step(s3model *m, float *buf, int64_t iters)
{
    int ok = 1;
    for (int k = S3_LAYERS - 1; k >= 0 && ok; k--) {
        ok = report("gather", dt_zero_gather(m->z, k));
        if (ok && k > 0)
            ok = report("prefetch", dt_zero_prefetch(m->z, k - 1));
        layer_compute(buf, OV_BUF, iters);
        ok = ok && report("release", dt_zero_release(m->z, k));
        ok = ok && report("grad_ready", dt_zero_grad_ready(m->z, k, m->g[k]));
    }
    return ok && report("step", dt_zero_step(m->z, NULL, NULL));
}

static int s3_iteration(s3model *m, float *buf, int64_t iters)
{
    return s3_forward(m, buf, iters) && s3_backward_step(m, buf, iters);
}

static int s3_setup(s3model *m, int stage, const dt_mesh *mesh, const opts *o, float *buf,
                    int64_t iters)
{
    memset(m, 0, sizeof *m);
    m->stage = stage;
    int64_t shape[2] = {o->params / S3_LAYERS / ROW, ROW};
    dt_layout *rep = NULL, *part = NULL;
    int ok = model_layouts(mesh, &rep, &part);
    int64_t j = -1;
    for (int k = 0; ok && k < S3_LAYERS; k++) {
        ok = report("gradient", dt_tensor_zeros(part, DT_DTYPE_BF16, shape, &m->g[k]));
        if (ok && j < 0)
            j = dt_tensor_local_position(m->g[k], 0);
        if (ok)
            ok = report("gradient", fill(dt_tensor_local(m->g[k], 0)->data, o->params / S3_LAYERS,
                                         k, (int)j, 1));
    }
    uint64_t b1 = requested();
    dt_zero_opts zo = DT_ZERO_OPTS_INIT;
    zo.stage = stage;
    zo.allgather_size = o->allgather;
    zo.reduce_bucket_size = o->params / S3_LAYERS / 2; /* a quarter of a layer's bf16 bytes */
    dt_optim_hparams hp = DT_OPTIM_ADAM_INIT;
    if (ok)
        ok = report("dt_zero_create", dt_zero_create(mesh, &zo, &m->z));
    for (int k = 0; ok && k < S3_LAYERS; k++) {
        char name[16];
        const char *names[1] = {name};
        snprintf(name, sizeof name, "layer%d.w", k);
        ok = report("parameter", dt_tensor_zeros(rep, DT_DTYPE_BF16, shape, &m->p[k]));
        if (ok)
            ok = report("parameter",
                        fill(dt_tensor_local(m->p[k], 0)->data, o->params / S3_LAYERS, k, 0, 0));
        if (ok)
            ok =
                report("dt_zero_add_group", dt_zero_add_group(m->z, 1, names, &m->p[k], &hp, NULL));
        if (ok && stage == 3) {
            dt_tensor_destroy(m->p[k]); /* the optimizer's shards hold it now */
            m->p[k] = NULL;
        }
    }
    ok = bu_ok_all(ok);
    if (ok)
        ok = bu_ok_all(s3_iteration(m, buf, iters));
    m->base_bytes = b1;
    dt_layout_destroy(rep);
    dt_layout_destroy(part);
    return ok;
}

/* One sampled iteration: the bytes held between iterations (above the caller's gradients)
 * and the peaks above them, of the forward pass and of the whole iteration. */
static int s3_measure(s3model *m, float *buf, int64_t iters)
{
    int ok = 1;
    {
        uint64_t before = requested();
        m->held_bytes = before - m->base_bytes;
        atomic_store(&g_peak, before);
        atomic_store(&g_sampling, 1);
        pthread_t th;
        int have = pthread_create(&th, NULL, sampler, NULL) == 0;
        ok = s3_forward(m, buf, iters);
        m->fwd_peak_bytes = atomic_load(&g_peak) - before;
        ok = ok && s3_backward_step(m, buf, iters);
        atomic_store(&g_sampling, 0);
        if (have)
            pthread_join(th, NULL);
        m->peak_bytes = atomic_load(&g_peak) - before;
        ok = bu_ok_all(ok);
    }
    return ok;
}

static void s3_destroy(s3model *m)
{
    model_free(m->z, m->p, m->g, S3_LAYERS);
}

/* Stage 3 against stage 0 on the same layered loop: the bytes held between iterations against
 * 16P/N, the peak of an iteration above them in layers (what is gathered at once: the layer in
 * use and the one prefetched, plus the gradient chunk in reduction), and the iteration time
 * (interleaved with stage 0's) with a per-layer compute stand-in calibrated to one layer's
 * gather. */
static int stage3_case(const dt_mesh *mesh, const opts *o)
{
    float *buf = calloc(OV_BUF, sizeof *buf);
    s3model ms[2];
    memset(ms, 0, sizeof ms);
    int good = buf != NULL;
    /* The compute stand-in: about one layer's all-gather, timed once. */
    double sweep = 0;
    for (int r = 0; r < 3 && good; r++) {
        double t0 = MPI_Wtime();
        layer_compute(buf, OV_BUF, 4);
        double d = bu_max_all((MPI_Wtime() - t0) / 4);
        sweep = r == 0 || d < sweep ? d : sweep;
    }
    good = good && s3_setup(&ms[1], 3, mesh, o, buf, 0);
    double gt = 0;
    for (int r = 0; r < 3 && good; r++) {
        MPI_Barrier(MPI_COMM_WORLD);
        double t0 = MPI_Wtime();
        good = report("gather", dt_zero_gather(ms[1].z, 0)) &&
               report("release", dt_zero_release(ms[1].z, 0));
        double d = bu_max_all(MPI_Wtime() - t0);
        gt = r == 0 || d < gt ? d : gt;
        good = bu_ok_all(good);
    }
    int64_t iters = sweep > 0 ? (int64_t)(gt / sweep + 0.5) : 1;
    if (iters < 1)
        iters = 1;
    good = good && s3_measure(&ms[1], buf, iters);
    good = good && s3_setup(&ms[0], 0, mesh, o, buf, iters) && s3_measure(&ms[0], buf, iters);
    for (int r = 0; r < o->reps && good; r++)
        for (int i = 0; i < 2 && good; i++) {
            s3model *m = &ms[(r + i) % 2];
            MPI_Barrier(MPI_COMM_WORLD);
            double t0 = MPI_Wtime();
            int ok = s3_iteration(m, buf, iters);
            m->times[r] = bu_max_all(MPI_Wtime() - t0);
            good = bu_ok_all(ok);
        }
    /* Both took the same steps on the same gradients: the parameters must agree. */
    const char *check = "FAIL";
    for (int k = 0; good && k < S3_LAYERS; k++) {
        dt_tensor *t = NULL;
        good = bu_ok_all(report("gather", dt_zero_gather(ms[1].z, k)) &&
                         report("param", dt_zero_param(ms[1].z, k, &t)));
        int same = good && memcmp(dt_tensor_local(t, 0)->data, dt_tensor_local(ms[0].p[k], 0)->data,
                                  (size_t)(o->params / S3_LAYERS) * 2) == 0;
        good = good && report("release", dt_zero_release(ms[1].z, k));
        if (k == 0)
            check = "ok";
        if (!bu_ok_all(same))
            check = "FAIL_params_differ";
    }
    if (good) {
        uint64_t mine[4] = {ms[1].held_bytes, ms[1].peak_bytes, ms[0].held_bytes,
                            ms[1].fwd_peak_bytes};
        uint64_t *all = malloc(sizeof(uint64_t) * 4 * (size_t)g_nclients);
        MPI_Gather(mine, 4, MPI_UINT64_T, all, 4, MPI_UINT64_T, 0, MPI_COMM_WORLD);
        double med3 = bu_median(ms[1].times, o->reps), med0 = bu_median(ms[0].times, o->reps);
        double p = (double)o->params, n = g_nclients, layer = 2.0 * p / S3_LAYERS;
        double f = 16.0 * p / n;
        /* The bound on the reduction's host staging: max_live_bucket_bytes (default, twice
         * the bucket: half a layer's bf16 gradient) times (2N - 1) / N (each bucket's summand
         * and the N - 1 peers' summands of this rank's part). */
        double live = 2.0 * (double)(o->params / S3_LAYERS / 2);
        double staging = n > 1 ? live * (2 * n - 1) / n : 0;
        for (int r = 0; g_rank == 0 && r < g_nclients; r++) {
            const uint64_t *v = all + 4 * r;
            bu_line line;
            bu_line_init(&line);
            bu_line_add(&line, "case", "stage3");
            bu_line_add(&line, "np", "%d", g_nclients);
            bu_line_add(&line, "rank", "%d", r);
            bu_line_add(&line, "params", "%lld", (long long)o->params);
            bu_line_add(&line, "layers", "%d", S3_LAYERS);
            bu_line_add(&line, "steady_ratio", "%.4f", (double)v[0] / f);
            bu_line_add(&line, "peak_ratio", "%.4f",
                        ((double)v[0] + (double)v[1]) / (f + 2 * layer + staging));
            bu_line_add(&line, "peak_ratio_2layers", "%.4f",
                        ((double)v[0] + (double)v[1]) / (f + 2 * layer));
            bu_line_add(&line, "fwd_peak_ratio", "%.4f",
                        ((double)v[0] + (double)v[3]) / (f + 2 * layer));
            bu_line_add(&line, "fwd_live_layers", "%.2f", (double)v[3] / layer);
            bu_line_add(&line, "live_layers", "%.2f", (double)v[1] / layer);
            bu_line_add(&line, "held_bytes", "%llu", (unsigned long long)v[0]);
            bu_line_add(&line, "peak_extra_bytes", "%llu", (unsigned long long)v[1]);
            bu_line_add(&line, "formula_bytes", "%.0f", f);
            bu_line_add(&line, "layer_bytes", "%.0f", layer);
            bu_line_add(&line, "staging_bound_bytes", "%.0f", staging);
            bu_line_add(&line, "stage0_held_bytes", "%llu", (unsigned long long)v[2]);
            bu_line_add(&line, "step_ratio", "%.3f", med3 / med0);
            bu_line_add(&line, "iter_ms", "%.2f", med3 * 1e3);
            bu_line_add(&line, "stage0_iter_ms", "%.2f", med0 * 1e3);
            bu_line_add(&line, "gather_ms", "%.2f", gt * 1e3);
            bu_line_add(&line, "reps", "%d", o->reps);
            bu_line_add(&line, "check", "%s", check);
            bu_line_print(&line);
        }
        free(all);
    } else if (g_rank == 0) {
        printf("case=stage3 np=%d params=%lld error=step_failed\n", g_nclients,
               (long long)o->params);
    }
    s3_destroy(&ms[0]);
    s3_destroy(&ms[1]);
    free(buf);
    return good && strcmp(check, "ok") == 0;
}

static int usage(void)
{
    fprintf(stderr,
            "usage: bench_zero [--params P] [--allgather N] [--reps N] [--quick]\n"
            "                  [--cases memory,speed,overlap,stage3 | offload]\n"
            "  P: parameters (a multiple of %d), default 8388608; N: all-gather chunk\n"
            "  elements, default P/16; one CPU device per process (DT_CPU_DEVICES=1), or\n"
            "  for case offload (run alone) one GPU device per process (DT_GPU_DEVICES=1)\n",
            S3_LAYERS * ROW);
    return 2;
}

static int parse_args(int argc, char **argv, opts *o)
{
    *o = (opts){8388608, 0, 0, 10, "memory,speed,overlap,stage3"};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(a, "--quick") == 0) {
            o->reps = 3;
            continue;
        }
        if (!v)
            return usage();
        i++;
        if (strcmp(a, "--params") == 0)
            o->params = atoll(v);
        else if (strcmp(a, "--allgather") == 0)
            o->allgather = atoll(v);
        else if (strcmp(a, "--reps") == 0)
            o->reps = atoi(v);
        else if (strcmp(a, "--cases") == 0)
            o->cases = v;
        else
            return usage();
    }
    if (o->params < S3_LAYERS * ROW || o->params % (S3_LAYERS * ROW) != 0 || o->allgather < 0 ||
        o->reps < 1 || o->reps > MAX_REPS)
        return usage();
    if (o->allgather == 0)
        o->allgather = o->params / 16;
    return 0;
}

int main(int argc, char **argv)
{
    opts o;
    int rc = parse_args(argc, argv, &o);
    if (rc != 0)
        return rc;
    dt_init_opts io = DT_INIT_OPTS_INIT;
    dt_status st = dt_init(&argc, &argv, &io);
    if (st != DT_OK) {
        fprintf(stderr, "bench_zero: dt_init: %s: %s\n", dt_status_name(st), dt_last_error());
        return 1;
    }
    g_rank = dt_client_id();
    g_nclients = dt_num_clients();
    if (bu_list_has(o.cases, "offload")) {
        int ok = offload_main(&o);
        dt_finalize();
        return ok ? 0 : 1;
    }
    const char *names[1] = {"batch"};
    int64_t size = dt_num_global_devices(DT_DEVICE_CPU);
    dt_mesh *mesh = NULL;
    int good = report("mesh", dt_mesh_create("dp", 1, names, &size, DT_DEVICE_CPU, &mesh));
    /* The overlap case alone may run with several devices per process: one process driving
     * 2 devices on 2 cores leaves a core to its progress thread (docs/bench.md). */
    int ndev = dt_num_local_devices(DT_DEVICE_CPU);
    if (good && ndev != 1 && strcmp(o.cases, "overlap") != 0) {
        if (g_rank == 0)
            fprintf(stderr, "bench_zero: run with one CPU device per process "
                            "(DT_CPU_DEVICES=1), or --cases overlap alone\n");
        good = 0;
    }
    if (!bu_ok_all(good)) {
        dt_mesh_destroy(mesh);
        dt_finalize();
        return 1;
    }
    if (g_rank == 0) {
        printf("# bench_zero: %d process(es), %d CPU device(s) each; mixed-precision Adam (bf16 "
               "parameters and gradients, f32 master and moments), %lld parameters in %d "
               "tensors, all-gather chunk %lld elements\n",
               g_nclients, ndev, (long long)o.params, NT, (long long)o.allgather);
        fflush(stdout);
    }
    model ms[NSTAGES];
    memset(ms, 0, sizeof ms);
    for (int s = 0; s < NSTAGES && good; s++)
        good = model_setup(&ms[s], s, mesh, &o);
    int set_up = good;
    const char *check = "FAIL_setup";
    double med[NSTAGES] = {0};
    int timed = bu_list_has(o.cases, "speed");
    if (good && timed)
        good = time_steps(ms, &o, med);
    if (good) {
        check = check_params(ms, &o);
        if (timed)
            speed_lines(ms, &o, med, check);
        if (bu_list_has(o.cases, "memory"))
            memory_lines(ms, &o, check);
    } else if (g_rank == 0) {
        printf("case=zero np=%d params=%lld error=%s\n", g_nclients, (long long)o.params,
               set_up ? "step_failed" : "setup_failed");
    }
    good = good && strcmp(check, "ok") == 0;
    if (good && bu_list_has(o.cases, "overlap"))
        good = overlap_case(mesh, &o);
    if (good && bu_list_has(o.cases, "stage3"))
        good = stage3_case(mesh, &o);
    for (int s = 0; s < NSTAGES; s++)
        model_destroy(&ms[s]);
    if (good && bu_list_has(o.cases, "reduce"))
        good = reduce_case(mesh, &o);
    dt_mesh_destroy(mesh);
    dt_finalize();
    return good ? 0 : 1;
}
