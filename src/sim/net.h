/*
 * The simulated network: links with a capacity, and transfers ("flows")
 * that share them as a fluid.
 *
 * Links, each one direction (full duplex: sending and receiving never
 * compete):
 *   a port per rank, out and in, into its host's fabric (NVLink, shared
 *   memory): the intra-host link kind's bandwidth;
 *   a NIC per host (or `nics` per host, rank r using NIC r % nics of its
 *   host), out and in: the inter-host link kind's bandwidth.
 * A transfer between ranks of one host crosses the sender's out-port and
 * the receiver's in-port; between hosts, the sender's NIC out and the
 * receiver's NIC in (the GPU's own path to its NIC is taken to be no
 * narrower than the NIC). Which kind joins two ranks is dt_topo_link's
 * rule, through the stand-in world (sim/world.h).
 *
 * Sharing: a flow's rate is the minimum over its links of capacity /
 * (flows on that link). This is max-min fairness's first round only: a
 * flow held back elsewhere leaves its share of a link unused instead of
 * handing it to the others. It is chosen because it is local: a flow
 * starting or ending changes the rates of the flows on its own two links
 * only, so each change costs O(flows on those links), where exact
 * max-min needs a global water-filling pass. It is exact whenever the
 * flows sharing a link are bottlenecked on it alike (the regular patterns
 * of collectives: rings, butterflies, hosts' ranks all crossing their
 * NIC), and errs on the slow side otherwise.
 *
 * Processor sharing (dt_sim_net_share_cpu): compute is a flow too, of
 * seconds of one rank's work at its own full rate, crossing the rank's
 * cores (capacity 1: it never runs faster than alone) and its host's
 * (capacity: how many ranks' worth of cores the host has). A host whose
 * ranks outnumber its cores so shares them among the ranks computing at
 * the instant: a rank idle in a pipeline's bubble or waiting on a message
 * hands its share to the others, as the operating system's scheduler does.
 *
 * Changes at one instant are batched: adding and removing flows only marks
 * their links, and dt_sim_net_settle (called before time moves on)
 * recomputes each affected flow once and reports its new end time through
 * the callback. Latency (alpha) is not the network's: the engine waits it
 * out before adding the flow.
 */
#ifndef DT_SIM_NET_H
#define DT_SIM_NET_H

#include <stddef.h>
#include <stdint.h>

#include "sim/world.h"

#define DT_SIM_PATH 2 /* links a flow crosses */

typedef struct {
    double cap; /* bytes per second */
    int *flows, n, alloc;
    int dirty;
} dt_sim_link;

typedef struct {
    double remaining, rate, last; /* bytes left as of time `last`, at rate bytes/s */
    int link[DT_SIM_PATH], pos[DT_SIM_PATH]; /* links crossed; index in each one's flows */
    uint32_t version, stamp;
    int owner; /* the engine's transfer, or its stream for work; -1 when the slot is free */
    int work;  /* compute (dt_sim_net_add_work), not a transfer */
    int next_free;
} dt_sim_flow;

/* Flow `flow` (at `version`) now ends at t_end unless something changes. */
typedef void (*dt_sim_flow_cb)(void *ctx, int flow, double t_end, uint32_t version);

typedef struct {
    const dt_sim_world *w;
    int nics; /* per host */
    dt_sim_link *link;
    int nlinks;
    int cpu_base; /* the CPU links' first index (ranks', then hosts'); 0: no sharing */
    dt_sim_flow *flow;
    int nflow, flow_alloc, free_flow;
    int *dirty, ndirty;
    uint32_t stamp;
    dt_sim_flow_cb cb;
    void *ctx;
    long long started, rate_changes; /* for the report */
} dt_sim_net;

/* 0, or -1 with a message (nics outside 1..ranks per host, no memory). */
int dt_sim_net_init(dt_sim_net *n, const dt_sim_world *w, int nics, dt_sim_flow_cb cb, void *ctx,
                    char *err, size_t len);
void dt_sim_net_free(dt_sim_net *n);

/* A flow of bytes > 0 from rank src to rank dst, from time now: its id, or
 * -1 out of memory. Its end is reported at the next settle. */
int dt_sim_net_add(dt_sim_net *n, int src, int dst, double bytes, double now, int owner);
/* From here on compute is shared work: each host has `ranks_worth` ranks'
 * full rates of cores (its cores over a rank's threads). Before any flow;
 * 0, or -1 out of memory. */
int dt_sim_net_share_cpu(dt_sim_net *n, double ranks_worth);
/* Work of `seconds` at rank's full rate, from now, for the engine's stream
 * `owner`: its id, or -1 out of memory. */
int dt_sim_net_add_work(dt_sim_net *n, int rank, double seconds, double now, int owner);
/* The flow has ended (its end event came up): it leaves its links. */
void dt_sim_net_remove(dt_sim_net *n, int flow);
/* Brings every flow whose links changed up to date at `now`. */
void dt_sim_net_settle(dt_sim_net *n, double now);
static inline int dt_sim_net_unsettled(const dt_sim_net *n) { return n->ndirty > 0; }
/* Whether an end reported for (flow, version) still holds. */
static inline int dt_sim_net_current(const dt_sim_net *n, int flow, uint32_t version)
{
    return n->flow[flow].owner >= 0 && (n->flow[flow].version & 0x3fffffffu) == version;
}

#endif
