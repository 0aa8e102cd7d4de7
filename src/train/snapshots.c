/*
 * In-memory snapshots and the restart that reads them (issue: lose a
 * rank, lose nothing). Under a launcher that restarts failed jobs
 * (TORCHELASTIC_MAX_RESTARTS > 0, set by `dtrain launch --max-restarts`
 * and torchrun), every --snapshot-every steps the ranks write their
 * training state with the checkpoints' writers into the job's directory
 * in the host's shared memory (train/ckpt/snapshot.h), keeping the newest.
 * The writers' atomicity is the commit: a snapshot is in place whole, with
 * every rank's shard and the ranks' agreement on it, or not at all.
 *
 * A restarted attempt (TORCHELASTIC_RESTART_COUNT > 0) continues from that
 * snapshot; resuming is exact, so the run ends with the weights it would
 * have had without the failure. Rank 0 also records the last step the job
 * completed (progress), which says how many steps the failure cost.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "core/env.h"
#include "core/timer.h"
#include "train/ckpt/checkpoint.h"
#include "train/ckpt/snapshot.h"
#include "train/run.h"

#define PROGRESS "progress"

/* The restart variables: 0 when there is no launcher that restarts. */
static int read_env(dt_run *t, long *max_restarts)
{
    char e[256];
    long v = 0;
    *max_restarts = 0;
    if (dt_env_long("TORCHELASTIC_MAX_RESTARTS", 0, 1000000, max_restarts, e, sizeof e) < 0 ||
        dt_env_long("TORCHELASTIC_RESTART_COUNT", 0, 1000000, &t->snap.restart, e, sizeof e) < 0)
        return dt_strf(ERR(t), "%s", e), -1;
    if (dt_env_long("DTRAIN_FAILURE_NS", 0, LONG_MAX, &v, e, sizeof e) < 0)
        return dt_strf(ERR(t), "%s", e), -1;
    t->snap.failure_ns = (uint64_t)v;
    return 0;
}

/* Two snapshots (the newest and the one being written) of the whole
 * state, weights and two moments in fp32, must fit in /dev/shm: checked
 * before the first step rather than found out at a full tmpfs. */
static int check_room(dt_run *t)
{
    struct statvfs fs;
    const double need = 2.0 * 3.0 * 4.0 * (double)t->model.n_floats;
    if (statvfs("/dev/shm", &fs) < 0)
        return dt_strf(ERR(t), "snapshots: cannot read /dev/shm's size: %s (--snapshot-every 0 "
                       "turns snapshots off)", strerror(errno)), -1;
    const double have = (double)fs.f_bavail * (double)fs.f_frsize;
    if (have >= need) return 0;
    return dt_strf(ERR(t), "snapshots: two of this model's training state take %.1f MiB of "
                   "shared memory, /dev/shm has %.1f MiB free; make room (a larger /dev/shm) "
                   "or turn snapshots off with --snapshot-every 0",
                   need / 1048576.0, have / 1048576.0), -1;
}

/* The last step the failed attempt completed, or -1 when unknown. */
static long read_progress(const dt_run *t)
{
    char path[320], buf[32] = {0};
    long step = -1;
    snprintf(path, sizeof path, "%s/" PROGRESS, t->snap.dir);
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    if (!fgets(buf, sizeof buf, f) || sscanf(buf, "%ld", &step) != 1) step = -1;
    fclose(f);
    return step;
}

int dt_run_snapshots_start(dt_run *t, const char *where)
{
    const char *rank = dt_env_str("DTRAIN_FAILED_RANK"), *how = dt_env_str("DTRAIN_FAILURE");
    t->snap.from_step = t->step;
    if (t->snap.every > 0 && t->snap.restart == 0 && t->r.rank == 0 && check_room(t)) return -1;
    if (t->snap.restart == 0) return 0;
    const char *source = !where                       ? "the start (no snapshot or checkpoint yet)"
                         : where == t->snap.dir       ? "the snapshot in memory"
                                                      : "the checkpoint on disk";
    long done = read_progress(t);
    fprintf(t->out, "restart %ld: rank %s %s; continuing at step %ld from %s", t->snap.restart,
            rank ? rank : "?", how ? how : "failed", t->step, source);
    if (where) fprintf(t->out, " (%s)", where);
    if (done >= t->step) fprintf(t->out, ", %ld step(s) lost", done - t->step);
    fprintf(t->out, "\n");
    fflush(t->out);
    /* The last restart the launcher allows: what memory holds goes to
     * disk first, so that a failure now still leaves it to resume from. */
    if (t->snap.restart >= t->snap.max_restarts && where == t->snap.dir && t->cfg->out_dir[0])
        return dt_run_save(t);
    return 0;
}

/* Rank 0: the last step completed, for a restart's count of steps lost
 * (a write to tmpfs a step; a torn one reads as unknown). */
static void write_progress(const dt_run *t)
{
    char path[320], line[32];
    snprintf(path, sizeof path, "%s/" PROGRESS, t->snap.dir);
    int fd = open(path, O_WRONLY | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd < 0) return;
    int n = snprintf(line, sizeof line, "%20ld\n", t->step);
    ssize_t w = pwrite(fd, line, (size_t)n, 0);
    (void)w;
    close(fd);
}

int dt_run_snapshot_after_step(dt_run *t)
{
    if (t->snap.restart > 0 && t->steps_run == 1 && t->snap.failure_ns)
        fprintf(t->out, "recovered: %.2f s from the failure to the end of the first step after "
                "it\n", (double)(dt_now_ns() - t->snap.failure_ns) * 1e-9);
    if (t->snap.max_restarts > 0) fflush(t->out); /* a rank killed loses no line it printed */
    if (t->snap.every == 0) return 0;
    if (t->r.rank == 0) write_progress(t); /* first: this step is done, snapshot or not */
    if (t->step % t->snap.every == 0) {
        char path[512];
        uint64_t t0 = dt_now_ns();
        if (dt_run_save_to(t, t->snap.dir, 1, path, sizeof path)) return -1;
        t->snap.count++;
        t->snap.write_ns += dt_now_ns() - t0;
    }
    return 0;
}

int dt_run_snapshots_setup(dt_run *t, const char **where)
{
    const dt_train_config *c = t->cfg;
    long max_restarts;
    *where = t->r.resuming ? (c->resume[0] ? c->resume : c->out_dir) : NULL;
    if (read_env(t, &max_restarts)) return -1;
    t->snap.max_restarts = max_restarts;
    if (max_restarts == 0) {
        if (DT_CONFIG_GIVEN(c, snapshot_every) && c->snapshot_every > 0)
            return dt_strf(ERR(t), "--snapshot-every %ld: snapshots serve restarts, and this run "
                           "has none; start it with dtrain launch --max-restarts K (or torchrun "
                           "--max-restarts K, or dtrain train --nproc N --max-restarts K)",
                           c->snapshot_every), -1;
        return 0;
    }
    const char *job = dt_env_str("DTRAIN_JOB_ID");
    if (!job || dt_snapshot_dir(job, t->snap.dir, sizeof t->snap.dir))
        return dt_strf(ERR(t), "restarts: DTRAIN_JOB_ID is %s; the launcher sets it",
                       job ? "too long" : "not set"), -1;
    t->snap.every = c->snapshot_every;
    /* Made here, not by the first snapshot: the progress record goes in
     * it from the first step. */
    if (t->snap.every > 0 && mkdir(t->snap.dir, 0700) < 0 && errno != EEXIST)
        return dt_strf(ERR(t), "snapshots: cannot create %s: %s (--snapshot-every 0 turns "
                       "snapshots off)", t->snap.dir, strerror(errno)), -1;
    if (t->snap.restart == 0) return 0;
    if (dt_ckpt_exists(t->snap.dir)) {
        *where = t->snap.dir;
        t->r.resuming = 1;
    } else if (c->out_dir[0] && dt_ckpt_exists(c->out_dir)) {
        *where = c->out_dir;
        t->r.resuming = 1;
    }
    return 0;
}

void dt_run_snapshots_summary(dt_run *t, double train_s)
{
    if (t->snap.count == 0) return;
    const double each = (double)t->snap.write_ns * 1e-9 / (double)t->snap.count;
    fprintf(t->out, "snapshots: %ld in memory (%s), %.0f ms each, %.1f%% of the training time\n",
            t->snap.count, t->snap.dir, each * 1e3,
            train_s > 0 ? 100.0 * (double)t->snap.write_ns * 1e-9 / train_s : 0.0);
}
