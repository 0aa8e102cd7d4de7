/* The mesh's lines of the start banner: which ranks form each group and
 * on which hosts they run, so that a user can see that the layout put the
 * busiest groups (tensor parallelism's) inside a host. See mesh.h. */
#include <stdio.h>
#include <string.h>

#include "parallel/mesh.h"

#define SHOWN_GROUPS 8 /* per axis; a line of every group at 1,000 ranks helps no one */

static const char *host(const char *hosts, int r) { return hosts + (size_t)r * DT_MESH_HOST_NAME; }

/* The rank at coordinates at[] (tp_i, cp_i, dp_i, pp_i). */
static int rank_at(const dt_mesh *g, const int at[4])
{
    return at[0] + g->tp * (at[1] + g->cp * (at[2] + g->dp * at[3]));
}

/* The ranks of the group along axis `axis` that holds rank r. */
static int group_of(const dt_mesh *g, int axis, int r, int *out)
{
    const int size[4] = {g->tp, g->cp, g->dp, g->pp};
    int at[4];
    dt_mesh_coords(g, r, at);
    for (int i = 0; i < size[axis]; i++) {
        at[axis] = i;
        out[i] = rank_at(g, at);
    }
    return size[axis];
}

/* "tp groups: [0 1] [2 3] ...", the groups in order of their lowest rank;
 * 1 when a group spans hosts. */
static int print_axis(const dt_mesh *g, int axis, const char *hosts, FILE *f)
{
    static const char *names[4] = {"tp", "cp", "dp", "pp"};
    const int size[4] = {g->tp, g->cp, g->dp, g->pp}, world = g->tp * g->cp * g->dp * g->pp;
    int members[1024], shown = 0, spans = 0, groups = 0;
    fprintf(f, "\n    %s groups:", names[axis]);
    if (size[axis] > (int)(sizeof members / sizeof members[0])) {
        fprintf(f, " %d of %d ranks", world / size[axis], size[axis]);
        return 0;
    }
    for (int r = 0; r < world; r++) {
        int n = group_of(g, axis, r, members);
        if (members[0] != r) continue;
        groups++;
        for (int i = 1; i < n; i++) spans |= strcmp(host(hosts, members[i]), host(hosts, r)) != 0;
        if (shown++ == SHOWN_GROUPS) fprintf(f, " ...");
        if (shown > SHOWN_GROUPS) continue;
        fprintf(f, " [");
        for (int i = 0; i < n; i++) fprintf(f, "%s%d", i ? " " : "", members[i]);
        fprintf(f, "]");
    }
    if (shown > SHOWN_GROUPS) fprintf(f, " (%d groups)", groups);
    return spans;
}

/* "ep groups: [0 1] [2 3] ...": ep consecutive ranks of the dp axis. */
static void print_ep(const dt_mesh *g, FILE *f)
{
    const int world = g->tp * g->cp * g->dp * g->pp, stride = g->tp * g->cp;
    int shown = 0, groups = 0, at[4];
    fprintf(f, "\n    ep groups (of the dp ranks):");
    for (int r = 0; r < world; r++) {
        dt_mesh_coords(g, r, at);
        if (at[2] % g->ep) continue;
        groups++;
        if (shown++ == SHOWN_GROUPS) fprintf(f, " ...");
        if (shown > SHOWN_GROUPS) continue;
        fprintf(f, " [");
        for (int i = 0; i < g->ep; i++) fprintf(f, "%s%d", i ? " " : "", r + i * stride);
        fprintf(f, "]");
    }
    if (shown > SHOWN_GROUPS) fprintf(f, " (%d groups)", groups);
}

/* "hosts: a (ranks 0-3), b (ranks 4-7)": runs of consecutive ranks. */
static void print_hosts(const char *hosts, int world, FILE *f)
{
    fprintf(f, "\n    hosts:");
    int printed = 0;
    for (int r = 0; r < world;) {
        int e = r + 1;
        while (e < world && !strcmp(host(hosts, e), host(hosts, r))) e++;
        if (printed++ < 2 * SHOWN_GROUPS) {
            fprintf(f, "%s %s (rank%s %d", printed > 1 ? "," : "", host(hosts, r),
                    e - r > 1 ? "s" : "", r);
            if (e - r > 1) fprintf(f, "-%d", e - 1);
            fprintf(f, ")");
        } else if (printed == 2 * SHOWN_GROUPS + 1) {
            fprintf(f, " ...");
        }
        r = e;
    }
}

void dt_mesh_print(const dt_mesh *g, const char *hosts, FILE *f)
{
    const int size[4] = {g->tp, g->cp, g->dp, g->pp};
    const int world = g->tp * g->cp * g->dp * g->pp;
    fprintf(f, "\n  mesh: tp %d x cp %d x dp %d x pp %d = %d ranks (tp fastest-varying, then "
            "cp, dp, pp); this rank (tp %d, cp %d, dp %d, pp %d)", g->tp, g->cp, g->dp, g->pp,
            world, g->tp_i, g->cp_i, g->dp_i, g->pp_i);
    if (g->ep > 1)
        fprintf(f, "\n    ep %d: the dp ranks in groups of %d consecutive, each holding 1/%d "
                "of the experts (this rank ep %d)", g->ep, g->ep, g->ep, g->ep_i);
    int tp_spans = 0;
    for (int axis = 0; axis < 4; axis++)
        if (size[axis] > 1) {
            int spans = print_axis(g, axis, hosts, f);
            if (axis == 0) tp_spans = spans;
        }
    if (g->ep > 1) print_ep(g, f);
    print_hosts(hosts, world, f);
    if (tp_spans)
        fprintf(f, "\n    note: a tensor-parallel group spans hosts, so its reduces (several "
                "a layer) cross the network; start %d ranks a host or a multiple", g->tp);
}
