/* libdtensor mixture-of-experts ops: the grouped matrix product of the experts (every local
 * expert multiplies its own contiguous group of token rows) and its weight gradient, each one
 * op definition (opdef.h, family "moe"; docs/moe.md).
 *
 * Shapes, as the factor rules see them: the tokens are viewed as [P, R, K] with P the size of
 * the expert-parallel mesh dim (1 without one) and dim 0 sharded over it; the experts' weight
 * is one [P*G, K, N] parameter (G local experts per device, expert e = p*G + g lives on member
 * p); counts [P, G] (i64) give the rows of each local expert: member p's rows
 * [off_g, off_g + counts[p, g]) belong to its expert g, off_g = the sum of the counts before g,
 * and rows past the sum of its counts are padding (their output is 0). So the same global call
 * means the same thing at every expert-parallel degree. Each output element is one dot product
 * in a fixed order (accumulated in f64), so a row's result does not depend on the other rows
 * of its group: the same bits whichever device holds it. */
#ifndef DTENSOR_MOE_H
#define DTENSOR_MOE_H

#include "dtensor/export.h"
#include "dtensor/status.h"
#include "dtensor/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* y [P, R, N] = for each member p and local expert g: x[p, rows of g] w[p*G + g] (trans_w 0,
 * w [P*G, K, N]) or x[p, rows of g] w[p*G + g]^T (trans_w 1, w [P*G, N, K]); padding rows 0.
 * x and w f32 or f64 alike, counts i64 [P, G] (each row's sum <= R, no negative count). Rule
 * "pRk,(pG)kn,pG->pRn": p may be sharded (expert parallelism, no communication), the rows and
 * the groups stay whole on each device; a sharded k leaves a partial sum. Differentiable in x and w
 * (not counts). Collective. Errors as ops_general.h's: DT_ERR_SHAPE for shapes that do not fit,
 * DT_ERR_INVALID_ARGUMENT for NULL arguments or counts out of range (on every client). */
DT_API dt_status dt_grouped_matmul(const dt_tensor *x, const dt_tensor *w, const dt_tensor *counts,
                                   int trans_w, dt_tensor **out);

/* The weight gradient of dt_grouped_matmul: dw [P*G, K, N] with dw[p*G + g] = the sum over
 * the rows r of group g (in row order) of x[p, r]^T dy[p, r] (x [P, R, K], dy [P, R, N]).
 * Rule "pRk,pRn,pG->(pG)kn". Not differentiable. Collective; errors as above. */
DT_API dt_status dt_grouped_matmul_wgrad(const dt_tensor *x, const dt_tensor *dy,
                                         const dt_tensor *counts, dt_tensor **out);

#ifdef __cplusplus
}
#endif
#endif
