/* Comparing a relayout plan with the reference planner's (layout/relayout_plan_ref.c), piece
 * by piece: tests/relayout's property and scale tests. */
#ifndef DT_RL_PLAN_CMP_H
#define DT_RL_PLAN_CMP_H

#include "layout/layout_impl.h"

/* Builds the plan of src -> dst (shape, dtype) with both planners as client sim->me of the
 * simulated table sim (NULL: the runtime) and returns the number of differences (piece
 * count, any field of any piece, summands, zero fills, statistics), printing the first few
 * with `what`. *work_out (may be NULL) gets the new planner's work count, *pieces_out its
 * piece count, *ref_work_out the reference's work count. */
int64_t rl_plan_compare(const dt_layout *src, const dt_layout *dst, int rank,
                        const int64_t *shape, dt_dtype dtype, const dt__rl_sim *sim,
                        const char *what, uint64_t *work_out, size_t *pieces_out,
                        uint64_t *ref_work_out);

#endif
