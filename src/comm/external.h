/*
 * A job joined through the caller's key-value store (dt_comm_init_external,
 * external.c): no store server and no control channel. Its watcher
 * (external_watch.c) stands in for the channel: it hears the failures
 * other ranks publish in the store, and notices peers on this host whose
 * process ended.
 */
#ifndef DT_COMM_EXTERNAL_H
#define DT_COMM_EXTERNAL_H

#include "comm/comm_internal.h"

/* Start watching the store, from the job's rendezvous on (so that a rank
 * hears of another's failure wherever it waits). 0, or a DT_ERR_* code. */
int dt_ext_watch_start(dt_job *job);
/* Once world, the job's world communicator, has its links: watch the
 * processes of the peers that share memory with us too. */
void dt_ext_watch_peers(dt_job *job, dt_comm *world);
/* The world communicator's destroy, or a failed start: the watcher stops
 * (nothing when none runs). */
void dt_ext_leave(dt_job *job);
/* This rank's failure, published in the store for the others (the first
 * one published is the message every rank reads). */
void dt_ext_report(dt_job *job, const char *msg);

#endif
