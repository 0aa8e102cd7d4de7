/*
 * `dtrain trace`: reading the timelines that `dtrain train --trace FILE`
 * writes. The computation is train/trace_summary.c; this file parses the
 * command line and prints.
 *
 *   dtrain trace summary FILE [--from-step K]
 *       each rank's busy, communication and idle fractions of its steps
 *       from step K on, and the job's means; a restarted job's failures.
 */
#include "cli/cli.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/parse.h"
#include "train/trace_summary.h"

static void trace_usage(FILE *f)
{
    fprintf(f,
            "usage: dtrain trace summary FILE [--from-step K]\n"
            "\n"
            "summary  for each rank of a timeline written by `dtrain train --trace FILE`,\n"
            "         the fractions of its steps' time it was\n"
            "           busy  computing (the union of its compute events),\n"
            "           comm  communicating and not computing (communication that\n"
            "                 compute did not hide),\n"
            "           idle  neither (waiting, data, the rest);\n"
            "         the three add up to 1. Then the job's line: the means over ranks.\n"
            "         A job that restarted (dtrain launch --max-restarts K) adds its\n"
            "         failures: each one, its recovery (from the failure to the end of\n"
            "         the first step after it), the steps lost, and the training\n"
            "         efficiency, as the run's own `failures:` line counts them.\n"
            "\n"
            "--from-step K  count steps K and later (default: all but the trace's first\n"
            "               step, which pays for kernel generation, when it has several)\n"
            "\n"
            "The file opens in ui.perfetto.dev or chrome://tracing too.\n"
            "\n"
            "example:\n"
            "  dtrain train --nproc 2 --steps 10 --trace run.json && dtrain trace summary run.json\n");
}

static int usage_error(const char *msg, const char *arg)
{
    fprintf(stderr, "dtrain trace: %s%s\nRun 'dtrain trace --help' for usage.\n", msg, arg);
    return CLI_EXIT_USAGE;
}

static void print_row(const char *who, const dt_trace_rank_stats *r, const char *note)
{
    printf("%-6s %11.3f %7.4f %7.4f %7.4f %6d%s\n", who, r->window_ms, r->busy, r->comm, r->idle,
           r->steps, note);
}

static void print_summary(const char *path, const dt_trace_summary *s)
{
    printf("trace %s: %d rank%s, steps %d..%d counted", path, s->nranks, s->nranks == 1 ? "" : "s",
           s->from_step, s->last_step);
    if (s->from_step == s->first_step + 1)
        printf(" (step %d left out: kernel warm-up; --from-step %d keeps it)", s->first_step,
               s->first_step);
    else if (s->from_step > s->first_step)
        printf(" (steps %d..%d left out)", s->first_step, s->from_step - 1);
    printf("\n%-6s %11s %7s %7s %7s %6s\n", "rank", "window_ms", "busy", "comm", "idle", "steps");
    for (int i = 0; i < s->nranks; i++) {
        const dt_trace_rank_stats *r = &s->rank[i];
        char who[16];
        snprintf(who, sizeof who, "%d", r->rank);
        if (r->window_ms > 0)
            print_row(who, r, "");
        else
            printf("%-6s no step in the window (a rank that serves the others?)\n", who);
    }
    char note[64];
    snprintf(note, sizeof note, "  (mean over %d rank%s)", s->job.steps,
             s->job.steps == 1 ? "" : "s");
    /* The job's steps column: the most any rank ran in the window. */
    dt_trace_rank_stats j = s->job;
    j.steps = 0;
    for (int i = 0; i < s->nranks; i++)
        if (s->rank[i].steps > j.steps) j.steps = s->rank[i].steps;
    print_row("job", &j, note);
}

/* The run's own `failures:` line, from the trace's marks, then each one. */
static void print_failures(const dt_trace_failures *t)
{
    if (t->n == 0) return;
    if (t->restarts > 0)
        printf("failures: %d restart(s), %ld step(s) lost, recovery %.2f s on average (%.2f s "
               "at most), training efficiency %.1f%% (%.1f s of %.1f s since the job started "
               "lost to failures)\n", t->restarts, t->lost, t->recovery_ms * 1e-3 / t->restarts,
               t->worst_ms * 1e-3, t->wall_ms > 0 ? 100.0 * (1.0 - t->lost_ms / t->wall_ms) : 0,
               t->lost_ms * 1e-3, t->wall_ms * 1e-3);
    else
        printf("failures: %d, none followed by a step in the trace\n", t->n);
    for (int i = 0; i < t->n; i++) {
        const dt_trace_failure *f = &t->f[i];
        char who[16] = "?";
        if (f->rank >= 0) snprintf(who, sizeof who, "%d", f->rank);
        printf("  restart %d at %.3f s: rank %s %s", f->restart, f->at_ms * 1e-3, who,
               f->how[0] ? f->how : "failed");
        if (f->recovery_ms < 0) {
            printf("; no step after it (the next attempt failed first)\n");
            continue;
        }
        printf("; continued at step %d, ", f->from_step);
        if (f->lost >= 0) printf("%d step(s) lost, ", f->lost);
        printf("recovered in %.2f s\n", f->recovery_ms * 1e-3);
    }
}

static int run_summary(const char *path, int from)
{
    dt_trace_summary s;
    char err[1024];
    if (dt_trace_summarize_file(path, from, &s, err, sizeof err)) {
        fprintf(stderr, "dtrain trace summary: %s\n", err);
        return 1;
    }
    print_summary(path, &s);
    print_failures(&s.failures);
    dt_trace_summary_free(&s);
    return 0;
}

int cli_trace(int argc, char **argv)
{
    if (argc < 2 || strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0) {
        trace_usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? CLI_EXIT_USAGE : 0;
    }
    if (strcmp(argv[1], "summary") != 0) return usage_error("unknown subcommand ", argv[1]);
    const char *file = NULL;
    long from = -1;
    for (int i = 2; i < argc; i++) {
        if (strcmp(argv[i], "--from-step") == 0 && i + 1 < argc) {
            if (dt_parse_long(argv[++i], 0, 1L << 30, &from))
                return usage_error("--from-step wants a step number (0 or more), not ", argv[i]);
        } else if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            trace_usage(stdout);
            return 0;
        } else if (argv[i][0] == '-') {
            return usage_error("unknown option or missing value: ", argv[i]);
        } else if (!file) {
            file = argv[i];
        } else {
            return usage_error("one trace at a time; extra argument ", argv[i]);
        }
    }
    if (!file) return usage_error("summary needs the trace FILE", "");
    return run_summary(file, (int)from);
}
