/* The stand-in world of a simulation (world.h). */
#include "sim/world.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SIM_MAX_RANKS (1 << 20) /* the engine packs ranks into 20 bits */

int dt_sim_world_init(dt_sim_world *w, int ranks, int per_host, const dt_cost_model *m,
                      char *err, size_t len)
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
    w->comm.host_of = malloc((size_t)ranks * sizeof *w->comm.host_of);
    if (!w->comm.host_of) {
        snprintf(err, len, "out of memory for %d ranks", ranks);
        return -1;
    }
    for (int r = 0; r < ranks; r++) w->comm.host_of[r] = r / per_host;
    w->ranks = ranks;
    w->per_host = per_host;
    w->hosts = ranks / per_host;
    w->job.model = *m;
    w->job.size = ranks;
    w->job.wake_fd = -1; /* nothing to wake: an abort here must not write to fd 0 */
    w->comm.job = &w->job;
    w->comm.size = ranks;
    w->comm.nhosts = w->hosts;
    w->comm.local_size = per_host;
    snprintf(w->comm.id, sizeof w->comm.id, "sim");
    for (int k = 0; k < DT_COLL_KIND_COUNT; k++) w->comm.algo_forced[k] = DT_ALGO_AUTO;
    /* auto's cache is valid for model_seen == model_version (both 0 here):
     * it must start empty, not all "the first algorithm". */
    memset(w->comm.auto_choice, -1, sizeof w->comm.auto_choice);
    return 0;
}

int dt_sim_world_init_group(dt_sim_world *w, int n, const int *host_of, const dt_cost_model *m,
                            char *err, size_t len)
{
    if (dt_sim_world_init(w, n, 1, m, err, len)) return -1;
    int *count = calloc((size_t)n, sizeof *count), hosts = 0, most = 0;
    if (!count) {
        dt_sim_world_free(w);
        return snprintf(err, len, "out of memory for a group of %d", n), -1;
    }
    for (int i = 0; i < n; i++) {
        int h = host_of[i] >= 0 && host_of[i] < n ? host_of[i] : i;
        w->comm.host_of[i] = h;
        hosts += count[h]++ == 0;
        if (count[h] > most) most = count[h];
    }
    free(count);
    w->hosts = w->comm.nhosts = hosts;
    w->per_host = w->comm.local_size = most;
    return 0;
}

void dt_sim_world_free(dt_sim_world *w)
{
    free(w->comm.host_of);
    memset(w, 0, sizeof *w);
}

dt_link_kind dt_sim_world_link(const dt_sim_world *w, int a, int b)
{
    return dt_topo_link(&w->comm, a, b);
}

const dt_link_cost *dt_sim_world_cost(const dt_sim_world *w, int a, int b)
{
    return &w->job.model.link[dt_sim_world_link(w, a, b)];
}
