/* Pipeline schedules as data, without a model or a message sent:
 *  - every kind for p 2..8 and M 1..16 (interleaved with V = 2 and 3 at
 *    the M that are multiples of p, refused at the others) passes the
 *    static check;
 *  - the unit-time simulation idles as the closed forms say: gpipe and
 *    1f1b (p-1)/(M+p-1), naive (p-1)/p, interleaved (p-1)/(V*M) of the
 *    ideal compute; zb1p less than 1f1b, and once M >= p at most 0.4 of
 *    it: exactly ZB-H1's (p-1)*(F+I-W) over M*(F+I+W);
 *  - activations in flight: 1f1b min(M, p-r) on rank r, zb1p the same
 *    (and at most p micro-batches waiting for their W), gpipe M;
 *  - every action of a schedule is needed: the check refuses it without;
 *  - the check catches a receive without a send and a deadlock, naming
 *    them; bad combinations are refused with a message saying what works;
 *  - the chart has a row per rank, each in its schedule's order.
 * The closed forms are written here, apart from the library's, which is
 * compared with them once. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "parallel/pipeline/schedule.h"

static int n_checked;

static int build(dt_pp_schedule *s, dt_pp_kind kind, int p, int V, int M)
{
    char err[512] = "";
    if (dt_pp_schedule_build(s, kind, p, V, M, err, sizeof err)) {
        CHECK(0, "build: %s", err);
        return -1;
    }
    int rc = dt_pp_schedule_check(s, err, sizeof err);
    CHECK(rc == 0, "check: %s", err);
    n_checked += rc == 0;
    return 0;
}

/* F costs f and B 2f, or I and W f each. */
static int simulate(const dt_pp_schedule *s, double f, dt_pp_sim *sim)
{
    const double cost[4] = {f, 2 * f, f, f};
    char err[512] = "";
    int rc = dt_pp_schedule_simulate(s, cost, sim, err, sizeof err);
    CHECK(rc == 0, "simulate: %s", err);
    return rc;
}

static double sum(const double *x, int n)
{
    double t = 0;
    for (int i = 0; i < n; i++) t += x[i];
    return t;
}

static int min_int(int a, int b) { return a < b ? a : b; }

/* Most micro-batches between F and W on rank r: what ZB-H1 holds for W. */
static int held_for_w(const dt_pp_schedule *s, int r)
{
    int held = 0, peak = 0;
    for (int j = 0; j < s->n[r]; j++) {
        held += s->acts[r][j].op == DT_PP_F ? 1 : s->acts[r][j].op == DT_PP_W ? -1 : 0;
        if (held > peak) peak = held;
    }
    return peak;
}

static void check_zb1p(const dt_pp_schedule *s, const dt_pp_sim *sim, int p, int M)
{
    const double x = (p - 1.0) / (3.0 * M);
    if (M >= p)
        CHECK(fabs(sim->idle_fraction - x / (1 + x)) < 1e-12, "idles %.15f, not ZB-H1's %.15f",
              sim->idle_fraction, x / (1 + x));
    for (int r = 0; r < p; r++)
        CHECK(held_for_w(s, r) <= p, "rank %d keeps %d micro-batches for W, more than p",
              r, held_for_w(s, r));
}

/* The sum of idle time over the ranks, or -1 when the run failed. */
static double check_one(dt_pp_kind kind, int p, int M)
{
    dt_pp_schedule s;
    dt_pp_sim sim;
    if (build(&s, kind, p, 1, M)) return -1;
    if (simulate(&s, 1, &sim)) return dt_pp_schedule_free(&s), -1;
    double fill = (double)(p - 1) / (M + p - 1), idle = sum(sim.idle, p);
    if (kind == DT_PP_NAIVE)
        CHECK(fabs(sim.idle_fraction - (double)(p - 1) / p) < 1e-12, "naive idles %.15f",
              sim.idle_fraction);
    if (kind == DT_PP_GPIPE || kind == DT_PP_1F1B)
        CHECK(fabs(sim.idle_fraction - fill) < 1e-12, "idles %.15f, not (p-1)/(M+p-1) = %.15f",
              sim.idle_fraction, fill);
    if (kind == DT_PP_ZB1P) check_zb1p(&s, &sim, p, M);
    for (int r = 0; r < p; r++) {
        int want = kind == DT_PP_GPIPE ? M : min_int(M, p - r);
        if (kind != DT_PP_NAIVE)
            CHECK(sim.peak_in_flight[r] == want, "rank %d holds %d activations at most, not %d", r,
                  sim.peak_in_flight[r], want);
    }
    dt_pp_sim_free(&sim);
    dt_pp_schedule_free(&s);
    return idle;
}

static void test_kinds(void)
{
    for (int p = 2; p <= 8; p++) {
        for (int M = 1; M <= 16; M++) {
            double idle[5];
            for (int k = DT_PP_NAIVE; k <= DT_PP_ZB1P; k++) {
                if (k == DT_PP_INTERLEAVED) continue;
                check_set_label("%s p %d M %d: ", dt_pp_kind_name((dt_pp_kind)k), p, M);
                idle[k] = check_one((dt_pp_kind)k, p, M);
            }
            check_set_label("zb1p p %d M %d: ", p, M);
            CHECK(idle[DT_PP_ZB1P] < idle[DT_PP_1F1B], "idles %g, 1f1b %g", idle[DT_PP_ZB1P],
                  idle[DT_PP_1F1B]);
            if (M >= p)
                CHECK(idle[DT_PP_ZB1P] <= 0.4 * idle[DT_PP_1F1B] + 1e-9,
                      "idles %g, more than 0.4 of 1f1b's %g", idle[DT_PP_ZB1P], idle[DT_PP_1F1B]);
            if (p == 4 && M == 8)
                printf("p 4, M 8: idle time 1f1b %g, zb1p %g (F = I = W = 1)\n",
                       idle[DT_PP_1F1B], idle[DT_PP_ZB1P]);
        }
    }
    check_set_label("%s", "");
}

static void check_interleaved(int p, int V, int M)
{
    dt_pp_schedule s;
    dt_pp_sim sim;
    char err[512] = "";
    if (M % p) {
        CHECK_ERR(dt_pp_schedule_build(&s, DT_PP_INTERLEAVED, p, V, M, err, sizeof err), err,
                  "multiple of p");
        return;
    }
    if (build(&s, DT_PP_INTERLEAVED, p, V, M)) return;
    if (!simulate(&s, 1.0 / V, &sim)) {
        double x = (double)(p - 1) / (V * M), got = sum(sim.idle, p) / sum(sim.busy, p);
        CHECK(fabs(got - x) < 1e-9, "bubble / compute %.12f, not (p-1)/(V*M) = %.12f", got, x);
        CHECK(fabs(sim.idle_fraction - x / (1 + x)) < 1e-9, "idle / total %.12f, not %.12f",
              sim.idle_fraction, x / (1 + x));
        dt_pp_sim_free(&sim);
    }
    dt_pp_schedule_free(&s);
}

static void test_interleaved(void)
{
    for (int p = 2; p <= 8; p++)
        for (int V = 2; V <= 3; V++)
            for (int M = 1; M <= 16; M++) {
                check_set_label("interleaved p %d V %d M %d: ", p, V, M);
                check_interleaved(p, V, M);
            }
    check_set_label("%s", "");
}

/* The library's closed forms against the ones written here. */
static void test_formula(void)
{
    for (int p = 2; p <= 8; p++) {
        for (int M = 1; M <= 16; M++) {
            double il = (p - 1.0) / (2 * M), zb = (p - 1.0) / (3 * M);
            const double want[5] = {(p - 1.0) / p, (p - 1.0) / (M + p - 1), (p - 1.0) / (M + p - 1),
                                    il / (1 + il), zb / (1 + zb)};
            for (int k = DT_PP_NAIVE; k <= DT_PP_ZB1P; k++) {
                double got = dt_pp_bubble_formula((dt_pp_kind)k, p, 2, M);
                CHECK(fabs(got - want[k]) < 1e-15, "%s p %d M %d: formula %.17g, not %.17g",
                      dt_pp_kind_name((dt_pp_kind)k), p, M, got, want[k]);
            }
        }
    }
}

static dt_pp_action act(int op, int stage, int micro, int peer)
{
    return (dt_pp_action){(uint8_t)op, (int16_t)stage, micro, (int16_t)peer};
}

/* Two ranks, one micro-batch, lists given by hand. */
static int check_by_hand(dt_pp_action *r0, int n0, dt_pp_action *r1, int n1, char *err,
                         size_t len)
{
    int n[2] = {n0, n1};
    dt_pp_action *acts[2] = {r0, r1};
    dt_pp_schedule s = {DT_PP_1F1B, 2, 1, 1, n, acts};
    return dt_pp_schedule_check(&s, err, len);
}

static void test_bad_schedules(void)
{
    char err[512] = "";
    dt_pp_action good0[] = {act(DT_PP_F, 0, 0, -1), act(DT_PP_SEND_F, 0, 0, 1),
                            act(DT_PP_RECV_B, 0, 0, 1), act(DT_PP_B, 0, 0, -1)};
    dt_pp_action good1[] = {act(DT_PP_RECV_F, 1, 0, 0), act(DT_PP_F, 1, 0, -1),
                            act(DT_PP_B, 1, 0, -1), act(DT_PP_SEND_B, 1, 0, 0)};
    int rc = check_by_hand(good0, 4, good1, 4, err, sizeof err);
    CHECK(rc == 0, "the hand-made schedule passes: %s", err);

    /* Rank 0 forgets to send its activation. */
    dt_pp_action nosend0[] = {good0[0], good0[2], good0[3]};
    CHECK_ERR(check_by_hand(nosend0, 3, good1, 4, err, sizeof err), err, "rank 1", "action 0",
              "RECV_F", "no matching SEND_F");
    printf("no send: %s\n", err);

    /* Both ranks receive first. */
    dt_pp_action lock0[] = {good0[2], good0[0], good0[1], good0[3]};
    CHECK_ERR(check_by_hand(lock0, 4, good1, 4, err, sizeof err), err, "deadlock", "rank 0",
              "RECV_B", "rank 1");
    printf("deadlock: %s\n", err);

    /* A backward before its gradient arrived. */
    dt_pp_action early0[] = {good0[0], good0[1], good0[3], good0[2]};
    CHECK_ERR(check_by_hand(early0, 4, good1, 4, err, sizeof err), err, "rank 0", "action 2",
              "RECV_B");

    /* Rank 1 names itself as the sender of its input. */
    dt_pp_action self1[] = {act(DT_PP_RECV_F, 1, 0, 1), good1[1], good1[2], good1[3]};
    CHECK_ERR(check_by_hand(good0, 4, self1, 4, err, sizeof err), err, "rank 1", "action 0",
              "peer");
}

/* Each action of a good schedule dropped in turn: the check must refuse
 * every one of the results. */
static void check_all_needed(dt_pp_kind kind, int p, int V, int M)
{
    dt_pp_schedule s;
    char err[512];
    if (build(&s, kind, p, V, M)) return;
    int missed = 0;
    for (int r = 0; r < p; r++) {
        for (int j = 0; j < s.n[r]; j++) {
            dt_pp_action cut = s.acts[r][j];
            memmove(&s.acts[r][j], &s.acts[r][j + 1], (size_t)(s.n[r] - j - 1) * sizeof cut);
            s.n[r]--;
            missed += dt_pp_schedule_check(&s, err, sizeof err) == 0;
            s.n[r]++;
            memmove(&s.acts[r][j + 1], &s.acts[r][j], (size_t)(s.n[r] - j - 1) * sizeof cut);
            s.acts[r][j] = cut;
        }
    }
    CHECK(missed == 0, "%s p %d V %d M %d: %d actions could go unnoticed",
          dt_pp_kind_name(kind), p, V, M, missed);
    dt_pp_schedule_free(&s);
}

static void test_all_needed(void)
{
    check_all_needed(DT_PP_NAIVE, 2, 1, 2);
    check_all_needed(DT_PP_GPIPE, 3, 1, 4);
    check_all_needed(DT_PP_1F1B, 4, 1, 6);
    check_all_needed(DT_PP_INTERLEAVED, 2, 3, 4);
    check_all_needed(DT_PP_ZB1P, 3, 1, 5);
}

static void test_refusals(void)
{
    dt_pp_schedule s;
    char err[512] = "";
    CHECK_ERR(dt_pp_schedule_build(&s, DT_PP_1F1B, 1, 1, 4, err, sizeof err), err, "2 to 64");
    CHECK_ERR(dt_pp_schedule_build(&s, DT_PP_GPIPE, 4, 1, 0, err, sizeof err), err,
              "at least 1");
    CHECK_ERR(dt_pp_schedule_build(&s, DT_PP_INTERLEAVED, 4, 2, 6, err, sizeof err), err,
              "multiple of p", "8");
    CHECK_ERR(dt_pp_schedule_build(&s, DT_PP_1F1B, 4, 2, 8, err, sizeof err), err,
              "interleaved");
    CHECK_ERR(dt_pp_schedule_build(&s, DT_PP_INTERLEAVED, 4, 1, 8, err, sizeof err), err,
              "at least 2");
    dt_pp_kind k;
    for (int i = DT_PP_NAIVE; i <= DT_PP_ZB1P; i++)
        CHECK(!dt_pp_kind_parse(dt_pp_kind_name((dt_pp_kind)i), &k) && (int)k == i,
              "kind %d parses back", i);
    CHECK(dt_pp_kind_parse("2f2b", &k) == -1, "an unknown name is refused");
}

static void test_chart(void)
{
    dt_pp_schedule s;
    if (build(&s, DT_PP_1F1B, 4, 1, 8)) return;
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    dt_pp_schedule_chart(f, &s);
    fclose(f);
    int rows = 0;
    for (const char *c = text; (c = strstr(c, "\nrank ")); c++) rows++;
    CHECK(rows == 4, "%d rank rows in\n%s", rows, text);
    /* rank 0: p - 1 = 3 warm-up forwards and F3, then idle until B0 is back: F0 reaches
     * the last stage at 4 and its backward takes 2 on each of ranks 3, 2 and 1, so 6 */
    CHECK(strstr(text, "\nrank  0 | F0 F1 F2 F3 .  .  .  .  .  .  B0 B0 F4 "), "rank 0's row "
          "in\n%s", text);
    /* the last rank: idle while the first three forwards fill the pipe */
    CHECK(strstr(text, "\nrank  3 | .  .  .  F0 B0 B0 F1 "), "rank 3's row in\n%s", text);
    fputs(text, stdout);
    free(text);
    dt_pp_schedule_free(&s);
}

int main(void)
{
    test_kinds();
    test_interleaved();
    test_formula();
    test_bad_schedules();
    test_all_needed();
    test_refusals();
    test_chart();
    printf("%d schedules built and checked\n", n_checked);
    return finish("test_pp_schedule");
}
