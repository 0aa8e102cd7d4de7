/* The stand-in world of a simulation (world.h). */
#include "sim/world.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/cost/standin.h"
#include "comm/topo.h"

#define SIM_MAX_RANKS (1 << 20) /* the engine packs ranks into 20 bits */

/* w's sizes and an empty host map of `ranks`, checked: 0, or -1 with a
 * message. */
static int size_world(dt_sim_world *w, int ranks, int per_host, char *err, size_t len)
{
    memset(w, 0, sizeof *w);
    if (ranks < 1 || ranks > SIM_MAX_RANKS) {
        snprintf(err, len, "--ranks %d: use 1..%d ranks", ranks, SIM_MAX_RANKS);
        return -1;
    }
    if (per_host < 1 || ranks % per_host) {
        snprintf(err, len, "--ranks %d is not a multiple of --ranks-per-node %d: every host "
                 "holds the same number of ranks (try --ranks %d)", ranks, per_host,
                 per_host > 0 ? (ranks + per_host - 1) / per_host * per_host : ranks);
        return -1;
    }
    w->host_of = malloc((size_t)ranks * sizeof *w->host_of);
    if (!w->host_of) {
        snprintf(err, len, "out of memory for %d ranks", ranks);
        return -1;
    }
    w->ranks = ranks;
    w->per_host = per_host;
    w->hosts = ranks / per_host;
    return 0;
}

/* The stand-in of w's host map, its job holding m. */
static int stand_in(dt_sim_world *w, const dt_cost_model *m, char *err, size_t len)
{
    w->model = *m;
    w->comm = dt_standin_create(w->ranks, w->host_of, m);
    if (w->comm) return 0;
    snprintf(err, len, "out of memory for %d ranks", w->ranks);
    dt_sim_world_free(w);
    return -1;
}

int dt_sim_world_init(dt_sim_world *w, int ranks, int per_host, const dt_cost_model *m,
                      char *err, size_t len)
{
    if (size_world(w, ranks, per_host, err, len)) return -1;
    for (int r = 0; r < ranks; r++) w->host_of[r] = r / per_host;
    return stand_in(w, m, err, len);
}

int dt_sim_world_init_group(dt_sim_world *w, int n, const int *host_of, const dt_cost_model *m,
                            char *err, size_t len)
{
    if (size_world(w, n, 1, err, len)) return -1;
    int *count = calloc((size_t)n, sizeof *count), hosts = 0, most = 0;
    if (!count) {
        dt_sim_world_free(w);
        return snprintf(err, len, "out of memory for a group of %d", n), -1;
    }
    for (int i = 0; i < n; i++) {
        int h = host_of[i] >= 0 && host_of[i] < n ? host_of[i] : i;
        w->host_of[i] = h;
        hosts += count[h]++ == 0;
        if (count[h] > most) most = count[h];
    }
    free(count);
    w->hosts = hosts;
    w->per_host = most;
    return stand_in(w, m, err, len);
}

void dt_sim_world_free(dt_sim_world *w)
{
    dt_standin_destroy(w->comm);
    free(w->host_of);
    memset(w, 0, sizeof *w);
}

dt_link_kind dt_sim_world_link(const dt_sim_world *w, int a, int b)
{
    return dt_topo_link(w->comm, a, b);
}

const dt_link_cost *dt_sim_world_cost(const dt_sim_world *w, int a, int b)
{
    return &w->model.link[dt_sim_world_link(w, a, b)];
}
