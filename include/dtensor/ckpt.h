/* libdtensor checkpoints (DTensor's DSaver): sharded save from the host mesh, one merged
 * index, restore onto any mesh and layout, and local inspection for tools.
 * The on-disk format is specified in docs/ckpt-format.md; design notes in docs/ckpt.md. */
#ifndef DTENSOR_CKPT_H
#define DTENSOR_CKPT_H

#include <stddef.h>
#include <stdint.h>

#include "dtensor/export.h"
#include "dtensor/layout.h"
#include "dtensor/mesh.h"
#include "dtensor/status.h"
#include "dtensor/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Version of the on-disk format this library writes ("format_version" in the index). */
#define DT_CKPT_FORMAT_VERSION 2
/* File name of the merged index inside a checkpoint directory. */
#define DT_CKPT_INDEX_NAME "dtensor-index.json"
/* Default size of the chunks each slice's CRC32C list covers (docs/ckpt-format.md). */
#define DT_CKPT_CHUNK_BYTES ((uint64_t)1 << 20)
/* Longest tensor or value name accepted, in bytes (without the NUL). */
#define DT_CKPT_NAME_MAX 1024

/* ---- small named values saved beside the tensors ---------------------------------------- */

typedef enum dt_ckpt_value_type {
    DT_CKPT_VALUE_I64 = 0,    /* a step counter, an epoch */
    DT_CKPT_VALUE_F64 = 1,    /* a loss scale, a learning rate */
    DT_CKPT_VALUE_BYTES = 2,  /* an RNG state, any small blob (at most 16 MiB) */
} dt_ckpt_value_type;

/* One named value. For BYTES, `bytes`/`nbytes` (borrowed by the callee during the call). */
typedef struct dt_ckpt_value {
    const char *name;
    dt_ckpt_value_type type;
    int64_t i64;
    double f64;
    const void *bytes;
    size_t nbytes;
} dt_ckpt_value;

/* ---- save ----------------------------------------------------------------------------------- */

/* One explicitly placed slice of a tensor saved through dt_save_opts.pieces, for data that
 * follows no layout (the ZeRO optimizer's state: slices of a parameter's flattened form).
 * It is box [offsets, offsets + sizes) of the global tensor `name` (dtype, rank, shape), held
 * by local device `device` (index into the saving mesh's local devices: the device
 * dt_mesh_local_device_id(mesh, device) of the mesh given to dt_save) in host memory as a
 * compact row-major array `data` (borrowed during the call; may be NULL when empty). Names
 * follow the rules of tensor names. Over all clients, the pieces of one name must agree on
 * dtype, rank and shape and tile the global tensor exactly (no overlap, no gap), else dt_save
 * fails on every client with DT_ERR_INVALID_ARGUMENT naming the tensor and nothing is written
 * (a checkpoint already at `dir` stays). Each piece is written by its device into that
 * device's own file (a device holding only pieces writes one too); a device may hold several
 * pieces of one tensor (its file then keys the second and later ones "name#k",
 * docs/ckpt-format.md). A name may not also be in `names`. Empty pieces are allowed and write
 * nothing, but declare their tensor (a tensor with 0 elements needs one). The index records
 * such a tensor with the layout string "" (none) and the saving host mesh; it follows the
 * `names` tensors, in order of first appearance (client 0's pieces first, each client's in
 * its order). Restore it with dt_restore onto any layout, or read any box with
 * dt_ckpt_read_box. Every client receives every client's piece descriptors (about 80 bytes
 * each plus the name); the checks cost O(P log P) for P pieces cut along one dim. */
typedef struct dt_ckpt_piece {
    const char *name;
    dt_dtype dtype;
    int rank;
    const int64_t *shape;
    const int64_t *offsets;
    const int64_t *sizes;
    int device;
    const void *data;
} dt_ckpt_piece;

/* Options of dt_save. Initialise with DT_SAVE_OPTS_INIT, then set fields. */
typedef struct dt_save_opts {
    /* fsync every file and directory before the commit: 1 (default) or 0 (faster, not crash
     * safe: a power loss may then leave a torn checkpoint). */
    int fsync;
    /* Named values to store in the index (client 0's copies are written). */
    int nvalues;
    const dt_ckpt_value *values;
    /* Bytes per CRC32C chunk of a slice; 0 means DT_CKPT_CHUNK_BYTES. Else a multiple of 4096,
     * at most 1 GiB. */
    uint64_t chunk_bytes;
    /* Seconds the barriers of the save wait for other clients; <= 0 waits forever. */
    double timeout_seconds;
    /* This client's explicitly placed slices (differing between clients), saved beside the
     * tensors. */
    int npieces;
    const dt_ckpt_piece *pieces;
    /* dt_save_async: the most bytes of staging memory this client holds at once; when it is
     * full the call waits for the background writer to free some (it always holds at least
     * one piece: up to 1 MiB, or chunk_bytes if smaller). 0: all of this client's bytes
     * (copied, then written) for tensors on a CPU mesh; DT_CKPT_STAGING_MB MiB (default 64)
     * when some are in GPU memory. dt_save stages GPU tensors too, with the same bound. The
     * staging buffer is kept for the next save that stages (its pages already mapped, so only
     * the first save pays their page faults), replaced by a smaller one when a later save's
     * bound is below its size, freed after every save when DT_CKPT_STAGING_KEEP=0, and
     * freed by dt_finalize. */
    uint64_t staging_bytes;
    /* The dtype to store each of the n tensors as (TensorFlow's should_cast: f32 master
     * weights saved as bf16), NULL: as they are. A tensor of another dtype among f32, f64,
     * f16 and bf16 is cast (dt_cast rounding) on the host before it is written; other
     * changes are DT_ERR_INVALID_ARGUMENT. dt_restore_into casts back into its targets. */
    const dt_dtype *save_dtypes;
    /* 1: a node-local save (the in-memory checkpoints of dt_memckpt, docs/recovery.md):
     * `dir` may differ between clients and names a directory each client sees only with the
     * clients passing the same `dir` (a host's /dev/shm). The lowest client of each such set
     * prepares, indexes and commits its copy; each client writes its own files there, so a
     * directory ends up with the whole index and the files of its clients only. Not with
     * the checkpoint manager (dt_save_step): DT_ERR_INVALID_ARGUMENT. 0 (default): one
     * shared `dir`. */
    int node_local;
} dt_save_opts;

#define DT_SAVE_OPTS_INIT {1, 0, NULL, 0, 0.0, 0, NULL, 0, NULL, 0}

/* One shard file of a save: the file the saving device writes. */
typedef struct dt_ckpt_shard {
    char *path;            /* "<dir>/data-0000K-of-0000N.safetensors" (owned by the list) */
    int device_id;         /* the saving device (global id, host mesh of `mesh`) */
    int64_t position;      /* its mesh position */
    int64_t num_slices;    /* slices it writes */
    uint64_t data_bytes;   /* tensor bytes it writes (headers excluded) */
} dt_ckpt_shard;

/* DTensor's sharded_prefix: the shard files that dt_save(mesh, dir, n, names, tensors) writes,
 * in file order, for a save without dt_save_opts.pieces (pieces are not known here: with them
 * a save may write more files, numbered differently). Each block of each tensor is written by exactly one device holding it; a
 * replicated block goes to the holder with the fewest bytes assigned so far (ties: lowest
 * mesh position), so replicas are spread over devices. Devices owning no non-empty block write
 * no file. All tensors must live on `mesh` (dt_mesh_equal). Names are checked as in dt_save.
 * On success *shards_out is an owned array of *count_out entries (free with
 * dt_ckpt_shards_free); 0 entries when nothing is to be written.
 * DT_ERR_INVALID_ARGUMENT for bad names (empty, too long, repeated, control characters,
 * "__metadata__") or a tensor on another mesh. Local (no communication). */
DT_API dt_status dt_sharded_prefix(const dt_mesh *mesh, const char *dir, int n,
                                   const char *const *names, const dt_tensor *const *tensors,
                                   dt_ckpt_shard **shards_out, int *count_out);
DT_API void dt_ckpt_shards_free(dt_ckpt_shard *shards, int count);

/* Saves `n` named tensors (all on `mesh`) and opts->values into the checkpoint directory `dir`.
 * Partial tensors are reduced first (dt_relayout, on their mesh). Tensors on a GPU mesh are
 * read from their devices piece by piece into staging memory of at most opts->staging_bytes
 * (0: DT_CKPT_STAGING_MB MiB, default 64) while earlier pieces are written: never a host
 * copy of a whole tensor. Every saving device writes only the slices it owns, into its
 * own data-0000K-of-0000N.safetensors; client 0 merges one index after a barrier. The commit
 * is atomic: files are written (and fsynced) in "<dir>.dtensor-tmp" beside `dir`, then renamed
 * into place; an existing checkpoint at `dir` is replaced safely (moved to "<dir>.dtensor-old",
 * the new one renamed in, the old one removed). A crash at any moment leaves the previous
 * checkpoint or the new one readable by dt_restore/dt_ckpt_open. Names are keys inside the
 * files, never paths. All clients must pass the same names, shapes, dtypes and layouts.
 * Collective: every client holding devices of `mesh` calls it, in the same order.
 * Returns DT_ERR_INVALID_ARGUMENT (bad name, NULL, a tensor on another mesh, `dir` exists and
 * is not a checkpoint), DT_ERR_IO (naming the file and the errno text, e.g. ENOSPC: the
 * previous checkpoint is kept and the temporary directory removed), DT_ERR_NO_MEMORY,
 * DT_ERR_COMM/DT_ERR_TIMEOUT. Every client returns the same status; a client whose own part
 * succeeded reports the failing client's message. opts may be NULL for defaults. */
DT_API dt_status dt_save(const dt_mesh *mesh, const char *dir, int n, const char *const *names,
                         const dt_tensor *const *tensors, const dt_save_opts *opts);

/* ---- asynchronous save ---------------------------------------------------------------------- */

/* An asynchronous save in progress (owned by the caller until dt_save_wait). */
typedef struct dt_save_request dt_save_request;

/* Like dt_save, but returns once this client's bytes are copied into staging memory (after
 * the collective start: inputs checked, partial tensors reduced and casts made on their
 * mesh, the plan made and the temporary directory created): the caller may change or
 * destroy its tensors, pieces and values at once. A background thread writes the files,
 * syncs them, and with the other clients' threads commits exactly as dt_save does (the same
 * crash safety: the previous checkpoint stays until the commit). opts->staging_bytes bounds
 * the staging memory (the call then waits for the writer, copying as it frees room).
 * opts->timeout_seconds applies to the start only. A save (sync or async) begins by waiting
 * for the previous asynchronous one to end; dt_finalize waits too. Without MPI_THREAD_MULTIPLE
 * the whole save runs in the call. On success *req_out is an owned request: its outcome comes
 * from dt_save_wait (errors of the background part, e.g. DT_ERR_IO for a full disk, appear
 * there, the same on every client). Errors of the start are returned here, as dt_save's, and
 * no request is made. Collective as dt_save. */
DT_API dt_status dt_save_async(const dt_mesh *mesh, const char *dir, int n,
                               const char *const *names, const dt_tensor *const *tensors,
                               const dt_save_opts *opts, dt_save_request **req_out);
/* Waits for the save to end and frees the request: its outcome (as dt_save's, with
 * dt_last_error() set on failure). Local (the clients' background threads agree among
 * themselves). */
DT_API dt_status dt_save_wait(dt_save_request *req);
/* *done_out = 1 when the save has ended (dt_save_wait will not block), else 0. Local. */
DT_API dt_status dt_save_test(const dt_save_request *req, int *done_out);

/* ---- checkpoint manager: steps under a root directory -------------------------------------- */

/* Which steps a manager save keeps under its root. */
typedef struct dt_ckpt_keep {
    int last;                     /* the newest `last` complete steps (>= 1) */
    int64_t every;                /* and every step divisible by it (0: none) */
} dt_ckpt_keep;
#define DT_CKPT_KEEP_INIT {3, 0}

/* "<root>/step-%010lld" of `step` (>= 0) into buf. DT_ERR_INVALID_ARGUMENT. Local. */
DT_API dt_status dt_ckpt_step_dir(const char *root, int64_t step, char *buf, size_t len);

/* dt_save into dt_ckpt_step_dir(root, step), then client 0 points "<root>/latest" at it
 * (a one-line file "step-%010lld", replaced atomically through a rename, fsynced with
 * opts->fsync) and removes the steps below `step` that `keep` (NULL: DT_CKPT_KEEP_INIT) does
 * not keep: beyond the newest keep->last complete ones (this one included), those not a
 * multiple of keep->every, and incomplete ones (a crashed save's). A removal deletes the
 * index first, so a crash during it leaves an incomplete step, never a damaged complete one.
 * Damaged steps (dt_ckpt_step) are never removed: client 0 renames the ones below `step`,
 * and `step`'s own directory when it is damaged (before the save writes), to
 * "step-N.damaged". Steps above `step` are not touched. Returns dt_save's statuses (the same on every
 * client); DT_ERR_INVALID_ARGUMENT for a negative step or a bad keep; DT_ERR_IO naming the
 * path when the pointer or a removal fails (the step itself is then committed). Collective. */
DT_API dt_status dt_save_step(const dt_mesh *mesh, const char *root, int64_t step,
                              const dt_ckpt_keep *keep, int n, const char *const *names,
                              const dt_tensor *const *tensors, const dt_save_opts *opts);
/* dt_save_step as dt_save_async: the pointer and the pruning happen in the background after
 * the commit. Collective. */
DT_API dt_status dt_save_step_async(const dt_mesh *mesh, const char *root, int64_t step,
                                    const dt_ckpt_keep *keep, int n, const char *const *names,
                                    const dt_tensor *const *tensors, const dt_save_opts *opts,
                                    dt_save_request **req_out);

/* The latest complete step under root: the step "<root>/latest" names when it is complete,
 * else the highest complete step. Complete: its index opens (checksum and schema valid) and
 * every data file it lists is present with its recorded size; data CRCs are checked by the
 * restore. *step_out (may be NULL) gets the step, dir_buf (may be NULL) its directory.
 * Damaged steps passed over are not reported here: dt_ckpt_find_latest says which.
 * DT_ERR_NOT_FOUND when no step is complete (or no root; the message names the newest
 * damaged step and why, if any). Local. */
DT_API dt_status dt_ckpt_latest(const char *root, int64_t *step_out, char *dir_buf,
                                size_t len);

/* Longest reason text kept for a damaged step (with its NUL). */
#define DT_CKPT_REASON_MAX 512

/* What dt_ckpt_find_latest chose, and the damaged steps it passed over to get there. */
typedef struct dt_ckpt_latest_info {
    int64_t step;                 /* the latest complete step */
    int64_t skipped;              /* damaged steps above it passed over (the one "latest"
                                   * names, or newer ones when there is no usable pointer) */
    int64_t skipped_step;         /* the newest of them; -1 when none */
    char skipped_reason[DT_CKPT_REASON_MAX]; /* why that one is damaged ("" when none) */
} dt_ckpt_latest_info;

/* dt_ckpt_latest, also saying what it skipped: a caller that resumes from a step should tell
 * its user when info_out->skipped > 0 (the library never prints), e.g. "step 8 is damaged
 * (<reason>); resuming from step 7". Damaged: see dt_ckpt_step. info_out and dir_buf (may be
 * NULL) are written on success only. Statuses of dt_ckpt_latest. Local. */
DT_API dt_status dt_ckpt_find_latest(const char *root, dt_ckpt_latest_info *info_out,
                                     char *dir_buf, size_t len);

/* One step directory under a root. */
typedef struct dt_ckpt_step {
    int64_t step;
    int complete;                 /* as dt_ckpt_latest means it */
    /* 1 when the step was committed (its directory holds an index) but is not complete now:
     * a file truncated, missing or altered after the save. Never chosen as latest, never
     * removed by a manager save: the next one (dt_save_step) renames it to
     * "step-N.damaged" (".damaged.2", ... when taken) so that it is kept for inspection and
     * out of the way. A crashed save's leftovers are incomplete, not damaged. */
    int damaged;
    int set_aside;                /* 1: this entry is such a "step-N.damaged" directory */
    char name[64];                /* its directory entry: "step-0000000008", or the aside
                                   * name */
    char reason[DT_CKPT_REASON_MAX]; /* damaged: what is wrong, naming the file; else "" */
} dt_ckpt_step;
/* Every step found under root (a directory "step-<digits>", or its leftovers of a crashed
 * save), by increasing step, into an owned array (free with dt_ckpt_steps_free; 0 entries
 * possible); a step's set-aside directories follow it as entries of their own.
 * DT_ERR_NOT_FOUND (no root), DT_ERR_IO, DT_ERR_NO_MEMORY. Local. */
DT_API dt_status dt_ckpt_list_steps(const char *root, dt_ckpt_step **steps_out,
                                    int64_t *count_out);
DT_API void dt_ckpt_steps_free(dt_ckpt_step *steps);

/* ---- restore -------------------------------------------------------------------------------- */

/* Restores `n` named tensors from the checkpoint `dir` as new tensors with `layouts[i]` (all
 * on `mesh`, any device count, mesh shape or sharding; partial layouts are not accepted),
 * with the saved global shapes and dtypes. Each device reads only the chunks of the saved
 * slices its shard intersects (pread), and checks the index's own CRC32C, every chunk's
 * CRC32C, the file sizes and the safetensors headers (CRC32C and content) against the index.
 * GPU components are filled through staging memory of at most DT_CKPT_STAGING_MB MiB per
 * client (default 64; DT_ERR_INVALID_ARGUMENT if it is not a positive number), the file read
 * of one piece overlapping the copy of the previous one to its device.
 * Collective over the clients holding devices of `mesh`; every client returns the same status,
 * also when only one client's arguments (its dir, a name, a layout) are bad: the others then
 * report "client C: <its message>". A client holding no device of the mesh reads the index
 * (the checkpoint must exist by then), communicates with no one and gets tensors without
 * local components (docs/mesh.md). On success tensors_out[i] are owned handles; on failure
 * nothing is written.
 * Returns DT_ERR_NOT_FOUND (no checkpoint at `dir`, or no tensor of that name),
 * DT_ERR_CORRUPT (missing, truncated or altered file or index: the message names the file and
 * the tensor), DT_ERR_SHAPE (layout rank differs from the saved rank), DT_ERR_INVALID_ARGUMENT,
 * DT_ERR_IO, DT_ERR_NO_MEMORY, DT_ERR_COMM. */
DT_API dt_status dt_restore(const dt_mesh *mesh, const char *dir, int n,
                            const char *const *names, const dt_layout *const *layouts,
                            dt_tensor **tensors_out);

/* Like dt_restore into existing tensors (their layouts, shapes and dtypes fixed, all on one
 * mesh, none partial): DT_ERR_SHAPE when a saved shape differs, or the dtype differs and is
 * not castable (names both); a tensor saved as f32, f64, f16 or bf16 restores into any of
 * those, cast as dt_cast does (bf16 saved from f32 masters comes back as f32). On failure
 * the targets' contents are unspecified (partly overwritten). Collective as above. */
DT_API dt_status dt_restore_into(const char *dir, int n, const char *const *names,
                                 dt_tensor *const *tensors);

/* ---- inspection (local: no MPI, no runtime needed) ------------------------------------------ */

typedef struct dt_ckpt dt_ckpt;

/* Opens the checkpoint at `dir`: reads and validates its index (its own CRC32C, then schema,
 * names, shapes, slice bounds, slices tiling each tensor exactly). If `dir` holds no index but "<dir>.dtensor-old"
 * does (a save crashed mid-commit), that previous checkpoint is opened (dt_ckpt_path says
 * which). Reads no tensor data. Owned handle, close with dt_ckpt_close.
 * DT_ERR_NOT_FOUND (no checkpoint), DT_ERR_CORRUPT (altered or bad index, naming the file and the field), DT_ERR_IO,
 * DT_ERR_UNSUPPORTED (a newer format_version). Local. */
DT_API dt_status dt_ckpt_open(const char *dir, dt_ckpt **ckpt_out);
/* Accepts NULL. */
DT_API void dt_ckpt_close(dt_ckpt *ckpt);

/* Directory actually read (borrowed), and the index's format_version and save mesh string. */
DT_API const char *dt_ckpt_path(const dt_ckpt *ckpt);
DT_API int dt_ckpt_format_version(const dt_ckpt *ckpt);
DT_API const char *dt_ckpt_mesh(const dt_ckpt *ckpt);

/* Data files, in index order (data-00000-of-0000N first). */
typedef struct dt_ckpt_file_info {
    const char *name;        /* file name inside the directory (borrowed) */
    uint64_t bytes;          /* its size */
    uint64_t header_bytes;   /* 8 + safetensors header length: where the data buffer starts */
    uint32_t header_crc32c;  /* CRC32C of those header_bytes bytes */
    int device_id;           /* device that wrote it */
} dt_ckpt_file_info;
DT_API int64_t dt_ckpt_num_files(const dt_ckpt *ckpt);
DT_API dt_status dt_ckpt_file(const dt_ckpt *ckpt, int64_t i, dt_ckpt_file_info *info_out);

/* Tensors in save order. Strings are borrowed from the handle. */
typedef struct dt_ckpt_tensor_info {
    const char *name;
    dt_dtype dtype;
    int rank;
    int64_t shape[DT_MAX_RANK];
    const char *layout;       /* layout string at save time (host mesh); "" for a tensor
                               * saved as pieces */
    const char *mesh;         /* mesh string at save time (host mesh) */
    int64_t num_slices;
} dt_ckpt_tensor_info;
DT_API int64_t dt_ckpt_num_tensors(const dt_ckpt *ckpt);
DT_API dt_status dt_ckpt_tensor(const dt_ckpt *ckpt, int64_t i, dt_ckpt_tensor_info *info_out);
/* Index of the tensor called `name`; DT_ERR_NOT_FOUND if none. */
DT_API dt_status dt_ckpt_find(const dt_ckpt *ckpt, const char *name, int64_t *index_out);

/* One saved slice (a box of the global tensor) of tensor i. */
typedef struct dt_ckpt_slice_info {
    const char *file;             /* data file name (borrowed) */
    const char *key;              /* its key in that file's safetensors header (borrowed) */
    int rank;
    int64_t offsets[DT_MAX_RANK]; /* box start in the global tensor */
    int64_t sizes[DT_MAX_RANK];   /* box shape */
    uint64_t file_offset;         /* absolute byte offset of its data in the file */
    uint64_t bytes;               /* its data length */
    uint32_t crc32c;              /* CRC32C of all its bytes */
    uint64_t chunk_bytes;         /* chunk size of the per-chunk CRCs */
    int64_t num_chunks;           /* ceil(bytes / chunk_bytes) */
} dt_ckpt_slice_info;
DT_API dt_status dt_ckpt_slice(const dt_ckpt *ckpt, int64_t tensor, int64_t slice,
                               dt_ckpt_slice_info *info_out);

/* Named values: count, i-th name and type, and getters by name (DT_ERR_NOT_FOUND if absent,
 * DT_ERR_SHAPE if of another type). dt_ckpt_value_bytes lends a pointer valid until close. */
DT_API int64_t dt_ckpt_num_values(const dt_ckpt *ckpt);
DT_API dt_status dt_ckpt_value_info(const dt_ckpt *ckpt, int64_t i, const char **name_out,
                                    dt_ckpt_value_type *type_out);
DT_API dt_status dt_ckpt_value_i64(const dt_ckpt *ckpt, const char *name, int64_t *value_out);
DT_API dt_status dt_ckpt_value_f64(const dt_ckpt *ckpt, const char *name, double *value_out);
DT_API dt_status dt_ckpt_value_bytes(const dt_ckpt *ckpt, const char *name,
                                     const void **data_out, size_t *nbytes_out);

/* One problem found by dt_ckpt_verify. Strings borrowed for the callback's duration. */
typedef struct dt_ckpt_problem {
    const char *file;        /* data file (or the index file name) */
    const char *tensor;      /* tensor name, "" when the problem is the file itself */
    int64_t tensor_index;    /* -1 when not about one tensor */
    int64_t slice_index;     /* -1 when not about one slice */
    dt_status status;        /* DT_ERR_CORRUPT or DT_ERR_IO */
    const char *message;     /* the full text, as dt_last_error() would give */
} dt_ckpt_problem;
typedef void (*dt_ckpt_problem_fn)(void *arg, const dt_ckpt_problem *problem);

/* Reads every data file completely (the index's own CRC32C was checked by dt_ckpt_open):
 * checks sizes, header CRCs, that each safetensors header and its DCP_SHARDING_INFO agree
 * with the index, and every slice's whole and per-chunk CRC32C. Calls `fn` (may be NULL) once per bad file or slice and goes on. *bad_out (may be
 * NULL) gets the number of problems. Returns DT_OK when none, else DT_ERR_CORRUPT (the first
 * problem's text in dt_last_error()). Local. */
DT_API dt_status dt_ckpt_verify(const dt_ckpt *ckpt, dt_ckpt_problem_fn fn, void *arg,
                                int64_t *bad_out);

/* Reads one tensor's whole global value into `buf` (row-major, `len` >= numel * dtype size
 * bytes), checking CRCs. DT_ERR_CORRUPT names file and tensor. Local. */
DT_API dt_status dt_ckpt_read_tensor(const dt_ckpt *ckpt, int64_t tensor, void *buf,
                                     size_t len);

/* Reads box [offsets, offsets + sizes) of tensor `tensor` (rank entries each; NULL allowed
 * for a scalar) into `buf`, a compact row-major array of shape `sizes` (`len` >= its bytes),
 * from every saved slice that intersects the box (any save: layouts or pieces), reading only
 * the chunks that hold it and checking their CRCs. A zero-size box reads nothing (`buf` may
 * then be NULL). DT_ERR_SHAPE for a box outside the tensor or `len` too small;
 * DT_ERR_INVALID_ARGUMENT for a bad handle or tensor index; DT_ERR_CORRUPT names file and
 * tensor; DT_ERR_IO. Local; several threads may read through one handle. Cost per call: the
 * files it touches are opened (each file's header is checked once per handle), and each slice
 * end inside the box costs one whole chunk read (chunk_bytes of the save, 1 MiB by default),
 * so many small boxes read faster from a save with small chunk_bytes. */
DT_API dt_status dt_ckpt_read_box(const dt_ckpt *ckpt, int64_t tensor, const int64_t *offsets,
                                  const int64_t *sizes, void *buf, size_t len);

/* Options of dt_ckpt_export. */
typedef struct dt_ckpt_export_opts {
    /* 0: one file. Else the most tensor bytes per output file; tensors are never split, so a
     * file holds at least one tensor even when that exceeds the limit. */
    uint64_t max_file_bytes;
    /* fsync the written files: 1 (default) or 0. */
    int fsync;
    /* dt_ckpt_export_hf_gpt2: the model's attention heads, for its config.json; 0: as the
     * checkpoint records them (train_gpt2's "train/config" value, "heads=H"). */
    int64_t heads;
} dt_ckpt_export_opts;
#define DT_CKPT_EXPORT_OPTS_INIT {0, 1, 0}

/* Writes every tensor, whole, as standard safetensors into the directory `out_dir` (created
 * if missing), or, when `out_dir` ends in ".safetensors", as that one file (written as
 * "<out_dir>.partial", then renamed; DT_ERR_INVALID_ARGUMENT when max_file_bytes would split
 * it or a directory of that name exists). Never into a checkpoint directory or a manager's
 * root (`out_dir`, or the one file's directory): DT_ERR_INVALID_ARGUMENT, nothing written.
 * In a directory: "model.safetensors" when it fits one file, else "model-0000K-of-0000N.safetensors"
 * (K from 00001) plus "model.safetensors.index.json" ({"metadata": {"total_size": bytes},
 * "weight_map": {name: file}}), as Hugging Face writes them; loadable by the safetensors
 * library as-is. Named values go into the first file's __metadata__ as strings
 * ("dtensor.value.<name>": decimal, "%.17g" or hex). Verifies CRCs while reading.
 * *files_out (may be NULL) gets the number of files written. opts may be NULL.
 * DT_ERR_CORRUPT, DT_ERR_IO, DT_ERR_NO_MEMORY. Local. */
DT_API dt_status dt_ckpt_export(const dt_ckpt *ckpt, const char *out_dir,
                                const dt_ckpt_export_opts *opts, int *files_out);

/* ---- in-memory checkpoints on a buddy host (docs/recovery.md) ------------------------------ */

/* A job's checkpoints in host memory outside its processes: every K steps each client writes
 * its files of a node-local dt_save (the same format) into its host's memory directory and
 * copies them, asynchronously, to a buddy client J clients away on another host. A restarted
 * job (a new launch: MPI cannot be initialised twice) finds the newest step complete across
 * the surviving hosts' memory and restores from it; the disk checkpoint stays as it is. */
typedef struct dt_memckpt dt_memckpt;

/* Options of dt_memckpt_create. Initialise with DT_MEMCKPT_OPTS_INIT. */
typedef struct dt_memckpt_opts {
    /* K: dt_memckpt_due says yes every `every` steps (>= 1). */
    int64_t every;
    /* J: client c's buddy is client (c + J) mod N of the mesh's N clients; 0: the smallest J
     * that puts every client's buddy on another host (the number of clients per host when
     * hosts are alike), else 1. */
    int buddy;
    /* The job's identity, part of every name ([A-Za-z0-9._-], at most 64 bytes): a job never
     * sees another job's memory. NULL: $DT_JOB_ID (set by dtensor launch). Required. */
    const char *job_id;
    /* The memory directory; "%h" is replaced by the host name, "%c" by the client id (tests
     * that make each client a host of its own). NULL: $DT_MEMCKPT_DIR, else /dev/shm. The
     * job's steps live in "<dir>/dtensor-mem-<job_id>/step-%010lld". */
    const char *dir;
    /* Steps kept in memory (>= 1; default 2: the newest, whose buddy copy may be in flight,
     * and the one before it, fully copied). */
    int keep;
} dt_memckpt_opts;
#define DT_MEMCKPT_OPTS_INIT {1, 0, NULL, NULL, 2}

/* Makes the handle for `mesh` (the mesh whose clients save and restore together): resolves
 * this client's directory, learns every client's (which clients share a host's memory) and
 * picks the buddies. Creates nothing on disk. DT_ERR_INVALID_ARGUMENT (bad option, no job
 * id), DT_ERR_NO_MEMORY, DT_ERR_COMM/DT_ERR_TIMEOUT. Collective over the mesh's clients. */
DT_API dt_status dt_memckpt_create(const dt_mesh *mesh, const dt_memckpt_opts *opts,
                                   dt_memckpt **mc_out);
/* Completes the last step (dt_memckpt_wait: its CRC gather is a collective of the mesh's
 * clients, so every client destroys its handle at the same point), then frees the handle; the
 * memory stays (dt_memckpt_cleanup removes it). Accepts NULL. */
DT_API void dt_memckpt_destroy(dt_memckpt *mc);

/* 1 when `step` is one to save (a multiple of K), else 0. Local. */
DT_API int dt_memckpt_due(const dt_memckpt *mc, int64_t step);
/* This client's directory of step `step` into buf (borrowed by nobody). Local. */
DT_API dt_status dt_memckpt_step_dir(const dt_memckpt *mc, int64_t step, char *buf, size_t len);

/* Writes one step: the caller's `save` writes the checkpoint into `dir` with `opts` (a copy
 * of `base`, or the defaults, made node-local and without fsync), e.g. through dt_zero_save;
 * it is called on every client with this client's directory and must reach one node-local
 * dt_save of the mesh. The first call of a handle is a whole node-local dt_save, agreed by
 * every client (the same status everywhere). The calls after it agree on nothing: they need
 * the tensors and pieces of the first (same names, shapes, dtypes, boxes; else
 * DT_ERR_STATE), write this client's files over the oldest step kept, post the CRC gather
 * and the buddy copy (nonblocking MPI, progressed by the MPI calls of the next steps,
 * dt_memckpt_poll and the next save; files sent from and received into mapped memory
 * files), and leave the commit (the directory leader's, on a thread of its own) to the next
 * poll or save; a failure there is this client's alone. Memory per client: `keep` x (its
 * files + its source's files) in the memory directory (dt_memckpt_stats). Returns save's
 * status, or DT_ERR_IO, DT_ERR_COMM, DT_ERR_TIMEOUT of the previous step's copy or CRC
 * gather. Every client of the mesh calls it at the same steps. */
typedef dt_status (*dt_memckpt_save_fn)(void *arg, const char *dir, const dt_save_opts *opts);
DT_API dt_status dt_memckpt_save(dt_memckpt *mc, int64_t step, dt_memckpt_save_fn save,
                                 void *arg, const dt_save_opts *base);
/* Progresses the last step's CRC gather, commit and buddy copy; *done_out (may be NULL) = 1
 * when none is left. Local. */
DT_API dt_status dt_memckpt_poll(dt_memckpt *mc, int *done_out);
/* Completes the last step: its CRC gather, its commit and its buddy copy. DT_ERR_IO,
 * DT_ERR_COMM, DT_ERR_TIMEOUT (a client lost). Every client of the mesh calls it at the same
 * point (the CRC gather is a collective of the mesh's clients). */
DT_API dt_status dt_memckpt_wait(dt_memckpt *mc);

/* What dt_memckpt_find found. */
typedef struct dt_memckpt_found {
    int64_t step;           /* the newest step complete across the clients' memory */
    int64_t files;          /* its data files */
    int64_t from_buddies;   /* of them, those whose only copies are buddy copies (the files
                             * of clients whose host memory is gone) */
    int hosts;              /* memory directories (hosts) of this job holding some of it */
    int64_t newer_incomplete; /* the newest step above it found incomplete, -1 if none */
} dt_memckpt_found;

/* The newest step complete across the memory of this job's clients (every data file of its
 * index present, at its size, in some client's directory, as written or as a buddy copy).
 * DT_ERR_NOT_FOUND when no step is (the message says what is missing of the newest one).
 * Every client returns the same. Collective. */
DT_API dt_status dt_memckpt_find(dt_memckpt *mc, dt_memckpt_found *found_out);
/* Brings every file of step `step` that this client's directory lacks from a client holding
 * it (over MPI, file by file), so that the directory, written into dir_buf, is a complete
 * checkpoint for dt_restore/dt_zero_load on any mesh. DT_ERR_NOT_FOUND (step incomplete),
 * DT_ERR_IO, DT_ERR_COMM, DT_ERR_TIMEOUT. Collective. */
DT_API dt_status dt_memckpt_fetch(dt_memckpt *mc, int64_t step, char *dir_buf, size_t len);
/* Completes the copies, then removes the job's memory directory on every host (a job that
 * ended normally). Collective. */
DT_API dt_status dt_memckpt_cleanup(dt_memckpt *mc);

/* This client's view. */
typedef struct dt_memckpt_stats {
    int buddy;              /* the client receiving this one's files */
    int source;             /* the client whose files this one receives */
    int buddy_same_host;    /* 1 when some client's buddy shares its memory directory */
    int hosts;              /* distinct memory directories among the clients */
    uint64_t own_bytes;     /* bytes of this client's files in its newest saved step */
    uint64_t buddy_bytes;   /* bytes received from its source for that step */
    uint64_t held_bytes;    /* both, over the steps kept: this client's share of memory */
    double last_save_seconds; /* the last dt_memckpt_save (write + copy start) */
} dt_memckpt_stats;
DT_API dt_status dt_memckpt_stats_get(const dt_memckpt *mc, dt_memckpt_stats *stats_out);

/* CRC32C (Castagnoli, reflected polynomial 0x82F63B78, init and final xor 0xFFFFFFFF) of
 * `len` bytes continuing from `crc` (0 to start): dt_crc32c(dt_crc32c(0, a, n), b, m) is the
 * CRC of a followed by b. dt_crc32c(0, "123456789", 9) == 0xE3069283. Local. */
DT_API uint32_t dt_crc32c(uint32_t crc, const void *data, size_t len);

#ifdef __cplusplus
}
#endif
#endif
