/*
 * The transports, as NCCL's ncclTransports[]: one row per kind of link,
 * each setting up the links (dt_link_ops, comm_internal.h) of a
 * communicator to the peers that topo (topo.h) assigns to it. The
 * communicator walks the table once at its creation; from then on the step
 * executor (p2p.c) sees only links, and the doorbell it sleeps on.
 */
#ifndef DT_COMM_TRANSPORT_TRANSPORT_H
#define DT_COMM_TRANSPORT_TRANSPORT_H

#include "comm/comm_internal.h"
#include "comm/topo.h"

typedef struct {
    dt_link_kind kind;
    /* Links to peers (communicator ranks, ascending), through the store
     * under the communicator's id. Collective: every member calls every
     * row's setup, with npeers 0 when it has no such peer, since a setup
     * may wait at store barriers of all the members. */
    int (*setup)(dt_comm *c, const int *peers, int npeers);
    /* Frees what setup made beyond the links (which go by their own
     * destroy); NULL when nothing. */
    void (*teardown)(dt_comm *c);
    /* NULL when its links wait otherwise (a descriptor, or polling). A
     * communicator sleeps on one doorbell, so one row at most has one. */
    const dt_doorbell *doorbell;
} dt_transport;

extern const dt_transport dt_transports[DT_LINK_KINDS];

/* Links to every member of c through the table, then a barrier; sets
 * c->transport_name ("shm", "tcp", "shm+tcp", "mpi", "self"). */
int dt_transports_connect(dt_comm *c);
/* Every link of c and every transport's state. */
void dt_transports_close(dt_comm *c);
/* The table's doorbell, for every communicator (comm.c sets c->doorbell);
 * one that never rings (sleep only naps) when no row has one. */
const dt_doorbell *dt_transports_doorbell(void);

/* The rows' setups and teardowns. */
int dt_shm_setup(dt_comm *c, const int *peers, int npeers);
void dt_shm_teardown(dt_comm *c);
extern const dt_doorbell dt_shm_doorbell;
int dt_tcp_setup(dt_comm *c, const int *peers, int npeers);
int dt_mpi_link_setup(dt_comm *c, const int *peers, int npeers);

#endif
