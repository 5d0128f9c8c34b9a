/* The pipeline module's private structs (schedules, pipes, pending sends). Not installed. */
#ifndef DTENSOR_PIPELINE_IMPL_H
#define DTENSOR_PIPELINE_IMPL_H

#include <mpi.h>

#include "dtensor/pipeline.h"
#include "runtime/group.h"

struct dt_pipe_schedule {
    dt_pipe_schedule_kind kind;
    int stages, micro, chunks;
    int64_t per_stage;     /* steps per stage */
    dt_pipe_step *steps;   /* stage-major: stage s's list at [s * per_stage] */
    dt_pipe_step *order;   /* all steps by (slot, stage) */
    int64_t *finish;       /* simulation: finish slot per (virtual stage, micro, phase) */
    int *peak;             /* per stage */
    int64_t length;
};

/* What a send to another client of this host sends by MPI (p2p.c): where the shard waits in
 * the sender's shm segment (offset of its block, whose first DT__PIPE_SHM_HEAD bytes hold the
 * flag the receiver raises once it copied the shard out), or offset -1 and the shard's bytes
 * following the descriptor in the same message (the pool was full). */
typedef struct dt__pipe_desc {
    int64_t offset;
    uint64_t bytes;
} dt__pipe_desc;
enum { DT__PIPE_SHM_HEAD = 64 };

/* A send in flight to another client: its buffer is freed once MPI is done with it; a shard
 * waiting in the shm segment (shm not NULL) once its receiver raised the block's flag. */
typedef struct dt__pipe_send {
    MPI_Request req;
    int peer_client;
    void *buf;
} dt__pipe_send;

/* A shard sent to a device of this same client: kept until its receive takes it. */
typedef struct dt__pipe_local {
    int from, to, tag;
    int64_t position; /* stage-local position */
    void *buf;
    size_t bytes;
} dt__pipe_local;

struct dt_pipe {
    dt_mesh *mesh;
    int dim, stages;
    dt_mesh **stage_mesh;   /* [stages] */
    int *holds;             /* [stages]: this client holds devices of stage s */
    int *leader;            /* [stages]: the lowest client holding devices of stage s */
    dt__group comm;         /* own communicator over the mesh's clients (dt__group_dup) */
    int *client_rank;       /* client id -> rank in comm, -1 outside (dt_num_clients entries) */
    dt__pipe_send *sends;
    int nsends, cap_sends;
    dt__pipe_local *locals;
    int nlocals, cap_locals;
    void **shm_blocks;      /* shards in this client's shm segment not yet copied out */
    int nshm, cap_shm;
    dt_pipe_stats stats;
};

/* dt_pipe_destroy: frees the shm blocks of sends (waiting briefly for their receivers). */
void dt__pipe_release_shm(dt_pipe *pipe);

#endif
