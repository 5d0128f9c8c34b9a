/* optim/ private header: the ZeRO optimizer's state (groups, parameters, chunks of the flat
 * buffers), the loss scaler, and the helpers its files share. Not installed. */
#ifndef DTENSOR_OPTIM_IMPL_H
#define DTENSOR_OPTIM_IMPL_H

#include <mpi.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "dtensor/dtensor.h"
#include "ops/ops_impl.h"
#include "runtime/device.h"

#define DT__ZERO_DEFAULT_ALLGATHER 500000000
/* Elements converted to f32 at a time (into a scratch block in each device's memory) when the
 * inner optimizer reads a 16-bit gradient partition. */
#define DT__ZERO_BLOCK 8192
/* Elements of optimizer state staged through host memory at a time when a checkpoint restores
 * it into device memory host code cannot reach. */
#define DT__ZERO_STAGE (1 << 20)

/* ---- loss scaler (scaler.c) ---------------------------------------------------------------- */

typedef struct dt__scaler {
    dt_loss_scaler_opts opts;
    double scale;
    int64_t iteration;       /* step calls so far */
    int64_t last_overflow;   /* iteration of the last overflow, -1 before any */
    int hysteresis_left;
} dt__scaler;

/* DT_ERR_INVALID_ARGUMENT naming the bad field of `o` (message starts with `fn`). */
dt_status dt__scaler_check(const char *fn, const dt_loss_scaler_opts *o);
void dt__scaler_init(dt__scaler *s, const dt_loss_scaler_opts *o);
/* The scale the next backward pass must use (1 in mode NONE). */
double dt__scaler_scale(const dt__scaler *s);
/* One step call's bookkeeping (DeepSpeed's DynamicLossScaler.update_scale). */
void dt__scaler_update(dt__scaler *s, int overflow);

/* ---- the optimizer's state ------------------------------------------------------------------ */

/* One parameter: a run [offset, offset + n) of its group's flat buffer. */
typedef struct dt__zparam {
    char *name;
    dt_tensor *tensor;        /* retained */
    int index;                /* over all groups (order of dt_zero_step's grads) */
    int64_t offset;           /* start in the group's flat buffer */
    int64_t n;                /* flattened local shard length, max over model coordinates */
    /* Mesh dims (not the dp dim) that shard the parameter, in mesh order: the rows of its
     * checkpointed state. The others replicate it (rep_mask, bit per mesh dim). */
    int nshard;
    int shard_dims[DT_MESH_MAX_DIMS];
    uint32_t rep_mask;
    /* Gradient layout the flat copy reads: the parameter's specs, partial (sum) over dp. */
    dt_layout *grad_layout;
    /* The parameter's own layout, global rank and shape (stage 3 remakes the tensor from
     * them at each gather; `tensor` is NULL while the parameter is released). */
    dt_layout *layout;
    int rank;
    int64_t shape[DT_MAX_RANK];
} dt__zparam;

/* One chunk [start, start + len) of a group's flat buffer. Each tensor has global shape
 * [m_1, ..., m_k, len] (m_j the non-dp mesh dims), its first k dims sharded on them. */
typedef struct dt__zchunk {
    int64_t start;
    int64_t len;
    dt_tensor *master;        /* f32, state layout (dp-sharded; stage 0 replicated) */
    dt_tensor *s1;            /* exp_avg (Adam) or momentum (SGD, momentum != 0), or NULL */
    dt_tensor *s2;            /* exp_avg_sq (Adam) or NULL */
    dt_tensor *flat;          /* stages 0, 1: persistent flat gradient, partial over dp */
    dt_tensor *gpart;         /* stage 2: persistent gradient partition, state layout */
    /* dt_zero_grad_ready (ready.c): parameters of the chunk still to come in this step, the
     * stage 2 transient flat chunk being filled, and whether the chunk is reduced. */
    int waiting;
    dt_tensor *filling;
    int reduced;
    /* Stage 3, 16-bit parameters: the rank's shard of the parameters in their dtype (state
     * layout), the source of the all-gather (f32 parameters gather from master). */
    dt_tensor *psh;
    /* Offload (offload.c): local device i's partition of the master (kind 0), s1 (1) and s2
     * (2) at host[kind][i], pinned host memory of hkind (host[kind] NULL where the kind is
     * absent); master, s1 and s2 are then NULL. */
    float **host[3];
    const dt__device_kind *hkind;
} dt__zchunk;

typedef struct dt__zgroup {
    dt_optim_hparams hp;
    dt_dtype dtype;           /* of the parameters */
    /* Of the flat gradients, their reduction over dp and the norm: dtype, or f32 where
     * dt_zero_opts.reduce_dtype asks f32 for 16-bit parameters. */
    dt_dtype gdtype;
    int nparams;
    dt__zparam *params;
    int64_t length;           /* L: the flat buffer's length per model coordinate */
    int nchunks;
    dt__zchunk *chunks;
    struct dt__zs3 *s3; /* stage 3: the group's gather (stage3.c); NULL otherwise */
} dt__zgroup;

/* A bucket of the background reduction (bucket.c): flat range [lo, hi) of one chunk, reduced
 * over dp once its `waiting` parameters are in. Phase 0: filling; 1: reduce-scatter in flight
 * (each local device's part of every dp peer's summand); 2 (stage 0 only): all-gather of the
 * reduced parts in flight; 3: done. Buffers (one per local device) in host staging memory of
 * the devices' kind. */
typedef struct dt__zbucket {
    dt__zgroup *group;
    dt__zchunk *chunk;
    int64_t lo, hi;
    int waiting;
    int phase;
    void **vals;              /* hi - lo elements: the device's summand, then (stage 0) the sum */
    int borrowed;             /* vals point into the flat chunk itself (host-visible devices,
                               * stages 0 and 1): no staging copy of the summand */
    void **recv;              /* dp_size - 1 slots of the device's part: every peer's summand */
    int nreq;
    MPI_Request *reqs;        /* nlocal * 2 * dp_size */
    int *peers;               /* client of each request, for the watchdog */
    unsigned char *isrecv;    /* 1 for a receive request */
} dt__zbucket;

struct dt_zero {
    dt_mesh *mesh;
    /* Stage 3 runs as stage 2 (gradient partitions, reduce-scatter) with sharded_params set:
     * the parameters live as shards and are gathered per group (stage3.c). */
    int stage;
    int sharded_params;
    int dp;                   /* dp mesh dim index */
    int64_t dp_size;
    int k;                    /* non-dp mesh dims, in mesh order */
    int nondp[DT_MESH_MAX_DIMS];
    int64_t allgather_size;
    double clip_norm;
    dt_zero_overflow_fn on_overflow;
    void *on_overflow_arg;
    dt_zero_combine_fn combine;   /* dt_zero_opts.combine (NULL: none) */
    void *combine_arg;
    /* Between dt_zero_step_begin and dt_zero_step_end (step.c): the gradients read in place
     * (direct, else NULL), the step's info so far. */
    struct {
        int open, direct;
        dt_tensor **gl;
        dt_zero_step_info info;
    } pending;
    dt__scaler scaler;
    int64_t step;             /* updates applied */
    /* Offload (offload.c): the state in host memory, the update on the host in blocks of
     * offload_block elements through the staging buffers `off`. */
    int offload;
    int64_t offload_block;
    int reduce_f32;           /* dt_zero_opts.reduce_dtype is DT_ZERO_REDUCE_F32 */
    struct dt__zoff *off;
    /* Rank k + 1 layouts of the chunk tensors: flat partial over dp ([model..., unsharded]
     * partial dp), state ([model..., dp], stage 0 [model..., unsharded]), gathered
     * ([model..., unsharded]). */
    dt_layout *flat_layout;
    dt_layout *state_layout;
    dt_layout *gather_layout;
    int nlocal;
    int64_t (*coords)[DT_MESH_MAX_DIMS]; /* mesh coordinates of each local device */
    const dt__device **devs;             /* each local device (component i of every tensor) */
    int ngroups;
    dt__zgroup *groups;
    int nparams;
    /* dt_zero_grad_ready: parameters made ready in this step (ready[index] set). */
    int nready;
    unsigned char *ready;
    /* Background reduction (bucket.c): on when dp_size > 1; comm holds the mesh's clients;
     * for local device i and dp coordinate q, entry i * dp_size + q of dp_rank, dp_client and
     * dp_pos is the comm rank, client and mesh position of the device at q beside it. */
    int64_t reduce_bucket_size;   /* bytes */
    int64_t max_live_bytes;       /* gradient bytes of buckets in phase 1 or 2 at most */
    int overlap;
    MPI_Comm comm;
    int *dp_rank;
    int *dp_client;
    int64_t *dp_pos;
    int nbuckets;
    dt__zbucket *buckets;
    int comm_failed;          /* a wait or test of the buckets failed (a peer lost) */
    /* This step's CPU seconds of gradient copies and sums (step info): t_copy_in by the
     * caller's thread into the flat buffer (ready.c), t_copy and t_sum in the bucket phases, by
     * either thread under `lock`. */
    double t_copy_in, t_copy, t_sum;
    int nstarted;             /* buckets started in this step, their indices in order[] */
    int *order;
    /* With MPI_THREAD_MULTIPLE, a progress thread tests the requests of the buckets in flight
     * while the caller computes (MPI moves a large message only inside MPI calls); `lock`
     * guards the buckets' requests, order and nstarted while it runs. */
    int prog_on;
    atomic_int prog_stop;
    dt_status prog_status;    /* a phase the thread failed to complete, and its text */
    char prog_error[512];
    pthread_t prog;
    pthread_mutex_t lock;
};

/* ---- the local devices (device.c) ----------------------------------------------------------
 * The state lives in the mesh's device memory: every access goes through the device layer
 * (docs/optim.md). Kernels of device i run after dt__zero_select(z, i); their results are
 * complete, for relayouts and host reads, after dt__zero_sync. */

/* Selects local device i for its kernels (the kernel table's set_device); *be_out gets the
 * table. */
dt_status dt__zero_select(const dt_zero *z, int i, const dt__ops_backend **be_out);
/* Waits for the work issued on every local device; returns the first failure of it. */
dt_status dt__zero_sync(const dt_zero *z);

/* ---- flat buffers (flat.c) ------------------------------------------------------------------ */

/* A piece of one parameter inside a run of the flat buffer: elements [pos, pos + len) of the
 * parameter's flattened local form sit at flat index `flat`. */
typedef struct dt__zseg {
    const dt__zparam *param;
    int64_t pos;
    int64_t flat;
    int64_t len;
} dt__zseg;

/* The pieces of parameters covering flat range [lo, hi) of group g, in order, into segs
 * (room for g->nparams); returns their count. */
int dt__zero_segments(const dt__zgroup *g, int64_t lo, int64_t hi, dt__zseg *segs);

/* A box of a row-major array whose elements, in row-major order, are the flat range
 * [start, start + len) of it. */
typedef struct dt__zbox {
    int64_t offsets[DT_MAX_RANK];
    int64_t sizes[DT_MAX_RANK];
    int64_t start;
    int64_t len;
} dt__zbox;
#define DT__ZERO_MAX_BOXES (2 * DT_MAX_RANK)

/* Cuts flat range [a, b) of a row-major array of `shape` (rank >= 0, a < b <= numel) into
 * boxes (room for DT__ZERO_MAX_BOXES), in order; returns their count. */
int dt__zero_boxes(int rank, const int64_t *shape, int64_t a, int64_t b, dt__zbox *boxes);

/* Chunk tensor of `len` elements per model coordinate on one of the zero's layouts. */
dt_status dt__zero_chunk_tensor(const dt_zero *z, const dt_layout *layout, dt_dtype dtype,
                                int64_t len, int zeroed, dt_tensor **out);

/* Casts chunk ch's f32 master, device by device, into dst (a chunk tensor of g's dtype on the
 * same layout). */
dt_status dt__zero_cast_master(const dt_zero *z, const dt__zgroup *g, const dt__zchunk *ch,
                               dt_tensor *dst);

/* The range [*off, *off + *len) of chunk tensor t's last dim held by local device i. */
void dt__zero_local_range(const dt_tensor *t, int i, int64_t *off, int64_t *len);

/* Writes flat range [lo, lo + n) of group g, for local device i, into dst (dst_dtype, that
 * device's memory): each parameter piece read from src_tensors[param index] (their local
 * component i, any float dtype, cast), padding zero. src_tensors is indexed by
 * dt__zparam.index; NULL reads the parameters themselves. Issues device work only (no
 * sync). */
dt_status dt__zero_gather_in(const dt_zero *z, const dt__zgroup *g, int i, int64_t lo,
                             int64_t n, dt_tensor *const *src_tensors, void *dst,
                             dt_dtype dst_dtype);
/* Writes flat range [lo, lo + n) of group g, held by local device i in src (src_dtype, that
 * device's memory), into the parameters' local components i (cast to their dtype); padding
 * is skipped. Issues device work only (no sync). */
dt_status dt__zero_scatter_out(const dt_zero *z, const dt__zgroup *g, int i, int64_t lo,
                               int64_t n, const void *src, dt_dtype src_dtype);

/* Allocates group g's chunks and state (master initialised from the parameters). */
dt_status dt__zero_alloc_state(dt_zero *z, dt__zgroup *g);
void dt__zero_free_group(dt__zgroup *g);

/* 1 if local device i counts parameter p's gradient in the global norm: it is the first of
 * the devices holding identical copies (coordinate 0 on every mesh dim replicating p, and on
 * the dp dim in stage 0). The same rule picks the device that saves a state slice. */
int dt__zero_counts(const dt_zero *z, const dt__zparam *p, int i);

/* ---- the reduction of a chunk (step.c) and early reduction (ready.c) ------------------- */

/* The flat chunk tensor a reduction of chunk ch fills: the persistent one (stages 0, 1) or a
 * new transient (stage 2), into *flat_out. */
dt_status dt__zero_flat_for(const dt_zero *z, const dt__zgroup *g, dt__zchunk *ch,
                            dt_tensor **flat_out);
/* Reduces chunk ch over dp from `flat`, filled with every device's summands (after a sync):
 * stage 2 into the gradient partition (and destroys the transient flat), stages 0 and 1 in
 * place into the persistent flat buffer's partition. Collective. */
dt_status dt__zero_reduce_filled(const dt_zero *z, const dt__zgroup *g, dt__zchunk *ch,
                                 dt_tensor *flat);
/* DT_ERR_INVALID_ARGUMENT / DT_ERR_SHAPE unless t is a gradient for parameter p (message
 * starts with fn). */
dt_status dt__zero_check_grad(const dt_zero *z, const char *fn, const dt__zparam *p,
                              const dt_tensor *t);
/* The parameter with index `index` and its group (may be NULL); NULL when out of range. */
dt__zparam *dt__zero_param(const dt_zero *z, int index, dt__zgroup **group_out);
/* Drops this step's readiness (transient chunks freed). */
void dt__zero_ready_reset(dt_zero *z);

/* ---- background reduction (bucket.c) -------------------------------------------------------- */

/* The calling thread's CPU seconds (the step's copy and sum counters: work, not waits). */
double dt__zero_cpu_seconds(void);
/* Sets up z->overlap, z->comm and the dp peers (collective over the mesh's clients). Off when
 * dp_size is 1 or MPI's tags cannot tell the device pairs apart. */
dt_status dt__zero_overlap_init(dt_zero *z);
void dt__zero_overlap_fini(dt_zero *z);
/* Cuts every chunk into buckets of at most reduce_bucket_size bytes, counting the parameters
 * each waits for (first dt_zero_grad_ready of a step). */
dt_status dt__zero_buckets_begin(dt_zero *z);
/* Parameter p's gradient is in its chunks' filling tensors (device work synced): starts the
 * reduction of every bucket it completes, then progresses the buckets in flight (MPI_Test). */
dt_status dt__zero_buckets_take(dt_zero *z, const dt__zgroup *g, const dt__zparam *p);
/* Waits for every bucket in flight and completes it (the reduced gradients in place). */
dt_status dt__zero_buckets_wait(dt_zero *z);
/* Waits for what is in flight (buffers are read by MPI) and frees the buckets. */
void dt__zero_buckets_free(dt_zero *z);

/* ---- offload of the optimizer to the host (offload.c) --------------------------------------- */

/* Local device i's range [*off, *off + *len) of chunk ch in the state layout (its partition;
 * stage 0: the whole chunk). */
void dt__zero_part(const dt_zero *z, const dt__zchunk *ch, int i, int64_t *off, int64_t *len);
/* Local device i's partition of state `kind` (0 master, 1 s1, 2 s2) of chunk ch: host memory
 * under offload, else the tensor's device memory; NULL when the kind is absent. */
float *dt__zero_state_data(const dt__zchunk *ch, int kind, int i);
/* 1 if host code may read and write local device i's state directly (offload, or a device
 * kind whose memory the host reaches). */
int dt__zero_state_on_host(const dt_zero *z, int i);
/* Moves chunk ch's freshly initialised master partition into host memory (zeroed moments
 * beside it, s1 and s2 saying which exist) and frees its device tensor. */
dt_status dt__zero_offload_adopt(const dt_zero *z, dt__zchunk *ch, int s1, int s2);
void dt__zero_offload_free_chunk(dt__zchunk *ch);
/* The offloaded update of every chunk (grad_scale and t as the inner optimizer's) and the
 * all-gather of the updated parameters. Collective. */
dt_status dt__zero_offload_update(dt_zero *z, float grad_scale, int64_t t);
/* Host bytes the offloaded state and the staging hold. */
uint64_t dt__zero_offload_host_bytes(const dt_zero *z);
void dt__zero_offload_fini(dt_zero *z);

/* ---- stage 3: sharded parameters (stage3.c) ------------------------------------------------ */

/* Group g's parameters become shards: the 16-bit shard tensors are made from master, the
 * caller's tensors are let go (p->tensor NULL: released). */
dt_status dt__zero_s3_adopt(dt_zero *z, dt__zgroup *g);
void dt__zero_s3_free_group(const dt_zero *z, dt__zgroup *g);
/* After an update of chunk ch's master: its 16-bit shard made from it (no sync). */
dt_status dt__zero_s3_refresh(const dt_zero *z, const dt__zgroup *g, dt__zchunk *ch);
/* DT_ERR_STATE (message starts with fn) when a group is gathered or being gathered. */
dt_status dt__zero_s3_idle(const dt_zero *z, const char *fn);
/* Gathers every released group (for a checkpoint); *held_out gets which (ngroups bytes, to
 * free with dt__zero_s3_drop, which releases them again). */
dt_status dt__zero_s3_hold_all(dt_zero *z, unsigned char **held_out);
void dt__zero_s3_drop(dt_zero *z, unsigned char *held);

/* ---- mesh-wide agreement (agree.c) ---------------------------------------------------------- */

/* Reduces n doubles over every device of the zero's mesh (op DT_REDUCE_SUM or DT_REDUCE_MAX):
 * vals holds nlocal rows of n values, one per local device; out gets the n results on every
 * client. Collective. */
dt_status dt__zero_allreduce(const dt_zero *z, dt_reduce_op op, int n, const double *vals,
                             double *out);
/* Agrees on a status over the mesh's clients (dt__group_agree): every client returns the
 * lowest failing client's status and message, DT_OK when none failed. Collective. */
dt_status dt__zero_agree(const dt_zero *z, const char *fn, dt_status st);

/* optim/par.c: fn(lo, hi, arg) over items [lo, hi) of [0, n), on the caller and on threads
 * up to this process's share of the host's cores (dt__zero_par_threads), which claim blocks
 * of items in turn (cost non-NULL: one item a block, cost[i] the summed cost of the items
 * before i, cost[n] the total; NULL: elements, 65536 a block); no more threads than the
 * total cost over `grain`. The status of the lowest failing block, with its message. fn
 * must only touch host memory of its own items. */
typedef dt_status (*dt__zpar_fn)(int64_t lo, int64_t hi, void *arg);
int dt__zero_par_threads(void);
dt_status dt__zero_par(int64_t n, int64_t grain, const int64_t *cost, dt__zpar_fn fn, void *arg);

#endif
