/* Softmax and cross-entropy fused, forward and backward in one pass.
 *   logits [N, V], targets [N] in [0, V), losses [N]. */
#ifndef DT_KERNELS_CROSSENTROPY_H
#define DT_KERNELS_CROSSENTROPY_H

#include <stdint.h>

/* losses[i] = -log softmax(logits[i])[targets[i]]. When dlogits is not NULL it
 * receives (softmax - onehot) * grad_scale (overwrites; may alias logits, so
 * the logits buffer can hold its own gradient). Returns the sum of losses,
 * accumulated in double. */
double dt_crossentropy(float *dlogits, float *losses, const float *logits,
                       const int32_t *targets, int N, int V, float grad_scale);

#endif
