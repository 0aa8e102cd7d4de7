/*
 * The simulator's network and engine against closed forms worked out
 * here, with a model of round numbers (alpha 1 us / 20 us, 10 GB/s within
 * a host, 1 GB/s across, reduction at 5 GB/s):
 *  - one message of b bytes takes exactly alpha + beta b, within a host
 *    and across hosts;
 *  - two messages out of one host's single NIC take alpha + 2 beta b; with
 *    a NIC per rank, or in opposite directions (full duplex), alpha +
 *    beta b, the same as one;
 *  - a message joined half-way by a second on its NIC: the fluid model's
 *    times (full rate, then half) for both;
 *  - a dependency between streams (SIGNAL / WAIT), and a SEND / RECV
 *    pair on a channel, add up as written;
 *  - two ranks each waiting to receive from the other: a deadlock,
 *    reported naming a rank, not a hang;
 *  - processor sharing: 3 ranks on a host with 2 ranks' worth of cores,
 *    computing 1 ms each, end together at 1.5 ms; a rank that starts late
 *    (its peer's message in between, a pipeline's bubble) leaves the
 *    others a core each until it joins; a lone rank never goes faster
 *    than its own full rate.
 */
#include <math.h>
#include <stdio.h>

#include "check.h" /* tests/check.h */
#include "sim/engine.h"

static const double A_SHM = 1e-6, B_SHM = 1.0 / 10e9, A_TCP = 20e-6, B_TCP = 1.0 / 1e9;

static dt_cost_model test_model(void)
{
    dt_cost_model m;
    dt_cost_model_defaults(&m);
    m.link[DT_LINK_SHM] = (dt_link_cost){A_SHM, B_SHM, 1.0 / 5e9};
    m.link[DT_LINK_TCP] = (dt_link_cost){A_TCP, B_TCP, 1.0 / 5e9};
    return m;
}

static int close_to(double got, double want) { return fabs(got - want) <= 1e-9 * fabs(want); }

/* Ranks' programs, at most 8 ranks of 2 streams. */
typedef struct {
    dt_sim_world w;
    dt_sim_engine *e;
    dt_sim_prog prog[8][2];
    char err[512];
} sim;

static int sim_open(sim *s, int ranks, int per_host, int nics)
{
    memset(s, 0, sizeof *s);
    dt_cost_model m = test_model();
    if (dt_sim_world_init(&s->w, ranks, per_host, &m, s->err, sizeof s->err)) return -1;
    s->e = dt_sim_engine_new(&s->w, nics, 2, 4, s->err, sizeof s->err);
    return s->e ? 0 : -1;
}

static double sim_run(sim *s)
{
    for (int r = 0; r < s->w.ranks; r++)
        for (int k = 0; k < 2; k++) dt_sim_engine_program(s->e, r, k, &s->prog[r][k]);
    if (dt_sim_engine_run(s->e, s->err, sizeof s->err)) return -1;
    return dt_sim_engine_makespan(s->e);
}

static void sim_close(sim *s)
{
    dt_sim_engine_free(s->e);
    for (int r = 0; r < 8; r++)
        for (int k = 0; k < 2; k++) dt_sim_prog_free(&s->prog[r][k]);
    dt_sim_world_free(&s->w);
}

static void message(sim *s, int from, int to, double bytes)
{
    dt_sim_prog_add(&s->prog[from][1], dt_sim_send(to - from, bytes, 0));
    dt_sim_prog_add(&s->prog[to][1], dt_sim_recv(from - to, bytes, 0, "recv"));
}

static double run_messages(int ranks, int per_host, int nics, const int (*pairs)[2], int n,
                           double bytes)
{
    sim s;
    if (sim_open(&s, ranks, per_host, nics)) return -1;
    for (int i = 0; i < n; i++) message(&s, pairs[i][0], pairs[i][1], bytes);
    double t = sim_run(&s);
    if (t < 0) fprintf(stderr, "%s\n", s.err);
    sim_close(&s);
    return t;
}

static void one_message(void)
{
    const double b = 1e6;
    const int p01[][2] = {{0, 1}};
    double t = run_messages(2, 2, 1, p01, 1, b);
    CHECK(close_to(t, A_SHM + B_SHM * b), "within a host: %.9g s, want %.9g", t, A_SHM + B_SHM * b);
    t = run_messages(2, 1, 1, p01, 1, b);
    CHECK(close_to(t, A_TCP + B_TCP * b), "across hosts: %.9g s, want %.9g", t, A_TCP + B_TCP * b);
}

static void shared_nic(void)
{
    const double b = 1e6, one = A_TCP + B_TCP * b;
    const int out_of_host0[][2] = {{0, 2}, {1, 3}}, opposite[][2] = {{0, 2}, {3, 1}};
    double t = run_messages(4, 2, 1, out_of_host0, 2, b);
    CHECK(close_to(t, A_TCP + 2 * B_TCP * b), "two on one NIC: %.9g s, want %.9g", t,
          A_TCP + 2 * B_TCP * b);
    t = run_messages(4, 2, 2, out_of_host0, 2, b);
    CHECK(close_to(t, one), "a NIC each: %.9g s, want %.9g", t, one);
    t = run_messages(4, 2, 1, opposite, 2, b);
    CHECK(close_to(t, one), "opposite directions: %.9g s, want %.9g", t, one);
}

/* Rank 0 sends b to rank 2 at once; rank 1 sends b to rank 3 after d
 * seconds of compute. Both leave host 0 through its one NIC. */
static void joined_half_way(void)
{
    const double b = 1e6, d = 400e-6;
    sim s;
    CHECK(sim_open(&s, 4, 2, 1) == 0, "open: %s", s.err);
    message(&s, 0, 2, b);
    dt_sim_prog_add(&s.prog[1][0], dt_sim_compute(d, "wait"));
    dt_sim_prog_add(&s.prog[1][0], dt_sim_signal(0));
    dt_sim_prog_add(&s.prog[1][1], dt_sim_wait(0));
    message(&s, 1, 3, b);
    double t = sim_run(&s);
    /* The first flows alone from A to d + A, then at half rate. */
    double left = b - d / B_TCP, first = d + A_TCP + 2 * B_TCP * left;
    double second = first + B_TCP * (b - left); /* what it has left, alone again */
    CHECK(close_to(t, second), "second message ends at %.9g s, want %.9g", t, second);
    CHECK(close_to(dt_sim_engine_stats(s.e, 2)->finish, first), "first ends at %.9g s, want %.9g",
          dt_sim_engine_stats(s.e, 2)->finish, first);
    sim_close(&s);
}

static void dependencies(void)
{
    const double b = 2e6;
    sim s;
    CHECK(sim_open(&s, 2, 1, 1) == 0, "open: %s", s.err);
    dt_sim_prog_add(&s.prog[0][0], dt_sim_compute(1e-3, "forward"));
    dt_sim_prog_add(&s.prog[0][0], dt_sim_signal(1));
    dt_sim_prog_add(&s.prog[0][1], dt_sim_wait(1));
    message(&s, 0, 1, b);
    dt_sim_prog_add(&s.prog[1][1], dt_sim_signal(2));
    dt_sim_prog_add(&s.prog[1][0], dt_sim_wait(2));
    dt_sim_prog_add(&s.prog[1][0], dt_sim_compute(2e-3, "backward"));
    double t = sim_run(&s), want = 1e-3 + A_TCP + B_TCP * b + 2e-3;
    CHECK(close_to(t, want), "compute, message, compute: %.9g s, want %.9g", t, want);
    /* rank 1's receive waits idle until rank 0 sends (a pipeline's bubble),
     * then the message is exposed communication */
    const dt_sim_rank_stats *r1 = dt_sim_engine_stats(s.e, 1);
    CHECK(close_to(r1->compute, 2e-3) && close_to(r1->exposed, A_TCP + B_TCP * b) &&
              close_to(r1->idle, 1e-3),
          "rank 1: compute %.9g, exposed %.9g, idle %.9g", r1->compute, r1->exposed, r1->idle);
    sim_close(&s);
}

static void deadlock(void)
{
    sim s;
    CHECK(sim_open(&s, 2, 2, 1) == 0, "open: %s", s.err);
    dt_sim_prog_add(&s.prog[0][1], dt_sim_recv(1, 8, 0, "recv"));
    dt_sim_prog_add(&s.prog[1][1], dt_sim_recv(-1, 8, 0, "recv"));
    CHECK(sim_run(&s) < 0 && strstr(s.err, "deadlock: rank"), "expected a deadlock, got '%s'",
          s.err);
    sim_close(&s);
}

/* Host of 3 ranks, cores worth 2. Rank 0 and 1 compute c; rank 2 first
 * waits for a message of rank 0's (sent before its compute), then
 * computes c. Until rank 2 joins (alpha + beta b), ranks 0 and 1 run at
 * full rate; then three share 2 cores. */
static void processor_sharing(void)
{
    const double c = 1e-3, b = 1e6;
    sim s;
    CHECK(sim_open(&s, 3, 3, 1) == 0 && dt_sim_engine_share_cpu(s.e, 2.0) == 0, "open: %s",
          s.err);
    for (int r = 0; r < 3; r++) dt_sim_prog_add(&s.prog[r][0], dt_sim_compute(c, "work"));
    double t = sim_run(&s);
    CHECK(close_to(t, 1.5 * c), "three ranks on two cores' worth: %.9g s, want %.9g", t,
          1.5 * c);
    CHECK(close_to(dt_sim_engine_stats(s.e, 0)->compute, 1.5 * c),
          "rank 0 computes (slowed) for %.9g s, want %.9g", dt_sim_engine_stats(s.e, 0)->compute,
          1.5 * c);
    sim_close(&s);

    CHECK(sim_open(&s, 3, 3, 1) == 0 && dt_sim_engine_share_cpu(s.e, 2.0) == 0, "open: %s",
          s.err);
    message(&s, 0, 2, b);
    dt_sim_prog_add(&s.prog[2][1], dt_sim_signal(0));
    dt_sim_prog_add(&s.prog[2][0], dt_sim_wait(0));
    for (int r = 0; r < 3; r++) dt_sim_prog_add(&s.prog[r][0], dt_sim_compute(c, "work"));
    double j = A_SHM + B_SHM * b; /* rank 2 joins */
    /* Ranks 0 and 1 have c - j left at j, at 2/3 rate; rank 2 then has
     * c - (c - j) = j left at full rate, after they end. */
    double t01 = j + 1.5 * (c - j), t2 = t01 + (c - (c - j) * 1.0);
    t = sim_run(&s);
    CHECK(close_to(dt_sim_engine_stats(s.e, 0)->finish, t01),
          "the early ranks end at %.9g s, want %.9g", dt_sim_engine_stats(s.e, 0)->finish, t01);
    CHECK(close_to(t, t2), "the late rank ends at %.9g s, want %.9g", t, t2);
    sim_close(&s);

    CHECK(sim_open(&s, 1, 1, 1) == 0 && dt_sim_engine_share_cpu(s.e, 4.0) == 0, "open: %s",
          s.err);
    dt_sim_prog_add(&s.prog[0][0], dt_sim_compute(c, "work"));
    t = sim_run(&s);
    CHECK(close_to(t, c), "alone with cores to spare: %.9g s, want %.9g", t, c);
    sim_close(&s);
}

int main(void)
{
    one_message();
    shared_nic();
    joined_half_way();
    dependencies();
    deadlock();
    processor_sharing();
    return finish("test_sim_net");
}
