/* libdtensor input pipeline (TensorFlow DTensor's DTensorDataset): sources of examples (a
 * callback, fixed-size binary records, CSV plain or gzip, text lines, llm.c token shards),
 * global batches laid out on a mesh, a seeded shuffle per epoch, background prefetching and a
 * resumable position. Design notes in docs/data.md. */
#ifndef DTENSOR_DATA_H
#define DTENSOR_DATA_H

#include <stddef.h>
#include <stdint.h>

#include "dtensor/ckpt.h"
#include "dtensor/export.h"
#include "dtensor/layout.h"
#include "dtensor/status.h"
#include "dtensor/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Most fields (outputs) an example may have. */
#define DT_DATA_MAX_FIELDS 16

/* One field of an example: its dtype and shape (rank 0..DT_MAX_RANK-1 dims, each >= 1).
 * A batch of it has shape [rows, shape...]. */
typedef struct dt_data_field {
    dt_dtype dtype;
    int rank;
    int64_t shape[DT_MAX_RANK - 1];
} dt_data_field;

/* ---- sources ------------------------------------------------------------------------------ */

typedef struct dt_data_source dt_data_source;

/* Fills example `index` (0..num_examples-1): fields[k] is where field k goes (compact row-major,
 * the field's dtype and shape), or NULL when that field is not needed in this call. Returns
 * DT_OK or a status (set a message with the program's own means; the library reports
 * "example <index>: <status>" when dt_last_error() of the calling thread is empty). Called from
 * the dataset's prefetch thread (or the thread calling dt_dataset_next when prefetch is 0),
 * never from two threads at once for one dataset. */
typedef dt_status (*dt_data_fill_fn)(void *arg, int64_t index, void *const *fields);

/* A source of `num_examples` examples of `nfields` fields (1..DT_DATA_MAX_FIELDS) filled by
 * `fn(arg, ...)`; `arg` is borrowed for the source's life. Owned handle.
 * DT_ERR_INVALID_ARGUMENT for a bad count, field or NULL fn. Local. */
DT_API dt_status dt_data_source_callback(int64_t num_examples, int nfields,
                                         const dt_data_field *fields, dt_data_fill_fn fn,
                                         void *arg, dt_data_source **source_out);

/* Options of dt_data_source_records. Initialise with DT_DATA_RECORDS_OPTS_INIT. */
typedef struct dt_data_records_opts {
    /* Bytes skipped at the start of the file (a header). */
    uint64_t header_bytes;
    /* Bytes per record; 0 means the fields' sizes added up. */
    uint64_t record_bytes;
    /* Byte offset of each field inside a record (nfields entries); NULL: back to back from 0. */
    const uint64_t *field_offsets;
} dt_data_records_opts;
#define DT_DATA_RECORDS_OPTS_INIT {0, 0, NULL}

/* A file of fixed-size binary records after an optional header, one example per record, the
 * fields stored as raw little-endian values at their offsets. Only the records asked for are
 * read (pread, consecutive records in one call). The file stays open while the source lives.
 * DT_ERR_IO (unreadable: names the file and errno text), DT_ERR_CORRUPT (the file is not a
 * whole number of records: names the file and the truncated record), DT_ERR_INVALID_ARGUMENT
 * (a field outside the record). opts may be NULL. Owned handle. Local. */
DT_API dt_status dt_data_source_records(const char *path, int nfields,
                                        const dt_data_field *fields,
                                        const dt_data_records_opts *opts,
                                        dt_data_source **source_out);

/* Options of dt_data_source_csv. Initialise with DT_DATA_CSV_OPTS_INIT. */
typedef struct dt_data_csv_opts {
    char delimiter;    /* ',' by default */
    int64_t skip_lines; /* lines before the first example (a header): 0 by default */
} dt_data_csv_opts;
#define DT_DATA_CSV_OPTS_INIT {',', 0}

/* A CSV file (plain or gzip-compressed, told by its first bytes), one example per line: field
 * k takes the next numel(field k) columns, in row-major order, so a line has exactly as many
 * columns as the fields' elements together (no quoting: every delimiter separates). Numbers
 * are decimal (floats as strtod reads them, integers within their dtype's range; f16/bf16
 * rounded from f32). Opening reads the file once to find where lines start (a gzip file is
 * inflated into memory once); each batch then reads and parses only the lines its local
 * devices need. Blank lines are examples too (and fail to parse); a last line without a
 * newline counts. Bad lines are reported when read, by
 * dt_dataset_next or dt_data_source_read: DT_ERR_PARSE "file:line: ..." (wrong number of
 * columns, a column that is not a number of the field's dtype). Opening: DT_ERR_IO,
 * DT_ERR_CORRUPT (a damaged or truncated gzip stream), DT_ERR_INVALID_ARGUMENT. opts may be
 * NULL. Owned handle. Local. */
DT_API dt_status dt_data_source_csv(const char *path, int nfields, const dt_data_field *fields,
                                    const dt_data_csv_opts *opts, dt_data_source **source_out);

/* A text file (plain or gzip), one example per line: a single u8 field of shape [max_bytes]
 * holding the line without its "\n" or "\r\n", zero-padded. A longer line fails when read
 * with DT_ERR_PARSE "file:line: ...". Indexing as for CSV. Owned handle. Local. */
DT_API dt_status dt_data_source_lines(const char *path, int64_t max_bytes,
                                      dt_data_source **source_out);

/* llm.c's token shards (its dev/data scripts' .bin files): a header of 256 little-endian int32
 * (magic 20240520, version 1, the token count N at index 2) then N uint16 tokens. Example i is
 * the context + 1 tokens from token i * context, as two I32 fields of shape [context]: the
 * inputs (its first `context` tokens) and the targets (the same shifted by one); there are
 * (N - 1) / context examples. A dataset of global_batch B, shuffle 0 and drop_remainder 1
 * then delivers llm.c's batches on one process exactly: global batch k is the B*T+1 tokens
 * from token k*B*T, the inputs the first B*T as B rows of T, the targets shifted by one;
 * after the last whole batch the next epoch starts again at token 0. Only the rows a batch
 * needs are read (one pread per run of consecutive examples). DT_ERR_IO (unreadable),
 * DT_ERR_CORRUPT (bad magic or version, a size other than the header's count says),
 * DT_ERR_INVALID_ARGUMENT (context < 1, or fewer than context + 1 tokens). Owned handle.
 * Local. */
DT_API dt_status dt_data_source_llmc(const char *path, int64_t context,
                                     dt_data_source **source_out);

/* The token count of an llm.c token shard, its header checked as dt_data_source_llmc does.
 * Local. */
DT_API dt_status dt_data_llmc_tokens(const char *path, int64_t *ntokens_out);

/* Queries. Local. */
DT_API int64_t dt_data_source_num_examples(const dt_data_source *source);
DT_API int dt_data_source_num_fields(const dt_data_source *source);
/* Field k's dtype and shape into *field_out. DT_ERR_INVALID_ARGUMENT if k is out of range. */
DT_API dt_status dt_data_source_field(const dt_data_source *source, int k,
                                      dt_data_field *field_out);

/* Reads example `index` into fields[k] (compact, the field's shape; NULL skips a field), as a
 * dataset does: for references and tools. Statuses as the source's reads. Local. */
DT_API dt_status dt_data_source_read(dt_data_source *source, int64_t index, void *const *fields);

/* Drops the caller's reference (a dataset holds its own). Accepts NULL. */
DT_API void dt_data_source_destroy(dt_data_source *source);

/* ---- datasets: global batches on a mesh ------------------------------------------------------ */

typedef struct dt_dataset dt_dataset;

/* Options of dt_dataset_create. Initialise with DT_DATASET_OPTS_INIT, then set fields. */
typedef struct dt_dataset_opts {
    /* Examples per global batch (>= 1). Required. */
    int64_t global_batch;
    /* Seed of the per-epoch shuffle: epoch e's order is a permutation drawn from (seed, e)
     * alone, identical on every client. */
    uint64_t seed;
    /* 1 (default): shuffle every epoch; 0: examples in file order. */
    int shuffle;
    /* 1 (default): drop the last partial batch of an epoch; 0: deliver it (fewer rows). */
    int drop_remainder;
    /* Epochs to deliver; 0 (default): endless. */
    int64_t epochs;
    /* Batches a background thread prepares ahead (0..64, default 2); 0 reads in
     * dt_dataset_next. Prefetching changes nothing but time. */
    int prefetch;
} dt_dataset_opts;
#define DT_DATASET_OPTS_INIT {0, 0, 1, 1, 0, 2}

/* A dataset delivering global batches of `source`: output k is field k as a tensor of shape
 * [rows, field shape...] laid out by layouts[k] (n == the source's field count; rank = 1 +
 * the field's rank; all on one mesh, which must be usable here). Dim 0 (the batch) may be
 * sharded on any mesh dim or unsharded; other dims must be unsharded and nothing partial
 * (DT_ERR_UNSUPPORTED: relayout a delivered batch instead). Each client reads only the
 * examples of the rows its own devices hold. Global batch b of epoch e holds the examples at
 * positions [b*B, b*B + rows) of epoch e's order, so the batches are the same whatever the
 * number of clients or devices. The dataset retains the source and the layouts.
 * Collective over the clients holding devices of the mesh (each must hold one); every client
 * returns the same status, also when only one client's options or layouts are bad. DT_ERR_INVALID_ARGUMENT (bad options; global_batch larger than the
 * data set with drop_remainder), DT_ERR_SHAPE (a layout's rank), DT_ERR_UNSUPPORTED,
 * DT_ERR_DEVICE_MISMATCH, DT_ERR_NO_MEMORY, DT_ERR_COMM. Owned handle. */
DT_API dt_status dt_dataset_create(dt_data_source *source, int n, const dt_layout *const *layouts,
                                   const dt_dataset_opts *opts, dt_dataset **dataset_out);

/* Stops the prefetch thread and frees the dataset (and tensors' memory not yet delivered;
 * delivered tensors stay valid). Call before dt_finalize. Accepts NULL. Local. */
DT_API void dt_dataset_destroy(dt_dataset *dataset);

/* Which batch dt_dataset_next delivered. */
typedef struct dt_data_batch_info {
    int64_t epoch;  /* its epoch, from 0 */
    int64_t batch;  /* its index in the epoch, from 0 */
    int64_t rows;   /* examples in it: global_batch, or fewer for a kept last partial batch */
    int end;        /* 1 when the epochs are done: no batch, tensors_out[k] set to NULL */
} dt_data_batch_info;

/* Delivers the next global batch: tensors_out[k] (n == the number of outputs) a new owned
 * tensor on layouts[k], each local device holding its rows; on a GPU mesh the rows are staged
 * in host memory and copied to the devices here (dt_copy_to_mesh). info_out may be NULL.
 * Collective over the mesh's clients, in the same order: a failure on any client (a bad CSV
 * line, a truncated record file, an I/O error, a callback's status) fails the call on every
 * client with the failing client's message ("file:line: ..." or "file: record K ..."), delivers
 * nothing and does not advance, so a retry reads the same batch again.
 * Returns DT_OK (also at the end, with info_out->end = 1), DT_ERR_PARSE, DT_ERR_CORRUPT,
 * DT_ERR_IO, DT_ERR_NO_MEMORY, DT_ERR_INVALID_ARGUMENT, DT_ERR_COMM, or a callback's status. */
DT_API dt_status dt_dataset_next(dt_dataset *dataset, int n, dt_tensor **tensors_out,
                                 dt_data_batch_info *info_out);

/* The position of the next batch dt_dataset_next delivers: its epoch and index in the epoch. */
typedef struct dt_data_position {
    int64_t epoch;
    int64_t batch;
} dt_data_position;

/* Batches per epoch (with drop_remainder: examples / global_batch, else rounded up). Local. */
DT_API int64_t dt_dataset_batches_per_epoch(const dt_dataset *dataset);

/* The next batch's position. Local. */
DT_API dt_status dt_dataset_position(const dt_dataset *dataset, dt_data_position *position_out);

/* Moves to `position` (batch < dt_dataset_batches_per_epoch; epoch >= 0): batches prepared
 * ahead are dropped. DT_ERR_INVALID_ARGUMENT when out of range (nothing changes). Local; make
 * the same call on every client. */
DT_API dt_status dt_dataset_seek(dt_dataset *dataset, const dt_data_position *position);

/* Number of values dt_dataset_state_values writes. */
#define DT_DATASET_STATE_VALUES 6

/* The position as named checkpoint values for dt_save_opts.values: "<prefix>epoch" and
 * "<prefix>batch", and what fixes the data order, checked on restore: "<prefix>seed",
 * "<prefix>examples", "<prefix>global_batch" and "<prefix>order" (shuffle + 2 *
 * drop_remainder), all I64 (prefix e.g. "data/"). Names are borrowed from the dataset until
 * its next dt_dataset_state_values or destroy. DT_ERR_INVALID_ARGUMENT when a name would
 * exceed DT_CKPT_NAME_MAX. Local. */
DT_API dt_status dt_dataset_state_values(dt_dataset *dataset, const char *prefix,
                                         dt_ckpt_value values_out[DT_DATASET_STATE_VALUES]);

/* Restores the position saved by dt_dataset_state_values under `prefix` in an opened
 * checkpoint (any process count may have saved it): the next batch is the one that would
 * have followed the save. DT_ERR_NOT_FOUND (a value is missing), DT_ERR_INVALID_ARGUMENT
 * (saved for another seed, data set size, global batch or epoch length: names which; the
 * dataset is unchanged). Local; make the same call on every client. */
DT_API dt_status dt_dataset_load_state(dt_dataset *dataset, const dt_ckpt *ckpt,
                                       const char *prefix);

#ifdef __cplusplus
}
#endif
#endif
