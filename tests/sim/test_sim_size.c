/*
 * The closed-form size of a collective's recording (sim/sched_size.h)
 * against real recordings, which are the algorithms' own code run dry:
 *  - for every algorithm the simulator runs, at 2 to 33 ranks (powers of
 *    two and not: the folds), one rank a host and several (hier's column
 *    rings), hosts of unequal size (hier's leaders), and calls of one
 *    element, three, and more than a block a rank (ring passes skip empty
 *    blocks), the steps, operations and local entries read back from the
 *    recording equal the counts, and its bytes lie within the bounds; with
 *    free local work no local entry is recorded, as counted;
 *  - refusing: with a cap of 64 KiB, ring all-reduce of 1 MiB at 256 ranks
 *    (its recording is larger) is refused naming an algorithm whose real
 *    recording fits; all-to-all at 256 ranks, which no algorithm fits
 *    (their real recordings are larger), is refused naming a rank count at
 *    which the named algorithm's real recording fits; what fits is not
 *    refused;
 *  - at 65536 ranks an all-to-all of 1 GiB is refused without recording.
 */
#include <stdio.h>
#include <string.h>

#include "check.h" /* tests/check.h */
#include "core/timer.h"
#include "sim/coll.h"
#include "sim/sched_size.h"

static int world(dt_sim_world *w, int p, int per_host, int free_local)
{
    dt_cost_model m;
    char err[256];
    dt_cost_model_defaults(&m);
    if (free_local) {
        m.copy = 0;
        for (int k = 0; k < DT_LINK_KINDS; k++) m.link[k].gamma = 0;
    }
    int rc = dt_sim_world_init(w, p, per_host, &m, err, sizeof err);
    CHECK(rc == 0, "world of %d: %s", p, err);
    return rc;
}

/* What the recording holds, read back entry by entry. */
static dt_sim_entries read_back(const dt_sim_sched *s)
{
    dt_sim_entries n = {0};
    for (int r = 0; r < s->size; r++) {
        dt_sim_cursor c = dt_sim_cursor_at(s, r);
        dt_sim_entry e;
        while (dt_sim_cursor_next(&c, &e)) {
            n.locals += e.local;
            n.steps += !e.local;
            n.ops += e.local ? 0 : e.nops;
            for (int i = 0; i < e.nops; i++) {
                dt_sim_op_rec op;
                dt_sim_cursor_op(&c, &op);
            }
        }
    }
    return n;
}

/* The recording's bytes (0 when it failed). */
static double recorded(dt_sim_world *w, const dt_algo *al, size_t bytes, dt_sim_entries *got)
{
    dt_sim_sched s;
    char err[512];
    int rc = dt_sim_sched_record(&s, w, al->kind, al->name, bytes, err, sizeof err);
    CHECK(rc == 0, "%s %s at %d ranks: %s", dt_coll_name(al->kind), al->name, w->ranks, err);
    if (rc) return 0;
    if (got) *got = read_back(&s);
    double n = (double)s.start[s.size];
    dt_sim_sched_free(&s);
    return n;
}

static void compare(dt_sim_world *w, const dt_algo *al, size_t elems, const char *hosts)
{
    size_t unit = dt_sim_coll_bytes(&(dt_coll_args){.kind = al->kind, .count = 1}, w->ranks);
    dt_coll_args a = dt_sim_coll_call(al->kind, elems * unit, w->ranks);
    dt_sim_entries want, got;
    CHECK(dt_sim_sched_entries(w, al, &a, &want) == 0, "%s %s: no count", dt_coll_name(al->kind),
          al->name);
    double bytes = recorded(w, al, elems * unit, &got), lo, hi;
    dt_sim_sched_bytes(w, elems * unit, &want, &lo, &hi);
    CHECK(got.steps == want.steps && got.ops == want.ops && got.locals == want.locals,
          "%s %s at %d ranks (%s), %zu elements: recorded %.0f steps, %.0f ops, %.0f locals; "
          "counted %.0f, %.0f, %.0f", dt_coll_name(al->kind), al->name, w->ranks, hosts, elems,
          got.steps, got.ops, got.locals, want.steps, want.ops, want.locals);
    CHECK(lo <= bytes && bytes <= hi, "%s %s at %d ranks (%s): %.0f bytes, bounds %.0f..%.0f",
          dt_coll_name(al->kind), al->name, w->ranks, hosts, bytes, lo, hi);
}

static void every_algorithm(dt_sim_world *w, size_t elems, const char *hosts)
{
    char why[256];
    for (int i = 0; i < dt_algo_count; i++) {
        const dt_algo *al = &dt_algo_table[i];
        if (al->flags & DT_ALGO_NEEDS_MPI) continue;
        if (!dt_algo_usable(w->comm, al, why, sizeof why)) continue; /* hier on one host */
        compare(w, al, elems, hosts);
    }
}

static void counts(void)
{
    static const int ps[] = {2, 3, 4, 5, 6, 7, 8, 9, 12, 13, 16, 17, 24, 31, 32, 33};
    for (size_t i = 0; i < sizeof ps / sizeof ps[0]; i++)
        for (int per_host = 1; per_host <= 4; per_host *= 2) {
            int p = ps[i];
            if (p % per_host) continue;
            const size_t elems[] = {1, 3, 5 * (size_t)p + 3};
            for (int free_local = 0; free_local < 2; free_local++)
                for (size_t k = 0; k < 3; k++) {
                    dt_sim_world w;
                    if (world(&w, p, per_host, free_local)) return;
                    char hosts[64];
                    snprintf(hosts, sizeof hosts, "%d a host%s", per_host,
                             free_local ? ", local work free" : "");
                    every_algorithm(&w, elems[k], hosts);
                    dt_sim_world_free(&w);
                }
        }
}

/* Hosts of 3, 2 and 2 members (hier's leader form), and of 2, 2, 2. */
static void unequal_hosts(void)
{
    static const int uneven[] = {0, 0, 0, 3, 3, 5, 5}, even[] = {0, 0, 2, 2, 4, 4};
    const int *labels[] = {uneven, even};
    const int n[] = {7, 6};
    dt_cost_model m;
    dt_cost_model_defaults(&m);
    for (int g = 0; g < 2; g++)
        for (size_t elems = 1; elems <= 31; elems += 15) {
            dt_sim_world w;
            char err[256];
            int rc = dt_sim_world_init_group(&w, n[g], labels[g], &m, err, sizeof err);
            CHECK(rc == 0, "group world: %s", err);
            if (rc) return;
            compare(&w, &dt_algo_table[dt_algo_find(DT_COLL_ALLREDUCE, "hier")], elems,
                    g ? "hosts of 2" : "hosts of 3, 2, 2");
            dt_sim_world_free(&w);
        }
}

/* The number after `key` in s, or -1. */
static int number_after(const char *s, const char *key)
{
    const char *at = strstr(s, key);
    int v = -1;
    return at && sscanf(at + strlen(key), "%d", &v) == 1 ? v : -1;
}

static const dt_algo *named_after(const char *s, const char *key, dt_coll_kind kind)
{
    const char *at = strstr(s, key);
    char name[32] = "";
    if (!at || sscanf(at + strlen(key), "%31[a-z_]", name) != 1) return NULL;
    int i = dt_algo_find(kind, name);
    return i < 0 ? NULL : &dt_algo_table[i];
}

static void refusals(void)
{
    const double cap = 64 * 1024;
    dt_sim_world w;
    char err[1024];
    if (world(&w, 256, 1, 0)) return;
    /* ring all-reduce of 1 MiB: refused, naming one that fits. */
    const dt_algo *ring = &dt_algo_table[dt_algo_find(DT_COLL_ALLREDUCE, "ring")];
    dt_coll_args a = dt_sim_coll_call(DT_COLL_ALLREDUCE, 1 << 20, 256);
    CHECK(recorded(&w, ring, 1 << 20, NULL) > cap, "ring's recording fits in 64 KiB");
    CHECK_ERR(dt_sim_sched_fits(&w, ring, &a, cap, err, sizeof err), err,
              "the schedule of allreduce ring over 256 ranks takes at least", "use --algo ");
    const dt_algo *other = named_after(err, "use --algo ", DT_COLL_ALLREDUCE);
    CHECK(other && other != ring, "no other algorithm named: %s", err);
    if (other) {
        CHECK(recorded(&w, other, 1 << 20, NULL) <= cap, "%s does not fit: %s", other->name, err);
        a = dt_sim_coll_call(DT_COLL_ALLREDUCE, 1 << 20, 256);
        CHECK(dt_sim_sched_fits(&w, other, &a, cap, err, sizeof err) == 0, "%s refused: %s",
              other->name, err);
    }
    /* all-to-all of 1 MiB: nothing fits at 256 ranks; fewer would. */
    for (int i = 0; i < dt_algo_count; i++)
        if (dt_algo_table[i].kind == DT_COLL_ALLTOALL &&
            !(dt_algo_table[i].flags & DT_ALGO_NEEDS_MPI))
            CHECK(recorded(&w, &dt_algo_table[i], 1 << 20, NULL) > cap, "%s fits",
                  dt_algo_table[i].name);
    const dt_algo *pairwise = &dt_algo_table[dt_algo_find(DT_COLL_ALLTOALL, "pairwise")];
    a = dt_sim_coll_call(DT_COLL_ALLTOALL, 1 << 20, 256);
    CHECK_ERR(dt_sim_sched_fits(&w, pairwise, &a, cap, err, sizeof err), err,
              "no alltoall algorithm's schedule fits at 256 ranks; at most ");
    dt_sim_world_free(&w);
    int p = number_after(err, "at most ");
    const dt_algo *al = named_after(err, "would, by --algo ", DT_COLL_ALLTOALL);
    CHECK(p > 1 && p < 256 && al, "no rank count or algorithm: %s", err);
    if (p > 1 && al && world(&w, p, 1, 0) == 0) {
        CHECK(recorded(&w, al, 1 << 20, NULL) <= cap, "%s at %d ranks does not fit", al->name,
              p);
        dt_sim_world_free(&w);
    }
}

/* The user's case: refused from the counts, in well under a second of
 * work (recording took 32 s and 4.2 GB before it gave up). */
static void at_once(void)
{
    dt_sim_world w;
    dt_sim_sched s;
    char err[1024];
    if (world(&w, 65536, 1, 0)) return;
    uint64_t t0 = dt_now_ns();
    int rc = dt_sim_sched_record(&s, &w, DT_COLL_ALLTOALL, "auto", 1ull << 30, err, sizeof err);
    double sec = (double)(dt_now_ns() - t0) * 1e-9;
    CHECK_ERR(rc, err, "the schedule of alltoall ", "takes at least",
              "no alltoall algorithm's schedule fits at 65536 ranks; at most ");
    CHECK(!strstr(err, "--algo auto"), "suggests auto: %s", err);
    printf("65536-rank all-to-all refused in %.2f s: %s\n", sec, err);
    dt_sim_world_free(&w);
}

int main(void)
{
    counts();
    unequal_hosts();
    refusals();
    at_once();
    return finish("test_sim_size");
}
