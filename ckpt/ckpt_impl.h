/* The ckpt module's private header: the parsed checkpoint (dt_ckpt), the save plan, the
 * chunk-verifying reader, file and directory helpers, and the client group of a mesh.
 * Not installed. */
#ifndef DTENSOR_CKPT_IMPL_H
#define DTENSOR_CKPT_IMPL_H

#include <jansson.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "dtensor/ckpt.h"
#include "dtensor/relayout.h"
#include "runtime/device.h"
#include "runtime/group.h"

#define CK_SUFFIX_TMP ".dtensor-tmp"
#define CK_SUFFIX_OLD ".dtensor-old"
#define CK_FORMAT_NAME "dtensor-checkpoint"
/* Longest path the module builds (dir + '/' + file name). */
#define CK_PATH_MAX 4096

/* ---- the parsed checkpoint (index.c builds and frees it) --------------------------------- */

typedef struct ck_slice {
    int64_t file;                 /* index into dt_ckpt.files */
    char *key;                    /* its key in the file when not the tensor name, else NULL */
    int64_t off[DT_MAX_RANK];
    int64_t size[DT_MAX_RANK];
    uint64_t begin;               /* data_offsets[0], relative to the data buffer */
    uint64_t file_offset;         /* absolute */
    uint64_t bytes;
    uint32_t crc;
    int64_t nchunks;
    uint32_t *chunk_crc;          /* nchunks entries */
} ck_slice;

typedef struct ck_tensor {
    char *name;
    dt_dtype dtype;
    int rank;
    int64_t shape[DT_MAX_RANK];
    char *layout;
    char *mesh;
    int64_t nslices;
    ck_slice *slices;
    /* The slices sorted by their start along dim `sweep` (the dim with the most distinct
     * starts), and reach[i]: the furthest end along it of order[0..i]. A box meets only
     * slices in one run of `order` (dt__ckpt_slices_near). */
    int sweep;
    int64_t *order;
    int64_t *reach;
} ck_tensor;

typedef struct ck_file {
    char *name;
    uint64_t bytes;
    uint64_t header_bytes;
    uint32_t header_crc;
    int device_id;
    unsigned char header_ok;      /* header checked once (dt_ckpt_read_box); atomic access */
    int64_t nslices;              /* slices stored in this file ... */
    int64_t *slice_tensor;        /* ... as (tensor, slice) pairs */
    int64_t *slice_index;
} ck_file;

typedef struct ck_value {
    char *name;
    dt_ckpt_value_type type;
    int64_t i64;
    double f64;
    unsigned char *bytes;
    size_t nbytes;
} ck_value;

struct dt_ckpt {
    char *path;                   /* directory actually read */
    int version;
    char *mesh;
    int64_t num_devices;
    uint64_t chunk_bytes;
    int64_t nfiles;
    ck_file *files;
    int64_t ntensors;
    ck_tensor *tensors;
    int64_t *by_name;             /* tensor indices sorted by name */
    int64_t nvalues;
    ck_value *values;
};

/* ---- names, dtypes, small helpers (common.c) ---------------------------------------------- */

/* Checks a tensor or value name: non-empty, at most DT_CKPT_NAME_MAX bytes, valid UTF-8,
 * no control characters, not "__metadata__". `what` ("tensor", "value") for the message.
 * DT_ERR_INVALID_ARGUMENT. */
dt_status dt__ckpt_check_name(const char *fn, const char *what, const char *name);
/* safetensors dtype strings ("F32", "BF16", ...). */
const char *dt__ckpt_dtype_str(dt_dtype dtype);
int dt__ckpt_dtype_from_str(const char *s, dt_dtype *dtype_out);   /* 0 ok, -1 unknown */
/* "data-%05d-of-%05d.safetensors" into buf (>= 48 bytes). */
void dt__ckpt_file_name(char *buf, size_t len, int64_t k, int64_t n);
/* dir + "/" + name, or dir + suffix; DT_ERR_INVALID_ARGUMENT when too long. */
dt_status dt__ckpt_join(char *buf, size_t len, const char *dir, const char *sep,
                        const char *name);
/* Directory path without trailing slashes into buf. */
dt_status dt__ckpt_norm_dir(const char *fn, const char *dir, char *buf, size_t len);

/* A box with an id, for the overlap sweep. */
typedef struct ck_box {
    int64_t off[DT_MAX_RANK];
    int64_t size[DT_MAX_RANK];
    int64_t id;
} ck_box;
/* 1 if two of the n non-empty boxes overlap (their ids into *a_out, *b_out, in sweep order),
 * else 0. Picks the dim with the most distinct starts, sorts `boxes` by (start there, id) and
 * compares each box only with those starting inside it along that dim: O(n log n) when the
 * boxes are cut along one dim, quadratic only when many share the same span there. The
 * result depends only on the boxes and ids (the same on every client). */
/* The dimension with the most distinct box starts (0 for rank 0 or without memory). */
int dt__ckpt_sweep_dim(int rank, const ck_box *boxes, int64_t n);
/* Builds t's order and reach (parse time). */
dt_status dt__ckpt_slice_index(ck_tensor *t);
/* [*first, *end) of t->order: the only slices that may meet the box (off, shape) (callers
 * still intersect; for slices tiling a grid along the sweep dim, one row of it). */
void dt__ckpt_slices_near(const ck_tensor *t, const int64_t *off, const int64_t *shape,
                          int64_t *first, int64_t *end);
int dt__ckpt_find_overlap(int rank, ck_box *boxes, int64_t n, int64_t *a_out, int64_t *b_out);
/* A slice key made of a tensor name: name itself, or name + "#" + decimal digits. */
int dt__ckpt_key_of(const char *key, const char *name);

/* CRC32C (crc32c.c): combine as zlib's crc32_combine: CRC of A||B from CRC(A), CRC(B), |B|. */
uint32_t dt__crc32c_combine(uint32_t crc_a, uint32_t crc_b, uint64_t len_b);

/* ---- I/O (fileio.c) ------------------------------------------------------------------------ */

/* Full pread/pwrite loops (EINTR, short transfers). pread returns the bytes read (< len only
 * at end of file) or -1 with errno. pwrite returns 0 or -1 with errno. */
int64_t dt__ckpt_pread(int fd, void *buf, size_t len, uint64_t off);
int dt__ckpt_pwrite(int fd, const void *buf, size_t len, uint64_t off);
/* fsync of a directory; DT_ERR_IO naming it. */
dt_status dt__ckpt_fsync_dir(const char *path);
/* Removes the regular files directly inside `path`, then the directory. Missing is fine. */
dt_status dt__ckpt_remove_dir(const char *path);
/* Drops the page cache of data files data-K-of-N in `dir` (clean pages only; the files stay):
 * those with K < nmine and mine[K] != 0, and those with K >= nmine and K % nparts == part.
 * Best effort: errors are ignored. */
void dt__ckpt_drop_cache(const char *dir, const unsigned char *mine, int64_t nmine, int part,
                         int nparts);
/* Removes a replaced checkpoint directory (reap.c): its files are unlinked and the directory
 * removed before returning, but each file's last close, which frees its blocks, runs in a
 * background thread. dt__ckpt_reap_wait waits for those closes (dt_finalize calls it). */
dt_status dt__ckpt_retire_dir(const char *path);
void dt__ckpt_reap_wait(void);
/* Registers the finalize hook that waits for the closes (dt__ckpt_retire_dir does it too);
 * an asynchronous save calls it from the caller's thread, since dt__at_finalize is not
 * thread safe and its background thread retires directories. */
dt_status dt__ckpt_reap_register(void);
/* 1 if path/dtensor-index.json exists (a regular file). */
int dt__ckpt_has_index(const char *dir);

/* ---- commit protocol (commit.c) ------------------------------------------------------------ */

/* The directory a reader should open for checkpoint `dir` (normalised): dir itself, or
 * dir.dtensor-old after a crash mid-commit. DT_ERR_NOT_FOUND when neither holds an index. */
dt_status dt__ckpt_resolve(const char *dir, char *buf, size_t len);
/* Client 0, before writing: cleans leftovers, refuses a non-checkpoint `dir`, creates the
 * temporary directory (path into tmp_out). */
dt_status dt__ckpt_prepare(const char *dir, char *tmp_out, size_t len);
/* Client 0, after the index is in tmp: the renames. */
dt_status dt__ckpt_commit(const char *dir, const char *tmp, int do_fsync);

/* ---- the save plan (plan.c) ---------------------------------------------------------------- */

/* One explicitly placed slice (dt_ckpt_piece) after the gather: the same list on every
 * client (pieces.c). */
typedef struct ck_plan_piece {
    int tensor;                   /* index into the plan's tensors */
    int64_t position;             /* owning mesh position */
    int64_t off[DT_MAX_RANK];
    int64_t size[DT_MAX_RANK];
    int client;                   /* group rank of the client holding its data */
    int local;                    /* index into that client's dt_save_opts.pieces */
} ck_plan_piece;

typedef struct ck_plan_slice {
    int tensor;
    int64_t position;             /* owning mesh position */
    int64_t piece;                /* index into plan.pieces, or -1 (a layout's block) */
    char *key;                    /* key in its file when not the tensor name (owned), or NULL */
    int64_t off[DT_MAX_RANK];
    int64_t size[DT_MAX_RANK];
    uint64_t bytes;
    uint64_t begin;               /* in its file's data buffer */
    int64_t nchunks;
} ck_plan_slice;

typedef struct ck_plan_file {
    int64_t position;
    int device_id;
    int64_t nslices;
    int64_t *slices;              /* indices into plan.slices, in data order */
    uint64_t data_bytes;
    char *header;                 /* 8-byte length + padded JSON: header_bytes bytes */
    uint64_t header_bytes;
} ck_plan_file;

/* The tensors of a plan, all borrowed: tensors with a layout (non-partial, on the saving mesh)
 * and tensors given as pieces (layout NULL, slices from `pieces`). */
typedef struct ck_plan_input {
    int n;
    const char *const *names;
    const dt_layout *const *layouts;
    const int *ranks;
    const int64_t *const *shapes;
    const dt_dtype *dtypes;
    int64_t npieces;
    const ck_plan_piece *pieces;
} ck_plan_input;

typedef struct ck_plan {
    int n;
    const char *const *names;
    const dt_layout *const *layouts;  /* NULL for a tensor saved as pieces */
    const int *ranks;
    const int64_t *const *shapes;
    const dt_dtype *dtypes;
    const ck_plan_piece *pieces;
    uint64_t chunk_bytes;
    int64_t nslices;
    ck_plan_slice *slices;        /* grouped by tensor, row-major block order */
    int64_t nfiles;
    ck_plan_file *files;          /* in file order */
    int64_t *file_of_position;    /* mesh position -> file index or -1 */
    int overwrite;                /* files may exist (a quick save's recycled files): written
                                   * over in place, not truncated first */
} ck_plan;

/* Builds the plan (local, deterministic: every client computes the same). */
dt_status dt__ckpt_plan(const dt_mesh *mesh, const ck_plan_input *in, uint64_t chunk_bytes,
                        ck_plan *plan_out);
void dt__ckpt_plan_free(ck_plan *plan);

/* ---- JSON text (json_out.c) ----------------------------------------------------------------- */

/* A streaming JSON writer: jansson's text for the same document (indent > 0: JSON_INDENT(indent),
 * 0: JSON_COMPACT; members in the order written) without building a tree. Errors (no memory,
 * NULL string, unbalanced brackets) set `bad`; dt__jw_take then returns NULL. */
enum { CK_JW_DEPTH = 16 };
typedef struct ck_jw {
    char *buf;
    size_t len, cap;
    int indent, depth, bad;
    unsigned char first[CK_JW_DEPTH];   /* nothing written yet in the container at this depth */
} ck_jw;
void dt__jw_init(ck_jw *w, int indent);
void dt__jw_free(ck_jw *w);
/* The owned NUL-terminated text, or NULL (and the buffer freed) when anything failed. */
char *dt__jw_take(ck_jw *w);
void dt__jw_reserve(ck_jw *w, size_t n);     /* room for n more bytes (no copies while < n) */
void dt__jw_raw(ck_jw *w, const char *s, size_t n);
void dt__jw_open(ck_jw *w, char bracket);    /* '{' or '[' */
void dt__jw_close(ck_jw *w, char bracket);   /* '}' or ']' */
void dt__jw_key(ck_jw *w, const char *key);  /* a member's key; its value follows */
void dt__jw_elem(ck_jw *w);                  /* an array element follows */
void dt__jw_str(ck_jw *w, const char *s);
void dt__jw_int(ck_jw *w, int64_t v);
void dt__jw_real(ck_jw *w, double v);
void dt__jw_int_array(ck_jw *w, int n, const int64_t *v);

/* ---- index (index.c) ------------------------------------------------------------------------ */

/* Parses index text into a checkpoint read from `path` (messages name `index_path`). */
dt_status dt__ckpt_parse_index(const char *path, const char *index_path, const char *text,
                               size_t len, dt_ckpt **ckpt_out);
/* The index JSON of a finished save: crcs[i] and chunk_crcs[i] for plan slice i, sealed with
 * its checksum (seal.c). Owned text. */
dt_status dt__ckpt_index_text(const ck_plan *plan, const char *mesh_str,
                              int64_t num_devices, const uint32_t *crcs,
                              const uint32_t *const *chunk_crcs, int nvalues,
                              const dt_ckpt_value *values, char **text_out);

/* ---- the index checksum (seal.c) --------------------------------------------------------- */

/* Appends the member "index_crc32c" (CRC32C of all text before it) to jansson's indented text
 * of the index object. Owned text into *sealed_out. */
dt_status dt__ckpt_index_seal(const char *json, char **sealed_out);
/* Checks an index's seal: DT_ERR_CORRUPT (naming index_path and the field) when the trailer is
 * there but does not match; DT_OK otherwise, with *sealed_out 1 when it matched and 0 when the
 * text has no trailer (a format_version 1 index, or one whose end was altered). */
dt_status dt__ckpt_index_check_seal(const char *index_path, const char *text, size_t len,
                                    int *sealed_out);

/* ---- the verifying reader (read.c) --------------------------------------------------------- */

typedef struct ck_reader {
    const dt_ckpt *ck;
    int *fds;                     /* per file, -1 until opened and checked */
    unsigned char *bounce;        /* one chunk at most, allocated when first needed */
    uint64_t bounce_cap;
    int64_t bounce_file, bounce_slice_tensor, bounce_slice, bounce_chunk;
    int reuse_checks;             /* skip headers the handle has checked before (size still) */
} ck_reader;

dt_status dt__ckpt_reader_init(ck_reader *rd, const dt_ckpt *ck);
void dt__ckpt_reader_free(ck_reader *rd);
/* Opens file f (size, header CRC, header agrees with the index); `tensor` names the tensor
 * being read for messages. */
dt_status dt__ckpt_reader_file(ck_reader *rd, int64_t f, const char *tensor, int *fd_out);
/* Copies the part of slice (t, s) inside the box (doff, dsize) of tensor t into `dst`, a
 * compact row-major array of shape dsize, reading only the chunks it needs and checking each
 * chunk's CRC. */
dt_status dt__ckpt_read_box(ck_reader *rd, int64_t t, int64_t s, const int64_t *doff,
                            const int64_t *dsize, void *dst);
/* One local component of a restore target in memory host code cannot touch, filled from saved
 * tensor `ti` through staging (upload.c). */
typedef struct ck_fill {
    int64_t ti;
    const dt__device *dev;
    void *data;
    const int64_t *off, *shape;   /* its global offset and shape */
} ck_fill;
/* Fills the components: a thread reads the parts of the saved slices each one needs (chunk
 * CRCs checked as dt__ckpt_read_box does) into host buffers of the devices' kind, at most
 * `bound` bytes in all (plus the reader's one-chunk bounce buffer), while the caller copies
 * the previous buffer to its device. Local. */
dt_status dt__ckpt_upload(const dt_ckpt *ck, const ck_fill *fills, int64_t n, uint64_t bound);
/* Reads the whole slice in chunks, checking chunk CRCs and the whole CRC. */
dt_status dt__ckpt_check_slice(ck_reader *rd, int64_t t, int64_t s);

/* ---- agreeing over the mesh's group (agree.c) ---------------------------------------------- */

/* Every member learns the outcome: DT_OK when every st is DT_OK, else the status and message
 * of the lowest failing group rank (prefixed with its client id on the others); under the
 * watchdog, as dt__ckpt_wait. */
dt_status dt__ckpt_agree(const dt__group *g, dt_status st);
/* Waits for the group's nonblocking collective `req` that returned `rc` under the watchdog
 * (dt__wait_watched_group): a member lost meanwhile gives DT_ERR_TIMEOUT naming it within
 * DT_COMM_TIMEOUT, not a hang (docs/multihost.md, the watchdog). `what` names the step. */
dt_status dt__ckpt_wait(const dt__group *g, MPI_Request *req, int rc, const char *what);

/* ---- explicitly placed pieces (pieces.c) --------------------------------------------------- */

/* Every client's pieces, gathered and checked: tensors in order of first appearance (client
 * order, then each client's order), each with its dtype, rank and shape, and the pieces. */
typedef struct ck_pieces {
    int ntensors;
    const char **names;           /* into buf */
    dt_dtype *dtypes;
    int *ranks;
    int64_t (*shapes)[DT_MAX_RANK];
    const int64_t **shape_ptrs;   /* shapes[t] */
    int64_t npieces;
    ck_plan_piece *pieces;        /* tensor index: n + the index in this set */
    char *buf;                    /* the gathered descriptors */
} ck_pieces;

/* Checks this client's pieces (pointers, names, ranks, devices of `mesh`) without talking. */
dt_status dt__ckpt_pieces_check_local(const dt_mesh *mesh, int npieces,
                                      const dt_ckpt_piece *pieces);
/* Collective over g: gathers every client's descriptors and checks them together (dtypes and
 * shapes agree, boxes inside, exact tiling, no name among `names`). Every client computes the
 * same result; on an error the message names the tensor. */
dt_status dt__ckpt_pieces_gather(const dt_mesh *mesh, const dt__group *g, int n,
                                 const char *const *names, int npieces,
                                 const dt_ckpt_piece *pieces, ck_pieces *out);
void dt__ckpt_pieces_free(ck_pieces *p);
/* A deep copy of src (a quick save reuses the first save's gathered pieces). */
dt_status dt__ckpt_pieces_clone(const ck_pieces *src, ck_pieces *dst);

/* ---- writing the data files (write.c) --------------------------------------------------- */

/* Where a plan slice's bytes are: `data` in the memory of `dev` (a tensor's component), or
 * host memory when dev is NULL (a caller's piece). */
typedef struct ck_slice_src {
    const void *data;
    const dt__device *dev;
} ck_slice_src;

/* Where write.c takes each slice's bytes from, piece by piece in write order (files in order,
 * each file's slices in data order, each slice in the pieces dt__ckpt_piece_len cuts). */
typedef struct ck_source {
    /* Bytes [at, at + len) of plan slice si; NULL on failure (the message set). */
    const void *(*get)(struct ck_source *src, int64_t si, uint64_t at, uint64_t len);
    /* Done with what get returned. */
    void (*put)(struct ck_source *src, const void *bytes, uint64_t len);
    /* Optional: waits until the writer's work may compete with the caller (stage.c: the
     * caller's copy is done when everything fits), so that what runs beside the writes
     * (dropping the replaced checkpoint's cache) does not slow the copy the caller waits for. */
    void (*ready)(struct ck_source *src);
    int parallel;                 /* files may be written by concurrent threads */
    dt_status status;             /* get's failure */
    const ck_slice_src *slices;   /* for dt__ckpt_direct_source: per plan slice */
} ck_source;

/* A source reading slices[si].data directly (a synchronous save of memory host code may
 * touch). */
ck_source dt__ckpt_direct_source(const ck_slice_src *slices);
/* The length of the piece of a slice of `bytes` bytes starting at `at`: up to 1 MiB, never
 * crossing a chunk boundary of chunk_bytes. */
uint64_t dt__ckpt_piece_len(uint64_t chunk_bytes, uint64_t bytes, uint64_t at);

/* Writes the data files of `plan` whose device belongs to this client into `tmp` (header,
 * then each slice piece by piece, CRC'd as written), one thread per file when src->parallel,
 * fsyncing each when do_fsync; fills crcs[si] and chunk_crcs[si][c] of the slices written.
 * `dir` is the checkpoint being replaced (its cache is dropped meanwhile); g the save's group.
 * DT_ERR_IO names the file and errno text. With a sequential source, stops at the first
 * failure. */
dt_status dt__ckpt_write_local_files(const ck_plan *plan, ck_source *src, const char *dir,
                                     const dt__group *g, const char *tmp, int do_fsync,
                                     uint32_t *crcs, uint32_t **chunk_crcs);

/* ---- staging memory of a save (stage.c) ---------------------------------------------------- */

/* The staging bound of a save or restore whose bytes are in device memory host code cannot
 * touch, when the caller gives none (dt_save_opts.staging_bytes, DT_CKPT_STAGING_MB). */
#define CK_DEVICE_STAGING_DEFAULT ((uint64_t)64 << 20)
/* That bound: DT_CKPT_STAGING_MB when set (MiB, > 0), else the default; a value that is not
 * a positive number is DT_ERR_INVALID_ARGUMENT naming it (fn for the message). */
dt_status dt__ckpt_device_staging(const char *fn, uint64_t *bytes_out);

/* A ring of copied pieces between the caller (producer) and the writing thread (consumer)
 * for this client's slices of `plan`: at most `bound` bytes (0: all of them; never less than
 * one 1 MiB piece). Its memory comes from kind->host_alloc (staging suited to the kind's
 * copies: page-locked on CUDA), or malloc when kind is NULL. With `eager` the writer takes
 * pieces as soon as they are copied; otherwise, when everything fits, only once the copy is
 * done. The buffer is reused by the next stage when it fits and is within its bound (else
 * freed before a new one is allocated), unless DT_CKPT_STAGING_KEEP=0; freed at dt_finalize. */
typedef struct ck_stage ck_stage;
dt_status dt__ckpt_stage_create(const ck_plan *plan, uint64_t bound,
                                const dt__device_kind *kind, int eager, ck_stage **stage_out);
void dt__ckpt_stage_destroy(ck_stage *stage);
/* The writer's sequential source: pieces in the order dt__ckpt_stage_fill copies them. */
ck_source *dt__ckpt_stage_source(ck_stage *stage);
/* Caller: copies the bytes of this client's slices (src[si]) piece by piece in write order
 * (device memory through its kind's D2H copy), waiting while the queue is full; returns when
 * all are copied, or at once after an abort. A failure is handed to the writer (its get
 * fails with it). */
void dt__ckpt_stage_fill(ck_stage *stage, const ck_plan *plan, const ck_slice_src *src);
/* Writer: stop; the caller's fill returns without copying more. */
void dt__ckpt_stage_abort(ck_stage *stage);
/* This process's staging so far (for tests and benchmarks): buffers allocated, saves that
 * reused the kept one, and the size of the one kept now (0: none). */
typedef struct ck_stage_stats {
    uint64_t allocs, reuses, kept_bytes;
} ck_stage_stats;
void dt__ckpt_stage_stats(ck_stage_stats *out);

/* ---- what a save works on (inputs.c) ------------------------------------------------------- */

/* Host-mesh, non-partial layouts, owned copies of names and shapes, the tensors reduced and
 * cast on their own mesh (dt__ckpt_take_tensors), the pieces, and the plan's view of all
 * tensors. */
typedef struct ck_inputs {
    int n;
    dt_mesh *host;
    char **names;
    dt_layout **layouts;
    dt_tensor **tensors;          /* NULL for dt_sharded_prefix, and until take_tensors */
    int64_t (*shapes)[DT_MAX_RANK];
    dt_dtype *dtypes;
    int *ranks;
    /* dt_save's pieces: this client's (the data), every client's (gathered), and the plan's
     * view of all tensors (the n above, then the pieces' tensors). */
    const dt_ckpt_piece *user_pieces;
    ck_pieces pieces;
    ck_plan_input plan_in;
} ck_inputs;

/* Checks names and meshes (fn names the call in messages); builds the host layouts. */
dt_status dt__ckpt_inputs_init(const char *fn, const dt_mesh *mesh, int n,
                               const char *const *names, const dt_tensor *const *tensors,
                               ck_inputs *in);
void dt__ckpt_inputs_free(ck_inputs *in);
/* Checks dt_save_opts (NULL is fine). */
dt_status dt__ckpt_check_opts(const dt_save_opts *o);
/* Every tensor without partial dims (reduced on its own mesh: collective), cast to
 * o->save_dtypes when given, on its own devices. */
dt_status dt__ckpt_take_tensors(const dt_tensor *const *tensors, const dt_save_opts *o,
                                ck_inputs *in);
/* 1 when a tensor of dtype a may be stored as, or restored into, dtype b. */
int dt__ckpt_castable(dt_dtype a, dt_dtype b);
/* Checks o->save_dtypes against the inputs' dtypes (DT_ERR_INVALID_ARGUMENT). */
dt_status dt__ckpt_check_save_dtypes(const char *fn, const dt_save_opts *o, const ck_inputs *in);
/* Fills in->plan_in from the inputs and the gathered pieces. */
dt_status dt__ckpt_plan_input(ck_inputs *in);
/* Where every plan slice this client writes is (NULL data for the others'); owned array. */
dt_status dt__ckpt_slice_data(const ck_plan *plan, const ck_inputs *in, ck_slice_src **out);
/* 1 when a slice of src is in memory host code cannot touch (*kind_out: its kind), else 0. */
int dt__ckpt_slices_on_device(const ck_plan *plan, const ck_slice_src *src,
                              const dt__device_kind **kind_out);

/* ---- the end of a save (finish.c) ---------------------------------------------------------- */

/* The manager's part of a save (dt_save_step): after the commit, client 0 points ROOT/latest
 * at the step and prunes. */
typedef struct ck_publish {
    int active;
    char root[CK_PATH_MAX];
    int64_t step;
    dt_ckpt_keep keep;
} ck_publish;

typedef struct ck_finish {
    const ck_plan *plan;
    const dt__group *g;
    const char *dir, *tmp;
    const char *mesh_str;
    int64_t num_devices;
    uint32_t *crcs;
    uint32_t **chunk_crcs;
    int do_fsync;
    int nvalues;
    const dt_ckpt_value *values;
    const ck_publish *publish;
    const dt_mesh *barrier_mesh;  /* timed barriers on it before agreeing; NULL: none */
    double timeout;
    int made_tmp;                 /* client 0 created tmp (removed on failure) */
    int node_local;               /* dt_save_opts.node_local: CRCs to every client */
    int leader;                   /* this client prepares, indexes and commits `dir`: client
                                   * 0, or with node_local the lowest client of its dir */
} ck_finish;

/* A barrier with the caller's timeout (when barrier_mesh and timeout > 0), then agreement on
 * the outcome over g. */
dt_status dt__ckpt_sync_point(const ck_finish *f, const char *name, dt_status st);
/* After this client's files are written with outcome st: agree, gather the CRCs on client 0,
 * which writes the index, commits and publishes; agree on the outcome; on failure clean up
 * (dt__ckpt_save_cleanup). Collective over g. */
dt_status dt__ckpt_save_finish(ck_finish *f, dt_status st);
/* After a failed save (st agreed by all): client 0 removes tmp if it made it; every client
 * returns together (barrier unless the communicator failed), with st and its message. */
dt_status dt__ckpt_save_cleanup(const ck_finish *f, dt_status st);

/* ---- the files of the last node-local save (finish.c), for dt_memckpt --------------------- */

typedef struct ck_local_file {
    char name[64];                /* data-K-of-N.safetensors */
    uint64_t bytes;
    int client;                   /* the client that wrote it */
} ck_local_file;
/* The data files of this process's last successful node-local save (any thread's): an owned
 * array (free()) of *n_out entries, and the save's serial number (1 for the first; 0 and no
 * files before any). Saves the memory copy a parse of the index it just wrote. */
dt_status dt__ckpt_last_local_files(ck_local_file **files_out, int64_t *n_out,
                                    uint64_t *serial_out);
/* The serial number of the last successful node-local save (0: none yet). */
uint64_t dt__ckpt_local_serial(void);

/* The gather of a save's CRCs, posted (dt__ckpt_crcs_post) and completed later: a quick
 * node-local save (dt_memckpt) completes it between training steps. */
typedef struct ck_crc_gather {
    MPI_Request req;
    int rc, to_all;
    int *counts, *displs;
    int64_t *rank_of_slice;
    uint32_t *send, *recv;
} ck_crc_gather;
/* Posts the nonblocking gather of this client's slice CRCs (to every client when to_all, else
 * to client 0). Nothing is posted on one client (req stays MPI_REQUEST_NULL). */
dt_status dt__ckpt_crcs_post(const ck_plan *plan, const dt__group *g, int to_all,
                             const uint32_t *crcs, uint32_t *const *chunk_crcs,
                             ck_crc_gather *cg);
/* After the request completed: every slice's CRCs into crcs and chunk_crcs. */
dt_status dt__ckpt_crcs_unpack(const ck_plan *plan, const dt__group *g,
                               const ck_crc_gather *cg, uint32_t *crcs, uint32_t **chunk_crcs);
void dt__ckpt_crcs_free(ck_crc_gather *cg);
/* The leader: the index into tmp, the commit (and a manager's publish). */
dt_status dt__ckpt_index_commit(const ck_finish *f);

/* A quick node-local save (dt_memckpt after its first save): the same files and index as a
 * node-local dt_save, without any agreement. The first save (primed 0) runs the whole
 * protocol and records the gathered pieces, the directory's leader and this client's pieces'
 * digest; later saves reuse them (the state's structure must not change; a change of this
 * client's pieces is refused), write this client's files into the step's temporary directory
 * and post the CRC gather; dt__ckpt_quick_complete then (the leader) writes the index and
 * commits. Set for the calling thread around the caller's save by dt_memckpt_save. */
typedef struct ck_quick {
    const dt__group *g;           /* the group the CRCs are gathered over (dt_memckpt's own) */
    int primed;
    int leader;
    uint64_t digest;              /* this client's pieces (names, devices, boxes) */
    uint64_t in_digest;           /* the named tensors' ranks, shapes, dtypes */
    struct ck_save *tmpl;         /* the first quick save, kept: its plan is reused */
    ck_pieces pieces;             /* every client's, gathered at the first save (deep copy) */
    struct ck_save *pending;      /* the save whose CRC gather and commit are left */
    ck_crc_gather cg;
    /* The leader's commit of the pending save (index, renames, then after_commit) runs on a
     * thread of its own, which calls no MPI. */
    int committing;
    struct ck_save *commit_job;   /* the save the thread commits */
    pthread_t thread;
    atomic_int committed;
    dt_status commit_status;
    char commit_msg[512];
    void (*after_commit)(void *arg);
    void *after_arg;
    /* a step directory whose files this client takes over for its new step, so that their
     * memory pages are reused instead of freed and allocated again ("": none) */
    char recycle[CK_PATH_MAX];
    /* what the last quick save wrote (the buddy copy's file list) */
    char tmp[CK_PATH_MAX];
    ck_local_file *files;
    int64_t nfiles;
} ck_quick;
void dt__ckpt_quick_set(ck_quick *q);     /* this thread's next node-local saves; NULL: none */
/* Progresses the pending quick save: tests its CRC gather (mode 0), or waits for it under
 * the watchdog (1 and 2); once complete, the leader's thread writes the index and commits
 * (one commit at a time; mode 2 also waits for it). *done_out (may be NULL): 1 when nothing
 * is left. */
dt_status dt__ckpt_quick_complete(ck_quick *q, int mode, int *done_out);
/* Frees q's state (a pending save is dropped: its step is never committed). */
void dt__ckpt_quick_free(ck_quick *q);
/* Records plan's data files as those of the last node-local save (finish.c). */
void dt__ckpt_record_local_files(const ck_plan *plan);

/* ---- the checkpoint manager (manager.c) ---------------------------------------------------- */

/* Client 0 after the commit of ROOT/step-N: ROOT/latest names it (atomically), then the steps
 * below it that `keep` does not keep are removed. */
dt_status dt__ckpt_step_publish(const char *root, int64_t step, const dt_ckpt_keep *keep,
                                int do_fsync);
/* Client 0: when step directory `dir` is damaged (dt_ckpt_step), renames it to
 * "<dir>.damaged" (".damaged.2", ... when taken); nothing when it is complete, incomplete or
 * missing. DT_ERR_IO. */
dt_status dt__ckpt_step_set_aside(const char *dir, int do_fsync);
/* 1 when dir holds a checkpoint (or the previous one of a stopped commit) or is a manager's
 * root (a "latest" pointer): no place to export into. */
int dt__ckpt_is_checkpoint_place(const char *dir);
/* Refuses an export target (fn for the message): a directory where one file is asked
 * (one_file), or a place inside a checkpoint or a manager's root (out itself, or its parent
 * for one file). DT_ERR_INVALID_ARGUMENT (inspect.c). */
dt_status dt__ckpt_export_target(const char *fn, const char *out, int one_file);
/* Checks a keep policy (fn for the message). */
dt_status dt__ckpt_check_keep(const char *fn, const dt_ckpt_keep *keep);

/* ---- foreign sources (foreign_open.c, foreign_st.c, foreign_llmc.c, foreign_restore.c,
 * foreign_gpt2.c, foreign_export.c) ---------------------------------------------------------- */

#include "dtensor/foreign.h"

/* Longest safetensors header accepted (the safetensors library's own limit). */
#define CK_FOREIGN_HEADER_MAX ((uint64_t)100000000)

typedef struct ck_ftensor {
    char *name;
    dt_dtype dtype;
    int rank;
    int64_t shape[DT_MAX_RANK];
    int64_t file;                 /* index into dt_foreign.files */
    uint64_t offset;              /* absolute offset of its first byte */
    uint64_t bytes;
} ck_ftensor;

typedef struct ck_ffile {
    char *path;
    uint64_t size;                /* at open */
} ck_ffile;

/* Bytes read per device global id (grown on demand; kept apart so that a const handle
 * counts). */
typedef struct ck_fstats {
    int n;
    uint64_t *by_device;
    uint64_t total;
} ck_fstats;

struct dt_foreign {
    char *path;                   /* as given */
    char *dir;                    /* directory holding the files (config.json beside them) */
    const char *shown;            /* what messages name for the source: an index or the file */
    dt_foreign_format format;
    int64_t nfiles;
    ck_ffile *files;
    int64_t ntensors, cap;
    ck_ftensor *tensors;
    int64_t *by_name;             /* tensor indices sorted by name */
    json_t *metadata;             /* the first file's __metadata__ object, or NULL */
    json_t *index_metadata;       /* an index's "metadata" object, or NULL */
    int32_t llmc[8];              /* llm.c header ints 0..7 */
    ck_fstats *stats;
};

/* Appends a tensor (name copied). DT_ERR_NO_MEMORY. */
dt_status dt__foreign_add(dt_foreign *src, const char *name, dt_dtype dtype, int rank,
                          const int64_t *shape, int64_t file, uint64_t offset, uint64_t bytes);
/* Appends a file (path copied; its size from fstat of fd). */
dt_status dt__foreign_add_file(dt_foreign *src, const char *path, uint64_t size,
                               int64_t *index_out);
/* Parses the safetensors header of file `f` (open fd, size known): checks it as
 * dt_foreign_open says and appends its tensors in data order. Keeps the first file's
 * __metadata__. */
dt_status dt__foreign_parse_st(dt_foreign *src, int64_t f, int fd);
/* Parses an HF index text (path for messages, dir for the files it names) and every file it
 * names. */
dt_status dt__foreign_parse_index(dt_foreign *src, const char *index_path, const char *text,
                                  size_t len);
/* Parses llm.c's GPT-2 checkpoint header of file f. */
dt_status dt__foreign_parse_llmc(dt_foreign *src, int64_t f, int fd);
/* Sorts by_name and refuses repeated names (DT_ERR_CORRUPT naming the source). */
dt_status dt__foreign_index_names(dt_foreign *src);
/* Index of `name` or -1. */
int64_t dt__foreign_lookup(const dt_foreign *src, const char *name);

/* ---- in-memory checkpoints (memckpt.c, memckpt_find.c; docs/recovery.md) --------------- */

/* Beside a file received as a buddy copy: "<file>.buddy" (empty). */
#define MEMCKPT_BUDDY_SUFFIX ".buddy"

/* One file of the buddy copy in flight, mapped: its name and "<name>.part" in the step's
 * directory, which is open (dt_memckpt.copy_dir), so that a commit renaming that directory
 * meanwhile does not matter. */
typedef struct memckpt_xfer {
    char path[72], part[80];
    void *addr;
    uint64_t len;
    int recv, done;
} memckpt_xfer;

/* A memory file mapped for the copies and kept mapped: a file keeps its inode when its step
 * is recycled, so the next copy but one finds its pages mapped already. At most two per file
 * name (the newest step's and the one before), so no more memory is held than kept. */
typedef struct memckpt_map {
    char name[72];
    unsigned long long dev, ino;
    uint64_t len;
    void *addr;
    uint64_t used;
} memckpt_map;

struct dt_memckpt {
    dt__group g;                  /* a duplicate of the mesh's group: the copies' messages */
    int64_t every;
    int keep;
    char job[72];
    char root[CK_PATH_MAX];       /* <dir>/dtensor-mem-<job> */
    uint64_t *dir_ids;            /* per group rank: hash of its root (same host memory) */
    int leader;                   /* lowest rank of this root: makes, prunes, removes it */
    int hosts;                    /* distinct roots */
    int buddy_j, buddy, source;   /* J and the group ranks sent to and received from */
    int buddy_same_host;
    ck_quick quick;               /* the saves after the first: no agreements (ckpt/save.c) */
    /* the copy in flight */
    int64_t copy_step;
    int copy_dir;                 /* its step directory, open (-1: none) */
    memckpt_map *maps;
    int nmaps;
    uint64_t map_clock;
    memckpt_xfer *x;
    int nx;
    MPI_Request *reqs;
    int *peers;                   /* client id of each request's other side */
    int nreq;
    uint64_t own_bytes, buddy_bytes;
    double last_save_seconds;
};

uint64_t dt__memckpt_hash(const char *s);
dt_status dt__memckpt_mkdirs(const char *path);
/* Frees the copy's state (unfinished received files removed). */
void dt__memckpt_xfers_free(dt_memckpt *mc);
/* Unmaps the kept mappings (dt_memckpt_destroy). */
void dt__memckpt_maps_free(dt_memckpt *mc);
/* The step's data files (name, bytes, writing client): those the node-local save numbered
 * `serial` recorded, else read from the index in dir. Owned array (free()). */
dt_status dt__memckpt_step_files(const char *dir, uint64_t serial, ck_local_file **files_out,
                                 int64_t *n_out);
/* Posts the sends of this client's files of the step in dir to its buddy and the receives of
 * its source's files (unless they share its directory); completes at once when there is
 * nothing to wait for. */
dt_status dt__memckpt_start_copy(dt_memckpt *mc, const ck_local_file *files, int64_t nf,
                                 const char *dir);
/* Progresses (*done_out: 1 when complete) or completes the buddy copy in flight. */
dt_status dt__memckpt_copy_poll(dt_memckpt *mc, int *done_out);
dt_status dt__memckpt_copy_wait(dt_memckpt *mc);
/* Steps under root, newest first, at most max of them; the count. */
int dt__memckpt_list_steps(const char *root, int64_t *steps, int max);

#endif
