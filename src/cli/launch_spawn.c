/*
 * Starting a rank: fork, make the child the leader of its own process
 * group (so that killpg() reaches whatever it starts), tie its life to the
 * launcher's, give it its RANK and LOCAL_RANK, and exec the command. The
 * child reports a failure before exec through a close-on-exec pipe, so
 * the launcher knows at once whether the rank runs. In a job that may
 * shrink, a second pipe stays open in the command, which says through it
 * that the rank joined the job.
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <unistd.h>

#include "cli/launch.h"

/* What a child reports back through its close-on-exec pipe when it cannot
 * become the command; a successful exec closes the pipe instead. */
struct child_error {
    int step; /* 0: exec, 1: setup */
    int err;
};

static _Noreturn void child_fail(int errfd, int step, int err)
{
    struct child_error ce = {step, err};
    ssize_t w = write(errfd, &ce, sizeof ce);
    (void)w;
    _exit(127);
}

/* The test hook (DTRAIN_LAUNCH_TEST_LOST_RANK=K): once the job has
 * restarted, slot K's rank ends before it can join the job, as one whose
 * host is gone would never join it. It runs the launcher's real path: a
 * restarted rank that fails before joining. */
static void lost_for_test(const struct job *j, const struct rank *r)
{
    if (j->restarts == 0 || r - j->ranks != j->o->lost_slot) return;
    fprintf(stderr, PROG ": DTRAIN_LAUNCH_TEST_LOST_RANK=%ld: rank %d (slot %ld) cannot be "
            "started again\n", j->o->lost_slot, r->rank, j->o->lost_slot);
    _exit(1);
}

/* The pipe's write end stays open in the command, which writes a byte to
 * it once it has joined the job (dtrain train does). */
static void pass_joined_fd(int errfd, int joined_w)
{
    if (joined_w < 0) return;
    if (fcntl(joined_w, F_SETFD, 0) < 0 || launch_setenv_long("DTRAIN_LAUNCH_JOINED_FD", joined_w))
        child_fail(errfd, 1, errno);
}

static _Noreturn void run_child(struct job *j, const struct rank *r, int errfd, int out_w,
                                int err_w, int joined_w)
{
    /* Its own group, so that killpg() reaches everything the rank starts. */
    if (setpgid(0, 0) < 0) child_fail(errfd, 1, errno);
    /* A launcher killed with SIGKILL cannot clean up; the kernel does it. */
    if (prctl(PR_SET_PDEATHSIG, SIGKILL) < 0) child_fail(errfd, 1, errno);
    if (getppid() != j->launcher_pid) _exit(127); /* the launcher died before prctl */

    if (out_w >= 0 && (dup2(out_w, 1) < 0 || dup2(err_w, 2) < 0)) child_fail(errfd, 1, errno);
    /* A rank outside the terminal's foreground group that reads the
     * terminal gets stopped (SIGTTIN) and the job would hang. */
    if (j->stdin_is_tty) {
        int fd = open("/dev/null", O_RDONLY);
        if (fd < 0 || dup2(fd, 0) < 0) child_fail(errfd, 1, errno);
        close(fd);
    }
    if (launch_setenv_long("RANK", r->rank) || launch_setenv_long("LOCAL_RANK", r->local))
        child_fail(errfd, 1, errno);
    /* --bind-to: the slot's CPUs, the same in every attempt. */
    if (j->cpus && sched_setaffinity(0, sizeof *j->cpus, &j->cpus[r - j->ranks]) < 0)
        child_fail(errfd, 1, errno);
    pass_joined_fd(errfd, joined_w);
    lost_for_test(j, r);

    sigaction(SIGPIPE, &j->orig_sigpipe, NULL);
    sigprocmask(SIG_SETMASK, &j->orig_mask, NULL);
    execvp(j->o->cmd[0], j->o->cmd);
    child_fail(errfd, 0, errno);
}

static void close_fd(int *fd)
{
    if (*fd >= 0) close(*fd);
    *fd = -1;
}

/* Waits for the child's verdict on exec: end of file (it ran) or an error
 * record. Returns 0 when the rank runs, -1 when it did not start (the child
 * has already exited with 127 and will be reaped like any failed rank). */
static int await_exec(struct job *j, int errfd, const struct rank *r)
{
    struct child_error ce;
    ssize_t n;
    do n = read(errfd, &ce, sizeof ce);
    while (n < 0 && errno == EINTR);
    if (n != (ssize_t)sizeof ce) return 0;
    if (ce.step == 0)
        fprintf(stderr, PROG ": cannot run '%s': %s\n", j->o->cmd[0], strerror(ce.err));
    else
        fprintf(stderr, PROG ": cannot set up rank %d: %s\n", r->rank, strerror(ce.err));
    return -1;
}

void launch_read_joined(struct job *j)
{
    for (int i = 0; i < j->nranks; i++) {
        struct rank *r = &j->ranks[i];
        char c;
        if (r->joined_fd < 0 || r->joined) continue;
        if (read(r->joined_fd, &c, 1) == 1) r->joined = j->ever_joined = 1;
    }
}

int launch_spawn_rank(struct job *j, struct rank *r)
{
    int out_w = -1, err_w = -1, errp[2] = {-1, -1}, joined[2] = {-1, -1};
    if (j->o->tag_output &&
        (launch_stream_open(&r->out, 1, &out_w) < 0 || launch_stream_open(&r->err, 2, &err_w) < 0))
        goto fail;
    if (pipe2(errp, O_CLOEXEC) < 0) goto fail;
    /* Only a job that may shrink asks whether a rank failed before it
     * joined (launch_watch.c). */
    if (launch_may_shrink(j->o) && pipe2(joined, O_CLOEXEC | O_NONBLOCK) < 0) goto fail;

    pid_t pid = fork();
    if (pid < 0) goto fail;
    if (pid == 0) run_child(j, r, errp[1], out_w, err_w, joined[1]);

    /* Also here, so that the group exists before we might killpg() it. */
    setpgid(pid, pid);
    r->pid = pid;
    r->joined_fd = joined[0];
    close_fd(&errp[1]);
    close_fd(&out_w);
    close_fd(&err_w);
    close_fd(&joined[1]);
    int rc = await_exec(j, errp[0], r);
    close(errp[0]);
    return rc;

fail:
    fprintf(stderr, PROG ": cannot start rank %d: %s\n", r->rank, strerror(errno));
    close_fd(&errp[0]);
    close_fd(&errp[1]);
    close_fd(&joined[0]);
    close_fd(&joined[1]);
    close_fd(&out_w);
    close_fd(&err_w);
    return -1;
}
