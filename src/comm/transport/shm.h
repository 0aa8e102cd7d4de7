/*
 * The shared-memory transport, as the rest of the library sees it.
 *
 * Waiting on shared memory: each communicator's inbox has a doorbell (a
 * futex) that writers ring only when the reader has armed it, so the step
 * executor (p2p.c) can sleep until a message may have arrived.
 */
#ifndef DT_COMM_TRANSPORT_SHM_H
#define DT_COMM_TRANSPORT_SHM_H

#include <stdint.h>

#include "dtrain/comm.h"

/* Shared-memory doorbell of c. Read the bell before a progress pass; after
 * a fruitless pass, dt_shm_wait sleeps unless the bell moved since. */
uint32_t dt_shm_bell(const dt_comm *c);
/* Before sleeping a waiter arms (writers then ring), and makes one more
 * pass; disarm when that pass progressed. dt_shm_wait disarms itself. */
void dt_shm_arm(dt_comm *c);
void dt_shm_disarm(dt_comm *c);
void dt_shm_wait(dt_comm *c, uint32_t bell, int timeout_ms);
/* Wake c's waiter whatever it waits for (a job abort, a queued request). */
void dt_shm_wake(dt_comm *c);

/* Remove the shared-memory segments that job_id's ranks left in /dev/shm
 * (a rank that died cannot remove its own): for the launcher, after the
 * job. 0, or -1 with the first failure in err (the others are tried too). */
int dt_shm_remove_job(const char *job_id, char *err, size_t errlen);

#endif
