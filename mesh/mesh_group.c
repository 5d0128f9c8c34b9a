/* A mesh's communication group: the clients holding its devices, in client order, handed to
 * runtime/group.c's cache of groups by client list (docs/runtime.md, "Communication groups"). */
#include <stdint.h>
#include <stdlib.h>

#include "mesh/mesh_group.h"
#include "runtime/error.h"

dt_status dt__mesh_group(const dt_mesh *mesh, const dt__group **group_out)
{
    int nclients = dt_num_clients(), me = dt_client_id(), n = 0, mine = 0;
    int *clients = calloc((size_t)(nclients > 0 ? nclients : 1), sizeof *clients);
    if (!clients)
        return dt__error(DT_ERR_NO_MEMORY, "the mesh's client group: no memory");
    dt_device_type type = dt_mesh_device_type(mesh);
    for (int64_t p = 0; p < dt_mesh_size(mesh); p++) {
        int c = dt_device_client(type, dt_mesh_device_id(mesh, p));
        if (c >= 0 && c < nclients)
            clients[c] = 1;
    }
    for (int c = 0; c < nclients; c++)
        if (clients[c]) {
            mine |= c == me;
            clients[n++] = c;
        }
    dt_status st = DT_OK;
    if (mine)
        st = dt__clients_group(n, clients, group_out);
    else
        *group_out = dt__group_outside();
    free(clients);
    return st;
}
