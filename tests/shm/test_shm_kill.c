/* A host peer killed with SIGKILL in the middle of the job (run by tests/shm/shm_kill.sh,
 * 2 processes): the survivor's shm relayout ends in DT_ERR_TIMEOUT naming the killed client
 * within DT_COMM_TIMEOUT, not a hang. Prints "SHM_KILL_PID <pid>" for every process (the
 * script checks that no segment of theirs is left) and "SHM_KILL_OK <message>" on success. */
#include <mpi.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "dtensor/dtensor.h"
#include "runtime/comm.h"
#include "runtime/shm.h"

int main(int argc, char **argv)
{
    if (dt_init(&argc, &argv, NULL) != DT_OK) {
        fprintf(stderr, "dt_init: %s\n", dt_last_error());
        return 1;
    }
    printf("SHM_KILL_PID %ld\n", (long)getpid());
    fflush(stdout);
    if (!dt__shm_up() || dt_num_clients() != 2) {
        fprintf(stderr, "needs the shm pool up and 2 clients\n");
        return 1;
    }
    const char *dims[1] = {"x"};
    int64_t n = dt_num_global_devices(DT_DEVICE_CPU), shape[1] = {n * 1024};
    dt_mesh *m = NULL;
    dt_layout *rows = NULL, *rep = NULL;
    dt_tensor *src = NULL, *dst = NULL;
    if (dt_mesh_create("kill", 1, dims, &n, DT_DEVICE_CPU, &m) != DT_OK ||
        dt_layout_batch_sharded(m, "x", 1, 0, &rows) != DT_OK ||
        dt_layout_replicated(m, 1, &rep) != DT_OK ||
        dt_tensor_zeros(rows, DT_DTYPE_F32, shape, &src) != DT_OK ||
        dt_relayout(src, rep, &dst) != DT_OK) {  /* one that works first */
        fprintf(stderr, "setup: %s\n", dt_last_error());
        return 1;
    }
    dt_tensor_destroy(dst);
    dst = NULL;
    MPI_Barrier(dt__comm());
    if (dt_client_id() == 1)
        raise(SIGKILL);
    double t0 = dt__now_seconds();
    dt_status st = dt_relayout(src, rep, &dst);
    double took = dt__now_seconds() - t0, timeout = dt__comm_timeout(NULL);
    const char *msg = dt_last_error();
    if (st == DT_ERR_TIMEOUT && strstr(msg, "lost client(s) 1 (") && took <= timeout + 1.0)
        printf("SHM_KILL_OK after %.2f s: %s\n", took, msg);
    else
        printf("SHM_KILL_BAD status %d after %.2f s: %s\n", (int)st, took, msg);
    fflush(stdout);
    _exit(0); /* the job cannot end cleanly with a client gone */
}
