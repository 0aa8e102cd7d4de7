/* One run per output directory. Two runs writing checkpoints into one
 * directory would remove each other's temporary directories and prune each
 * other's checkpoints; the first takes an exclusive lock on OUT/.lock
 * (flock) and holds it until it ends, and a second fails at once, naming
 * the directory and the process that holds it. The kernel drops the lock
 * when the holder exits, however it exits, so a crashed run never leaves
 * the directory locked. */
#ifndef DT_TRAIN_CKPT_LOCK_H
#define DT_TRAIN_CKPT_LOCK_H

#include <stddef.h>

/* Creates out_dir if missing and locks it: a descriptor to hand to
 * dt_ckpt_unlock, or -1 with a message. */
int dt_ckpt_lock(const char *out_dir, char *err, size_t errlen);
/* For a process that reads out_dir's checkpoints or writes a file there
 * without being its run (`dtrain ckpt consolidate`): a shared lock, taken
 * beside other readers but never beside a run, so no run starts there
 * while it is held. *fd: the descriptor to hand to dt_ckpt_unlock, or -1
 * when out_dir has no lock file (no run has written there). 0, or -1 with
 * a message naming the run that holds out_dir. */
int dt_ckpt_lock_shared(const char *out_dir, int *fd, char *err, size_t errlen);
/* Releases the lock (fd < 0: nothing to do). The file stays: removing it
 * would let two runs lock two different files of one name. */
void dt_ckpt_unlock(int fd);

#endif
