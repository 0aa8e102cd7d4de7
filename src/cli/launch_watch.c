/*
 * Watching the ranks under the launcher's one failure policy:
 *
 *   the first rank to fail decides the exit status; the others get a grace
 *   period to fail on their own (the library makes them report a clear
 *   error of their own), then SIGTERM, then SIGKILL. With restarts left
 *   (--max-restarts), they get SIGKILL at once and launch.c starts the
 *   ranks again.
 *
 * With restarts, the nodes of a job agree on each attempt's end through
 * the store (launch_store.c): a failure on any node is every node's
 * verdict, which each applies to its own ranks.
 *
 * One poll() over a signalfd (SIGCHLD and the stop signals), with
 * --tag-output the ranks' output pipes, and with restarts the pipe that
 * says the verdict is in. Nothing runs in a signal handler.
 * A finished rank stays a zombie (waitid WNOWAIT) until the end: that keeps
 * its pid, and so its process-group id, reserved, so a late killpg() can
 * never hit an unrelated process that happened to get a recycled pid.
 */
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/signalfd.h>
#include <sys/wait.h>
#include <time.h>

#include "cli/launch.h"
#include "comm/transport/net.h"
#include "core/timer.h"

#define TERM_WAIT_S 3.0

static int rank_status(const struct rank *r)
{
    return r->signo ? 128 + r->signo : r->code;
}

static int ranks_alive(const struct job *j)
{
    int n = 0;
    for (int i = 0; i < j->nranks; i++)
        if (j->ranks[i].pid > 0 && !j->ranks[i].finished) n++;
    return n;
}

void launch_signal_groups(struct job *j, int sig)
{
    for (int i = 0; i < j->nranks; i++)
        if (j->ranks[i].pid > 0) killpg(j->ranks[i].pid, sig);
}

void launch_enter_term(struct job *j)
{
    launch_signal_groups(j, SIGTERM);
    j->phase = PHASE_TERM;
    j->deadline_ns = dt_now_ns() + (uint64_t)(TERM_WAIT_S * 1e9);
}

static void enter_kill(struct job *j)
{
    launch_signal_groups(j, SIGKILL);
    j->phase = PHASE_KILL;
}

/* The first failure sets the exit status; later ones are consequences. */
void launch_record_failure(struct job *j, int status)
{
    if (j->failed) return;
    j->failed = 1;
    j->exit_status = status;
}

/* What ended a rank, in words: "exited with status 3", "killed by signal 9
 * (Killed)". */
static void describe(const struct rank *r, char *buf, size_t n)
{
    if (r->signo)
        snprintf(buf, n, "killed by signal %d (%s)", r->signo, strsignal(r->signo));
    else
        snprintf(buf, n, "exited with status %d", r->code);
}

static void say_failed(const struct rank *r, const char *what)
{
    fprintf(stderr, PROG ": rank %d (pid %d) %s%s\n", r->rank, (int)r->pid,
            r->signo ? "was " : "", what);
}

/* A rank of a restarted attempt that failed before it joined the job
 * cannot be started: its slot is given up at the next attempt (--min-nproc)
 * rather than tried again. Only for a command that said in some attempt
 * that it joined (one that never says so cannot be told apart), and not
 * when a stopped rank is the cause. 0: restart as usual, 1: shrink, -1:
 * not below --min-nproc, give up. */
static int plan_shrink(struct job *j, const struct rank *r, const char *what)
{
    if (!launch_may_shrink(j->o) || j->restarts == 0) return 0;
    launch_read_joined(j);
    if (r->joined || !j->ever_joined) return 0;
    for (int i = 0; i < j->nranks; i++)
        if (j->ranks[i].stopped && !j->ranks[i].finished) return 0;
    if (j->active - 1 < j->o->min_nproc) {
        fprintf(stderr, PROG ": rank %d %s before it joined the job after a restart, and the "
                "job may not shrink below --min-nproc %ld ranks; giving up\n", r->rank, what,
                j->o->min_nproc);
        return -1;
    }
    j->shrink_slot = (int)(r - j->ranks);
    snprintf(j->shrink_why, sizeof j->shrink_why, "rank %d (slot %d) %s before it joined the "
             "job after a restart", r->rank, j->shrink_slot, what);
    return 1;
}

/* With restarts left, the attempt is over at once: the other ranks get no
 * grace period, since another attempt is coming and every second they take
 * is a second of recovery. 1 when another attempt follows. */
static int plan_restart(struct job *j, const struct rank *r, const char *what)
{
    if (j->o->max_restarts == 0) return 0;
    if (j->no_restart) {
        fprintf(stderr, PROG ": not restarting: the command did not start\n");
        return 0;
    }
    if (j->restarts >= j->o->max_restarts) {
        fprintf(stderr, PROG ": rank %d failed again after %d restart%s; giving up\n", r->rank,
                j->restarts, j->restarts == 1 ? "" : "s");
        return 0;
    }
    if (plan_shrink(j, r, what) < 0) return 0;
    j->restart_pending = 1;
    j->failed_rank = r->rank;
    j->failure_ns = dt_now_ns();
    snprintf(j->failure, sizeof j->failure, "%s", what);
    for (int i = 0; i < j->nranks; i++) /* a stopped rank is why its peers failed */
        if (j->ranks[i].stopped && !j->ranks[i].finished) {
            j->failed_rank = j->ranks[i].rank;
            snprintf(j->failure, sizeof j->failure, "was stopped by signal %d (%s)",
                     j->ranks[i].stopped, strsignal(j->ranks[i].stopped));
        }
    return 1;
}

static void on_rank_failed(struct job *j, const struct rank *r)
{
    char what[sizeof j->failure];
    describe(r, what, sizeof what);
    /* A later failure is a consequence, unless a signal we did not send
     * killed the rank (kill -9, the OOM killer, a crash): that rank may
     * well have died first, its death noticed after a peer's exit (the
     * peer saw its connection close and failed while it was still being
     * torn down). It is named too; the first failure's status stays. */
    if (j->failed && r->signo && (j->phase == PHASE_RUNNING || j->phase == PHASE_GRACE))
        say_failed(r, what);
    if (j->failed) return;
    say_failed(r, what);
    launch_record_failure(j, rank_status(r));
    if (j->phase != PHASE_RUNNING) return;
    /* The ranks are killed once every rank that has ended is noted (in
     * check_ranks), so that one killed from outside is still named. */
    if (plan_restart(j, r, what)) {
        launch_store_report(j, j->failed_rank, rank_status(r), j->failure, 1);
        return;
    }
    launch_store_report(j, r->rank, rank_status(r), what, 0);
    j->phase = PHASE_GRACE;
    j->deadline_ns = dt_now_ns() + (uint64_t)(j->o->grace_s * 1e9);
}

static const char *signal_name(int sig)
{
    switch (sig) {
    case SIGINT: return "SIGINT";
    case SIGTERM: return "SIGTERM";
    case SIGHUP: return "SIGHUP";
    default: return strsignal(sig);
    }
}

static void on_launcher_signal(struct job *j, int sig)
{
    j->signalled++;
    if (j->restart_pending) {
        /* The ranks are being killed already; only the next attempt is
         * called off. */
        j->restart_pending = 0;
        fprintf(stderr, PROG ": received %s; not restarting\n", signal_name(sig));
        return;
    }
    if (j->phase == PHASE_TERM || j->phase == PHASE_KILL) {
        /* Asked twice: stop waiting politely. */
        if (j->phase == PHASE_TERM) enter_kill(j);
        return;
    }
    fprintf(stderr, PROG ": received %s; stopping %d rank(s)\n", signal_name(sig),
            ranks_alive(j));
    launch_record_failure(j, 128 + sig);
    char what[64];
    snprintf(what, sizeof what, "its launcher received %s", signal_name(sig));
    launch_store_report(j, -1, 128 + sig, what, 0);
    launch_enter_term(j);
}

/* A rank stopped (SIGSTOP, a debugger) holds up its peers until the
 * store's heartbeat deadline fails them; it is named when it stops, and a
 * restart blames it rather than the peer that failed first. */
static void note_stop(struct job *j, struct rank *r, int sig)
{
    (void)j;
    if (sig && !r->stopped)
        fprintf(stderr, PROG ": rank %d (pid %d) was stopped by signal %d (%s); its peers wait "
                "for it until the heartbeat deadline (DTRAIN_HEARTBEAT_TIMEOUT)\n", r->rank,
                (int)r->pid, sig, strsignal(sig));
    r->stopped = sig;
}

/* How long a rank that exited with a status waits for its verdict when
 * it would be the job's first failure: a rank killed from outside
 * (kill -9, the OOM killer) is usually why its peers exit with status 1,
 * and a peer's exit can reach us a moment before the killed rank's death
 * does. Waiting lets that death, if it comes, be the one named. */
#define SETTLE_MS 100

/* Whether ranks that exited with a status should wait for a signal death
 * among their peers before they are judged. */
static int should_settle(const struct job *j)
{
    if (j->failed || j->phase != PHASE_RUNNING || ranks_alive(j) == 0) return 0;
    if (!j->settle_ns) return 1;
    return dt_now_ns() < j->settle_ns;
}

/* Among ranks found ended, those killed by a signal are judged first, then
 * those that exited with a status, after SETTLE_MS when nothing has failed
 * yet: rank order, or the order the kernel told us in, must not make a
 * peer's exit the job's first failure. */
static void judge_ranks(struct job *j)
{
    int waiting = 0;
    for (int pass = 0; pass < 2; pass++)
        for (int i = 0; i < j->nranks; i++) {
            struct rank *r = &j->ranks[i];
            if (!r->unjudged || (pass == 0) != (r->signo != 0)) continue;
            if (pass == 1 && should_settle(j)) {
                waiting = 1;
                continue;
            }
            r->unjudged = 0;
            on_rank_failed(j, r);
        }
    if (!waiting)
        j->settle_ns = 0;
    else if (!j->settle_ns)
        j->settle_ns = dt_now_ns() + (uint64_t)SETTLE_MS * 1000000u;
    if (j->restart_pending && j->phase == PHASE_RUNNING) enter_kill(j);
    if (!j->failed && !waiting && ranks_alive(j) == 0) launch_store_done(j);
}

/* Notes every rank that has ended, without reaping it (see the top), and
 * judges them. */
static void check_ranks(struct job *j)
{
    for (int i = 0; i < j->nranks; i++) {
        struct rank *r = &j->ranks[i];
        if (r->pid <= 0 || r->finished) continue;
        siginfo_t si;
        memset(&si, 0, sizeof si);
        if (waitid(P_PID, (id_t)r->pid, &si, WEXITED | WSTOPPED | WCONTINUED | WNOHANG | WNOWAIT)
                < 0 || si.si_pid == 0)
            continue;
        if (si.si_code == CLD_STOPPED || si.si_code == CLD_CONTINUED) {
            note_stop(j, r, si.si_code == CLD_STOPPED ? si.si_status : 0);
            continue;
        }
        r->finished = 1;
        if (si.si_code == CLD_EXITED)
            r->code = si.si_status;
        else
            r->signo = si.si_status;
        /* Its last words come before our verdict on it. */
        launch_drain_rank(j, r, 0);
        r->unjudged = rank_status(r) != 0;
    }
    judge_ranks(j);
}

/* "exited with status 3" and "was stopped by signal 19 (...)" are said as
 * they are, "killed by signal 9 (Killed)" with a "was". */
static const char *was(const char *what)
{
    return strncmp(what, "killed", 6) == 0 ? "was " : "";
}

/* Another node's failure, or one here that another node's reached the
 * store before, ends the attempt here too: the others are to restart. */
static void apply_restart(struct job *j, const struct verdict *v)
{
    if (!j->restart_pending) j->failure_ns = dt_now_ns(); /* when we learned of it */
    j->restart_pending = 1;
    j->failed_rank = v->rank;
    snprintf(j->failure, sizeof j->failure, "%s", v->what);
    if (j->phase != PHASE_RUNNING) return;
    fprintf(stderr, PROG ": rank %d on node %ld %s%s; stopping this node's %d rank(s) to "
            "restart with the others\n", v->rank, v->node, was(v->what), v->what,
            ranks_alive(j));
    launch_record_failure(j, v->status);
    enter_kill(j);
}

/* The job ends for a failure on another node: this node's ranks get the
 * usual policy, and the launcher that failure's status (unless one of
 * its own failed first). */
static void apply_end(struct job *j, const struct verdict *v)
{
    j->restart_pending = 0;
    if (v->rank >= 0)
        fprintf(stderr, PROG ": the job failed on node %ld and ends (restarts used: %d of %ld): "
                "rank %d %s%s\n", v->node, j->restarts, j->o->max_restarts, v->rank,
                was(v->what), v->what);
    else
        fprintf(stderr, PROG ": the job failed on node %ld and ends (restarts used: %d of %ld): "
                "%s\n", v->node, j->restarts, j->o->max_restarts, v->what);
    launch_record_failure(j, v->status);
    if (j->phase != PHASE_RUNNING || ranks_alive(j) == 0) return;
    j->phase = PHASE_GRACE;
    j->deadline_ns = dt_now_ns() + (uint64_t)(j->o->grace_s * 1e9);
}

static void on_verdict(struct job *j)
{
    struct verdict v;
    launch_store_verdict(j, &v);
    if (v.lost) {
        j->restart_pending = 0;
        fprintf(stderr, PROG ": %s; stopping %d rank(s)\n", v.why, ranks_alive(j));
        launch_record_failure(j, 1);
        if (j->phase == PHASE_RUNNING || j->phase == PHASE_GRACE) launch_enter_term(j);
        return;
    }
    if (v.done || v.ours) return;
    /* A node that decided to end (its command did not start, it was
     * stopped) outranks one that would restart; this node, when it
     * decided to end on its own, ends whatever the others do. */
    if (v.restart && !j->signalled && (j->restart_pending || !j->failed))
        apply_restart(j, &v);
    else if (!j->failed || j->restart_pending)
        apply_end(j, &v);
}

static void on_deadline(struct job *j)
{
    int alive = ranks_alive(j);
    if (j->phase == PHASE_GRACE) {
        fprintf(stderr, PROG ": %d rank(s) still running %gs after the failure; sending SIGTERM\n",
                alive, j->o->grace_s);
        launch_enter_term(j);
    } else if (j->phase == PHASE_TERM) {
        fprintf(stderr, PROG ": %d rank(s) still running %gs after SIGTERM; sending SIGKILL\n",
                alive, TERM_WAIT_S);
        enter_kill(j);
    }
}

static void read_signals(struct job *j)
{
    struct signalfd_siginfo si[16];
    for (;;) {
        ssize_t n = read(j->sigfd, si, sizeof si);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return;
        for (size_t k = 0; k < (size_t)n / sizeof si[0]; k++) {
            if (si[k].ssi_signo == SIGCHLD)
                check_ranks(j);
            else
                on_launcher_signal(j, (int)si[k].ssi_signo);
        }
    }
}

static int in_timed_phase(const struct job *j)
{
    return j->phase == PHASE_GRACE || j->phase == PHASE_TERM;
}

static int poll_timeout_ms(const struct job *j)
{
    uint64_t until = in_timed_phase(j) ? j->deadline_ns : 0;
    if (j->settle_ns && (!until || j->settle_ns < until)) until = j->settle_ns;
    return dt_net_poll_ms(until);
}

/* One round: wait for a signal, output, or the phase deadline. */
static int watch_once(struct job *j)
{
    struct pollfd *fds = j->fds;
    int nfds = 0;
    fds[nfds++] = (struct pollfd){.fd = j->sigfd, .events = POLLIN};
    for (int i = 0; i < j->nranks; i++) {
        fds[nfds++] = (struct pollfd){.fd = j->ranks[i].out.fd, .events = POLLIN};
        fds[nfds++] = (struct pollfd){.fd = j->ranks[i].err.fd, .events = POLLIN};
    }
    const int verdict_fd = launch_store_waiting(j) ? launch_store_fd(j) : -1;
    fds[nfds++] = (struct pollfd){.fd = verdict_fd, .events = POLLIN};
    int rc = poll(fds, (nfds_t)nfds, poll_timeout_ms(j));
    if (rc < 0 && errno != EINTR) return -1;
    if (rc > 0) {
        for (int i = 0; i < j->nranks; i++) {
            if (fds[1 + 2 * i].revents) launch_stream_read(j, &j->ranks[i].out, j->ranks[i].rank, 0);
            if (fds[2 + 2 * i].revents) launch_stream_read(j, &j->ranks[i].err, j->ranks[i].rank, 0);
        }
        if (fds[0].revents) read_signals(j);
        if (fds[nfds - 1].revents && launch_store_waiting(j)) on_verdict(j);
    }
    if (j->settle_ns && dt_now_ns() >= j->settle_ns) judge_ranks(j);
    if (in_timed_phase(j) && dt_now_ns() >= j->deadline_ns)
        on_deadline(j);
    return 0;
}

/* With restarts, a node whose ranks have ended still waits for the
 * verdict: every node's success, or a failure to restart for. */
void launch_watch(struct job *j)
{
    while (ranks_alive(j) > 0 || launch_store_waiting(j)) {
        if (watch_once(j) == 0) continue;
        /* poll() fails only for want of memory; the ranks must still be
         * followed to the end, so keep going at a slower pace. */
        read_signals(j);
        nanosleep(&(struct timespec){.tv_nsec = 100 * 1000 * 1000}, NULL);
    }
}

void launch_read_signals(struct job *j) { read_signals(j); }

int launch_take_restart(struct job *j)
{
    /* A stop signal that came while the ranks were ending calls it off. */
    if (j->restart_pending) read_signals(j);
    return j->restart_pending;
}

int launch_setup_signals(struct job *j)
{
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGCHLD);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    /* Under nohup, hanging up is not a reason to stop the job. */
    struct sigaction hup;
    if (sigaction(SIGHUP, NULL, &hup) == 0 && hup.sa_handler != SIG_IGN) sigaddset(&set, SIGHUP);

    /* An inherited SIG_IGN for SIGCHLD would make the kernel reap the
     * ranks behind our back, losing their exit status. */
    struct sigaction dfl;
    memset(&dfl, 0, sizeof dfl);
    dfl.sa_handler = SIG_DFL;
    sigaction(SIGCHLD, &dfl, NULL);
    /* With --tag-output our stdout may be a pipe whose reader went away;
     * that must not kill the launcher and orphan the ranks' cleanup. */
    struct sigaction ign = dfl;
    ign.sa_handler = SIG_IGN;
    sigaction(SIGPIPE, &ign, &j->orig_sigpipe);

    if (sigprocmask(SIG_BLOCK, &set, &j->orig_mask) < 0) {
        fprintf(stderr, PROG ": sigprocmask: %s\n", strerror(errno));
        return -1;
    }
    j->sigfd = signalfd(-1, &set, SFD_NONBLOCK | SFD_CLOEXEC);
    if (j->sigfd < 0) {
        fprintf(stderr, PROG ": signalfd: %s\n", strerror(errno));
        return -1;
    }
    return 0;
}
