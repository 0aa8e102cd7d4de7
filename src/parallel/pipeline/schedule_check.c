/* The static check and the unit-time simulation share one runner: both
 * execute the lists under the executor's rules (sends never block, a
 * receive waits for its send, each rank in order), the check only to see
 * every list reach its end, the simulation also to keep the clocks. */
#include "parallel/pipeline/schedule.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/str.h"

static const char *const op_names[] = {"F",      "B",      "I",      "W",
                                       "SEND_F", "RECV_F", "SEND_B", "RECV_B"};

/* What a rank has done for one (stage, micro-batch) so far. */
enum {
    HAS_F = 1, HAS_B = 2, HAS_I = 4, HAS_W = 8,
    HAS_RECV_F = 16, HAS_RECV_B = 32, HAS_SEND_F = 64, HAS_SEND_B = 128
};

typedef struct {
    int r, j; /* rank and action index; r = -1: none */
} where;

typedef struct {
    const dt_pp_schedule *s;
    int S;
    unsigned char *state; /* [S*M] HAS_ bits */
    where *send, *recv;   /* [2*S*M] by edge(), the one send and receive of each message */
    double *sent_at;      /* [2*S*M] the sender's clock when it issued the send */
    int *pc;              /* [p] the next action of each rank */
    double *clock;        /* [p] */
    char *err;
    size_t errlen;
} checker;

static int is_message(int op) { return op >= DT_PP_SEND_F; }

/* A message by direction and the stage that produced it, so a send and its
 * receive land on the same index. */
static int edge(const checker *c, dt_pp_action a)
{
    int dir = a.op == DT_PP_SEND_B || a.op == DT_PP_RECV_B;
    int producer = a.stage + (a.op == DT_PP_RECV_F ? -1 : a.op == DT_PP_RECV_B ? 1 : 0);
    return (dir * c->S + producer) * c->s->M + a.micro;
}

/* The stage at the other end of a message. */
static int other_stage(dt_pp_action a)
{
    return a.op == DT_PP_SEND_F || a.op == DT_PP_RECV_B ? a.stage + 1 : a.stage - 1;
}

static void describe(char *buf, size_t n, dt_pp_action a)
{
    const char *name = a.op < 8 ? op_names[a.op] : "unknown op";
    int len = dt_strf(buf, n, "%s stage %d micro %d", name, a.stage, (int)a.micro);
    if (a.op < 8 && is_message(a.op))
        dt_strf(buf + len, n - (size_t)len, " %s rank %d",
                a.op == DT_PP_SEND_F || a.op == DT_PP_SEND_B ? "to" : "from", a.peer);
}

static int fail_at(checker *c, int r, int j, const char *what)
{
    char act[96];
    describe(act, sizeof act, c->s->acts[r][j]);
    dt_strf(c->err, c->errlen, "pipeline schedule %s: rank %d, action %d (%s): %s",
            dt_pp_kind_name(c->s->kind), r, j, act, what);
    return -1;
}

/* Why a's fields cannot stand on rank r, or NULL. */
static const char *field_problem(const checker *c, int r, dt_pp_action a)
{
    const dt_pp_schedule *s = c->s;
    if (a.op > DT_PP_RECV_B) return "no such operation";
    if (a.stage < 0 || a.stage >= c->S) return "stage out of range";
    if (a.micro < 0 || a.micro >= s->M) return "micro-batch out of range";
    if (a.stage % s->p != r) return "the stage is not on this rank";
    if (!is_message(a.op)) return a.peer == -1 ? NULL : "a compute action with a peer";
    int k = other_stage(a);
    if (k < 0 || k >= c->S) return "a message past the first or last stage";
    return a.peer == k % s->p ? NULL : "the peer is not the rank of the neighbouring stage";
}

static const char *order_compute(unsigned char *b, dt_pp_action a, int S)
{
    if (a.op == DT_PP_F) {
        if (*b & HAS_F) return "a second F of this micro-batch on this stage";
        if (a.stage > 0 && !(*b & HAS_RECV_F)) return "F before the RECV_F of its input";
        return *b |= HAS_F, NULL;
    }
    if (a.op == DT_PP_W) {
        if (*b & HAS_W) return "a second W of this micro-batch on this stage";
        if (!(*b & HAS_I)) return "W before its I (or with a whole B)";
        return *b |= HAS_W, NULL;
    }
    if (*b & (HAS_B | HAS_I)) return "a second backward of this micro-batch on this stage";
    if (!(*b & HAS_F)) return "backward before its F";
    if (a.stage < S - 1 && !(*b & HAS_RECV_B)) return "backward before the RECV_B of its gradient";
    return *b |= a.op == DT_PP_B ? HAS_B : HAS_I, NULL;
}

static const char *order_message(unsigned char *b, dt_pp_action a)
{
    static const unsigned char bit[] = {HAS_SEND_F, HAS_RECV_F, HAS_SEND_B, HAS_RECV_B};
    unsigned char mine = bit[a.op - DT_PP_SEND_F];
    if (*b & mine) return "a second message of this micro-batch on this stage";
    if (a.op == DT_PP_SEND_F && !(*b & HAS_F)) return "SEND_F before the F it carries";
    if (a.op == DT_PP_SEND_B && !(*b & (HAS_B | HAS_I)))
        return "SEND_B before the backward it carries";
    return *b |= mine, NULL;
}

/* Fields, and the order rules on each rank; records where every message is. */
static int check_ranks(checker *c)
{
    const dt_pp_schedule *s = c->s;
    for (int r = 0; r < s->p; r++) {
        for (int j = 0; j < s->n[r]; j++) {
            dt_pp_action a = s->acts[r][j];
            const char *why = field_problem(c, r, a);
            unsigned char *b = why ? NULL : &c->state[a.stage * s->M + a.micro];
            if (!why) why = is_message(a.op) ? order_message(b, a) : order_compute(b, a, c->S);
            if (why) return fail_at(c, r, j, why);
            if (a.op == DT_PP_SEND_F || a.op == DT_PP_SEND_B) c->send[edge(c, a)] = (where){r, j};
            if (a.op == DT_PP_RECV_F || a.op == DT_PP_RECV_B) c->recv[edge(c, a)] = (where){r, j};
        }
    }
    return 0;
}

/* What one (stage, micro-batch) lacks at the end of its rank's list. */
static const char *missing_compute(unsigned b)
{
    if (!(b & HAS_F)) return "no F";
    if (!(b & (HAS_B | HAS_I))) return "no backward";
    return (b & HAS_I) && !(b & HAS_W) ? "an I without its W" : NULL;
}

/* Every (stage, micro-batch) forward once and backward once, as B or I + W. */
static int check_complete(checker *c)
{
    const int M = c->s->M;
    for (int k = 0; k < c->S; k++) {
        for (int i = 0; i < M; i++) {
            const char *why = missing_compute(c->state[k * M + i]);
            if (why)
                return dt_strf(c->err, c->errlen, "pipeline schedule %s: rank %d, stage %d, "
                               "micro %d: %s", dt_pp_kind_name(c->s->kind), k % c->s->p, k, i,
                               why), -1;
        }
    }
    return 0;
}

static int check_matching(checker *c)
{
    const dt_pp_schedule *s = c->s;
    static const char *const missing[] = {"no matching RECV_F on the peer",
                                          "no matching SEND_F on the peer",
                                          "no matching RECV_B on the peer",
                                          "no matching SEND_B on the peer"};
    for (int r = 0; r < s->p; r++) {
        for (int j = 0; j < s->n[r]; j++) {
            dt_pp_action a = s->acts[r][j];
            if (!is_message(a.op)) continue;
            int sends = a.op == DT_PP_SEND_F || a.op == DT_PP_SEND_B;
            where other = (sends ? c->recv : c->send)[edge(c, a)];
            if (other.r < 0) return fail_at(c, r, j, missing[a.op - DT_PP_SEND_F]);
        }
    }
    return 0;
}

static int deadlock(checker *c)
{
    const dt_pp_schedule *s = c->s;
    int r = 0;
    while (c->pc[r] == s->n[r]) r++;
    dt_pp_action a = s->acts[r][c->pc[r]];
    where w = c->send[edge(c, a)];
    char mine[96], theirs[96];
    describe(mine, sizeof mine, a);
    describe(theirs, sizeof theirs, s->acts[w.r][c->pc[w.r]]);
    dt_strf(c->err, c->errlen, "pipeline schedule %s: deadlock: rank %d blocks at action %d (%s), "
            "whose send is rank %d's action %d, but rank %d blocks at action %d (%s)",
            dt_pp_kind_name(s->kind), r, c->pc[r], mine, w.r, w.j, w.r, c->pc[w.r], theirs);
    return -1;
}

/* Runs rank r as far as it goes without waiting; whether it moved. */
static int advance(checker *c, int r, const double cost[4], double **start)
{
    const dt_pp_schedule *s = c->s;
    int moved = 0;
    for (; c->pc[r] < s->n[r]; c->pc[r]++, moved = 1) {
        dt_pp_action a = s->acts[r][c->pc[r]];
        if (a.op == DT_PP_RECV_F || a.op == DT_PP_RECV_B) {
            where w = c->send[edge(c, a)];
            if (c->pc[w.r] <= w.j) break;
            c->clock[r] = fmax(c->clock[r], c->sent_at[edge(c, a)]);
        }
        if (start) start[r][c->pc[r]] = c->clock[r];
        if (a.op <= DT_PP_W) c->clock[r] += cost[a.op];
        if (a.op == DT_PP_SEND_F || a.op == DT_PP_SEND_B) c->sent_at[edge(c, a)] = c->clock[r];
    }
    return moved;
}

/* Sweeps the ranks until none can move: the end of every list, or a
 * deadlock. Times do not depend on the sweep order, only on the lists. */
static int run(checker *c, const double cost[4], double **start)
{
    const dt_pp_schedule *s = c->s;
    for (int moved = 1; moved;) {
        moved = 0;
        for (int r = 0; r < s->p; r++) moved |= advance(c, r, cost, start);
    }
    for (int r = 0; r < s->p; r++)
        if (c->pc[r] < s->n[r]) return deadlock(c);
    return 0;
}

static void release(checker *c)
{
    free(c->state), free(c->send), free(c->recv), free(c->sent_at), free(c->pc), free(c->clock);
}

static int prepare(checker *c, const dt_pp_schedule *s, char *err, size_t errlen)
{
    const size_t cells = (size_t)s->p * s->V * s->M;
    *c = (checker){s, s->p * s->V, calloc(cells, 1), malloc(2 * cells * sizeof(where)),
                   malloc(2 * cells * sizeof(where)), calloc(2 * cells, sizeof(double)),
                   calloc((size_t)s->p, sizeof(int)), calloc((size_t)s->p, sizeof(double)),
                   err, errlen};
    if (!c->state || !c->send || !c->recv || !c->sent_at || !c->pc || !c->clock) {
        release(c);
        return dt_strf(err, errlen, "pipeline schedule check: out of memory"), -1;
    }
    for (size_t e = 0; e < 2 * cells; e++) c->send[e] = c->recv[e] = (where){-1, -1};
    if (check_ranks(c) || check_complete(c) || check_matching(c)) return release(c), -1;
    return 0;
}

static int shape_ok(const dt_pp_schedule *s, char *err, size_t errlen)
{
    int ok = s->p >= 2 && s->p <= 64 && s->V >= 1 && s->M >= 1 && (long)s->p * s->V <= 32767 &&
             s->n && s->acts;
    for (int r = 0; ok && r < s->p; r++) ok = s->n[r] >= 0 && (s->n[r] == 0 || s->acts[r]);
    if (ok) return 1;
    dt_strf(err, errlen, "pipeline schedule %s: no lists for p = %d, V = %d, M = %d",
            dt_pp_kind_name(s->kind), s->p, s->V, s->M);
    return 0;
}

int dt_pp_schedule_check(const dt_pp_schedule *s, char *err, size_t errlen)
{
    checker c;
    if (!shape_ok(s, err, errlen) || prepare(&c, s, err, errlen)) return -1;
    static const double unit[4] = {1, 1, 1, 1};
    int rc = run(&c, unit, NULL);
    release(&c);
    return rc;
}

/* Most micro-batches between F and B (or I) at once, in list order. */
static int peak_in_flight(const dt_pp_schedule *s, int r)
{
    int held = 0, peak = 0;
    for (int j = 0; j < s->n[r]; j++) {
        int op = s->acts[r][j].op;
        held += op == DT_PP_F ? 1 : op == DT_PP_B || op == DT_PP_I ? -1 : 0;
        if (held > peak) peak = held;
    }
    return peak;
}

static int sim_alloc(dt_pp_sim *out, const dt_pp_schedule *s)
{
    memset(out, 0, sizeof *out);
    out->p = s->p;
    out->busy = calloc((size_t)s->p, sizeof(double));
    out->idle = calloc((size_t)s->p, sizeof(double));
    out->peak_in_flight = calloc((size_t)s->p, sizeof(int));
    out->start = calloc((size_t)s->p, sizeof(double *));
    int ok = out->busy && out->idle && out->peak_in_flight && out->start;
    for (int r = 0; ok && r < s->p; r++)
        ok = (out->start[r] = malloc(((size_t)s->n[r] + 1) * sizeof(double))) != NULL;
    return ok ? 0 : -1;
}

static void sim_totals(dt_pp_sim *out, const dt_pp_schedule *s, const double cost[4],
                       const double *clock)
{
    double idle = 0;
    for (int r = 0; r < s->p; r++) out->makespan = fmax(out->makespan, clock[r]);
    for (int r = 0; r < s->p; r++) {
        for (int j = 0; j < s->n[r]; j++)
            if (s->acts[r][j].op <= DT_PP_W) out->busy[r] += cost[s->acts[r][j].op];
        out->idle[r] = out->makespan - out->busy[r];
        idle += out->idle[r];
        out->peak_in_flight[r] = peak_in_flight(s, r);
    }
    out->idle_fraction = out->makespan > 0 ? idle / (s->p * out->makespan) : 0;
}

int dt_pp_schedule_simulate(const dt_pp_schedule *s, const double cost[4], dt_pp_sim *out,
                            char *err, size_t errlen)
{
    memset(out, 0, sizeof *out);
    for (int k = 0; k < 4; k++)
        if (!(cost[k] >= 0 && isfinite(cost[k])))
            return dt_strf(err, errlen, "pipeline simulation: cost of %s is %g; give a finite "
                           "time >= 0", op_names[k], cost[k]), -1;
    checker c;
    if (!shape_ok(s, err, errlen) || prepare(&c, s, err, errlen)) return -1;
    int rc = sim_alloc(out, s);
    if (rc) dt_strf(err, errlen, "pipeline simulation: out of memory");
    if (!rc) rc = run(&c, cost, out->start);
    if (!rc) sim_totals(out, s, cost, c.clock);
    release(&c);
    if (rc) dt_pp_sim_free(out);
    return rc;
}

void dt_pp_sim_free(dt_pp_sim *sim)
{
    for (int r = 0; sim->start && r < sim->p; r++) free(sim->start[r]);
    free(sim->start), free(sim->busy), free(sim->idle), free(sim->peak_in_flight);
    memset(sim, 0, sizeof *sim);
}
