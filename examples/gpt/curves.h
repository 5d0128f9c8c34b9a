/* gpt/curves: train_gpt's curves (training loss per step, held-out loss per evaluation, in
 * nats per character) as CSV and as a PNG with the 2.00 target line. */
#ifndef GPT_CURVES_H
#define GPT_CURVES_H

#include <stddef.h>
#include <stdint.h>

#include "../train/history.h"

/* Records with a held-out loss are those whose eval_loss is not NaN. Return 0, or -1 with a
 * message in err. */
int curves_write_csv(const history *h, const char *path, char *err, size_t errlen);
int curves_write_plot(const history *h, int64_t total_steps, double target,
                      const char *subtitle, const char *path, char *err, size_t errlen);

#endif
