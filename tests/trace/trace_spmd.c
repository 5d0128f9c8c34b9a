/* SPMD mistakes for the flight recorder and DT_CHECK_COLLECTIVES (run by tests/trace/spmd.sh,
 * 2 processes of 1 CPU device): `skip` (client 1 skips a relayout, then both meet in a
 * barrier), `mismatch` (one relayout, client 0 asks for a 64x64 f32 row-sharded tensor
 * replicated and client 1 for it column-sharded), `kill` (client 1 ends by SIGTERM while
 * client 0 waits for it in a barrier; mpiexec then ends client 0 too). Every client prints "TRACE_RESULT client=C status=NAME wrong=K msg=..." for the
 * call that went wrong (wrong: elements of its result that differ from the reference) and
 * writes its record (dt_trace_dump). */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dtensor/dtensor.h"

enum { N = 64 };

static dt_mesh *mesh;
static dt_layout *rows, *cols, *rep;

/* Elements of t's local component that differ from the reference value i * N + j. */
static long wrong_elements(const dt_tensor *t)
{
    const DLTensor *c = dt_tensor_local(t, 0);
    const int64_t *off = dt_tensor_local_offset(t, 0);
    int64_t r = c->shape[0], k = c->shape[1];
    float *buf = malloc((size_t)(r * k) * sizeof *buf);
    long bad = 0;
    if (!buf || dt_tensor_local_read(t, 0, buf, (size_t)(r * k) * sizeof *buf) != DT_OK)
        return -1;
    for (int64_t i = 0; i < r; i++)
        for (int64_t j = 0; j < k; j++)
            bad += buf[i * k + j] != (float)((off[0] + i) * N + off[1] + j);
    free(buf);
    return bad;
}

static dt_status make_source(dt_tensor **out)
{
    int64_t shape[2] = {N, N};
    dt_tensor *t = NULL;
    dt_status st = dt_tensor_zeros(rows, DT_DTYPE_F32, shape, &t);
    if (st != DT_OK)
        return st;
    const DLTensor *c = dt_tensor_local(t, 0);
    const int64_t *off = dt_tensor_local_offset(t, 0);
    size_t n = (size_t)(c->shape[0] * c->shape[1]);
    float *buf = malloc(n * sizeof *buf);
    for (int64_t i = 0; buf && i < c->shape[0]; i++)
        for (int64_t j = 0; j < c->shape[1]; j++)
            buf[i * c->shape[1] + j] = (float)((off[0] + i) * N + j);
    st = buf ? dt_tensor_local_write(t, 0, buf, n * sizeof *buf) : DT_ERR_NO_MEMORY;
    free(buf);
    *out = t;
    return st;
}

static void report(dt_status st, long wrong)
{
    printf("TRACE_RESULT client=%d status=%s wrong=%ld msg=%s\n", dt_client_id(),
           dt_status_name(st), wrong, st == DT_OK ? "" : dt_last_error());
    fflush(stdout);
}

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "";
    if (dt_init(&argc, &argv, NULL) != DT_OK || dt_num_clients() != 2) {
        fprintf(stderr, "dt_init (2 clients of 1 device): %s\n", dt_last_error());
        return 1;
    }
    const char *dims[1] = {"x"};
    int64_t n = dt_num_global_devices(DT_DEVICE_CPU), shape[2] = {N, N};
    dt_tensor *src = NULL, *dst = NULL;
    if (dt_mesh_create("m", 1, dims, &n, DT_DEVICE_CPU, &mesh) != DT_OK ||
        dt_layout_batch_sharded(mesh, "x", 2, 0, &rows) != DT_OK ||
        dt_layout_inner_sharded(mesh, "x", 2, &cols) != DT_OK ||
        dt_layout_replicated(mesh, 2, &rep) != DT_OK || make_source(&src) != DT_OK ||
        dt_relayout(src, rep, &dst) != DT_OK || wrong_elements(dst) != 0 ||
        dt_barrier(mesh, "start", 0) != DT_OK) {
        fprintf(stderr, "setup: %s\n", dt_last_error());
        return 1;
    }
    dt_tensor_destroy(dst);
    dst = NULL;
    int me = dt_client_id();
    dt_status st = DT_OK;
    long wrong = 0;
    (void)shape;
    if (strcmp(mode, "skip") == 0) {
        if (me == 0)
            st = dt_relayout(src, cols, &dst);  /* client 1 skips it */
        if (st == DT_OK)
            st = dt_barrier(mesh, "after", 0);
    } else if (strcmp(mode, "mismatch") == 0) {
        st = dt_relayout(src, me == 0 ? rep : cols, &dst);
        if (st == DT_OK)
            wrong = wrong_elements(dst);
    } else if (strcmp(mode, "kill") == 0) {
        if (me == 1) {                         /* ends while client 0 waits in the barrier */
            usleep(300 * 1000);
            raise(SIGTERM);
        }
        st = dt_barrier(mesh, "kill", 0);
    } else {
        fprintf(stderr, "usage: trace_spmd skip|mismatch|kill\n");
        return 2;
    }
    report(st, wrong);
    dt_trace_dump(NULL, "end of trace_spmd");
    if (st == DT_ERR_TIMEOUT) {
        /* The peer may still be waiting for its own timeout (up to 3 stalls of
         * DT_COMM_TIMEOUT and their pings, runtime/watchdog.c): MPICH's launcher ends the job
         * as soon as one process exits without MPI_Finalize, which could kill the peer before
         * it writes its record. */
        const char *t = getenv("DT_COMM_TIMEOUT");
        double secs = t ? atof(t) : 0;
        if (secs > 0 && secs <= 10)
            usleep((useconds_t)((5 * secs + 1) * 1e6));
    }
    if (st != DT_OK)
        _exit(0);      /* after a failed collective the job cannot end cleanly */
    dt_tensor_destroy(dst);
    dt_tensor_destroy(src);
    dt_layout_destroy(rep);
    dt_layout_destroy(cols);
    dt_layout_destroy(rows);
    dt_mesh_destroy(mesh);
    dt_finalize();
    return 0;
}
