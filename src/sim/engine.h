/*
 * The discrete-event engine: ranks running programs over the simulated
 * network (sim/net.h), in simulated seconds.
 *
 * Each rank has a few streams (like a real rank's compute thread and its
 * collective thread); each stream runs a program, a list of operations in
 * order:
 *   COMPUTE  busy for `amount` seconds (label: the trace's name);
 *   COLL     this rank's part of a recorded collective (sim/coll.h): its
 *            steps one after another, each step's sends and receives
 *            proceeding at once and the step ending when all are done; a
 *            receive-reduce adds gamma x bytes after its data arrived (one
 *            reduction at a time per stream), local copies and reductions
 *            take their recorded seconds;
 *   SEND     a nonblocking send of `amount` bytes to rank `arg` on channel
 *            `chan`: posted, and the stream goes on;
 *   RECV     a blocking receive from rank `arg` on channel `chan`;
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
 * F/B/I/W as COMPUTE, SEND_F/SEND_B as SEND and RECV_F/RECV_B as RECV, on
 * channel 0 for activations and 1 for gradients (each pair's messages of
 * one kind are sent and received in the same order, so FIFO matching
 * pairs them right); its data-parallel all-reduces go to a comm stream
 * behind SIGNALs, as DDP's do here (sim/ddp.c).
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
#include "sim/world.h"

typedef enum {
    DT_SIM_COMPUTE = 0,
    DT_SIM_COLL,
    DT_SIM_SEND,
    DT_SIM_RECV,
    DT_SIM_SIGNAL,
    DT_SIM_WAIT
} dt_sim_op_kind;

typedef struct {
    int kind;          /* dt_sim_op_kind */
    int arg;           /* COLL: collective id; SEND/RECV: peer; SIGNAL/WAIT: event */
    int chan;          /* SEND/RECV: channel */
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
    return (dt_sim_op){DT_SIM_COMPUTE, 0, 0, seconds, label};
}
static inline dt_sim_op dt_sim_coll(int id) { return (dt_sim_op){DT_SIM_COLL, id, 0, 0, NULL}; }
static inline dt_sim_op dt_sim_signal(int ev) { return (dt_sim_op){DT_SIM_SIGNAL, ev, 0, 0, NULL}; }
static inline dt_sim_op dt_sim_wait(int ev) { return (dt_sim_op){DT_SIM_WAIT, ev, 0, 0, NULL}; }
static inline dt_sim_op dt_sim_send(int peer, double bytes, int chan)
{
    return (dt_sim_op){DT_SIM_SEND, peer, chan, bytes, NULL};
}
static inline dt_sim_op dt_sim_recv(int peer, double bytes, int chan, const char *label)
{
    return (dt_sim_op){DT_SIM_RECV, peer, chan, bytes, label};
}

/* What a rank did over the run: compute (any stream computing), exposed
 * communication (a collective or a receive under way and nothing
 * computing), idle (neither, up to the end of the whole run). */
typedef struct {
    double compute, exposed, idle, finish;
} dt_sim_rank_stats;

/* A span for the timeline: rank's `lane` was busy with `name` over
 * [t0, t1] (seconds); bytes -1 when not a transfer. */
typedef void (*dt_sim_span_fn)(void *ctx, int rank, dt_trace_lane lane, const char *name,
                               double t0, double t1, double bytes);

typedef struct dt_sim_engine dt_sim_engine;

/* An engine over world w (kept by pointer), nics NICs per host, `streams`
 * streams per rank (stream 0 drawn on the compute lane, the others on the
 * communication lane) and `events` SIGNAL/WAIT events per rank. NULL with
 * a message on failure. */
dt_sim_engine *dt_sim_engine_new(const dt_sim_world *w, int nics, int streams, int events,
                                 char *err, size_t len);
void dt_sim_engine_free(dt_sim_engine *e);
/* A collective the programs may run: its id, or -1 (it must span the
 * world). */
int dt_sim_engine_add_coll(dt_sim_engine *e, const dt_sim_sched *s);
void dt_sim_engine_program(dt_sim_engine *e, int rank, int stream, const dt_sim_prog *p);
void dt_sim_engine_on_span(dt_sim_engine *e, dt_sim_span_fn fn, void *ctx);
/* Runs every program to its end. 0, or -1 with a message: out of memory,
 * or a deadlock (naming a rank that is stuck and on what). */
int dt_sim_engine_run(dt_sim_engine *e, char *err, size_t len);

double dt_sim_engine_makespan(const dt_sim_engine *e);
const dt_sim_rank_stats *dt_sim_engine_stats(const dt_sim_engine *e, int rank);
/* Events handled, messages sent, bandwidth shares recomputed. */
void dt_sim_engine_counts(const dt_sim_engine *e, long long *events, long long *messages,
                          long long *rate_changes);

#endif
