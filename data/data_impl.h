/* The data module's private header: the source interface every reader implements, the text
 * line index shared by the CSV and line readers, the per-epoch order and the dataset.
 * Not installed. */
#ifndef DTENSOR_DATA_IMPL_H
#define DTENSOR_DATA_IMPL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "dtensor/data.h"
#include "runtime/comm.h"
#include "runtime/device.h"
#include "runtime/error.h"
#include "runtime/group.h"
#include "runtime/util.h"

/* ---- sources (source.c) -------------------------------------------------------------------- */

typedef struct dd_source_ops {
    /* Reads examples idx[0..count) into dst[k] + j * field_bytes[k] for each non-NULL dst[k].
     * Sets the error text (dt__error) on failure. Safe to call from any one thread at a time
     * per dataset; readers sharing a source from several threads must be reentrant. */
    dt_status (*read)(dt_data_source *s, const int64_t *idx, int64_t count, void *const *dst);
    void (*release)(void *impl);
} dd_source_ops;

struct dt_data_source {
    atomic_int refs;
    int64_t n;
    int nfields;
    dt_data_field fields[DT_DATA_MAX_FIELDS];
    size_t field_bytes[DT_DATA_MAX_FIELDS];
    const dd_source_ops *ops;
    void *impl;
};

/* Checks `fields` (what, for messages: the calling function's name) and creates a source with
 * one reference; on failure *impl is left to the caller. */
dt_status dd_source_new(const char *what, int64_t n, int nfields, const dt_data_field *fields,
                        const dd_source_ops *ops, void *impl, dt_data_source **out);
dt_data_source *dd_source_retain(dt_data_source *s);

/* Full pread of len bytes at off; DT_ERR_IO or (at end of file) DT_ERR_CORRUPT naming `path`
 * and `what` (e.g. "record 12"). */
dt_status dd_pread_all(int fd, void *buf, size_t len, uint64_t off, const char *path,
                       const char *what);

/* ---- text files: plain or gzip, indexed by line (text.c) ------------------------------------ */

typedef struct dd_text {
    char *path;
    int fd;          /* plain file read with pread, or -1 */
    char *mem;       /* a gzip file's whole inflated text, or NULL */
    int64_t first_line; /* line number (from 1) of line 0 of the index */
    int64_t nlines;
    int64_t *start;  /* nlines + 1 offsets: line i is [start[i], start[i+1]) with its newline */
} dd_text;

/* Opens and indexes `path`, skipping its first `skip` lines. */
dt_status dd_text_open(const char *path, int64_t skip, dd_text *t);
void dd_text_close(dd_text *t);
/* The bytes of lines [first, first + count): in *buf (grown as needed, the caller frees) for
 * a plain file, or pointing into memory for a gzip one. */
dt_status dd_text_lines(const dd_text *t, int64_t first, int64_t count, char **buf, size_t *cap,
                        const char **text_out);

/* ---- the order of an epoch (order.c) --------------------------------------------------------- */

/* perm[0..n) = epoch `epoch`'s order: a Fisher-Yates shuffle driven by a generator seeded
 * from (seed, epoch) alone, or 0..n-1 when !shuffle. */
void dd_epoch_order(uint64_t seed, int64_t epoch, int shuffle, int64_t n, int64_t *perm);

/* ---- the dataset (dataset.c, fill.c, next.c, state.c) --------------------------------------- */

/* One prepared batch: buffers for every (output, local device), or an error. */
typedef struct dd_slot {
    int ready;
    dt_status st;
    char msg[1024];
    int64_t epoch, batch, rows;
    int end;
    void **bufs; /* nout * nlocal, index k * nlocal + d; NULL once handed to a tensor */
    /* On a GPU mesh, once uploaded: bufs are device memory of ds->devs[d], of dbytes[i]
     * bytes (what dt__device_free needs back). */
    int on_device;
    size_t *dbytes;
} dd_slot;

struct dt_dataset {
    dt_data_source *src;
    int nout, nlocal;
    dt_layout *layouts[DT_DATA_MAX_FIELDS];
    dt_mesh *mesh;
    int64_t *pos; /* mesh position of each local device */
    int gpu;
    const dt__device **devs; /* a GPU mesh's local devices (NULL on a CPU mesh) */
    dt_dataset_opts o;
    int64_t bpe; /* batches per epoch */
    const dt__group *group; /* the mesh's clients (cached by the runtime, not owned) */

    /* The next batch to deliver. */
    int64_t epoch, batch;

    /* Producer (prefetch thread, or dt_dataset_next itself when prefetch == 0). */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    pthread_t thread;
    int running, stop, halted; /* halted: the producer delivered an end or an error */
    int nslots, head, count; /* ring: `count` ready slots from `head` */
    dd_slot *slots;
    int64_t fill_epoch, fill_batch; /* the next batch the producer prepares */
    int64_t *perm;                  /* the order of epoch perm_epoch (producer only) */
    int64_t perm_epoch;

    char *names; /* dt_dataset_state_values' names */
};

/* Prepares batch (epoch, batch) into `slot` (fill.c); st/msg hold any failure. Producer only. */
void dd_fill(dt_dataset *ds, int64_t epoch, int64_t batch, dd_slot *slot);
/* Frees a slot's buffers and marks it empty. */
void dd_slot_clear(const dt_dataset *ds, dd_slot *slot);
/* On a GPU mesh, copies a prepared slot's host buffers onto its devices (upload.c): device
 * buffers from the device pool, one H2D copy each on the device's stream, the host buffers
 * then freed; a failure goes into the slot's st/msg. Nothing on a CPU mesh, after an error or
 * at the end. Producer only. */
void dd_upload(dt_dataset *ds, dd_slot *slot);
/* Stops the producer thread and drops prepared batches; the producer restarts at the
 * dataset's position. */
void dd_stop(dt_dataset *ds);
/* The next prepared slot (waiting for the thread, or filling it here); dd_release hands it
 * back. DT_ERR_SYSTEM when the thread cannot start. */
dt_status dd_take(dt_dataset *ds, dd_slot **slot_out);
void dd_release(dt_dataset *ds);

#endif
