/* Facts a planner derives from a mesh's whole device table, cached on the mesh per world
 * (mesh_facts.c). Internal, not installed. */
#ifndef DTENSOR_MESH_FACTS_H
#define DTENSOR_MESH_FACTS_H

#include <stdint.h>

#include "dtensor/dtensor.h"

/* Keys are DT__MESH_FACT_KEY ints (the same as mesh_impl.h's), chosen by the caller. */
enum { DT__MESH_FACT_KEY_INTS = 4 };

/* 1 and the value into *value_out if the mesh holds a fact under key, else 0. */
int dt__mesh_fact_get(const dt_mesh *mesh, const int *key, uint64_t *value_out);
/* Keeps value under key (replacing the oldest key when full). */
void dt__mesh_fact_put(const dt_mesh *mesh, const int *key, uint64_t value);

#endif
