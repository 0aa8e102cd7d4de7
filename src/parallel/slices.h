/* What tensor and expert parallelism share: a rank's model is a share of
 * the whole (its slices, its experts), so both pick the tensors that are
 * theirs as ranges, fingerprint the tensors every rank of the group holds
 * alike, and place a share's floats into the whole model. */
#ifndef DT_PARALLEL_SLICES_H
#define DT_PARALLEL_SLICES_H

#include <stdint.h>

#include "model/gpt.h"

typedef int (*dt_slices_pick)(const dt_param_tensor *t);

/* The floats of the tensors `pick` takes, merged where one continues the
 * last (at = lo); out holds up to m->n_tensors. Returns the count. */
int dt_slices_ranges(const dt_gpt *m, dt_slices_pick pick, dt_flat_range *out);
/* A fingerprint of the parameters of the tensors `pick` takes. */
uint64_t dt_slices_hash(const dt_gpt *m, dt_slices_pick pick);
/* The floats `local`, in lay's layout (a share of whole's model), placed
 * into whole->params. 0, or -1 out of memory. */
int dt_slices_place(const dt_gpt *lay, dt_gpt *whole, const float *local);

#endif
