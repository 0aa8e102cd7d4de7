/*
 * Binding the ranks of this host to CPUs (--bind-to), as mpirun does by
 * default: each local rank gets a block of the CPUs the launcher may use,
 * blocks of equal size (within one), in the order the kernel lists them.
 *
 * Why: a rank's waits spin before they sleep, and two ranks left to the
 * scheduler can end up on one CPU, waking each other through the kernel
 * at every message. On a 2-core VM with one other busy process, an 8-byte
 * all-reduce between 2 unbound ranks took 140 us; bound, 0.3 us. With
 * more ranks than CPUs (oversubscribed) the ranks must share anyway, and
 * auto leaves them free, as mpirun does.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/launch.h"

/* The CPUs in set, listed as "0-3,8": at most n bytes. */
static void cpu_list(const cpu_set_t *set, char *buf, size_t n)
{
    size_t used = 0;
    buf[0] = 0;
    for (int c = 0; c < CPU_SETSIZE && used + 24 < n; c++) {
        if (!CPU_ISSET(c, set)) continue;
        int last = c;
        while (last + 1 < CPU_SETSIZE && CPU_ISSET(last + 1, set)) last++;
        used += (size_t)snprintf(buf + used, n - used, used ? ",%d" : "%d", c);
        if (last > c) used += (size_t)snprintf(buf + used, n - used, "-%d", last);
        c = last;
    }
}

static void report(const struct job *j, int ncpus, const char *why)
{
    char list[256];
    if (!j->cpus) {
        fprintf(stderr, PROG ": %d rank(s) on %d CPU(s), not bound: %s\n", j->nranks, ncpus,
                why);
        return;
    }
    for (int i = 0; i < j->nranks; i++) {
        cpu_list(&j->cpus[i], list, sizeof list);
        fprintf(stderr, PROG ": local rank %d bound to CPU(s) %s\n", i, list);
    }
}

int launch_plan_binding(struct job *j)
{
    cpu_set_t all;
    const char *why = NULL;
    if (sched_getaffinity(0, sizeof all, &all) != 0) {
        fprintf(stderr, PROG ": cannot read the CPUs this launcher may use: %s\n",
                strerror(errno));
        return -1;
    }
    const int ncpus = CPU_COUNT(&all), n = j->nranks;
    if (j->o->bind == LAUNCH_BIND_NONE)
        why = "--bind-to none";
    else if (n > ncpus && j->o->bind == LAUNCH_BIND_CORE) {
        fprintf(stderr, PROG ": --bind-to core gives each rank a CPU of its own, but -n %d ranks "
                "outnumber the %d CPU(s) this launcher may use; use --bind-to none (or the "
                "default, which leaves oversubscribed ranks unbound)\n", n, ncpus);
        return -2;
    } else if (n > ncpus)
        why = "more ranks than CPUs, so they share them";
    else if (n == 1)
        why = "one rank has every CPU";
    if (!why) {
        j->cpus = calloc((size_t)n, sizeof *j->cpus);
        if (!j->cpus) return fprintf(stderr, PROG ": out of memory\n"), -1;
        int order[CPU_SETSIZE], k = 0;
        for (int c = 0; c < CPU_SETSIZE; c++)
            if (CPU_ISSET(c, &all)) order[k++] = c;
        for (int i = 0; i < n; i++) /* block i: [i * ncpus / n, (i + 1) * ncpus / n) */
            for (int c = i * ncpus / n; c < (i + 1) * ncpus / n; c++)
                CPU_SET(order[c], &j->cpus[i]);
    }
    if (j->o->report_bindings) report(j, ncpus, why);
    return 0;
}
