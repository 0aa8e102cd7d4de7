/*
 * The store's control connections, one per rank: HELLO, heartbeats, FAIL
 * reports and BYE. From them the server gives the job's verdict: it
 * aborts the job when a control connection closes without BYE (the rank
 * died), when a rank's heartbeats stop for longer than the heartbeat
 * timeout (stopped or hung process), or when a rank reports FAIL. For a
 * FAIL that is a timeout, the server first looks for a rank whose
 * heartbeats are late and names that rank as the cause instead, so every
 * rank reports the same culprit.
 */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "comm/bootstrap/store_server.h"
#include "core/log.h"
#include "core/timer.h"
#include "dtrain/comm.h"

static void job_abort(dt_store_server *s, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* The first cause wins; every control connection hears it once. */
static void job_abort(dt_store_server *s, int code, const char *fmt, ...)
{
    if (s->aborted) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(s->abort_msg, sizeof s->abort_msg, fmt, ap);
    va_end(ap);
    s->aborted = 1;
    s->abort_code = code;
    dt_log(DT_LOG_INFO, "store: aborting the job: %s", s->abort_msg);
    /* Rank 0, the store's own process, hears last: once told it may exit
     * and take the store with it. */
    for (int i = 1; i <= s->world_size; i++) {
        rank_state *rs = &s->ranks[i % s->world_size];
        if (rs->ctl && !rs->bye) dt_srv_send_abort(rs->ctl, code, s->abort_msg);
    }
}

static double beat_age_s(const rank_state *rs, uint64_t now)
{
    return now > rs->last_beat_ns ? (double)(now - rs->last_beat_ns) * 1e-9 : 0.0;
}

/* Whether a live rank's heartbeats are over two intervals late: its
 * process is stopped or hung (its monitor thread beats whatever the rest of
 * it does). */
static int beats_late(const rank_state *rs, uint64_t now)
{
    return rs->ctl && !rs->bye && rs->interval_ms &&
           beat_age_s(rs, now) > 2.0 * rs->interval_ms * 1e-3;
}

/* The rank whose heartbeats are latest, if any is late; -1 if none. */
static int find_late_rank(dt_store_server *s, int except, double *age_out)
{
    uint64_t now = dt_now_ns();
    int late = -1;
    double worst = 0;
    for (int r = 0; r < s->world_size; r++) {
        rank_state *rs = &s->ranks[r];
        if (r == except || !beats_late(rs, now)) continue;
        double age = beat_age_s(rs, now);
        if (age > worst) {
            late = r;
            worst = age;
        }
    }
    *age_out = worst;
    return late;
}

void dt_srv_resolve_fail(dt_store_server *s)
{
    fail_report *f = &s->fail;
    if (!f->set || s->aborted) return;
    f->set = 0;
    double age;
    int late = f->is_timeout ? find_late_rank(s, f->rank, &age) : -1;
    if (late >= 0) {
        job_abort(s, DT_ERR_TIMEOUT,
                  "rank %d is unresponsive: no heartbeat for %.1f s (stopped or hung); "
                  "rank %d reported: %s",
                  late, age, f->rank, f->msg);
        return;
    }
    job_abort(s, f->code, "%s", f->msg);
}

void dt_srv_check_heartbeats(dt_store_server *s)
{
    if (s->aborted || s->beat_timeout_s <= 0) return;
    uint64_t now = dt_now_ns();
    int silent = -1;
    double worst = s->beat_timeout_s;
    for (int r = 0; r < s->world_size; r++) {
        rank_state *rs = &s->ranks[r];
        if (!rs->ctl || rs->bye) continue;
        double age = beat_age_s(rs, now);
        if (age > worst) {
            silent = r;
            worst = age;
        }
    }
    if (silent >= 0)
        job_abort(s, DT_ERR_TIMEOUT,
                  "rank %d is unresponsive: no heartbeat for %.1f s (stopped or hung)", silent,
                  worst);
}

/* A control connection is gone: a rank that neither said BYE nor reported
 * its own failure was lost. */
void dt_srv_rank_gone(dt_store_server *s, conn *c)
{
    rank_state *rs = &s->ranks[c->rank];
    rs->ctl = NULL;
    if (rs->bye || rs->reported) return;
    if (c->dead_by_error)
        job_abort(s, DT_ERR_PEER, "rank %d was lost: the store dropped its connection (%s)",
                  c->rank, c->why);
    else
        job_abort(s, DT_ERR_PEER,
                  "rank %d was lost: its connection to the store closed without a goodbye "
                  "(the process died or was killed)",
                  c->rank);
}

/* ---- messages ---- */

void dt_srv_on_hello(dt_store_server *s, conn *c, const dt_wire_hdr *h)
{
    int r = h->a;
    if (r < 0 || r >= s->world_size) {
        dt_srv_reply_error(c, h->id, DT_ERR_INVALID, "rank %d is outside the job's %d ranks", r,
                           s->world_size);
        dt_srv_drop(c, 1, "HELLO from rank %d, outside the job's %d ranks", r, s->world_size);
        return;
    }
    rank_state *rs = &s->ranks[r];
    if (rs->ctl) {
        dt_srv_reply_error(c, h->id, DT_ERR_INVALID,
                           "rank %d is already connected to the store (two processes with the same rank?)",
                           r);
        dt_srv_drop(c, 1, "a second HELLO for rank %d", r);
        return;
    }
    c->kind = CONN_CONTROL;
    c->rank = r;
    *rs = (rank_state){.ctl = c, .seen = 1, .last_beat_ns = dt_now_ns(),
                       .interval_ms = h->b > 0 ? (uint32_t)h->b : 0};
    dt_srv_reply(c, h->id, 0, NULL, 0);
    if (s->aborted) dt_srv_send_abort(c, s->abort_code, s->abort_msg);
}

void dt_srv_on_fail(dt_store_server *s, conn *c, const dt_wire_hdr *h, const unsigned char *body)
{
    s->ranks[c->rank].reported = 1;
    if (s->aborted) return;
    fail_report *f = &s->fail;
    /* Within a turn a definite failure explains more than a timeout or a
     * lost peer, which are often its echoes. */
    int weak_old = f->is_timeout || f->code == DT_ERR_PEER;
    int weak_new = h->flag || h->a == DT_ERR_PEER;
    if (f->set && !(weak_old && !weak_new)) return;
    f->set = 1;
    f->rank = c->rank;
    f->code = h->a < 0 ? h->a : DT_ERR_ABORTED;
    f->suspect = h->b;
    f->is_timeout = h->flag != 0;
    snprintf(f->msg, sizeof f->msg, "%.*s", (int)h->val_len, (const char *)body);
}


void dt_srv_on_heartbeat(dt_store_server *s, conn *c) { s->ranks[c->rank].last_beat_ns = dt_now_ns(); }

/* A rank that leaves while the job runs is news to the others: one that
 * waits for it in a collective can fail at once, naming it, instead of
 * waiting out its deadline. (After everyone is done, nobody waits.) */
void dt_srv_on_bye(dt_store_server *s, conn *c)
{
    s->ranks[c->rank].bye = 1;
    if (s->aborted) return;
    dt_wire_hdr left = {.type = DT_WIRE_LEFT, .a = c->rank};
    for (int r = 0; r < s->world_size; r++) {
        rank_state *rs = &s->ranks[r];
        if (r != c->rank && rs->ctl && !rs->bye) dt_srv_send(rs->ctl, &left, NULL);
    }
}

int dt_srv_ranks_done(dt_store_server *s)
{
    uint64_t now = dt_now_ns();
    int seen = 0, bye = 0;
    for (int r = 0; r < s->world_size; r++) {
        const rank_state *rs = &s->ranks[r];
        /* Once the job has failed, a rank that no longer beats (the stopped
         * one the verdict named) will never say BYE: waiting for it kept
         * rank 0 in dt_comm_destroy for DTRAIN_TIMEOUT after the verdict. */
        if (rs->ctl && !rs->bye && !(s->aborted && beats_late(rs, now))) return 0;
        seen += rs->seen;
        bye += rs->bye;
    }
    /* No control connections at all: the store was used for requests only. */
    return seen == 0 || s->aborted || bye == s->world_size;
}
