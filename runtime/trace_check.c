/* DT_CHECK_COLLECTIVES=1: before a collective, its group all-gathers each member's call and a
 * hash of its arguments (shapes, dtypes, layouts), so that members making different calls get
 * DT_ERR_STATE naming both instead of a hang or wrong data (docs/trace.md). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/comm.h"
#include "runtime/error.h"
#include "runtime/group.h"
#include "runtime/trace.h"
#include "runtime/util.h"

typedef struct digest {
    uint64_t hash;                    /* of the call and the whole detail */
    int32_t client, pad;
    char call[DT__TRACE_CALL];
    char detail[DT__TRACE_DETAIL];
} digest;

static uint64_t fnv(uint64_t h, const char *s)
{
    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return (h ^ 0xffu) * 1099511628211ull;
}

dt_status dt__trace_check(const int *clients, int n, const char *group, unsigned long long seq,
                          const char *call, const char *detail)
{
    if (n <= 1)
        return DT_OK;
    const dt__group *g = NULL;
    dt_status st = dt__clients_group(n, clients, &g);
    if (st != DT_OK)
        return st;
    if (g->comm == MPI_COMM_NULL)
        return DT_OK;
    digest mine;
    memset(&mine, 0, sizeof mine);
    mine.hash = fnv(fnv(1469598103934665603ull, call), detail);
    mine.client = dt_client_id();
    dt__strlcpy(mine.call, call, sizeof mine.call);
    dt__strlcpy(mine.detail, detail, sizeof mine.detail);
    digest *all = malloc((size_t)n * sizeof *all);
    if (!all)
        return dt__error(DT_ERR_NO_MEMORY, "collective check: no memory");
    MPI_Request req = MPI_REQUEST_NULL;
    int rc = MPI_Iallgather(&mine, (int)sizeof mine, MPI_BYTE, all, (int)sizeof mine, MPI_BYTE,
                            g->comm, &req);
    if (rc != MPI_SUCCESS) {
        free(all);
        return dt__mpi_error(rc, "collective check: MPI_Iallgather");
    }
    char what[160];
    snprintf(what, sizeof what, "collective check of %s (seq %llu on group %s)", call, seq,
             group);
    st = dt__wait_watched_group(&req, clients, n, 0, what);
    if (st != DT_OK) {
        free(all);
        return st;
    }
    for (int i = 1; i < n; i++) {
        if (all[i].hash == all[0].hash)
            continue;
        st = dt__error(DT_ERR_STATE, "collective check (seq %llu on group %s): client %d called "
                       "%.*s %.*s but client %d called %.*s %.*s", seq, group, all[0].client,
                       (int)sizeof all[0].call, all[0].call, (int)sizeof all[0].detail,
                       all[0].detail, all[i].client, (int)sizeof all[i].call, all[i].call,
                       (int)sizeof all[i].detail, all[i].detail);
        break;
    }
    free(all);
    return st;
}
