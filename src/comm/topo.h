/*
 * Where the members of a communicator run, and the one rule for which kind
 * of link joins two of them. The communicator (transport/transport.c) asks
 * it which transport to set up for each peer, and the cost model
 * (cost/predict.c) which link to price, so the two always agree.
 *
 * A host is a (hostname, boot id) pair: ranks with the same pair share
 * memory. DTRAIN_HOSTNAME stands in for the host's name, so that tests can
 * make ranks of one machine look like several hosts.
 */
#ifndef DT_COMM_TOPO_H
#define DT_COMM_TOPO_H

#include <stddef.h>

#include "dtrain/comm.h"

/* The kinds of link, one per transport (transport/transport.h). */
typedef enum { DT_LINK_SHM = 0, DT_LINK_TCP, DT_LINK_MPI, DT_LINK_KINDS } dt_link_kind;

/* "shm", "tcp", "mpi": as in DTRAIN_TRANSPORT and the cost model's file. */
const char *dt_link_kind_name(dt_link_kind k);

struct dt_job;

/* This process's host name and boot id, into job->hostname and
 * job->boot_id (job->rank picks its entry of a DTRAIN_HOSTNAME list). */
void dt_topo_read_host(struct dt_job *job);
/* World communicator: exchange hosts through the store and number them
 * into c->host_of, and count the members on this one's kernel into
 * c->kernel_ranks (collective). */
int dt_topo_find_hosts(dt_comm *c);
/* From c->host_of: c->local_rank, c->local_size and c->nhosts. */
void dt_topo_layout(dt_comm *c);

/* The link between members a and b of c: MPI when DTRAIN_TRANSPORT=mpi,
 * shared memory when they share a host (unless DTRAIN_TRANSPORT=tcp), TCP
 * otherwise. */
dt_link_kind dt_topo_link(const dt_comm *c, int a, int b);
/* Whether any two members of c are joined by a link of kind k. */
int dt_topo_uses(const dt_comm *c, dt_link_kind k);

#endif
