/* The clients holding a mesh's devices: how many (dt_mesh_num_clients), whether they are all of
 * them (dt_mesh_check_clients), and their communication group, handed to runtime/group.c's
 * cache of groups by client list (docs/runtime.md, "Communication groups"; docs/mesh.md). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "mesh/mesh_group.h"
#include "mesh/mesh_impl.h"
#include "runtime/error.h"
#include "runtime/trace.h"

/* Marks in member[c] (nclients entries, zeroed) each client holding a device of the mesh;
 * returns how many do. Every client computes the same answer: the runtime's table of which
 * client owns which global device is the same everywhere. */
static int mark_clients(const dt_mesh *mesh, int nclients, int *member)
{
    int n = 0;
    dt_device_type type = dt_mesh_device_type(mesh);
    for (int64_t p = 0; p < dt_mesh_size(mesh); p++) {
        int c = dt_device_client(type, dt_mesh_device_id(mesh, p));
        if (c >= 0 && c < nclients && !member[c]) {
            member[c] = 1;
            n++;
        }
    }
    return n;
}

int dt_mesh_num_clients(const dt_mesh *mesh)
{
    if (!mesh || !dt_is_initialized())
        return 0;
    int nclients = dt_num_clients();
    int *member = calloc((size_t)nclients, sizeof *member);
    if (!member)
        return -1;
    int n = mark_clients(mesh, nclients, member);
    free(member);
    return n;
}

dt_status dt_mesh_check_clients(const dt_mesh *mesh)
{
    dt_status st = dt_mesh_check_devices(mesh);
    if (st != DT_OK)
        return st;
    int nclients = dt_num_clients();
    int *member = calloc((size_t)nclients, sizeof *member);
    if (!member)
        return dt__error(DT_ERR_NO_MEMORY, "dt_mesh_check_clients: no memory");
    int n = mark_clients(mesh, nclients, member);
    if (n == nclients) {
        free(member);
        return DT_OK;
    }
    /* The clients left out, a few by number: "client 1", "clients 1, 2, 3 and 5 more". */
    char label[192], out[160];
    size_t pos = 0;
    int shown = 0, missing = nclients - n;
    for (int c = 0; c < nclients && shown < 4; c++)
        if (!member[c]) {
            pos += (size_t)snprintf(out + pos, sizeof out - pos, "%s%d", shown ? ", " : "", c);
            shown++;
        }
    if (missing > shown)
        snprintf(out + pos, sizeof out - pos, " and %d more", missing - shown);
    free(member);
    dt__mesh_label(mesh, label, sizeof label);
    dt_device_type type = dt_mesh_device_type(mesh);
    char hint[160] = "";
    if (dt_mesh_size(mesh) % nclients == 0) /* the even split a user most likely meant */
        snprintf(hint, sizeof hint, "; e.g. %s=%lld with %d processes",
                 type == DT_DEVICE_GPU ? "DT_GPU_DEVICES" : "DT_CPU_DEVICES",
                 (long long)(dt_mesh_size(mesh) / nclients), nclients);
    return dt__error(DT_ERR_DEVICE_MISMATCH,
                     "%s has %lld %s devices, held by %d of the %d clients: client%s %s hold%s "
                     "none of them (the clients hold %d %s devices in all%s)",
                     label, (long long)dt_mesh_size(mesh), dt_device_type_name(type), n, nclients,
                     missing == 1 ? "" : "s", out, missing == 1 ? "s" : "",
                     dt_num_global_devices(type), dt_device_type_name(type), hint);
}

dt_status dt__mesh_group(const dt_mesh *mesh, const dt__group **group_out)
{
    int nclients = dt_num_clients(), me = dt_client_id(), n = 0, mine = 0;
    int *clients = calloc((size_t)(nclients > 0 ? nclients : 1), sizeof *clients);
    if (!clients)
        return dt__error(DT_ERR_NO_MEMORY, "the mesh's client group: no memory");
    mark_clients(mesh, nclients, clients);
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

dt_status dt__mesh_agree(const dt_mesh *mesh, dt_status st, const char *call)
{
    const dt__group *g = NULL;
    dt_status gst = dt__mesh_group(mesh, &g);
    if (gst != DT_OK)
        return st != DT_OK ? st : gst;
    if (g->comm == MPI_COMM_NULL || g->size <= 1)
        return st;
    long tk = dt__coll_record(g->clients, g->size, call, "agreement");
    st = dt__group_agree(g, st, call);
    dt__coll_end(tk, "mpi", st);
    return st;
}
