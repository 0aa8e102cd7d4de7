/* Fault points for tests (see fault.h). */
#include "core/fault.h"

#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static char want_point[32];
static long want_step = -1;
static atomic_long step_now = -1;
static atomic_int armed; /* 1 once the variable named a point for this rank */
static char slow_point[32];
static atomic_long slow_ms; /* DTRAIN_TEST_SLOW's sleep at slow_point; 0: none */

static int known(const char *point)
{
    static const char *const points[] = {"forward", "backward", "allreduce",
                                         "update",  "snapshot", "save"};
    for (size_t i = 0; i < sizeof points / sizeof *points; i++)
        if (strcmp(point, points[i]) == 0) return 1;
    return 0;
}

/* A test hook that would never fire must not pass for one that did: a
 * value it cannot use ends the process. */
static void read_env(void)
{
    const char *v = getenv("DTRAIN_TEST_KILL_AT");
    const char *restart = getenv("TORCHELASTIC_RESTART_COUNT");
    const char *rank = getenv("RANK");
    char point[32];
    long step, who = -1;
    if (!v || (restart && atol(restart) > 0)) return;
    int n = sscanf(v, "%31[a-z]:%ld:%ld", point, &step, &who);
    if (n < 2 || !known(point) || step < 1) {
        fprintf(stderr, "DTRAIN_TEST_KILL_AT='%s': expected POINT:STEP or POINT:STEP:RANK, "
                "POINT one of forward, backward, allreduce, update, snapshot, save, STEP from "
                "1\n", v);
        exit(2);
    }
    if (n == 3 && (!rank || atol(rank) != who)) return;
    snprintf(want_point, sizeof want_point, "%s", point);
    want_step = step;
    atomic_store(&armed, 1);
}

static void read_slow_env(void)
{
    const char *v = getenv("DTRAIN_TEST_SLOW");
    const char *rank = getenv("RANK");
    char point[32];
    long ms, who;
    if (!v) return;
    int n = sscanf(v, "%31[a-z]:%ld:%ld", point, &ms, &who);
    int in_step = n >= 1 && known(point) && strcmp(point, "snapshot") && strcmp(point, "save");
    if (n != 3 || !in_step || ms < 1) {
        fprintf(stderr, "DTRAIN_TEST_SLOW='%s': expected POINT:MS:RANK, POINT one of forward, "
                "backward, allreduce, update (the points inside a step), MS from 1\n", v);
        exit(2);
    }
    if (!rank || atol(rank) != who) return;
    snprintf(slow_point, sizeof slow_point, "%s", point);
    atomic_store_explicit(&slow_ms, ms, memory_order_release); /* after slow_point */
}

void dt_fault_set_step(long step)
{
    static int read;
    if (!read) {
        read = 1;
        read_env();
        read_slow_env();
    }
    atomic_store(&step_now, step);
}

void dt_fault_point_of(const char *point, long step)
{
    if (!atomic_load_explicit(&armed, memory_order_relaxed)) return;
    if (step != want_step || strcmp(point, want_point) != 0) return;
    raise(SIGKILL);
}

static void maybe_sleep(const char *point)
{
    long ms = atomic_load_explicit(&slow_ms, memory_order_acquire);
    if (ms == 0 || strcmp(point, slow_point) != 0) return;
    struct timespec d = {ms / 1000, ms % 1000 * 1000000L};
    while (nanosleep(&d, &d) != 0) {
    }
}

void dt_fault_point(const char *point)
{
    maybe_sleep(point);
    dt_fault_point_of(point, atomic_load(&step_now));
}
