/*
 * The shared-memory transport, as the rest of the library sees it: its
 * files in /dev/shm. The communicator reaches it through the table of
 * transports (transport.h): its setup, its links and its doorbell.
 */
#ifndef DT_COMM_TRANSPORT_SHM_H
#define DT_COMM_TRANSPORT_SHM_H

#include <stddef.h>

/* Remove the shared-memory segments that job_id's ranks left in /dev/shm
 * (a rank that died cannot remove its own): for the launcher, after the
 * job. 0, or -1 with the first failure in err (the others are tried too). */
int dt_shm_remove_job(const char *job_id, char *err, size_t errlen);

struct dt_comm;
/* The process id of member rank of c when shared memory links them, else
 * 0: for a watcher that notices a peer's process is gone. */
int dt_shm_peer_pid(const struct dt_comm *c, int rank);

#endif
