/* Groups of ranks and their collectives' recordings (group.h). */
#include "sim/group.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Member i's label: the index of the group's first member on its host.
 * first[] (one per world host, all -1) is left as it was found. */
static void labels(const dt_sim_world *w, const int *m, int n, int *first, int *label)
{
    for (int i = 0; i < n; i++) {
        int h = w->host_of[m[i]];
        if (first[h] < 0) first[h] = i;
        label[i] = first[h];
    }
    for (int i = 0; i < n; i++) first[w->host_of[m[i]]] = -1;
}

/* Each group's shape: the first earlier shape with the same labels, or a
 * new one. */
static int shapes(dt_sim_groups *g, const dt_sim_world *w)
{
    int n = g->n, *first = malloc((size_t)w->ranks * sizeof *first);
    int *lab = malloc(2 * (size_t)n * sizeof *lab);
    int *seen = NULL, cap = 0;
    g->shape = malloc((size_t)g->ngroups * sizeof *g->shape);
    g->rep = malloc((size_t)g->ngroups * sizeof *g->rep);
    if (!first || !lab || !g->shape || !g->rep) return free(first), free(lab), -1;
    for (int r = 0; r < w->ranks; r++) first[r] = -1;
    int rc = 0;
    for (int k = 0; k < g->ngroups && rc == 0; k++) {
        labels(w, g->members + (size_t)k * n, n, first, lab);
        int s = 0;
        while (s < g->nshapes && memcmp(seen + (size_t)s * n, lab, (size_t)n * sizeof *lab)) s++;
        if (s == g->nshapes) {
            if (s == cap) {
                cap = cap ? 2 * cap : 4;
                int *v = realloc(seen, (size_t)cap * (size_t)n * sizeof *v);
                if (!v) {
                    rc = -1;
                    break;
                }
                seen = v;
            }
            memcpy(seen + (size_t)s * n, lab, (size_t)n * sizeof *lab);
            g->rep[g->nshapes++] = k;
        }
        g->shape[k] = s;
    }
    free(first);
    free(lab);
    free(seen);
    return rc;
}

int dt_sim_groups_init(dt_sim_groups *g, const dt_sim_world *w, int n,
                       int (*member)(void *ctx, int group, int i), void *ctx, char *err,
                       size_t len)
{
    memset(g, 0, sizeof *g);
    if (n < 1 || w->ranks % n) {
        snprintf(err, len, "groups of %d do not divide %d ranks", n, w->ranks);
        return -1;
    }
    g->n = n;
    g->ngroups = w->ranks / n;
    g->members = malloc((size_t)w->ranks * sizeof *g->members);
    g->pos = malloc((size_t)w->ranks * sizeof *g->pos);
    if (!g->members || !g->pos) {
        dt_sim_groups_free(g);
        return snprintf(err, len, "out of memory for groups of %d", n), -1;
    }
    for (int r = 0; r < w->ranks; r++) g->pos[r] = -1;
    for (int k = 0; k < g->ngroups; k++)
        for (int i = 0; i < n; i++) {
            int r = member(ctx, k, i), at = k * n + i;
            if (r < 0 || r >= w->ranks || g->pos[r] >= 0) {
                dt_sim_groups_free(g);
                snprintf(err, len, "groups of %d: rank %d is not in exactly one group", n, r);
                return -1;
            }
            g->members[at] = r;
            g->pos[r] = at;
        }
    if (shapes(g, w)) {
        dt_sim_groups_free(g);
        return snprintf(err, len, "out of memory for groups of %d", n), -1;
    }
    return 0;
}

void dt_sim_groups_free(dt_sim_groups *g)
{
    free(g->members);
    free(g->pos);
    free(g->shape);
    free(g->rep);
    memset(g, 0, sizeof *g);
}

int dt_sim_group_coll_record(dt_sim_group_coll *c, const dt_sim_groups *g, const dt_sim_world *w,
                             dt_coll_kind kind, const char *algo, size_t bytes, char *err,
                             size_t len)
{
    c->g = g;
    c->by_shape = calloc((size_t)g->nshapes, sizeof *c->by_shape);
    int *hosts = malloc((size_t)g->n * sizeof *hosts);
    int *first = malloc((size_t)w->ranks * sizeof *first);
    int rc = c->by_shape && hosts && first ? 0 : -1;
    if (rc) snprintf(err, len, "out of memory");
    for (int r = 0; rc == 0 && r < w->ranks; r++) first[r] = -1;
    for (int s = 0; rc == 0 && s < g->nshapes; s++) {
        labels(w, g->members + (size_t)g->rep[s] * g->n, g->n, first, hosts);
        dt_sim_world gw;
        rc = dt_sim_world_init_group(&gw, g->n, hosts, &w->model, err, len);
        gw.progress = w->progress;
        if (rc == 0) rc = dt_sim_sched_record(&c->by_shape[s], &gw, kind, algo, bytes, err, len);
        dt_sim_world_free(&gw);
    }
    free(hosts);
    free(first);
    if (rc) dt_sim_group_coll_free(c);
    return rc;
}

void dt_sim_group_coll_free(dt_sim_group_coll *c)
{
    if (c->by_shape && c->g)
        for (int s = 0; s < c->g->nshapes; s++) dt_sim_sched_free(&c->by_shape[s]);
    free(c->by_shape);
    c->by_shape = NULL;
}
