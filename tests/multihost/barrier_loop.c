/* For the link-cut test (test_multihost.py): barriers over every device, one after another,
 * with no timeout of the caller's (the watchdog's DT_COMM_TIMEOUT applies). Prints "ready"
 * after the first 50, "done" after N (argv[1], default 10^7); on a failure prints the
 * runtime's message and aborts the job, as a program must once a client is lost. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

#include "dtensor/dtensor.h"

int main(int argc, char **argv)
{
    long n = argc > 1 ? atol(argv[1]) : 10000000L;
    dt_status st = dt_init(&argc, &argv, NULL);
    if (st != DT_OK) {
        fprintf(stderr, "barrier_loop: dt_init: %s\n", dt_last_error());
        return 1;
    }
    const char *names[1] = {"x"};
    int64_t sizes[1] = {dt_num_global_devices(DT_DEVICE_CPU)};
    dt_mesh *m = NULL;
    st = dt_mesh_create("everyone", 1, names, sizes, DT_DEVICE_CPU, &m);
    for (long i = 0; st == DT_OK && i < n; i++) {
        st = dt_barrier(m, "loop", 0);
        if (i == 50 && dt_client_id() == 0) {
            printf("ready\n");
            fflush(stdout);
        }
    }
    if (st != DT_OK) {
        fprintf(stderr, "barrier_loop: client %d: %s: %s\n", dt_client_id(), dt_status_name(st),
                dt_last_error());
        MPI_Abort(MPI_COMM_WORLD, 3);
    }
    if (dt_client_id() == 0)
        printf("done\n");
    dt_mesh_destroy(m);
    dt_finalize();
    return 0;
}
