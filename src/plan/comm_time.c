/* The seconds of a layout's collectives for `dtrain plan`: each group of
 * the mesh as a stand-in world of its size with as many of its members to
 * a host as the placement puts there (sim/world.h), and the collective's
 * real algorithm, auto's choice, costed dry by the cost model
 * (dt_sim_coll_predict). Answers are kept: thousands of layouts ask the
 * same few questions. See plan.h. */
#include <stdlib.h>
#include <string.h>

#include "core/str.h"
#include "plan/plan.h"
#include "plan/plan_internal.h"
#include "sim/coll.h"

#define CACHE DT_PLAN_ANSWERS

static double predict(dt_plan_memo *c, dt_coll_kind kind, int ranks, int per_host, size_t bytes)
{
    dt_sim_world w;
    char err[256];
    if (dt_sim_world_init(&w, ranks, per_host, &c->links, err, sizeof err)) return -1;
    double s = dt_sim_coll_predict(&w, kind, bytes, NULL);
    dt_sim_world_free(&w);
    return s;
}

double dt_plan_coll(dt_plan_memo *c, dt_coll_kind kind, int ranks, int per_host, size_t bytes)
{
    if (ranks < 2 || bytes == 0) return 0;
    if (per_host > ranks) per_host = ranks;
    if (per_host < 1) per_host = 1;
    while (ranks % per_host) per_host--; /* whole hosts of the group */
    for (int i = 0; i < c->n; i++) {
        const dt_plan_answer *a = &c->cache[i];
        if (a->kind == (int)kind && a->ranks == ranks && a->per_host == per_host &&
            a->bytes == bytes)
            return a->seconds;
    }
    double s = predict(c, kind, ranks, per_host, bytes);
    if (c->n < CACHE) c->cache[c->n++] = (dt_plan_answer){(int)kind, ranks, per_host, bytes, s};
    return s;
}

double dt_plan_p2p(const dt_plan_memo *c, int same_host, size_t bytes)
{
    const dt_link_cost *l = &c->links.link[same_host ? DT_LINK_SHM : DT_LINK_TCP];
    return l->alpha + l->beta * (double)bytes;
}

int dt_plan_group_per_host(int per_node, int stride, int size)
{
    int k = stride >= per_node ? 1 : per_node / stride;
    return k < size ? k : size;
}
