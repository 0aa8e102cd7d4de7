/*
 * Dry runs of the collective algorithms (predict.c), as the rest of the
 * library sees them: a stand-in communicator (standin.h) plays one rank of
 * a real algorithm on one process, and what the rank would do (its steps,
 * its local copies and reductions) is costed by the model instead of done.
 * By default a dry run sums the model's time for the rank
 * (dt_cost_predict); with a hook it hands each step and each piece of
 * local work to the hook instead, so that a simulator can replay the very
 * schedule the algorithm runs (sim/coll.c).
 */
#ifndef DT_COMM_COST_DRY_H
#define DT_COMM_COST_DRY_H

#include "comm/algo/table.h"

/* One operation of a step, as a hook sees it. */
typedef struct {
    dt_p2p_kind kind;
    int peer; /* the stand-in's rank */
    size_t bytes;
} dt_dry_op;

typedef struct {
    /* A step: ops posted together. */
    void (*step)(void *arg, const dt_dry_op *ops, int n);
    /* Local work: a copy or a reduction, costed by the model. */
    void (*local)(void *arg, double seconds);
    void *arg;
} dt_dry_hook;

/* Predicted seconds of al for call a on c: its slowest rank's, by a dry
 * run; -1 for algorithms that cannot be costed (MPI's) or cannot run
 * there. */
double dt_cost_predict(dt_comm *c, const dt_algo *al, const dt_coll_args *a);

/* Runs rank `rank` of algorithm al for call a dry on a stand-in of
 * `like` (its job's model, its size, its host map), handing every step
 * and every piece of local work to hook. The algorithm's return value:
 * negative when it cannot run there. */
int dt_dry_run_rank(const dt_comm *like, const dt_algo *al, const dt_coll_args *a, int rank,
                    const dt_dry_hook *hook);

#endif
