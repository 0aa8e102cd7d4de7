/*
 * Stand-in communicators: the shape of a communicator (its size, which
 * members share a host) and its job's cost model, and nothing else: never
 * connected, they move no byte. The cost model's dry runs play each rank
 * of an algorithm on one (predict.c); the simulator and the planner make
 * one to ask the real code what it would do on a job that does not exist:
 * which link joins two ranks (dt_topo_link), which algorithm auto picks
 * (dt_algo_pick, algo/table.h), what it costs (dt_cost_predict) and its
 * steps (dt_dry_run_rank, cost/dry.h).
 */
#ifndef DT_COMM_COST_STANDIN_H
#define DT_COMM_COST_STANDIN_H

#include "comm/cost/model.h"
#include "dtrain/comm.h"

/* A stand-in of `size` members, member r on host host_of[r], a number in
 * 0..size-1 equal for members that share a host; its job holds a copy of
 * m, and auto chooses for it as for a communicator just made. NULL when
 * out of memory. */
dt_comm *dt_standin_create(int size, const int *host_of, const dt_cost_model *m);
void dt_standin_destroy(dt_comm *c);

#endif
