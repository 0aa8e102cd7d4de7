/* What a step of a mixture-of-experts model reports: the balance losses
 * added to the loss that is differentiated (the logged loss stays the
 * cross-entropy alone) and each layer's load, summed over the job's
 * ranks; and the experts' bias of aux-loss-free balancing moved by that
 * load. Private to src/train. */
#ifndef DT_TRAIN_MOE_STATS_H
#define DT_TRAIN_MOE_STATS_H

#include <stdio.h>

struct dt_run;

typedef struct {
    int on;          /* the model has experts */
    double aux_loss; /* coefficient x the sequences' mean of sum_e f_e P_e, summed over layers */
    double z_loss;   /* coefficient x the tokens' mean of logsumexp^2, summed over layers */
    double dropped;  /* routing slots dropped by the capacity, all layers */
    double ep_skew;  /* expert parallelism: the busiest ep rank's slots over the
                      * ranks' mean, averaged over layers (0 without ep) */
} dt_moe_step;

/* Before a step: the model's counts zeroed. */
void dt_moe_step_begin(struct dt_run *t);
/* After it: the counts summed over the ranks (collective over the job),
 * the step's figures, the bias moved, and with --moe-per-layer-logging
 * each layer's load printed on f. 0, or -1 with the run's error. */
int dt_moe_step_end(struct dt_run *t, dt_moe_step *out, FILE *f, int print);

#endif
