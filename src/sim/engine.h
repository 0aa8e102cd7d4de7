/*
 * The discrete-event engine: ranks running programs over the simulated
 * network (sim/net.h), in simulated seconds.
 *
 * Each rank has a few streams (like a real rank's compute thread and its
 * collective thread); each stream runs a program, a list of operations in
 * order:
 *   COMPUTE  busy for `amount` seconds (label: the trace's name);
 *   COLL     this rank's part of a recorded collective (sim/coll.h), over
 *            the world or over groups of ranks (sim/group.h): its
 *            steps one after another, each step's sends and receives
 *            proceeding at once and the step ending when all are done; a
 *            receive-reduce adds gamma x bytes after its data arrived (one
 *            reduction at a time per stream), local copies and reductions
 *            take their recorded seconds;
 *   SEND     a nonblocking send of `amount` bytes on channel `chan` to the
 *            rank `arg` away (rank + arg: relative, so that the ranks of
 *            a pipeline stage can share one program): posted, and the
 *            stream goes on;
 *   RECV     a blocking receive from the rank `arg` away on channel `chan`;
 *   SIGNAL   marks event `arg` of this rank as happened;
 *   WAIT     waits until event `arg` of this rank has happened.
 * SIGNAL and WAIT are the dependencies between a rank's streams: a
 * bucket's all-reduce (comm stream) WAITs for the SIGNAL that the backward
 * compute producing its gradients gives; the optimizer (compute stream)
 * WAITs for the last all-reduce's SIGNAL. Events are one-shot.
 *
 * A send meets the receive its peer posts under the same key (the
 * collective's id, or the channel, and the pair; sim/match.h), in order;
 * the message starts when both are posted, pays the link's alpha as
 * latency, then flows through the network sharing bandwidth with the
 * other flows on its links; it is done, on both sides, when its last byte
 * arrives. Within a step, two messages to one peer flow at once (sharing
 * the link) where the transports would send them one after the other:
 * the same total time for the bandwidth, one alpha less.
 *
 * A pipeline schedule (parallel/pipeline/schedule.h) maps onto this
 * directly: rank r's action list becomes a program of its compute stream,
 * F/B/I/W as COMPUTE, SEND_F/SEND_B as SEND and RECV_F/RECV_B as RECV, a
 * channel per stage boundary and direction (a boundary's messages are
 * sent and received in micro-batch order, so FIFO matching pairs them
 * right); its data-parallel reductions go to a comm stream behind
 * SIGNALs (sim/layout_prog.c).
 *
 * Programs are not copied: ranks that run the same program (every rank of
 * a DDP step) can share one, and it must outlive the run. Likewise the
 * collectives' schedules.
 */
#ifndef DT_SIM_ENGINE_H
#define DT_SIM_ENGINE_H

#include <stddef.h>
#include <stdint.h>

#include "core/trace.h"
#include "sim/coll.h"
#include "sim/group.h"
#include "sim/world.h"

typedef enum {
    DT_SIM_COMPUTE = 0,
    DT_SIM_COLL,
    DT_SIM_SEND,
    DT_SIM_RECV,
    DT_SIM_SIGNAL,
    DT_SIM_WAIT
} dt_sim_op_kind;

/* Exposed communication is told apart in this many classes (what each
 * stands for is the program builder's: tensor-parallel reduces, pipeline
 * messages, gradient reductions...). */
#define DT_SIM_CLASSES 5

typedef struct {
    int kind;          /* dt_sim_op_kind */
    int arg;           /* COLL: collective id; SEND/RECV: peer - rank; SIGNAL/WAIT: event */
    int chan;          /* SEND/RECV: channel */
    int cls;           /* COLL, RECV: the class its exposed time counts in */
    double amount;     /* COMPUTE: seconds; SEND/RECV: bytes */
    const char *label; /* COMPUTE, RECV: name in the trace (kept by pointer) */
} dt_sim_op;

typedef struct {
    dt_sim_op *op;
    int n, alloc;
} dt_sim_prog;

/* Appends op: 0, or -1 out of memory. */
int dt_sim_prog_add(dt_sim_prog *p, dt_sim_op op);
void dt_sim_prog_free(dt_sim_prog *p);
static inline dt_sim_op dt_sim_compute(double seconds, const char *label)
{
    return (dt_sim_op){DT_SIM_COMPUTE, 0, 0, 0, seconds, label};
}
static inline dt_sim_op dt_sim_coll(int id) { return (dt_sim_op){DT_SIM_COLL, id, 0, 0, 0, NULL}; }
static inline dt_sim_op dt_sim_coll_as(int id, int cls)
{
    return (dt_sim_op){DT_SIM_COLL, id, 0, cls, 0, NULL};
}
static inline dt_sim_op dt_sim_signal(int ev)
{
    return (dt_sim_op){DT_SIM_SIGNAL, ev, 0, 0, 0, NULL};
}
static inline dt_sim_op dt_sim_wait(int ev) { return (dt_sim_op){DT_SIM_WAIT, ev, 0, 0, 0, NULL}; }
static inline dt_sim_op dt_sim_send(int peer, double bytes, int chan)
{
    return (dt_sim_op){DT_SIM_SEND, peer, chan, 0, bytes, NULL};
}
static inline dt_sim_op dt_sim_recv(int peer, double bytes, int chan, const char *label)
{
    return (dt_sim_op){DT_SIM_RECV, peer, chan, 0, bytes, label};
}

/* What a rank did over the run: compute (any stream computing), exposed
 * communication (a collective under way, or a receive whose sender has
 * sent, and nothing computing), idle (neither, up to the end of the whole
 * run: a receive still waiting for its sender to send is idle, the
 * pipeline's bubble). Exposed time is split among the classes under way
 * (exposed_cls sums to exposed). */
typedef struct {
    double compute, exposed, idle, finish;
    double exposed_cls[DT_SIM_CLASSES];
} dt_sim_rank_stats;

/* A span for the timeline: rank's `lane` was busy with `name` over
 * [t0, t1] (seconds); bytes -1 when not a transfer. */
typedef void (*dt_sim_span_fn)(void *ctx, int rank, dt_trace_lane lane, const char *name,
                               double t0, double t1, double bytes);

typedef struct dt_sim_engine dt_sim_engine;

/* An engine over world w (kept by pointer), nics NICs per host, `streams`
 * streams per rank and `events` SIGNAL/WAIT events per rank. On the
 * timeline, computing is drawn on the compute lane and collectives and
 * receives on the communication lane, whatever their stream. NULL with a
 * message on failure. */
dt_sim_engine *dt_sim_engine_new(const dt_sim_world *w, int nics, int streams, int events,
                                 char *err, size_t len);
void dt_sim_engine_free(dt_sim_engine *e);
/* A collective the programs may run: its id, or -1 (it must span the
 * world). */
int dt_sim_engine_add_coll(dt_sim_engine *e, const dt_sim_sched *s);
/* A collective over groups (sim/group.h; kept by pointer): a rank running
 * it plays its group's shape's recording as its member index, with the
 * members' ranks as peers. Its id, or -1 (the groups are not of this
 * world). */
int dt_sim_engine_add_group_coll(dt_sim_engine *e, const dt_sim_group_coll *c);
void dt_sim_engine_program(dt_sim_engine *e, int rank, int stream, const dt_sim_prog *p);
void dt_sim_engine_on_span(dt_sim_engine *e, dt_sim_span_fn fn, void *ctx);
/* Compute as processor sharing (sim/net.h): a host has `ranks_worth`
 * ranks' full rates of cores, shared among its ranks computing at each
 * instant; an op's amount is its seconds at the rank's full rate. Without
 * it each rank computes on cores of its own. Before run; 0, or -1 out of
 * memory. */
int dt_sim_engine_share_cpu(dt_sim_engine *e, double ranks_worth);
/* Runs every program to its end. 0, or -1 with a message: out of memory,
 * or a deadlock (naming a rank that is stuck and on what). Tells the
 * world's progress (sim/world.h) as it goes, "running the simulation":
 * operations begun and recorded bytes read, of all the programs'. */
int dt_sim_engine_run(dt_sim_engine *e, char *err, size_t len);

double dt_sim_engine_makespan(const dt_sim_engine *e);
const dt_sim_rank_stats *dt_sim_engine_stats(const dt_sim_engine *e, int rank);
/* Events handled, messages sent, bandwidth shares recomputed. */
void dt_sim_engine_counts(const dt_sim_engine *e, long long *events, long long *messages,
                          long long *rate_changes);

#endif
