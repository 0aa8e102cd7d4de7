/* Naive data parallelism in one process, the scheme torch.nn.DataParallel
 * teaches: N devices are worker threads, each with a replica of the model.
 * Every step the main device (device 0, the trainer's model) copies its
 * parameters to the replicas, hands each device its slice of the batch,
 * lets all of them run forward and backward at once, then gathers their
 * gradients and sums them into its own. Only the main device holds the
 * optimizer and updates; the replicas are refreshed at the next step.
 *
 * It is here for comparison with DDP: the copies and the gather run on the
 * main device while the others wait, and every replica costs a full model. */
#ifndef DT_PARALLEL_NAIVE_DP_H
#define DT_PARALLEL_NAIVE_DP_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "model/gpt.h"

typedef struct {
    int ndev;
    dt_gpt *main;     /* device 0 */
    dt_gpt *replicas; /* devices 1 .. ndev-1 */
    int B, T, accum;
    int32_t *tokens;  /* per device, per micro-batch: B*T inputs then B*T targets */
    float grad_scale; /* of the step in flight */
    double *loss;     /* per device: the sum over its micro-batches */
    int *failed;      /* per device */

    pthread_t *threads; /* devices 1 .. ndev-1 */
    int nthreads;
    pthread_mutex_t mu;
    pthread_cond_t go, done;
    long generation; /* bumped to start a step on every device */
    int pending;     /* devices still working on it */
    int stop;

    /* Measured over the last step, on the main device. */
    double copy_ms;      /* parameters out and gradients in: nothing overlaps them */
    uint64_t bytes_moved; /* what those copies moved */
} dt_naive_dp;

/* ndev devices (>= 1) for micro-batches of B x T and accum of them per step;
 * main must have gradients and activations for B x T. 0, or -1 with a message. */
int dt_naive_dp_init(dt_naive_dp *d, dt_gpt *main, int ndev, int B, int T, int accum,
                     char *err, size_t errlen);
void dt_naive_dp_free(dt_naive_dp *d);

/* Where the main device scatters device dev's micro-batch j before a step. */
int32_t *dt_naive_dp_inputs(dt_naive_dp *d, int dev, int j);
int32_t *dt_naive_dp_targets(dt_naive_dp *d, int dev, int j);

/* One step's forward and backward on every device, each backward scaled by
 * grad_scale; afterwards main->grads holds the sum over devices (in device
 * order) and *loss the mean loss over all micro-batches. 0, or -1 with a
 * message naming the device. */
int dt_naive_dp_step(dt_naive_dp *d, float grad_scale, double *loss, char *err, size_t errlen);

#endif
