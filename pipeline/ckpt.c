/* Checkpoints of a pipelined model under global names: every stage's tensors copied onto the
 * pipe's whole mesh (dim 0 sharded over the pipeline dim) and saved as one checkpoint, and
 * restored from any stage count onto the stage meshes (docs/pipeline.md). */
#include <stdlib.h>
#include <string.h>

#include "dtensor/relayout.h"
#include "pipeline/pipe_impl.h"
#include "runtime/error.h"

enum { META = 2 + DT_MAX_RANK }; /* dtype, rank, shape */

static dt_status check_stages(const dt_pipe *pipe, int n, const int *stage_of, const char *fn)
{
    for (int i = 0; i < n; i++)
        if (stage_of[i] < 0 || stage_of[i] >= pipe->stages)
            return dt__error(DT_ERR_INVALID_ARGUMENT, "%s: tensor %d belongs to stage %d (the "
                             "pipe has %d)", fn, i, stage_of[i], pipe->stages);
    return DT_OK;
}

/* The layout on the whole mesh: dim 0 sharded over the pipeline dim, the rest unsharded. */
static dt_status whole_layout(const dt_pipe *pipe, int rank, dt_layout **out)
{
    if (rank == 0)
        return dt_layout_replicated(pipe->mesh, 0, out);
    const char *specs[DT_MAX_RANK];
    for (int d = 0; d < rank; d++)
        specs[d] = d == 0 ? dt_mesh_dim_name(pipe->mesh, pipe->dim) : "unsharded";
    return dt_layout_create(pipe->mesh, rank, specs, out);
}

/* Tensor i as a replicated tensor on its stage mesh: the holder's (reduced) or, on the
 * other clients, an empty one of the same shape (no local components), so that every client
 * can take part in the copy onto the whole mesh. */
static dt_status stage_replica(const dt_pipe *pipe, int s, const dt_tensor *t, const double *meta,
                               dt_tensor **out)
{
    int rank = (int)meta[1];
    dt_layout *rep = NULL;
    dt_status st = dt_layout_replicated(pipe->stage_mesh[s], rank, &rep);
    if (st != DT_OK)
        return st;
    if (pipe->holds[s]) {
        st = dt_relayout(t, rep, out);
    } else {
        int64_t shape[DT_MAX_RANK];
        for (int d = 0; d < rank; d++)
            shape[d] = (int64_t)meta[2 + d];
        st = dt_tensor_zeros(rep, (dt_dtype)(int)meta[0], shape, out);
    }
    dt_layout_destroy(rep);
    return st;
}

dt_status dt_pipe_save(dt_pipe *pipe, const char *dir, int n, const char *const *names,
                       const int *stage_of, const dt_tensor *const *tensors,
                       const dt_save_opts *opts)
{
    if (!pipe || !dir || n < 0 || (n > 0 && (!names || !stage_of || !tensors)))
        return dt__error(DT_ERR_INVALID_ARGUMENT, "dt_pipe_save: NULL argument");
    dt_status st = check_stages(pipe, n, stage_of, "dt_pipe_save");
    for (int i = 0; i < n && st == DT_OK; i++) {
        int s = stage_of[i];
        if (pipe->holds[s] && (!tensors[i] ||
                               !dt_mesh_equal(dt_layout_mesh(dt_tensor_layout(tensors[i])),
                                              pipe->stage_mesh[s])))
            st = dt__error(DT_ERR_INVALID_ARGUMENT, "dt_pipe_save: tensor %d ('%s') is not on "
                           "stage %d's mesh here", i, names[i], s);
    }
    double *meta = calloc((size_t)(n > 0 ? n : 1) * META, sizeof *meta);
    int *meta_stage = malloc((size_t)(n > 0 ? n : 1) * META * sizeof *meta_stage);
    dt_tensor **whole = calloc((size_t)(n > 0 ? n : 1), sizeof *whole);
    if (st == DT_OK && (!meta || !meta_stage || !whole))
        st = dt__error(DT_ERR_NO_MEMORY, "dt_pipe_save: no memory");
    /* The non-holders learn each tensor's dtype and shape from its stage. (A client failing
     * the checks above returns here; the others then end with DT_ERR_TIMEOUT.) */
    for (int i = 0; st == DT_OK && i < n; i++) {
        int s = stage_of[i];
        for (int k = 0; k < META; k++)
            meta_stage[i * META + k] = s;
        if (pipe->holds[s]) {
            const dt_tensor *t = tensors[i];
            meta[i * META] = (double)dt_tensor_dtype(t);
            meta[i * META + 1] = dt_tensor_rank(t);
            for (int d = 0; d < dt_tensor_rank(t); d++)
                meta[i * META + 2 + d] = (double)dt_tensor_shape(t)[d];
        }
    }
    if (st == DT_OK)
        st = dt_pipe_share_values(pipe, n * META, meta_stage, meta);
    for (int i = 0; st == DT_OK && i < n; i++) {
        dt_tensor *rep = NULL;
        dt_layout *wl = NULL;
        st = stage_replica(pipe, stage_of[i], tensors[i], &meta[i * META], &rep);
        if (st == DT_OK)
            st = whole_layout(pipe, (int)meta[i * META + 1], &wl);
        if (st == DT_OK)
            st = dt_copy_to_mesh(rep, wl, &whole[i]);
        dt_layout_destroy(wl);
        dt_tensor_destroy(rep);
    }
    if (st == DT_OK)
        st = dt_save(pipe->mesh, dir, n, names, (const dt_tensor *const *)whole, opts);
    for (int i = 0; whole && i < n; i++)
        dt_tensor_destroy(whole[i]);
    free(whole);
    free(meta_stage);
    free(meta);
    return st;
}

dt_status dt_pipe_restore(dt_pipe *pipe, const char *dir, int n, const char *const *names,
                          const int *stage_of, const dt_layout *const *layouts,
                          dt_tensor **tensors_out)
{
    if (!pipe || !dir || n < 0 || (n > 0 && (!names || !stage_of || !layouts || !tensors_out)))
        return dt__error(DT_ERR_INVALID_ARGUMENT, "dt_pipe_restore: NULL argument");
    dt_status st = check_stages(pipe, n, stage_of, "dt_pipe_restore");
    for (int i = 0; i < n && st == DT_OK; i++)
        if (!layouts[i] || !dt_mesh_equal(dt_layout_mesh(layouts[i]), pipe->stage_mesh[stage_of[i]]))
            st = dt__error(DT_ERR_INVALID_ARGUMENT, "dt_pipe_restore: the layout of tensor %d "
                           "('%s') is not on stage %d's mesh", i, names[i], stage_of[i]);
    if (st != DT_OK)
        return st;
    dt_layout **wl = calloc((size_t)(n > 0 ? n : 1), sizeof *wl);
    dt_tensor **whole = calloc((size_t)(n > 0 ? n : 1), sizeof *whole);
    dt_tensor **got = calloc((size_t)(n > 0 ? n : 1), sizeof *got);
    if (!wl || !whole || !got)
        st = dt__error(DT_ERR_NO_MEMORY, "dt_pipe_restore: no memory");
    for (int i = 0; st == DT_OK && i < n; i++)
        st = whole_layout(pipe, dt_layout_rank(layouts[i]), &wl[i]);
    if (st == DT_OK)
        st = dt_restore(pipe->mesh, dir, n, names, (const dt_layout *const *)wl, whole);
    for (int i = 0; st == DT_OK && i < n; i++)
        st = dt_copy_to_mesh(whole[i], layouts[i], &got[i]);
    for (int i = 0; st == DT_OK && i < n; i++) {
        if (!pipe->holds[stage_of[i]]) {
            dt_tensor_destroy(got[i]);
            got[i] = NULL;
        }
        tensors_out[i] = got[i];
    }
    for (int i = 0; i < n && wl; i++) {
        dt_layout_destroy(wl[i]);
        if (whole)
            dt_tensor_destroy(whole[i]);
        if (st != DT_OK && got)
            dt_tensor_destroy(got[i]);
    }
    free(wl);
    free(whole);
    free(got);
    return st;
}
