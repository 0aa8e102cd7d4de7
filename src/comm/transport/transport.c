/*
 * The table of transports (transport.h) and the walk that connects a
 * communicator through it: topo decides the kind of link to each peer,
 * the row of that kind sets the links up. The table's doorbell is the
 * row's that has one.
 */
#include "comm/transport/transport.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

const dt_transport dt_transports[DT_LINK_KINDS] = {
    [DT_LINK_SHM] = {DT_LINK_SHM, dt_shm_setup, dt_shm_teardown, &dt_shm_doorbell},
    [DT_LINK_TCP] = {DT_LINK_TCP, dt_tcp_setup, NULL, NULL},
    [DT_LINK_MPI] = {DT_LINK_MPI, dt_mpi_link_setup, NULL, NULL},
};

/* "shm+tcp" from the kinds in use, in table order. */
static void name_transport(dt_comm *c, const int *npeers)
{
    size_t o = 0;
    c->transport_name[0] = '\0';
    for (int k = 0; k < DT_LINK_KINDS; k++)
        if (npeers[k])
            o += (size_t)snprintf(c->transport_name + o, sizeof c->transport_name - o, "%s%s",
                                  o ? "+" : "", dt_link_kind_name((dt_link_kind)k));
    if (o == 0) snprintf(c->transport_name, sizeof c->transport_name, "self");
}

int dt_transports_connect(dt_comm *c)
{
    int *peers = malloc((size_t)DT_LINK_KINDS * (size_t)c->size * sizeof *peers);
    if (!peers) return dt_comm_fail(c, DT_ERR_NOMEM, -1, "out of memory");
    int npeers[DT_LINK_KINDS] = {0};
    for (int r = 0; r < c->size; r++) {
        if (r == c->rank) continue;
        dt_link_kind k = dt_topo_link(c, c->rank, r);
        peers[(size_t)k * (size_t)c->size + (size_t)npeers[k]++] = r;
    }
    name_transport(c, npeers);
    int rc = 0;
    for (int k = 0; k < DT_LINK_KINDS && rc == 0; k++)
        rc = dt_transports[k].setup(c, peers + (size_t)k * (size_t)c->size, npeers[k]);
    free(peers);
    if (rc == 0) rc = dt_comm_store_barrier(c, "connected");
    return rc;
}

void dt_transports_close(dt_comm *c)
{
    if (c->links)
        for (int i = 0; i < c->size; i++)
            if (c->links[i]) c->links[i]->ops->destroy(c->links[i]);
    for (int k = 0; k < DT_LINK_KINDS; k++)
        if (dt_transports[k].teardown) dt_transports[k].teardown(c);
}

/* For a table without a doorbell: nothing rings it, so a sleep lasts. */
static uint32_t silent_read(const dt_comm *c) { return (void)c, 0; }
static void silent_nothing(dt_comm *c) { (void)c; }
static void silent_sleep(dt_comm *c, uint32_t seen, int ms)
{
    (void)c, (void)seen;
    usleep((useconds_t)ms * 1000);
}
static const dt_doorbell silent = {silent_read, silent_nothing, silent_nothing, silent_sleep,
                                   silent_nothing};

const dt_doorbell *dt_transports_doorbell(void)
{
    for (int k = 0; k < DT_LINK_KINDS; k++)
        if (dt_transports[k].doorbell) return dt_transports[k].doorbell;
    return &silent;
}
