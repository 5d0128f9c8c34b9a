/* The simulated accelerator (DT_GPU=sim, DT_GPU_DEVICES=4, DT_SIM_MEMORY_MB=64): host code
 * touching its memory dies of SIGSEGV, its kernels and copies give the CPU kernels' bits, its
 * work is asynchronous with sticky errors that surface at sync, running out of its memory is
 * a clear error that loses nothing, its allocator is thread-safe, and a GPU mesh works end to
 * end on it against host references. */
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"
#include "ops/ops_impl.h"
#include "runtime/device.h"
#include "runtime/error.h"
#include "runtime/sim.h"

static const dt__device *gpu(int i)
{
    const dt__device *d = dt__device_local(DT_DEVICE_GPU, i);
    CU_ASSERT_PTR_NOT_NULL_FATAL(d);
    return d;
}

static void *dev_alloc(const dt__device *d, size_t bytes)
{
    void *p = NULL;
    DT_ASSERT_OK(d->kind->alloc(d, bytes, &p));
    return p;
}

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* ---- a gate: a stream item that waits until the test opens it ---- */

static atomic_int gate_open, probe_ran;

static dt_status gate_fn(void *arg)
{
    while (!atomic_load(&gate_open))
        sleep_ms(1);
    return DT_OK;
}

static dt_status probe_fn(void *arg)
{
    atomic_store(&probe_ran, 1);
    return DT_OK;
}

static void close_gate(const dt__device *d)
{
    atomic_store(&gate_open, 0);
    DT_ASSERT_OK(dt__sim_submit(d->ordinal, gate_fn, NULL, 0));
}

/* ---- host access to device memory ---- */

static int fault_pipe = -1;

static void report_fault(int sig, siginfo_t *info, void *ctx)
{
    void *addr = info->si_addr;
    ssize_t w = write(fault_pipe, &addr, sizeof addr);
    (void)w;
    /* SA_RESETHAND restored the default action: returning re-runs the access, which kills. */
}

/* Runs a host load (write = 0) or store at p in a child process; returns the child's wait
 * status and in *addr_out the faulting address it reported (NULL if none). */
static int host_access_in_child(volatile float *p, int write_it, void **addr_out)
{
    int fds[2];
    CU_ASSERT_FATAL(pipe(fds) == 0);
    fflush(NULL);
    pid_t pid = fork();
    CU_ASSERT_FATAL(pid >= 0);
    if (pid == 0) {
        close(fds[0]);
        fault_pipe = fds[1];
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_sigaction = report_fault;
        sa.sa_flags = SA_SIGINFO | SA_RESETHAND;
        sigaction(SIGSEGV, &sa, NULL);
        if (write_it)
            *p = 1.0f;
        else
            (void)*p;
        _exit(0);
    }
    close(fds[1]);
    int status = 0;
    CU_ASSERT_FATAL(waitpid(pid, &status, 0) == pid);
    *addr_out = NULL;
    if (read(fds[0], addr_out, sizeof *addr_out) != (ssize_t)sizeof *addr_out)
        *addr_out = NULL;
    close(fds[0]);
    return status;
}

static void assert_access_kills(volatile float *p, int write_it)
{
    void *addr = NULL;
    int status = host_access_in_child(p, write_it, &addr);
    CU_ASSERT(WIFSIGNALED(status) && WTERMSIG(status) == SIGSEGV);
    CU_ASSERT_PTR_EQUAL(addr, (void *)p);
}

static void test_host_read_or_write_of_sim_memory_dies_of_sigsegv(void)
{
    const dt__device *d = gpu(1);
    float *x = dev_alloc(d, 4096 * sizeof(float));
    float one = 1.0f;
    DT_ASSERT_OK(d->kind->fill(d, x, 4096, &one, sizeof one));
    DT_ASSERT_OK(d->kind->sync(d));
    assert_access_kills(x, 0);
    assert_access_kills(x + 4095, 1);
    /* The same child on host memory runs to its end: the check can tell the two apart. */
    static float host = 2.0f;
    void *addr = NULL;
    int status = host_access_in_child(&host, 1, &addr);
    CU_ASSERT(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    CU_ASSERT_PTR_NULL(addr);
    d->kind->free(d, x);

    /* A GPU-mesh tensor's DLPack data is such memory too. */
    dt_mesh *mesh = NULL;
    dt_layout *rep = NULL;
    dt_tensor *t = NULL;
    DT_ASSERT_OK(dt_mesh_create("g", 1, (const char *const[]){"x"}, (const int64_t[]){4},
                                DT_DEVICE_GPU, &mesh));
    DT_ASSERT_OK(dt_layout_replicated(mesh, 1, &rep));
    DT_ASSERT_OK(dt_tensor_filled(rep, DT_DTYPE_F32, (const int64_t[]){16}, &one, &t));
    const DLTensor *c = dt_tensor_local(t, 2);
    CU_ASSERT_EQUAL(c->device.device_type, kDLCUDA);
    CU_ASSERT_EQUAL(c->device.device_id, gpu(2)->ordinal);
    assert_access_kills(c->data, 0);
    dt_tensor_destroy(t);
    dt_layout_destroy(rep);
    dt_mesh_destroy(mesh);
}

/* ---- every kernel against the CPU kernels ---- */

enum { ROWS = 25, COLS = 40, N = ROWS * COLS, SLOTS = 24 };

typedef struct io {
    float *a, *b, *bias, *out; /* out: SLOTS * N */
    int32_t *labels;
} io;

/* Queues every kernel of the table on io's buffers, each writing its own slot of out. */
static void run_every_kernel(const dt__ops_backend *be, const io *m)
{
    float *s[SLOTS];
    for (int i = 0; i < SLOTS; i++)
        s[i] = m->out + (size_t)i * N;
    dt_sgd_opts sgd = DT_SGD_OPTS_INIT;
    dt_adam_opts adam = DT_ADAMW_OPTS_INIT;
    sgd.lr = 0.1f;
    sgd.momentum = 0.9f;
    if (be->set_device)
        DT_ASSERT_OK(be->set_device(0));
    DT_ASSERT_OK(be->gemm(0, 1, ROWS, ROWS, COLS, 1.5f, m->a, DT_DTYPE_F32, COLS, m->b,
                          DT_DTYPE_F32, COLS, 0.0f, s[0], ROWS));
    DT_ASSERT_OK(be->add(N, m->a, m->b, s[1]));
    DT_ASSERT_OK(be->sub(N, m->a, m->b, s[2]));
    DT_ASSERT_OK(be->mul(N, m->a, m->b, s[3]));
    DT_ASSERT_OK(be->scale(N, 0.75f, m->a, s[4]));
    DT_ASSERT_OK(be->copy(N, m->b, s[5]));
    DT_ASSERT_OK(be->axpy(N, -2.0f, m->a, s[5]));
    DT_ASSERT_OK(be->fill(N, 3.25f, s[6]));
    DT_ASSERT_OK(be->copy(N, m->a, s[7]));
    DT_ASSERT_OK(be->bias_add(ROWS, COLS, m->bias, s[7]));
    DT_ASSERT_OK(be->bias_grad(ROWS, COLS, m->a, s[8]));
    DT_ASSERT_OK(be->relu(N, m->a, s[9]));
    DT_ASSERT_OK(be->relu_grad(N, m->a, m->b, s[10]));
    DT_ASSERT_OK(be->gelu(N, m->a, s[11]));
    DT_ASSERT_OK(be->gelu_grad(N, m->a, m->b, s[12]));
    DT_ASSERT_OK(be->softmax_xent(ROWS, COLS, m->a, m->labels, 0.04f, s[13]));
    DT_ASSERT_OK(be->softmax_xent_grad(ROWS, COLS, m->a, m->labels, 0.04f, s[14]));
    DT_ASSERT_OK(be->sum(N, m->a, s[15]));
    DT_ASSERT_OK(be->max(N, m->a, s[15] + 1));
    DT_ASSERT_OK(be->mean(N, m->a, s[15] + 2));
    DT_ASSERT_OK(be->sq_norm(N, m->a, s[15] + 3));
    DT_ASSERT_OK(be->reduce_axis(DT_REDUCE_MAX, 5, 8, 25, m->a, s[16]));
    DT_ASSERT_OK(be->nonfinite(N, m->b, DT_DTYPE_F32, (int32_t *)s[17]));
    DT_ASSERT_OK(be->cast(N, m->a, DT_DTYPE_F32, s[18], DT_DTYPE_BF16));
    DT_ASSERT_OK(be->copy(N, m->a, s[19]));
    DT_ASSERT_OK(be->copy(N, m->b, s[20]));
    DT_ASSERT_OK(be->sgd(N, &sgd, s[19], m->b, s[20]));
    DT_ASSERT_OK(be->copy(N, m->a, s[21]));
    DT_ASSERT_OK(be->fill(N, 0.0f, s[22]));
    DT_ASSERT_OK(be->fill(N, 0.5f, s[23]));
    DT_ASSERT_OK(be->adam(N, &adam, 3, s[21], m->b, s[22], s[23]));
    /* The options were the caller's stack: a kernel still queued must have its own copy. */
    sgd.lr = adam.lr = 1e9f;
}

static void test_sim_kernels_and_copies_give_the_cpu_kernels_bits(void)
{
    const dt__device *d = gpu(3);
    const dt__ops_backend *sim = d->kind->ops(), *cpu = dt__ops_cpu_backend();
    CU_ASSERT_STRING_EQUAL(sim->name, "sim");
    size_t in_bytes = (size_t)(3 * N + COLS) * sizeof(float);
    size_t out_bytes = (size_t)SLOTS * N * sizeof(float);
    float *host_in = malloc(in_bytes), *host_out = calloc(1, out_bytes);
    float *back = malloc(out_bytes);
    CU_ASSERT_FATAL(host_in && host_out && back);
    uint32_t r = 12345;
    for (int i = 0; i < 2 * N + COLS; i++) {
        r = r * 1664525u + 1013904223u;
        host_in[i] = (float)(int32_t)(r >> 8) / (float)(1 << 22); /* about -2..2 */
    }
    host_in[N + 7] = (float)NAN; /* b: nonfinite finds it */
    int32_t *labels = (int32_t *)(host_in + 2 * N + COLS);
    for (int i = 0; i < ROWS; i++)
        labels[i] = (i * 7) % COLS;
    io h = {host_in, host_in + N, host_in + 2 * N, host_out, labels};

    char *din = dev_alloc(d, in_bytes);
    float *dout = dev_alloc(d, out_bytes);
    DT_ASSERT_OK(d->kind->copy(d, DT__COPY_H2D, din, host_in, in_bytes));
    DT_ASSERT_OK(d->kind->memset0(d, dout, out_bytes));
    io g = {(float *)din, (float *)din + N, (float *)din + 2 * N, dout,
            (int32_t *)((float *)din + 2 * N + COLS)};

    run_every_kernel(cpu, &h);
    close_gate(d); /* everything queues behind it: the calls above cannot have run yet */
    run_every_kernel(sim, &g);
    atomic_store(&gate_open, 1);
    DT_ASSERT_OK(sim->sync());
    DT_ASSERT_OK(d->kind->copy(d, DT__COPY_D2H, back, dout, out_bytes));
    for (int i = 0; i < SLOTS; i++) {
        int same = memcmp(back + (size_t)i * N, host_out + (size_t)i * N, N * sizeof(float)) == 0;
        if (!same)
            fprintf(stderr, "slot %d differs from the CPU kernels\n", i);
        CU_ASSERT(same);
    }
    CU_ASSERT_EQUAL(((int32_t *)host_out)[17 * N], 1); /* the reference did find the NaN */

    /* Device copies: D2D between two devices, a fill, a reduction and a divide. */
    const dt__device *e = gpu(0);
    float *y = dev_alloc(e, N * sizeof(float)), *ref = malloc(N * sizeof(float));
    DT_ASSERT_OK(e->kind->copy(e, DT__COPY_D2D, y, din, N * sizeof(float)));
    DT_ASSERT_OK(e->kind->reduce_into(e, DT_REDUCE_SUM, DT_DTYPE_F32, y, din + N * sizeof(float),
                                      N));
    DT_ASSERT_OK(e->kind->divide(e, DT_DTYPE_F32, y, N, 3));
    DT_ASSERT_OK(e->kind->copy(e, DT__COPY_D2H, back, y, N * sizeof(float)));
    memcpy(ref, host_in, N * sizeof(float));
    dt__host_reduce(DT_REDUCE_SUM, DT_DTYPE_F32, ref, host_in + N, N);
    dt__host_divide(DT_DTYPE_F32, ref, N, 3);
    CU_ASSERT_EQUAL(memcmp(back, ref, N * sizeof(float)), 0);
    uint16_t half = 0x3c00;
    DT_ASSERT_OK(e->kind->fill(e, y, 7, &half, sizeof half));
    DT_ASSERT_OK(e->kind->copy(e, DT__COPY_D2H, back, y, 7 * sizeof half));
    for (int i = 0; i < 7; i++)
        CU_ASSERT_EQUAL(((uint16_t *)back)[i], 0x3c00);

    /* A host pointer where the device's memory belongs is refused, as it would fault on a GPU. */
    DT_ASSERT_FAILS(sim->add(N, host_in, g.b, dout), DT_ERR_INVALID_ARGUMENT);
    DT_ASSERT_ERROR_MENTIONS("not simulated device memory");
    DT_ASSERT_FAILS(e->kind->copy(e, DT__COPY_D2H, back, host_in, 16), DT_ERR_INVALID_ARGUMENT);
    e->kind->free(e, y);
    d->kind->free(d, din);
    d->kind->free(d, dout);
    free(ref);
    free(back);
    free(host_out);
    free(host_in);
}

/* ---- asynchrony and errors ---- */

static void test_sim_work_is_asynchronous_and_sync_waits_for_it(void)
{
    const dt__device *d = gpu(0);
    float *x = dev_alloc(d, N * sizeof(float)), v = 7.0f, back[N];
    close_gate(d);
    atomic_store(&probe_ran, 0);
    DT_ASSERT_OK(d->kind->fill(d, x, N, &v, sizeof v));
    DT_ASSERT_OK(dt__sim_submit(d->ordinal, probe_fn, NULL, 0));
    sleep_ms(20);
    CU_ASSERT_EQUAL(atomic_load(&probe_ran), 0); /* both calls returned; nothing ran */
    atomic_store(&gate_open, 1);
    DT_ASSERT_OK(d->kind->sync(d));
    CU_ASSERT_EQUAL(atomic_load(&probe_ran), 1);
    DT_ASSERT_OK(d->kind->copy(d, DT__COPY_D2H, back, x, sizeof back));
    for (int i = 0; i < N; i++)
        CU_ASSERT_EQUAL(back[i], 7.0f);
    d->kind->free(d, x);
}

static dt_status failing_fn(void *arg)
{
    return dt__error(DT_ERR_IO, "probe failure %d", *(const int *)arg);
}

static void test_sim_failing_kernel_surfaces_at_sync_and_later_work_runs(void)
{
    const dt__device *d = gpu(2);
    const dt__ops_backend *be = d->kind->ops();
    float *x = dev_alloc(d, N * sizeof(float)), back[N];
    DT_ASSERT_OK(be->set_device(d->ordinal));
    close_gate(d); /* all three queue before the failure is seen */
    DT_ASSERT_OK(be->fill(N, 1.0f, x));
    DT_ASSERT_OK(be->add(-1, x, x, x)); /* queued; fails on the stream */
    DT_ASSERT_OK(be->fill(N, 5.0f, x)); /* skipped behind the failure */
    dt_clear_error();
    atomic_store(&gate_open, 1);
    DT_ASSERT_FAILS(be->sync(), DT_ERR_INVALID_ARGUMENT);
    DT_ASSERT_ERROR_MENTIONS("dt_kernel_add: negative size -1");
    DT_ASSERT_OK(d->kind->copy(d, DT__COPY_D2H, back, x, sizeof back));
    CU_ASSERT_EQUAL(back[0], 1.0f);
    CU_ASSERT_EQUAL(back[N - 1], 1.0f);
    DT_ASSERT_OK(be->fill(N, 2.0f, x));
    DT_ASSERT_OK(be->sync());
    DT_ASSERT_OK(d->kind->copy(d, DT__COPY_D2H, back, x, sizeof back));
    CU_ASSERT_EQUAL(back[0], 2.0f);
    CU_ASSERT_EQUAL(back[N - 1], 2.0f);

    /* A stream failure also comes back from the next submit, to the calling thread, with
     * its message; that submit queues nothing and what was queued behind it never runs. */
    int code = 42;
    DT_ASSERT_OK(dt__sim_submit(d->ordinal, failing_fn, &code, sizeof code));
    DT_ASSERT_FAILS(d->kind->sync(d), DT_ERR_IO);
    DT_ASSERT_ERROR_MENTIONS("probe failure 42");
    code = 43;
    atomic_store(&probe_ran, 0);
    DT_ASSERT_OK(dt__sim_submit(d->ordinal, failing_fn, &code, sizeof code));
    dt_clear_error();
    dt_status st;
    while ((st = dt__sim_submit(d->ordinal, probe_fn, NULL, 0)) == DT_OK)
        sleep_ms(1);
    CU_ASSERT_EQUAL(st, DT_ERR_IO);
    DT_ASSERT_ERROR_MENTIONS("probe failure 43");
    DT_ASSERT_OK(d->kind->sync(d));
    CU_ASSERT_EQUAL(atomic_load(&probe_ran), 0);
    DT_ASSERT_OK(dt__sim_submit(d->ordinal, probe_fn, NULL, 0));
    DT_ASSERT_OK(d->kind->sync(d));
    CU_ASSERT_EQUAL(atomic_load(&probe_ran), 1);
    DT_ASSERT_FAILS(be->set_device(dt__sim_num_ordinals()), DT_ERR_INVALID_ARGUMENT);
    d->kind->free(d, x);
}

/* ---- memory ---- */

static void test_sim_out_of_memory_names_device_and_bytes_and_keeps_other_blocks(void)
{
    const dt__device *d = gpu(1);
    size_t cap = dt__sim_capacity(), mb = (size_t)1 << 20;
    CU_ASSERT_EQUAL(cap, 64 * mb); /* DT_SIM_MEMORY_MB=64 */
    size_t free0 = dt__sim_free_bytes();
    unsigned char pattern = 0x5a, back[4096];
    unsigned char *a = dev_alloc(d, mb);
    DT_ASSERT_OK(d->kind->fill(d, a, (int64_t)mb, &pattern, 1));
    void *big = NULL;
    char want[64];
    DT_ASSERT_FAILS(d->kind->alloc(d, 100 * mb, &big), DT_ERR_NO_MEMORY);
    snprintf(want, sizeof want, "device %d", d->global_id);
    DT_ASSERT_ERROR_MENTIONS(want);
    DT_ASSERT_ERROR_MENTIONS("104857600 bytes");
    CU_ASSERT_PTR_NULL(big);
    DT_ASSERT_OK(d->kind->copy(d, DT__COPY_D2H, back, a + mb - sizeof back, sizeof back));
    for (size_t i = 0; i < sizeof back; i++)
        CU_ASSERT_EQUAL(back[i], 0x5a);

    /* Freed neighbours merge: after four 15 MiB blocks go in shuffled order, 62 MiB fit. */
    void *q[4];
    for (int i = 0; i < 4; i++)
        q[i] = dev_alloc(d, 15 * mb);
    DT_ASSERT_FAILS(d->kind->alloc(d, 4 * mb, &big), DT_ERR_NO_MEMORY);
    const int order[4] = {2, 0, 3, 1};
    for (int i = 0; i < 4; i++)
        d->kind->free(d, q[order[i]]);
    big = dev_alloc(d, 62 * mb);
    d->kind->free(d, big);
    d->kind->free(d, a);
    CU_ASSERT_EQUAL(dt__sim_free_bytes(), free0);

    /* Through the tensor API: the tensor the caller holds stays intact. */
    dt_mesh *mesh = NULL;
    dt_layout *rep = NULL;
    dt_tensor *t = NULL, *huge = NULL;
    float v = 3.5f, got[64];
    DT_ASSERT_OK(dt_mesh_create("g", 1, (const char *const[]){"x"}, (const int64_t[]){4},
                                DT_DEVICE_GPU, &mesh));
    DT_ASSERT_OK(dt_layout_replicated(mesh, 1, &rep));
    DT_ASSERT_OK(dt_tensor_filled(rep, DT_DTYPE_F32, (const int64_t[]){64}, &v, &t));
    DT_ASSERT_FAILS(dt_tensor_zeros(rep, DT_DTYPE_F32, (const int64_t[]){(int64_t)32 << 20},
                                    &huge), DT_ERR_NO_MEMORY);
    DT_ASSERT_ERROR_MENTIONS("134217728 bytes");
    CU_ASSERT_PTR_NULL(huge);
    for (int i = 0; i < dt_tensor_num_local(t); i++) {
        DT_ASSERT_OK(dt_tensor_local_read(t, i, got, sizeof got));
        CU_ASSERT(got[0] == 3.5f && got[63] == 3.5f);
    }
    dt_tensor_destroy(t);
    dt_layout_destroy(rep);
    dt_mesh_destroy(mesh);
    CU_ASSERT_EQUAL(dt__sim_free_bytes(), free0);
}

enum { THREADS = 8, ROUNDS = 150, LIVE = 4 };

static void *alloc_worker(void *arg)
{
    int id = (int)(intptr_t)arg, bad = 0;
    const dt__device *d = dt__device_local(DT_DEVICE_GPU, id % 4);
    unsigned char *blk[LIVE] = {0}, back[8192];
    size_t len[LIVE] = {0};
    uint32_t r = 77u + (uint32_t)id;
    for (int round = 0; round < ROUNDS && !bad; round++) {
        int k = round % LIVE;
        if (blk[k]) { /* still holds this thread's pattern: no other block overlapped it */
            if (d->kind->copy(d, DT__COPY_D2H, back, blk[k], len[k]) != DT_OK)
                bad = 1;
            for (size_t i = 0; i < len[k] && !bad; i++)
                bad = back[i] != (unsigned char)(id * LIVE + k);
            d->kind->free(d, blk[k]);
            blk[k] = NULL;
        }
        r = r * 1664525u + 1013904223u;
        len[k] = 1 + (r >> 8) % sizeof back;
        unsigned char value = (unsigned char)(id * LIVE + k);
        if (d->kind->alloc(d, len[k], (void **)&blk[k]) != DT_OK ||
            d->kind->fill(d, blk[k], (int64_t)len[k], &value, 1) != DT_OK)
            bad = 1;
    }
    for (int k = 0; k < LIVE; k++)
        d->kind->free(d, blk[k]);
    return (void *)(intptr_t)bad;
}

static void test_sim_memory_is_safe_to_allocate_and_free_from_many_threads(void)
{
    size_t free0 = dt__sim_free_bytes();
    pthread_t th[THREADS];
    for (int i = 0; i < THREADS; i++)
        CU_ASSERT_FATAL(pthread_create(&th[i], NULL, alloc_worker, (void *)(intptr_t)i) == 0);
    for (int i = 0; i < THREADS; i++) {
        void *bad = NULL;
        pthread_join(th[i], &bad);
        CU_ASSERT_PTR_NULL(bad);
    }
    CU_ASSERT_EQUAL(dt__sim_free_bytes(), free0);
}

/* ---- a GPU mesh end to end ---- */

/* Writes global element (r, c) = f(r, c) into every local component of a rank-2 tensor. */
static void write_global(dt_tensor *t, float scale)
{
    for (int i = 0; i < dt_tensor_num_local(t); i++) {
        const DLTensor *c = dt_tensor_local(t, i);
        const int64_t *off = dt_tensor_local_offset(t, i);
        int64_t n = c->shape[0] * c->shape[1];
        float *buf = malloc((size_t)(n ? n : 1) * sizeof *buf);
        for (int64_t e = 0; e < n; e++)
            buf[e] = scale * (float)((off[0] + e / c->shape[1]) * 10 + off[1] + e % c->shape[1]);
        DT_ASSERT_OK(dt_tensor_local_write(t, i, buf, (size_t)n * sizeof *buf));
        free(buf);
    }
}

/* Checks every local component against ref (a rows x cols row-major host array). */
static void check_global(const dt_tensor *t, const float *ref, int64_t cols)
{
    for (int i = 0; i < dt_tensor_num_local(t); i++) {
        const DLTensor *c = dt_tensor_local(t, i);
        const int64_t *off = dt_tensor_local_offset(t, i);
        int64_t n = c->shape[0] * c->shape[1], bad = 0;
        CU_ASSERT_EQUAL(c->device.device_type, kDLCUDA);
        float *buf = malloc((size_t)(n ? n : 1) * sizeof *buf);
        DT_ASSERT_OK(dt_tensor_local_read(t, i, buf, (size_t)n * sizeof *buf));
        for (int64_t e = 0; e < n; e++)
            bad += buf[e] != ref[(off[0] + e / c->shape[1]) * cols + off[1] + e % c->shape[1]];
        CU_ASSERT_EQUAL(bad, 0);
        free(buf);
    }
}

static void test_gpu_mesh_runs_end_to_end_on_the_simulator(void)
{
    dt_mesh *mesh = NULL;
    DT_ASSERT_OK(dt_mesh_create("g", 2, (const char *const[]){"x", "y"},
                                (const int64_t[]){2, 2}, DT_DEVICE_GPU, &mesh));
    dt_layout *xy = dt_test_layout(mesh, 2, "x", "y", NULL);
    dt_layout *y_ = dt_test_layout(mesh, 2, "y", NULL, NULL);
    dt_layout *rep = dt_test_layout(mesh, 2, NULL, NULL, NULL);
    dt_layout *part = dt_test_layout(mesh, 2, NULL, "y", "x");
    dt_layout *rowpar_a = dt_test_layout(mesh, 2, NULL, "y", NULL);
    dt_layout *rowpar_b = dt_test_layout(mesh, 2, "y", NULL, NULL);
    enum { R = 8, C = 6, K = 5 };
    const int64_t shape[2] = {R, C};
    float ref[R * C], zero[R * C] = {0}, seven[R * C], sum3[R * C];
    for (int i = 0; i < R * C; i++) {
        ref[i] = (float)((i / C) * 10 + i % C);
        seven[i] = 7.0f;
        sum3[i] = 3.0f * ref[i]; /* partial components 1*ref and 2*ref over x */
    }
    dt_tensor *z = NULL, *f = NULL, *a = NULL, *a2 = NULL, *p = NULL, *pr = NULL;
    float v = 7.0f;
    DT_ASSERT_OK(dt_tensor_zeros(xy, DT_DTYPE_F32, shape, &z));
    check_global(z, zero, C);
    DT_ASSERT_OK(dt_tensor_filled(y_, DT_DTYPE_F32, shape, &v, &f));
    check_global(f, seven, C);

    /* Sharding to sharding, then to replicated. */
    DT_ASSERT_OK(dt_tensor_zeros(xy, DT_DTYPE_F32, shape, &a));
    write_global(a, 1.0f);
    DT_ASSERT_OK(dt_relayout(a, y_, &a2));
    check_global(a2, ref, C);
    dt_tensor_destroy(a2);
    DT_ASSERT_OK(dt_relayout(a, rep, &a2));
    check_global(a2, ref, C);

    /* Partial (sum over x) to replicated: a reduction on the devices. */
    DT_ASSERT_OK(dt_tensor_zeros(part, DT_DTYPE_F32, shape, &p));
    for (int i = 0; i < dt_tensor_num_local(p); i++) {
        const DLTensor *c = dt_tensor_local(p, i);
        const int64_t *off = dt_tensor_local_offset(p, i);
        int64_t pos = dt_tensor_local_position(p, i), n = c->shape[0] * c->shape[1];
        float buf[R * C];
        for (int64_t e = 0; e < n; e++)
            buf[e] = (float)(pos / 2 + 1) * ref[(off[0] + e / c->shape[1]) * C + off[1] +
                                                e % c->shape[1]];
        DT_ASSERT_OK(dt_tensor_local_write(p, i, buf, (size_t)n * sizeof *buf));
    }
    DT_ASSERT_OK(dt_relayout(p, rep, &pr));
    check_global(pr, sum3, C);

    /* Row-parallel matmul (partial over y) against a host product (small integers: exact). */
    dt_tensor *ra = NULL, *b = NULL, *mm = NULL, *mmr = NULL;
    float bh[C * K], want[R * K];
    DT_ASSERT_OK(dt_relayout(a, rowpar_a, &ra));
    DT_ASSERT_OK(dt_tensor_zeros(rowpar_b, DT_DTYPE_F32, (const int64_t[]){C, K}, &b));
    for (int i = 0; i < dt_tensor_num_local(b); i++) {
        const DLTensor *c = dt_tensor_local(b, i);
        const int64_t *off = dt_tensor_local_offset(b, i);
        float buf[C * K];
        for (int64_t e = 0; e < c->shape[0] * c->shape[1]; e++)
            buf[e] = (float)((off[0] + e / K) % 3) - (float)(e % K);
        DT_ASSERT_OK(dt_tensor_local_write(b, i, buf, (size_t)(c->shape[0] * K) * sizeof *buf));
    }
    for (int i = 0; i < C * K; i++)
        bh[i] = (float)((i / K) % 3) - (float)(i % K);
    for (int r = 0; r < R; r++)
        for (int k = 0; k < K; k++) {
            float s = 0.0f;
            for (int c = 0; c < C; c++)
                s += ref[r * C + c] * bh[c * K + k];
            want[r * K + k] = s;
        }
    DT_ASSERT_OK(dt_matmul(ra, b, 0, 0, NULL, &mm));
    CU_ASSERT_EQUAL(dt_layout_num_partial(dt_tensor_layout(mm)), 1);
    DT_ASSERT_OK(dt_relayout(mm, rep, &mmr));
    check_global(mmr, want, K);

    dt_tensor *all[] = {z, f, a, a2, p, pr, ra, b, mm, mmr};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        dt_tensor_destroy(all[i]);
    dt_layout *layouts[] = {xy, y_, rep, part, rowpar_a, rowpar_b};
    for (size_t i = 0; i < sizeof layouts / sizeof *layouts; i++)
        dt_layout_destroy(layouts[i]);
    dt_mesh_destroy(mesh);
}

int main(int argc, char **argv)
{
    static const dt_test_case cases[] = {
        DT_TEST(test_host_read_or_write_of_sim_memory_dies_of_sigsegv),
        DT_TEST(test_sim_kernels_and_copies_give_the_cpu_kernels_bits),
        DT_TEST(test_sim_work_is_asynchronous_and_sync_waits_for_it),
        DT_TEST(test_sim_failing_kernel_surfaces_at_sync_and_later_work_runs),
        DT_TEST(test_sim_out_of_memory_names_device_and_bytes_and_keeps_other_blocks),
        DT_TEST(test_sim_memory_is_safe_to_allocate_and_free_from_many_threads),
        DT_TEST(test_gpu_mesh_runs_end_to_end_on_the_simulator),
        DT_TEST_END,
    };
    return dt_test_main_gpu(argc, argv, "device_sim", cases);
}
