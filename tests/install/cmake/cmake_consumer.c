/* A separate program built with CMake against the installed libdtensor (find_package(dtensor
 * CONFIG), target dtensor::dtensor): it starts the runtime, checks that the clients are MPI's
 * ranks (the MPI the package names, through its mpi.h), and checks one device's shard of a
 * layout against hand-worked values. */
#include <dtensor/dtensor.h>
#include <mpi.h>
#include <stdio.h>
#include <string.h>

int main(int argc, char **argv)
{
    if (dt_init(&argc, &argv, NULL) != DT_OK) {
        fprintf(stderr, "cmake_consumer: dt_init: %s\n", dt_last_error());
        return 1;
    }
    int size = 0, rank = -1;
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    int ok = size == dt_num_clients() && rank == dt_client_id();
    dt_layout *l = NULL;
    if (ok && dt_layout_parse("sharding_specs:x,unsharded, mesh:|x=2,y=2|*CPU", &l) != DT_OK) {
        fprintf(stderr, "cmake_consumer: %s\n", dt_last_error());
        ok = 0;
    }
    int64_t shape[2] = {5, 3}, off[2], loc[2];
    /* Position 2 has x=1: rows 3..4 of 5 (the first shard takes the extra row). */
    ok = ok && dt_layout_shard(l, shape, 2, off, loc) == DT_OK && off[0] == 3 && loc[0] == 2 &&
         off[1] == 0 && loc[1] == 3;
    dt_layout_destroy(l);
    if (rank == 0)
        printf("cmake_consumer: libdtensor %s, %d client(s): %s\n", DT_VERSION_STRING, size,
               ok ? "ok" : "FAILED");
    dt_finalize();
    return ok ? 0 : 1;
}
