/* The choice of a transport per relayout plan: the table in priority order, DT_TRANSPORT,
 * and the reasons a transport does not apply (docs/transports.md). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dtensor/version.h" /* DT_HAVE_CUDA */
#include "runtime/device.h"
#include "runtime/error.h"
#include "runtime/shm.h"
#include "runtime/transport.h"

#if !DT_HAVE_CUDA
const dt__transport *dt__transport_nccl(void)
{
    return NULL;
}

dt_status dt__transport_nccl_start(const char *mode)
{
    (void)mode;
    return DT_OK;
}

void dt__transport_nccl_stop(void)
{
}

const char *dt__nccl_absence(void)
{
    return "this build has no NCCL (configure with -Dcuda=enabled)";
}
#endif

/* In priority order for DT_TRANSPORT=auto. `get` returns NULL where the transport does not
 * apply, `absent` says why. */
typedef struct entry {
    const char *name;
    const dt__transport *(*get)(void);
    const char *(*absent)(void);
} entry;

static const entry table[] = {
    {"nccl", dt__transport_nccl, dt__nccl_absence},
    {"shm", dt__transport_shm, dt__shm_absence},
    {"mpi", dt__transport_mpi, NULL},
    {"staged", dt__transport_staged, NULL},
};
enum { NENTRIES = sizeof table / sizeof table[0] };

static int forced = -1; /* index into table, -1: auto */

dt_status dt__transport_configure(void)
{
    const char *v = getenv("DT_TRANSPORT");
    forced = -1;
    if (!v || !*v || strcmp(v, "auto") == 0)
        return DT_OK;
    for (int i = 0; i < NENTRIES; i++)
        if (strcmp(v, table[i].name) == 0) {
            forced = i;
            return DT_OK;
        }
    return dt__error(DT_ERR_INVALID_ARGUMENT,
                     "DT_TRANSPORT='%s' is not one of auto, mpi, staged, nccl, shm", v);
}

/* Why table[i] cannot move the kinds between the clients, NULL when it can. */
static const char *why_not(int i, const dt__device_kind *const *kinds, int nkinds,
                           const int *clients, int nclients, char *buf, size_t len)
{
    const dt__transport *t = table[i].get ? table[i].get() : NULL;
    if (!t) {
        snprintf(buf, len, "%s", table[i].absent ? table[i].absent() : "it is not available");
        return buf;
    }
    for (int k = 0; k < nkinds; k++) {
        int ok = t->moves ? t->moves(kinds[k]) : !kinds[k] || kinds[k]->host_visible;
        if (!ok) {
            snprintf(buf, len, "it does not move %s%s memory",
                     kinds[k] ? kinds[k]->name : "host", kinds[k] ? " device" : "");
            return buf;
        }
    }
    if (t->can_connect)
        for (int a = 0; a < nclients; a++)
            if (clients[a] != dt_client_id() && !t->can_connect(clients[a])) {
                snprintf(buf, len, "it cannot reach client %d from client %d", clients[a],
                         dt_client_id());
                return buf;
            }
    return NULL;
}

dt_status dt__transport_select(const dt__device_kind *const *kinds, int nkinds,
                               const int *clients, int nclients, int crossing,
                               const dt__transport **out)
{
    char buf[256];
    *out = NULL;
    if (forced >= 0) {
        const char *why = why_not(forced, kinds, nkinds, clients, nclients, buf, sizeof buf);
        if (why && crossing)
            return dt__error(DT_ERR_UNSUPPORTED,
                             "DT_TRANSPORT=%s cannot move this relayout's pieces between "
                             "processes: %s (nothing was sent)", table[forced].name, why);
        *out = why ? dt__transport_mpi() : table[forced].get(); /* nothing crosses */
        return DT_OK;
    }
    for (int i = 0; i < NENTRIES; i++)
        if (!why_not(i, kinds, nkinds, clients, nclients, buf, sizeof buf)) {
            *out = table[i].get();
            return DT_OK;
        }
    if (!crossing) {
        *out = dt__transport_mpi();
        return DT_OK;
    }
    return dt__error(DT_ERR_UNSUPPORTED,
                     "no transport moves this relayout's pieces between processes (%s "
                     "memory): nothing was sent",
                     nkinds && kinds[nkinds - 1] ? kinds[nkinds - 1]->name : "host");
}

const char *dt__transport_mode(void)
{
    return forced >= 0 ? table[forced].name : "auto";
}

/* NCCL's communicator, then the shm pool (it asks dt__transport_mode, never DT_TRANSPORT). */
dt_status dt__transport_start(void)
{
    dt__transport_shm_reset();
    dt_status st = dt__transport_nccl_start(dt__transport_mode());
    if (st == DT_OK)
        st = dt__shm_start(dt__transport_mode());
    return st;
}

void dt__transport_stop(void)
{
    dt__shm_stop();
    dt__transport_nccl_stop();
}
