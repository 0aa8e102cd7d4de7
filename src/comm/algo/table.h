/*
 * The collective algorithms as a table (table.c): what the communicator
 * runs, what the cost model costs (cost/dry.h), and what the simulator and
 * the planner name and choose, without the schedules' insides
 * (algorithms.h).
 */
#ifndef DT_COMM_ALGO_TABLE_H
#define DT_COMM_ALGO_TABLE_H

#include <stddef.h>

#include "comm/coll.h"

/* Every algorithm has this one signature (algorithms.h says what the
 * arguments mean for each collective). */
typedef int (*dt_algo_fn)(dt_comm *c, const void *send, void *recv, size_t n, int root);

enum {
    DT_ALGO_NO_AUTO = 1u,  /* never chosen by auto (needs asking for) */
    DT_ALGO_NEEDS_MPI = 2u /* runs inside MPI: only when the job runs on it */
};

typedef struct {
    const char *name; /* as in DTRAIN_ALLREDUCE_ALGO=<name> */
    dt_coll_kind kind;
    dt_algo_fn run;
    unsigned flags;
    const char *summary; /* one line, for --explain and error messages */
} dt_algo;

/* Every algorithm of every collective. */
extern const dt_algo dt_algo_table[];
extern const int dt_algo_count;
/* Index in the table of the named algorithm of kind k, or -1. */
int dt_algo_find(dt_coll_kind k, const char *name);
/* The algorithm to run for this call: the one forced, or the cheapest by
 * the cost model. Same answer on every rank. Fails c (DT_ERR_INVALID)
 * when the forced one cannot run here. */
int dt_algo_pick(dt_comm *c, const dt_coll_args *a, const dt_algo **out);
/* Whether algorithm al can run on c at all (mpi needs MPI; hier several
 * hosts); otherwise why not, in why. */
int dt_algo_usable(const dt_comm *c, const dt_algo *al, char *why, size_t len);
/* Read DTRAIN_<COLLECTIVE>_ALGO for every selectable collective into
 * c's forced choices; a bad name fails with a message listing the
 * choices. */
int dt_algo_read_env(dt_comm *c, char *err, size_t len);

/* The n an algorithm gets for a call: elements for all-reduce and
 * reduce-scatter, bytes for the others. */
static inline size_t dt_algo_arg_n(const dt_coll_args *a)
{
    if (a->kind == DT_COLL_ALLREDUCE || a->kind == DT_COLL_REDUCE_SCATTER) return a->count;
    return a->count * dt_dtype_size(a->dtype);
}

#endif
