/*
 * Dry runs of the collective algorithms (predict.c): a stand-in
 * communicator plays one rank of a real algorithm on one process, its
 * steps and local steps going to the dry run (c->dry) instead of the
 * transports and the memory. By default a dry run sums the cost model's
 * time for the rank (dt_cost_predict); with a hook it hands each step and
 * each local copy or reduction to the hook instead, so that a simulator
 * can replay the very schedule the algorithm runs (sim/coll.c).
 */
#ifndef DT_COMM_COST_DRY_H
#define DT_COMM_COST_DRY_H

#include "comm/algo/algorithms.h"

typedef struct {
    /* A step: ops posted together (peers are the stand-in's ranks). */
    void (*step)(void *arg, const dt_p2p *ops, int n);
    /* Local work: a copy or a reduction, costed by the model. */
    void (*local)(void *arg, double seconds);
    void *arg;
} dt_dry_hook;

/* Runs rank `rank` of algorithm al for call a dry on a stand-in of
 * `like` (its job's model, its size, its host map), handing every step
 * and every piece of local work to hook. The algorithm's return value:
 * negative when it cannot run there. */
int dt_dry_run_rank(const dt_comm *like, const dt_algo *al, const dt_coll_args *a, int rank,
                    const dt_dry_hook *hook);

#endif
