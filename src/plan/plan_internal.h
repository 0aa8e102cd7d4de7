/* What the planner's files share (plan.h is the interface). */
#ifndef DT_PLAN_PLAN_INTERNAL_H
#define DT_PLAN_PLAN_INTERNAL_H

#include <stddef.h>

#include "comm/coll.h"
#include "plan/plan.h"
#include "parallel/places.h"

/* The planner's memory of answers it worked out once: collectives'
 * seconds by (kind, ranks, per host, bytes), and pipeline schedules'
 * makespans in units of a forward by (kind, p, V, M, backward / forward). */
typedef struct {
    int kind, ranks, per_host;
    size_t bytes;
    double seconds;
} dt_plan_answer;

typedef struct {
    int kind, p, V, M;
    double bwd, makespan;
} dt_plan_span;

/* The places of a layout (the ddp kind's, parallel/places.h) before the
 * ZeRO stage divides their state: the layouts that differ only in the
 * stage (the innermost loop of the enumeration) share them. */
typedef struct {
    dt_plan_layout key; /* zero = 0 */
    int have;
    dt_gpt layout;      /* the whole model's, with the key's recompute mode */
    dt_places places;
} dt_plan_places;
void dt_plan_places_free(dt_plan_places *P);

struct dt_plan_memo {
    dt_cost_model links;
    dt_plan_answer *cache;
    int n;
    dt_plan_span *spans;
    int nspans, capspans;
    dt_plan_places places;
};

/* Every layout of in with what the user fixed, each handed to visit
 * (layouts.c); 0, or the first nonzero visit returned. */
typedef int (*dt_plan_visit)(void *ctx, const dt_plan_layout *l);
int dt_plan_layouts_each(const dt_plan_input *in, dt_plan_visit visit, void *ctx);

/* Why in has no layout (no_layout.c): the size asked for that has none on
 * its own or the two that have none together, with the rule they break
 * and the values that would work; with nothing asked for, the batch.
 * Always -1, with err. */
int dt_plan_no_layout(const dt_plan_input *in, char *err, size_t errlen);

/* Seconds of collective `kind` of `bytes` (fp32 data; all ranks' together
 * for an all-gather or a reduce-scatter) over a group of `ranks` with
 * `per_host` of them to a host (comm_time.c); 0 on one rank, -1 when no
 * algorithm runs there. */
double dt_plan_coll(dt_plan_memo *c, dt_coll_kind kind, int ranks, int per_host, size_t bytes);
/* One message of `bytes` within a host or between hosts. */
double dt_plan_p2p(const dt_plan_memo *c, int same_host, size_t bytes);
/* Members of a group of `size` ranks `stride` apart on one host of
 * per_node ranks (Megatron's placement fills hosts in rank order). */
int dt_plan_group_per_host(int per_node, int stride, int size);

#endif
