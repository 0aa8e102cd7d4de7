/* In-memory snapshots, for restarts (`--max-restarts`): a run directory in
 * the host's shared memory, named by the job,
 *
 *   /dev/shm/dtrain-snap-<DTRAIN_JOB_ID>/ckpt-NNNNNNNN/...   as checkpoint.h
 *   /dev/shm/dtrain-snap-<DTRAIN_JOB_ID>/latest
 *
 * written by the ranks every --snapshot-every steps with the checkpoints'
 * atomic writers (a snapshot counts once it is in place whole), read by
 * the ranks of a restarted job, and removed by the launcher when the job
 * is over. It outlives the processes that write it: tmpfs is memory that
 * belongs to the host, not to a process. The name is not under the comm
 * layer's prefix (dtrain-<id>-), whose segments the launcher removes
 * between attempts. */
#ifndef DT_TRAIN_CKPT_SNAPSHOT_H
#define DT_TRAIN_CKPT_SNAPSHOT_H

#include <stddef.h>

/* The job's snapshot directory into buf; -1 when it does not fit. */
int dt_snapshot_dir(const char *job_id, char *buf, size_t len);
/* Removes the job's snapshots, if any: 0, or -1 with a message. */
int dt_snapshot_remove(const char *job_id, char *err, size_t errlen);

#endif
