/* Facts derived from a mesh's whole device table, cached on the mesh: a planner that would
 * otherwise read every device of the mesh on every new plan (relayout_pattern.c's check that
 * each client's devices share a coordinate along a mesh dim and each line stays on one host,
 * issue 22) computes them once per mesh and world, then reads them in O(1). The key names the
 * world (the runtime's, or a simulated table); a few keys are kept, the oldest replaced. The
 * mesh stays immutable to its users: the cache only saves work and takes a short spin lock,
 * so meshes shared between threads stay safe. */
#include <string.h>

#include "mesh/mesh_impl.h"
#include "mesh/mesh_facts.h"

_Static_assert((int)DT__MESH_FACT_KEY == (int)DT__MESH_FACT_KEY_INTS, "one key size");

static void lock(dt_mesh *m)
{
    while (atomic_flag_test_and_set_explicit(&m->facts_lock, memory_order_acquire))
        ;
}

static void unlock(dt_mesh *m)
{
    atomic_flag_clear_explicit(&m->facts_lock, memory_order_release);
}

int dt__mesh_fact_get(const dt_mesh *mesh, const int *key, uint64_t *value_out)
{
    dt_mesh *m = (dt_mesh *)mesh;   /* the cache is the mesh's only mutable part */
    int found = 0;
    lock(m);
    for (int i = 0; i < DT__MESH_NFACTS && !found; i++)
        if (m->facts[i].used && memcmp(m->facts[i].key, key, sizeof m->facts[i].key) == 0) {
            *value_out = m->facts[i].value;
            found = 1;
        }
    unlock(m);
    return found;
}

void dt__mesh_fact_put(const dt_mesh *mesh, const int *key, uint64_t value)
{
    dt_mesh *m = (dt_mesh *)mesh;
    lock(m);
    int slot = -1;
    for (int i = 0; i < DT__MESH_NFACTS && slot < 0; i++)
        if (m->facts[i].used && memcmp(m->facts[i].key, key, sizeof m->facts[i].key) == 0)
            slot = i;
    if (slot < 0) {
        slot = m->facts_next;
        m->facts_next = (m->facts_next + 1) % DT__MESH_NFACTS;
    }
    m->facts[slot].used = 1;
    memcpy(m->facts[slot].key, key, sizeof m->facts[slot].key);
    m->facts[slot].value = value;
    unlock(m);
}
