/* What the planner's files share (plan.h is the interface). */
#ifndef DT_PLAN_PLAN_INTERNAL_H
#define DT_PLAN_PLAN_INTERNAL_H

#include <stddef.h>

#include "comm/coll.h"
#include "plan/plan.h"
#include "parallel/places.h"

/* The planner's memory of what it worked out once: collectives' seconds
 * by (kind, ranks, per host, bytes), pipeline schedules' makespans in
 * units of a forward by (kind, p, V, M, backward / forward), the layouts
 * and schedules the memory of the places is worked out over. */
#define DT_PLAN_ANSWERS 4096 /* collectives' answers kept */
typedef struct {
    int kind, ranks, per_host;
    size_t bytes;
    double seconds;
} dt_plan_answer;

typedef struct {
    int kind, p, V, M;
    double bwd, makespan;
} dt_plan_span;

/* A (tp, ep)'s share layouts, share k being tensor rank k / ep with the
 * experts of ep rank k % ep (dt_mesh_places' order): their tensors do not
 * depend on the rest of the layout, whose context and sequence
 * parallelism and recompute mode each layout sets on them. */
typedef struct {
    int tp, ep;
    dt_gpt *lay; /* [tp ep] */
    int *like;   /* [tp ep]: the first share of the same sizes (tensor by tensor, and each
                  * split's widths), whose places hold what this one's do */
} dt_plan_shares;

/* A pipeline schedule built once: its action lists, and once memory asks,
 * its cut of the layers and each pipeline rank's activation slots. */
typedef struct {
    int kind, p, V, M;
    dt_pp_schedule s;
    int *cut;            /* [p V + 1]; NULL until asked */
    int *slots;          /* [p] */
    dt_gpt_part **parts; /* [p], each slots[q] long */
} dt_plan_sched;

/* A place of a layout (parallel/places.h): what each of its ranks holds,
 * and where it is, for the messages. */
typedef struct {
    dt_rank_mem mem;
    int stage, tp_rank;
} dt_plan_place;

/* The places of the last layout weighed, before the ZeRO stage divides
 * their state: the layouts that differ only in the stage (the innermost
 * loop of the enumeration) share them. */
typedef struct {
    dt_plan_layout key; /* zero = 0 */
    int have, n, cap;
    dt_plan_place *at;
} dt_plan_places;

struct dt_plan_memo {
    dt_cost_model links;
    dt_plan_answer *cache;
    int n;
    dt_plan_span *spans;
    int nspans, capspans;
    dt_gpt whole;              /* the whole model's layout */
    dt_plan_shares *shares;
    int nshares;
    dt_plan_sched *scheds;
    int nscheds, capscheds;
    dt_plan_places places;
};

/* The ddp kind's places of layout l into c->places (places.c): what
 * dt_mesh_places says, from the pieces the memo keeps. 0, or -1 with
 * err. */
int dt_plan_places_of(const dt_plan_input *in, dt_plan_memo *c, const dt_plan_layout *l,
                      char *err, size_t errlen);
/* Schedule (kind, p, V, M) built once; with `stages`, its cut of the
 * whole model's layers and its ranks' slots too. Valid until the next
 * call. NULL, with err, when it does not build. */
const dt_plan_sched *dt_plan_sched_of(dt_plan_memo *c, dt_pp_kind kind, int p, int V, int M,
                                      int stages, char *err, size_t errlen);
/* The pieces' memory, freed (places.c). */
void dt_plan_places_memo_free(dt_plan_memo *c);

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
