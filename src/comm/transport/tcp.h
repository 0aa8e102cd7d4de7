/* The TCP transport's two halves: its links (tcp.c) and their setup
 * (tcp_setup.c), which hands each connected socket over. */
#ifndef DT_COMM_TRANSPORT_TCP_H
#define DT_COMM_TRANSPORT_TCP_H

#include "comm/comm_internal.h"

/* A link to peer over fd, a connected and authenticated socket, which it
 * takes over (c's teardown closes it). 0, or fails c. */
int dt_tcp_link_add(dt_comm *c, int peer, int fd);

#endif
