/* An LD_PRELOAD shim for bench/gpt.sh (the MPI profiling interface): adds up the wall time
 * this process spends inside the MPI calls libdtensor communicates with (collectives,
 * point-to-point and their waits) and writes "comm_seconds=<s> calls=<n>" to the file named
 * by DT_BENCH_COMM_FILE (suffixed with the rank) at MPI_Finalize. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double total;
static long calls;

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

#define TIMED(call)                                                                         \
    double t0_ = now();                                                                     \
    int rc_ = call;                                                                         \
    total += now() - t0_;                                                                   \
    calls++;                                                                                \
    return rc_;

int MPI_Allreduce(const void *s, void *r, int n, MPI_Datatype t, MPI_Op op, MPI_Comm c)
{
    TIMED(PMPI_Allreduce(s, r, n, t, op, c))
}

int MPI_Allgather(const void *s, int sn, MPI_Datatype st, void *r, int rn, MPI_Datatype rt,
                  MPI_Comm c)
{
    TIMED(PMPI_Allgather(s, sn, st, r, rn, rt, c))
}

int MPI_Allgatherv(const void *s, int sn, MPI_Datatype st, void *r, const int *rn,
                   const int *d, MPI_Datatype rt, MPI_Comm c)
{
    TIMED(PMPI_Allgatherv(s, sn, st, r, rn, d, rt, c))
}

int MPI_Gatherv(const void *s, int sn, MPI_Datatype st, void *r, const int *rn, const int *d,
                MPI_Datatype rt, int root, MPI_Comm c)
{
    TIMED(PMPI_Gatherv(s, sn, st, r, rn, d, rt, root, c))
}

int MPI_Bcast(void *b, int n, MPI_Datatype t, int root, MPI_Comm c)
{
    TIMED(PMPI_Bcast(b, n, t, root, c))
}

int MPI_Barrier(MPI_Comm c)
{
    TIMED(PMPI_Barrier(c))
}

int MPI_Isend(const void *b, int n, MPI_Datatype t, int dst, int tag, MPI_Comm c,
              MPI_Request *rq)
{
    TIMED(PMPI_Isend(b, n, t, dst, tag, c, rq))
}

int MPI_Irecv(void *b, int n, MPI_Datatype t, int src, int tag, MPI_Comm c, MPI_Request *rq)
{
    TIMED(PMPI_Irecv(b, n, t, src, tag, c, rq))
}

int MPI_Wait(MPI_Request *rq, MPI_Status *s)
{
    TIMED(PMPI_Wait(rq, s))
}

int MPI_Waitall(int n, MPI_Request *rq, MPI_Status *s)
{
    TIMED(PMPI_Waitall(n, rq, s))
}

int MPI_Test(MPI_Request *rq, int *flag, MPI_Status *s)
{
    TIMED(PMPI_Test(rq, flag, s))
}

int MPI_Finalize(void)
{
    const char *path = getenv("DT_BENCH_COMM_FILE");
    int rank = 0;
    PMPI_Comm_rank(MPI_COMM_WORLD, &rank);
    if (path && *path) {
        char name[4096];
        snprintf(name, sizeof name, "%s.%d", path, rank);
        FILE *f = fopen(name, "w");
        if (f) {
            fprintf(f, "comm_seconds=%.6f calls=%ld\n", total, calls);
            fclose(f);
        }
    }
    return PMPI_Finalize();
}
