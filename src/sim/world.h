/*
 * The simulated job as the communication layer sees it: a stand-in world
 * communicator (comm/cost/standin.h) of `ranks` members, `per_host` to a
 * host (ranks r*K .. r*K + K-1 on host r), whose job holds the cost
 * model. Handing it to the real code keeps the simulator honest: the link
 * between two ranks is dt_topo_link's, auto's choice is dt_algo_pick's,
 * the analytic prediction is dt_cost_predict's, and the algorithms run
 * dry on it (sim/coll.c). Nothing in it is ever connected.
 */
#ifndef DT_SIM_WORLD_H
#define DT_SIM_WORLD_H

#include <stddef.h>

#include "comm/cost/model.h"

/* How far long work on a world has got, for a person waiting on it: fn
 * is called now and then with what is under way ("recording allreduce
 * rhd", "running the simulation") and `done` of `total` units of it,
 * done == total last. NULL: nobody is told. */
typedef struct {
    void (*fn)(void *ctx, const char *what, double done, double total);
    void *ctx;
} dt_sim_progress;

typedef struct {
    dt_comm *comm;       /* the stand-in world */
    dt_cost_model model; /* its job's */
    int *host_of;        /* [ranks] each rank's host, as the stand-in has it */
    int ranks, per_host, hosts;
    dt_sim_progress progress; /* a group's world tells its parent's */
} dt_sim_world;

/* Tells w's progress, if anyone listens. */
static inline void dt_sim_tell(const dt_sim_world *w, const char *what, double done, double total)
{
    if (w->progress.fn) w->progress.fn(w->progress.ctx, what, done, total);
}

/* 0, or -1 with a message saying what would work (ranks not a multiple of
 * per_host, too many ranks). The model is copied. */
int dt_sim_world_init(dt_sim_world *w, int ranks, int per_host, const dt_cost_model *m,
                      char *err, size_t len);
/* A stand-in world for a group of n ranks (a tensor-parallel group, the
 * replicas of a stage), to record a collective over it: member i on host
 * host_of[i], a number in 0..n-1 equal for members sharing a host (the
 * first member on that host, say), so the algorithms see the group's own
 * mix of links. per_host is the most members on one host. 0, or -1 with a
 * message. */
int dt_sim_world_init_group(dt_sim_world *w, int n, const int *host_of, const dt_cost_model *m,
                            char *err, size_t len);
void dt_sim_world_free(dt_sim_world *w);

/* The link between ranks a and b, and its cost (alpha, beta, gamma). */
dt_link_kind dt_sim_world_link(const dt_sim_world *w, int a, int b);
const dt_link_cost *dt_sim_world_cost(const dt_sim_world *w, int a, int b);

#endif
