/* The simulated network's links and fluid flows (net.h). */
#include "sim/net.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Link numbering: rank r's port out 2r, in 2r + 1; NIC k (of all hosts'
 * NICs) out 2R + 2k, in 2R + 2k + 1. */
static int port_out(int r) { return 2 * r; }
static int nic_of(const dt_sim_net *n, int r)
{
    const dt_sim_world *w = n->w;
    return w->host_of[r] * n->nics + (r % w->per_host) % n->nics;
}

int dt_sim_net_init(dt_sim_net *n, const dt_sim_world *w, int nics, dt_sim_flow_cb cb, void *ctx,
                    char *err, size_t len)
{
    memset(n, 0, sizeof *n);
    if (nics < 1 || nics > w->per_host) {
        snprintf(err, len, "--nics-per-node %d: use 1..%d (at most one NIC per rank of a host)",
                 nics, w->per_host);
        return -1;
    }
    n->w = w;
    n->nics = nics;
    n->cb = cb;
    n->ctx = ctx;
    n->free_flow = -1;
    n->nlinks = 2 * w->ranks + 2 * w->hosts * nics;
    n->link = calloc((size_t)n->nlinks, sizeof *n->link);
    n->dirty = malloc((size_t)n->nlinks * sizeof *n->dirty);
    if (!n->link || !n->dirty) {
        dt_sim_net_free(n);
        snprintf(err, len, "out of memory for %d links", 2 * w->ranks);
        return -1;
    }
    /* The world never runs over MPI nor forces TCP: dt_topo_link gives shm
     * within a host and tcp across hosts. */
    double port = 1.0 / w->model.link[DT_LINK_SHM].beta;
    double nic = 1.0 / w->model.link[DT_LINK_TCP].beta;
    for (int i = 0; i < n->nlinks; i++) n->link[i].cap = i < 2 * w->ranks ? port : nic;
    return 0;
}

void dt_sim_net_free(dt_sim_net *n)
{
    for (int i = 0; n->link && i < n->nlinks; i++) free(n->link[i].flows);
    free(n->link);
    free(n->flow);
    free(n->dirty);
    memset(n, 0, sizeof *n);
}

static void mark(dt_sim_net *n, int l)
{
    if (!n->link[l].dirty) {
        n->link[l].dirty = 1;
        n->dirty[n->ndirty++] = l;
    }
}

static int join(dt_sim_net *n, int f, int k, int l)
{
    dt_sim_link *L = &n->link[l];
    if (L->n == L->alloc) {
        int alloc = L->alloc ? 2 * L->alloc : 4;
        int *fl = realloc(L->flows, (size_t)alloc * sizeof *fl);
        if (!fl) return -1;
        L->flows = fl;
        L->alloc = alloc;
    }
    n->flow[f].link[k] = l;
    n->flow[f].pos[k] = L->n;
    L->flows[L->n++] = f;
    mark(n, l);
    return 0;
}

static int new_flow(dt_sim_net *n)
{
    if (n->free_flow >= 0) {
        int f = n->free_flow;
        n->free_flow = n->flow[f].next_free;
        return f;
    }
    if (n->nflow == n->flow_alloc) {
        int alloc = n->flow_alloc ? 2 * n->flow_alloc : 1024;
        dt_sim_flow *fl = realloc(n->flow, (size_t)alloc * sizeof *fl);
        if (!fl) return -1;
        n->flow = fl;
        n->flow_alloc = alloc;
    }
    n->flow[n->nflow].version = 0;
    return n->nflow++;
}

static int flow_over(dt_sim_net *n, int a, int b, double amount, double now, int owner, int work)
{
    int f = new_flow(n);
    if (f < 0) return -1;
    dt_sim_flow *fl = &n->flow[f];
    fl->remaining = amount;
    fl->rate = 0;
    fl->last = now;
    fl->stamp = n->stamp;
    fl->owner = owner;
    fl->work = work;
    if (join(n, f, 0, a) || join(n, f, 1, b)) return -1;
    n->started += !work;
    return f;
}

int dt_sim_net_share_cpu(dt_sim_net *n, double ranks_worth)
{
    const dt_sim_world *w = n->w;
    int base = n->nlinks, total = base + w->ranks + w->hosts;
    dt_sim_link *link = realloc(n->link, (size_t)total * sizeof *link);
    if (!link) return -1;
    n->link = link;
    int *dirty = realloc(n->dirty, (size_t)total * sizeof *dirty);
    if (!dirty) return -1;
    n->dirty = dirty;
    memset(link + base, 0, (size_t)(total - base) * sizeof *link);
    for (int i = base; i < total; i++) link[i].cap = i < base + w->ranks ? 1.0 : ranks_worth;
    n->nlinks = total;
    n->cpu_base = base;
    return 0;
}

int dt_sim_net_add_work(dt_sim_net *n, int rank, double seconds, double now, int owner)
{
    int host = n->cpu_base + n->w->ranks + n->w->host_of[rank];
    return flow_over(n, n->cpu_base + rank, host, seconds, now, owner, 1);
}

int dt_sim_net_add(dt_sim_net *n, int src, int dst, double bytes, double now, int owner)
{
    int a, b;
    if (dt_sim_world_link(n->w, src, dst) == DT_LINK_SHM) {
        a = port_out(src), b = port_out(dst) + 1;
    } else {
        int base = 2 * n->w->ranks;
        a = base + 2 * nic_of(n, src), b = base + 2 * nic_of(n, dst) + 1;
    }
    return flow_over(n, a, b, bytes, now, owner, 0);
}

void dt_sim_net_remove(dt_sim_net *n, int f)
{
    dt_sim_flow *fl = &n->flow[f];
    for (int k = 0; k < DT_SIM_PATH; k++) {
        dt_sim_link *L = &n->link[fl->link[k]];
        int moved = L->flows[--L->n], at = fl->pos[k];
        L->flows[at] = moved;
        dt_sim_flow *m = &n->flow[moved];
        for (int j = 0; j < DT_SIM_PATH; j++)
            if (m->link[j] == fl->link[k]) m->pos[j] = at;
        mark(n, fl->link[k]);
    }
    fl->owner = -1;
    fl->version++;
    fl->next_free = n->free_flow;
    n->free_flow = f;
}

static void update(dt_sim_net *n, int f, double now)
{
    dt_sim_flow *fl = &n->flow[f];
    fl->remaining -= fl->rate * (now - fl->last);
    if (fl->remaining < 0) fl->remaining = 0;
    fl->last = now;
    double rate = 0;
    for (int k = 0; k < DT_SIM_PATH; k++) {
        const dt_sim_link *L = &n->link[fl->link[k]];
        double share = L->cap / L->n;
        if (k == 0 || share < rate) rate = share;
    }
    if (rate == fl->rate) return;
    fl->rate = rate;
    fl->version++;
    n->rate_changes++;
    n->cb(n->ctx, f, now + fl->remaining / rate, fl->version);
}

void dt_sim_net_settle(dt_sim_net *n, double now)
{
    n->stamp++;
    for (int i = 0; i < n->ndirty; i++) {
        dt_sim_link *L = &n->link[n->dirty[i]];
        L->dirty = 0;
        for (int j = 0; j < L->n; j++) {
            int f = L->flows[j];
            if (n->flow[f].stamp == n->stamp) continue;
            n->flow[f].stamp = n->stamp;
            update(n, f, now);
        }
    }
    n->ndirty = 0;
}
