/*
 * The async engine: one progress thread per communicator (started on the
 * first non-blocking call) runs its operations in issue order. A blocking
 * call runs inline on the caller's thread when nothing is queued, so the
 * latency path never crosses threads; otherwise it queues behind the
 * pending operations and waits, which keeps every rank's order identical.
 */
#ifndef DT_COMM_ASYNC_H
#define DT_COMM_ASYNC_H

#include "comm/comm_internal.h"

struct dt_async *dt_async_create(void);
void dt_async_destroy(struct dt_async *a);
/* Wait until every queued operation of c has finished. */
void dt_async_drain(dt_comm *c);
/* Run a (validated) collective: blocking when req is NULL, else queued with
 * *req set. */
int dt_async_submit(dt_comm *c, const dt_coll_args *args, dt_request **req);

/* Defined by collectives.c: run one collective now, on this thread. */
int dt_coll_execute(dt_comm *c, const dt_coll_args *args);

#endif
