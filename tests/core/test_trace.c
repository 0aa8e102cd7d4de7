/* The timeline: the recorder (core/trace.h), the file it becomes in one
 * process (train/trace_file.h), read back with cJSON field by field, and
 * the summary's fractions (train/trace_summary.h) against fractions worked
 * out by hand below from the same intervals. Under restarts: an attempt's
 * events kept step by step and read back by the next one
 * (train/trace_spool.h), the failure and recovery marks
 * (train/trace_marks.h), and the summary's failures and time lost
 * (train/trace_failures.h) against figures worked out by hand.
 *
 *   test_trace [SCRATCH_DIR]   (default: a fresh directory under /tmp) */
#include <cjson/cJSON.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "core/file.h"
#include "core/trace.h"
#include "train/trace_file.h"
#include "train/trace_marks.h"
#include "train/trace_spool.h"
#include "train/trace_summary.h"

#define BASE_NS 5000000000ull
#define US(x) (BASE_NS + (uint64_t)((x) * 1000.0))

static int near(double a, double b) { return fabs(a - b) < 1e-9; }

static void test_off(void)
{
    dt_trace_args a = dt_trace_noargs();
    CHECK(a.step == -1 && a.micro == -1 && a.stage == -1 && a.layer_lo == -1 &&
              a.layer_hi == -1 && a.peer == -1 && a.bytes == -1,
          "noargs: every field -1");
    CHECK(!dt_trace_on() && dt_trace_now() == 0, "off before start: on 0, now 0");
    dt_trace_add(DT_TRACE_COMPUTE, "x", 1, 2, NULL);
    dt_trace_event *ev;
    size_t n, dropped;
    CHECK(dt_trace_snapshot(&ev, &n, &dropped) == 0 && n == 0 && ev == NULL,
          "an add while off records nothing (%zu events)", n);
}

/* More than one chunk (1024 events), kept in the order added. */
static void test_chunks(void)
{
    CHECK(dt_trace_start() == 0 && dt_trace_on() && dt_trace_now() > 0, "start");
    for (int i = 0; i < 2500; i++) {
        dt_trace_args a = dt_trace_noargs();
        a.micro = i;
        dt_trace_add(DT_TRACE_COMM, "e", (uint64_t)i, (uint64_t)i + 1, &a);
    }
    dt_trace_event *ev;
    size_t n, dropped;
    CHECK(dt_trace_snapshot(&ev, &n, &dropped) == 0 && n == 2500 && dropped == 0,
          "2500 events over 3 chunks, got %zu", n);
    int ordered = 1;
    for (size_t i = 0; ev && i < n; i++)
        ordered &= ev[i].a.micro == (int)i && ev[i].start_ns == i && ev[i].lane == DT_TRACE_COMM;
    CHECK(ordered, "events kept in order with their args");
    free(ev);
    CHECK(dt_trace_snapshot_from(1000, &ev, &n, &dropped) == 0 && n == 1500 &&
              ev[0].a.micro == 1000 && ev[1499].a.micro == 2499,
          "from event 1000 (inside the first chunk's successor): 1000..2499");
    free(ev);
    CHECK(dt_trace_snapshot_from(2048, &ev, &n, &dropped) == 0 && n == 452 &&
              ev[0].a.micro == 2048,
          "from event 2048 (a chunk's first): 2048..2499, got %zu", n);
    free(ev);
    CHECK(dt_trace_snapshot_from(2500, &ev, &n, &dropped) == 0 && n == 0 && ev == NULL,
          "from the end: none");
    dt_trace_add(DT_TRACE_COMPUTE, "backwards", 9, 3, NULL);
    CHECK(dt_trace_snapshot(&ev, &n, &dropped) == 0 && n == 2501 && ev[2500].end_ns == 9 &&
              ev[2500].a.bytes == -1,
          "an end before the start is clamped to it; NULL args are absent");
    free(ev);
    CHECK(dt_trace_start() == 0, "restart");
    CHECK(dt_trace_snapshot(&ev, &n, &dropped) == 0 && n == 0, "a restart drops old events");
    dt_trace_stop();
    CHECK(!dt_trace_on() && dt_trace_snapshot(&ev, &n, &dropped) == 0 && n == 0,
          "stop: off and empty");
}

static void *adder(void *arg)
{
    (void)arg;
    for (int i = 0; i < 3000; i++) dt_trace_add(DT_TRACE_COMM, "t", 1, 2, NULL);
    return NULL;
}

static void test_threads(void)
{
    pthread_t th[4];
    dt_trace_start();
    for (int i = 0; i < 4; i++) pthread_create(&th[i], NULL, adder, NULL);
    for (int i = 0; i < 4; i++) pthread_join(th[i], NULL);
    dt_trace_event *ev;
    size_t n, dropped;
    CHECK(dt_trace_snapshot(&ev, &n, &dropped) == 0 && n == 12000 && dropped == 0,
          "4 threads x 3000 adds: 12000 events, got %zu", n);
    free(ev);
    dt_trace_stop();
}

/* ---- one process's file ------------------------------------------------------------ */

static void add(dt_trace_lane lane, const char *name, double lo_us, double hi_us, int step,
                int micro, long long bytes)
{
    dt_trace_args a = dt_trace_noargs();
    a.step = step;
    a.micro = micro;
    a.bytes = bytes;
    if (lane == DT_TRACE_COMPUTE && micro >= 0) a.layer_lo = 0, a.layer_hi = 3;
    dt_trace_add(lane, name, US(lo_us), US(hi_us), &a);
}

/* Steps 0 [0,100], 1 [100,300], 2 [320,500] (a gap between 1 and 2).
 * Step 0: compute [0,90].
 * Step 1: forward [100,160] and backward [150,220] overlap: busy 120;
 *   optimizer [280,290]: 10. Comm [200,260] and [250,270]: their union
 *   [200,270] minus compute is [220,270]: 50. Idle [270,280] [290,300]: 20.
 * Step 2: compute [320,400]: 80; comm [390,450]: 50 exposed; comm
 *   [480,520] ends after the step: [480,500], 20. Idle [450,480]: 30.
 * A comm event in the gap [305,315] lies in no window. */
static void record_scenario(void)
{
    add(DT_TRACE_STEP, "step", 0, 100, 0, -1, -1);
    add(DT_TRACE_COMPUTE, "forward", 0, 90, -1, 0, -1);
    add(DT_TRACE_STEP, "step", 100, 300, 1, -1, -1);
    add(DT_TRACE_COMPUTE, "forward", 100, 160, -1, 0, -1);
    add(DT_TRACE_COMPUTE, "backward", 150, 220, -1, 0, -1);
    add(DT_TRACE_COMM, "allreduce", 200, 260, -1, -1, 4096);
    add(DT_TRACE_COMM, "allreduce", 250, 270, -1, -1, 1024);
    add(DT_TRACE_COMPUTE, "optimizer", 280, 290, 1, -1, -1);
    add(DT_TRACE_COMM, "stray", 305, 315, -1, -1, -1);
    add(DT_TRACE_STEP, "step", 320, 500, 2, -1, -1);
    add(DT_TRACE_COMPUTE, "forward", 320, 400, -1, 0, -1);
    add(DT_TRACE_COMM, "allreduce", 390, 450, -1, -1, 8);
    add(DT_TRACE_COMM, "allreduce", 480, 520, -1, -1, 8);
    dt_trace_args a = dt_trace_noargs();
    a.stage = 1;
    a.peer = 2;
    a.layer_lo = 4;
    dt_trace_add(DT_TRACE_COMM, "send \"act\"", US(600), US(600), &a); /* zero length */
}

static const cJSON *item(const cJSON *o, const char *k)
{
    return cJSON_GetObjectItemCaseSensitive(o, k);
}

/* The complete event named name whose ts is ts (microseconds). */
static const cJSON *find_x(const cJSON *events, const char *name, double ts)
{
    const cJSON *e;
    cJSON_ArrayForEach(e, events)
    {
        const cJSON *n = item(e, "name"), *t = item(e, "ts");
        if (cJSON_IsString(n) && strcmp(n->valuestring, name) == 0 && cJSON_IsNumber(t) &&
            near(t->valuedouble, ts))
            return e;
    }
    return NULL;
}

static int count_ph(const cJSON *events, const char *ph, const char *name)
{
    int k = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, events)
    {
        if (strcmp(item(e, "ph")->valuestring, ph) == 0 &&
            (!name || strcmp(item(e, "name")->valuestring, name) == 0))
            k++;
    }
    return k;
}

static void check_event_fields(const cJSON *ev)
{
    const cJSON *b = find_x(ev, "backward", 150);
    CHECK(b && strcmp(item(b, "ph")->valuestring, "X") == 0 && item(b, "pid")->valueint == 0 &&
              item(b, "tid")->valueint == DT_TRACE_COMPUTE && near(item(b, "dur")->valuedouble, 70),
          "backward: X, pid 0, tid 0, ts 150 us, dur 70 us");
    const cJSON *args = b ? item(b, "args") : NULL;
    CHECK(args && item(args, "micro")->valueint == 0 &&
              strcmp(item(args, "layers")->valuestring, "0-3") == 0 && !item(args, "step") &&
              !item(args, "bytes") && cJSON_GetArraySize(args) == 2,
          "backward's args: micro and layers only");
    const cJSON *r = find_x(ev, "allreduce", 200);
    CHECK(r && item(r, "tid")->valueint == DT_TRACE_COMM &&
              item(item(r, "args"), "bytes")->valuedouble == 4096,
          "allreduce: tid 1, bytes 4096");
    const cJSON *s = find_x(ev, "step", 320);
    CHECK(s && item(s, "tid")->valueint == DT_TRACE_STEP && near(item(s, "dur")->valuedouble, 180) &&
              item(item(s, "args"), "step")->valueint == 2,
          "step 2: tid 2, dur 180 us, args.step 2");
    const cJSON *p = find_x(ev, "send \"act\"", 600);
    const cJSON *pa = p ? item(p, "args") : NULL;
    CHECK(pa && item(pa, "stage")->valueint == 1 && item(pa, "peer")->valueint == 2 &&
              strcmp(item(pa, "layers")->valuestring, "4") == 0 &&
              near(item(p, "dur")->valuedouble, 0),
          "a quoted name survives; stage, peer, a lone layer");
    CHECK(count_ph(ev, "X", NULL) == 14, "14 complete events, got %d", count_ph(ev, "X", NULL));
}

static void check_metadata(const cJSON *root, const cJSON *ev)
{
    CHECK(count_ph(ev, "M", "process_name") == 1 && count_ph(ev, "M", "thread_name") == 3,
          "one process_name, three thread_names");
    const char *want[3] = {"compute", "communication", "steps"};
    const cJSON *e;
    int named = 0;
    cJSON_ArrayForEach(e, ev)
    {
        if (strcmp(item(e, "name")->valuestring, "thread_name") != 0) continue;
        int tid = item(e, "tid")->valueint;
        named += tid >= 0 && tid < 3 &&
                 strcmp(item(item(e, "args"), "name")->valuestring, want[tid]) == 0;
        if (strcmp(item(e, "name")->valuestring, "process_name") == 0)
            CHECK(strcmp(item(item(e, "args"), "name")->valuestring, "rank 0") == 0, "rank 0");
    }
    CHECK(named == 3, "threads named compute, communication, steps");
    const cJSON *unit = item(root, "displayTimeUnit"), *other = item(root, "otherData");
    CHECK(cJSON_IsString(unit) && strcmp(unit->valuestring, "ms") == 0, "displayTimeUnit ms");
    CHECK(other && item(other, "ranks")->valueint == 1 &&
              item(other, "t0_ns")->valuedouble == (double)BASE_NS,
          "otherData: 1 rank, t0 the earliest event");
}

/* The fractions of the scenario, from the sums in record_scenario's comment. */
static void check_summary(const char *path)
{
    dt_trace_summary s;
    char err[512];
    int rc = dt_trace_summarize_file(path, -1, &s, err, sizeof err);
    CHECK(rc == 0, "summary: %s", err);
    if (rc) return;
    const dt_trace_rank_stats *r = &s.rank[0];
    CHECK(s.nranks == 1 && s.from_step == 1 && s.first_step == 0 && s.last_step == 2,
          "default window: steps 1..2 (got from %d, %d..%d)", s.from_step, s.first_step,
          s.last_step);
    CHECK(r->steps == 2 && near(r->window_ms, 0.380), "window 380 us (got %.6f ms)", r->window_ms);
    CHECK(near(r->busy, 210.0 / 380) && near(r->comm, 120.0 / 380) && near(r->idle, 50.0 / 380),
          "busy 210, comm 120, idle 50 of 380 (got %.6f %.6f %.6f)", r->busy, r->comm, r->idle);
    CHECK(near(s.job.busy, r->busy) && s.job.steps == 1, "the job's line is the one rank's");
    dt_trace_summary_free(&s);
    CHECK(dt_trace_summarize_file(path, 0, &s, err, sizeof err) == 0 &&
              near(s.rank[0].busy, 300.0 / 480) && near(s.rank[0].comm, 120.0 / 480) &&
              near(s.rank[0].idle, 60.0 / 480),
          "from step 0: busy 300, comm 120, idle 60 of 480");
    dt_trace_summary_free(&s);
    CHECK(dt_trace_summarize_file(path, 2, &s, err, sizeof err) == 0 &&
              near(s.rank[0].busy, 80.0 / 180) && near(s.rank[0].comm, 70.0 / 180) &&
              near(s.rank[0].idle, 30.0 / 180),
          "from step 2: busy 80, comm 70, idle 30 of 180");
    dt_trace_summary_free(&s);
    rc = dt_trace_summarize_file(path, 3, &s, err, sizeof err);
    CHECK_ERR(rc, err, "--from-step 3", "0..2");
}

static void test_file(const char *dir)
{
    char path[1024], err[512];
    snprintf(path, sizeof path, "%s/one.json", dir);
    dt_trace_start();
    record_scenario();
    int rc = dt_trace_write(NULL, path, err, sizeof err);
    dt_trace_stop();
    CHECK(rc == 0, "write: %s", err);
    char *text = dt_read_file(path, 1 << 20, NULL, err, sizeof err);
    cJSON *root = text ? cJSON_Parse(text) : NULL;
    const cJSON *ev = root ? item(root, "traceEvents") : NULL;
    CHECK(cJSON_IsArray(ev), "the file parses, with a traceEvents array");
    if (cJSON_IsArray(ev)) {
        check_event_fields(ev);
        check_metadata(root, ev);
    }
    cJSON_Delete(root);
    free(text);
    check_summary(path);
    snprintf(path, sizeof path, "%s/no/such/dir/x.json", dir);
    dt_trace_start();
    rc = dt_trace_write(NULL, path, err, sizeof err);
    dt_trace_stop();
    CHECK_ERR(rc, err, "--trace", "x.json");
}

/* ---- a job that restarted ----------------------------------------------------------- */

/* Times in us from BASE_NS. Attempt 0 begins at 0; step 0 [10,110] and a
 * forward [10,100] are spooled (with a 1 us clock offset); step 1
 * [110,210] is not (the rank is killed during the next). The failure at
 * 250; attempt 1 begins at 400: step 1 [500,700], step 2 [700,800]; the
 * recovery runs from 250 to 700, continuing at step 1 with none lost.
 * The summary: wall 800, pace (800 - 500) / 2 = 150, time lost
 * 450 + (0 - 1) x 150 = 300. */
static void record_restarted(const char *dir)
{
    char err[512];
    dt_trace_start();
    CHECK(dt_trace_spool_open(dir, 0, 0, 1000, err, sizeof err) == 0, "spool 0: %s", err);
    CHECK(dt_trace_marks_open(dir, 0, US(0), 0, NULL, NULL, err, sizeof err) == 0,
          "marks 0: %s", err);
    add(DT_TRACE_STEP, "step", 10, 110, 0, -1, -1);
    add(DT_TRACE_COMPUTE, "forward", 10, 100, -1, 0, -1);
    CHECK(dt_trace_spool_step(err, sizeof err) == 0 && dt_trace_spool_attempt() == 0,
          "spool a step: %s", err);
    add(DT_TRACE_STEP, "step", 110, 210, 1, -1, -1);
    char path[1024];
    snprintf(path, sizeof path, "%s/trace-0.0", dir);
    FILE *f = fopen(path, "a"); /* a record torn by the kill */
    if (f) fputs("torn!!", f), fclose(f);
    /* The restart: a new process's recorder. */
    dt_trace_start();
    CHECK(dt_trace_spool_open(dir, 0, 1, 0, err, sizeof err) == 0, "spool 1: %s", err);
    CHECK(dt_trace_marks_open(dir, 1, US(400), US(250), "1", "killed by signal 9 (Killed)", err,
                              sizeof err) == 0,
          "marks 1: %s", err);
    add(DT_TRACE_STEP, "step", 500, 700, 1, -1, -1);
    dt_trace_mark_recovery(US(250), 450000, 1, 0);
    add(DT_TRACE_STEP, "step", 700, 800, 2, -1, -1);
}

static const cJSON *find_mark(const cJSON *ev, const char *name, double ts)
{
    const cJSON *e = find_x(ev, name, ts);
    return e && strcmp(item(e, "cat")->valuestring, "restart") == 0 &&
                   item(e, "pid")->valueint == 0 && item(e, "tid")->valueint == 3
               ? e : NULL;
}

static void check_restarted_file(const cJSON *root, const cJSON *ev)
{
    const cJSON *s0 = find_x(ev, "step", 11), *s1 = find_x(ev, "step", 500);
    CHECK(s0 && item(item(s0, "args"), "attempt")->valueint == 0 &&
              near(item(s0, "dur")->valuedouble, 100),
          "attempt 0's step 0 from its spool, on rank 0's clock (+1 us), args.attempt 0");
    CHECK(find_x(ev, "forward", 11) && !find_x(ev, "step", 110) && !find_x(ev, "step", 111),
          "its forward kept; its step 1, never spooled, and the torn record left out");
    CHECK(s1 && item(item(s1, "args"), "attempt")->valueint == 1 &&
              item(item(s1, "args"), "step")->valueint == 1,
          "attempt 1's step 1 from memory, args.attempt 1");
    const cJSON *a0 = find_mark(ev, "attempt", 0), *a1 = find_mark(ev, "attempt", 400);
    CHECK(a0 && a1 && strcmp(item(a1, "ph")->valuestring, "i") == 0 &&
              item(item(a1, "args"), "attempt")->valueint == 1,
          "the attempts' marks at 0 and 400 us (the earliest: t0)");
    const cJSON *fl = find_mark(ev, "failure", 250), *fa = fl ? item(fl, "args") : NULL;
    CHECK(fa && strcmp(item(fl, "ph")->valuestring, "i") == 0 &&
              strcmp(item(fl, "s")->valuestring, "g") == 0 &&
              item(fa, "restart")->valueint == 1 && item(fa, "rank")->valueint == 1 &&
              strcmp(item(fa, "how")->valuestring, "killed by signal 9 (Killed)") == 0,
          "the failure: a global instant at 250 us, restart 1, rank 1, how");
    const cJSON *rc = find_mark(ev, "recovery", 250), *ra = rc ? item(rc, "args") : NULL;
    CHECK(ra && strcmp(item(rc, "ph")->valuestring, "X") == 0 &&
              near(item(rc, "dur")->valuedouble, 450) && item(ra, "from_step")->valueint == 1 &&
              item(ra, "steps_lost")->valueint == 0 && item(ra, "restart")->valueint == 1,
          "the recovery: 250 to 700 us, from step 1, 0 lost");
    CHECK(count_ph(ev, "M", "thread_name") == 4 &&
              item(item(root, "otherData"), "attempts")->valueint == 2,
          "a fourth row (restarts) on rank 0; otherData.attempts 2");
}

static void test_restarted(const char *dir)
{
    char path[1024], err[512];
    record_restarted(dir);
    snprintf(path, sizeof path, "%s/restarted.json", dir);
    int rc = dt_trace_write(NULL, path, err, sizeof err);
    dt_trace_spool_close();
    dt_trace_marks_close();
    dt_trace_stop();
    CHECK(rc == 0, "write: %s", err);
    char *text = dt_read_file(path, 1 << 20, NULL, err, sizeof err);
    cJSON *root = text ? cJSON_Parse(text) : NULL;
    const cJSON *ev = root ? item(root, "traceEvents") : NULL;
    CHECK(cJSON_IsArray(ev), "the file parses");
    if (cJSON_IsArray(ev)) check_restarted_file(root, ev);
    cJSON_Delete(root);
    free(text);
    dt_trace_summary s;
    rc = dt_trace_summarize_file(path, -1, &s, err, sizeof err);
    CHECK(rc == 0, "summary: %s", err);
    if (rc) return;
    const dt_trace_failures *f = &s.failures;
    CHECK(f->n == 1 && f->restarts == 1 && f->f[0].rank == 1 && near(f->f[0].at_ms, 0.25) &&
              near(f->f[0].recovery_ms, 0.45) && f->f[0].from_step == 1 && f->f[0].lost == 0 &&
              strcmp(f->f[0].how, "killed by signal 9 (Killed)") == 0,
          "one failure: rank 1 at 0.25 ms, recovered in 0.45 ms from step 1");
    CHECK(near(f->wall_ms, 0.8) && near(f->step_ms, 0.15) && near(f->lost_ms, 0.3),
          "wall 0.8 ms, pace 0.15, lost 0.3 (got %g %g %g)", f->wall_ms, f->step_ms, f->lost_ms);
    dt_trace_summary_free(&s);
    static const char *const names[] = {"trace-0.0", "trace-0.1", "trace-marks"};
    for (int i = 0; i < 3; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        unlink(path);
    }
    snprintf(path, sizeof path, "%s/restarted.json", dir);
    unlink(path);
}

/* ---- the summary on hand-written JSON ---------------------------------------------- */

/* Rank 0: step 0 [0,100]; step 1 [100,300] with compute [100,200]:
 *   busy 1/2, comm 0, idle 1/2.
 * Rank 1: step 1 [100,200], compute [100,150], comm [140,190]:
 *   busy 1/2, comm 40/100, idle 1/10.
 * Rank 2 serves (named, no events). The job: busy 0.5, comm 0.2, idle
 * 0.3 over ranks 0 and 1, window (0.2 + 0.1) / 2 ms. */
static const char *two_ranks =
    "{\"traceEvents\":["
    "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":2,\"args\":{\"name\":\"rank 2\"}},"
    "{\"name\":\"step\",\"ph\":\"X\",\"pid\":1,\"tid\":2,\"ts\":100,\"dur\":100,\"args\":{\"step\":1}},"
    "{\"name\":\"f\",\"ph\":\"X\",\"pid\":1,\"tid\":0,\"ts\":100,\"dur\":50},"
    "{\"name\":\"c\",\"ph\":\"X\",\"pid\":1,\"tid\":1,\"ts\":140,\"dur\":50},"
    "{\"name\":\"step\",\"ph\":\"X\",\"pid\":0,\"tid\":2,\"ts\":0,\"dur\":100,\"args\":{\"step\":0}},"
    "{\"name\":\"step\",\"ph\":\"X\",\"pid\":0,\"tid\":2,\"ts\":100,\"dur\":200,\"args\":{\"step\":1}},"
    "{\"name\":\"f\",\"ph\":\"X\",\"pid\":0,\"tid\":0,\"ts\":100,\"dur\":100},"
    "{\"name\":\"instant\",\"ph\":\"i\",\"pid\":0,\"tid\":0,\"ts\":5}"
    "]}";

static void test_two_ranks(void)
{
    dt_trace_summary s;
    char err[512];
    int rc = dt_trace_summarize(two_ranks, -1, &s, err, sizeof err);
    CHECK(rc == 0, "two ranks: %s", err);
    if (rc) return;
    CHECK(s.nranks == 3 && s.rank[0].rank == 0 && s.rank[1].rank == 1 && s.rank[2].rank == 2,
          "ranks 0, 1, 2 in order");
    CHECK(near(s.rank[0].busy, 0.5) && near(s.rank[0].comm, 0) && near(s.rank[0].idle, 0.5),
          "rank 0: 0.5 0 0.5");
    CHECK(near(s.rank[1].busy, 0.5) && near(s.rank[1].comm, 0.4) && near(s.rank[1].idle, 0.1),
          "rank 1: 0.5 0.4 0.1");
    CHECK(s.rank[2].window_ms == 0 && s.rank[2].steps == 0, "rank 2: no window");
    CHECK(s.job.steps == 2 && near(s.job.busy, 0.5) && near(s.job.comm, 0.2) &&
              near(s.job.idle, 0.3) && near(s.job.window_ms, 0.15),
          "the job: means over ranks 0 and 1");
    dt_trace_summary_free(&s);
}

/* A job under restarts that never failed: its first attempt's spool and
 * marks leave the file as it would be without them; a directory that is
 * not there is refused naming the file. */
static void test_no_failure(const char *dir)
{
    char path[1024], err[512];
    dt_trace_start();
    CHECK(dt_trace_spool_open(dir, 0, 0, 0, err, sizeof err) == 0 &&
              dt_trace_marks_open(dir, 0, US(0), 0, NULL, NULL, err, sizeof err) == 0,
          "open: %s", err);
    add(DT_TRACE_STEP, "step", 10, 110, 0, -1, -1);
    CHECK(dt_trace_spool_step(err, sizeof err) == 0, "spool: %s", err);
    snprintf(path, sizeof path, "%s/calm.json", dir);
    int rc = dt_trace_write(NULL, path, err, sizeof err);
    char *text = rc == 0 ? dt_read_file(path, 1 << 20, NULL, err, sizeof err) : NULL;
    CHECK(text && !strstr(text, "\"attempt") && !strstr(text, "restart") &&
              strstr(text, "\"ts\":0.000,\"dur\":100.000"),
          "no failure: no marks, no args.attempt, t0 the first event");
    free(text);
    unlink(path);
    static const char *const names[] = {"trace-0.0", "trace-marks"};
    for (int i = 0; i < 2; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        unlink(path);
    }
    snprintf(path, sizeof path, "%s/no/such", dir);
    rc = dt_trace_spool_open(path, 3, 2, 0, err, sizeof err);
    CHECK_ERR(rc, err, "--trace", "no/such/trace-3.2");
    rc = dt_trace_marks_open(path, 2, US(0), US(1), "1", "x", err, sizeof err);
    CHECK_ERR(rc, err, "--trace", "no/such/trace-marks");
    dt_trace_spool_close();
    dt_trace_marks_close();
    dt_trace_stop();
}

/* Three failures, out of order: restart 1 at 100 us recovered by 400
 * (from step 3, 2 lost); restart 2 at 1000 with no step after it; restart
 * 3 at 2000 recovered in 500 (from step 5, 1 lost). Rank 0's last attempt
 * (3) steps over [2300,2500] twice: pace 100; rank 1 ends last, at 2600.
 * Lost: 800 + (3 - 2) x 100 = 900 of 2600. */
static const char *restarted =
    "{\"traceEvents\":["
    "{\"name\":\"recovery\",\"cat\":\"restart\",\"ph\":\"X\",\"pid\":0,\"tid\":3,\"ts\":2000,"
    "\"dur\":500,\"args\":{\"restart\":3,\"from_step\":5,\"steps_lost\":1}},"
    "{\"name\":\"failure\",\"cat\":\"restart\",\"ph\":\"i\",\"s\":\"g\",\"pid\":0,\"tid\":3,"
    "\"ts\":2000,\"args\":{\"restart\":3,\"rank\":0,\"how\":\"exited with status 1\"}},"
    "{\"name\":\"failure\",\"cat\":\"restart\",\"ph\":\"i\",\"pid\":0,\"tid\":3,\"ts\":100,"
    "\"args\":{\"restart\":1,\"rank\":2,\"how\":\"killed by signal 9 (Killed)\"}},"
    "{\"name\":\"recovery\",\"cat\":\"restart\",\"ph\":\"X\",\"pid\":0,\"tid\":3,\"ts\":100,"
    "\"dur\":300,\"args\":{\"restart\":1,\"from_step\":3,\"steps_lost\":2}},"
    "{\"name\":\"failure\",\"cat\":\"restart\",\"ph\":\"i\",\"pid\":0,\"tid\":3,\"ts\":1000,"
    "\"args\":{\"restart\":2,\"how\":\"exited with status 3\"}},"
    "{\"name\":\"step\",\"ph\":\"X\",\"pid\":0,\"tid\":2,\"ts\":0,\"dur\":100,"
    "\"args\":{\"step\":0,\"attempt\":0}},"
    "{\"name\":\"step\",\"ph\":\"X\",\"pid\":0,\"tid\":2,\"ts\":2300,\"dur\":100,"
    "\"args\":{\"step\":5,\"attempt\":3}},"
    "{\"name\":\"step\",\"ph\":\"X\",\"pid\":0,\"tid\":2,\"ts\":2400,\"dur\":100,"
    "\"args\":{\"step\":6,\"attempt\":3}},"
    "{\"name\":\"step\",\"ph\":\"X\",\"pid\":1,\"tid\":2,\"ts\":2450,\"dur\":150,"
    "\"args\":{\"step\":6,\"attempt\":3}}"
    "]}";

static void test_failures(void)
{
    dt_trace_summary s;
    char err[512];
    int rc = dt_trace_summarize(restarted, -1, &s, err, sizeof err);
    CHECK(rc == 0, "restarted: %s", err);
    if (rc) return;
    const dt_trace_failures *f = &s.failures;
    CHECK(f->n == 3 && f->f[0].restart == 1 && f->f[1].restart == 2 && f->f[2].restart == 3,
          "three failures in the order of their restarts");
    CHECK(f->f[0].rank == 2 && near(f->f[0].at_ms, 0.1) && near(f->f[0].recovery_ms, 0.3) &&
              f->f[0].from_step == 3 && f->f[0].lost == 2,
          "restart 1: rank 2 at 0.1 ms, 0.3 ms, from step 3, 2 lost");
    CHECK(f->f[1].rank == -1 && f->f[1].recovery_ms < 0 &&
              strcmp(f->f[1].how, "exited with status 3") == 0,
          "restart 2: no rank given, no recovery");
    CHECK(f->restarts == 2 && f->lost == 3 && near(f->recovery_ms, 0.8) && near(f->worst_ms, 0.5),
          "two recovered, 3 steps lost, 0.8 ms of recovery, 0.5 at most");
    CHECK(near(f->wall_ms, 2.6) && near(f->step_ms, 0.1) && near(f->lost_ms, 0.9),
          "wall 2.6 ms, pace 0.1, lost 0.9 (got %g %g %g)", f->wall_ms, f->step_ms, f->lost_ms);
    dt_trace_summary_free(&s);
    rc = dt_trace_summarize(two_ranks, -1, &s, err, sizeof err);
    CHECK(rc == 0 && s.failures.n == 0, "a trace without marks: no failures");
    dt_trace_summary_free(&s);
    CHECK_ERR(dt_trace_summarize("[{\"name\":\"recovery\",\"cat\":\"restart\",\"ph\":\"X\","
                                 "\"pid\":0,\"tid\":3,\"ts\":5,\"args\":{\"restart\":1}},"
                                 "{\"ph\":\"X\",\"pid\":0,\"tid\":2,\"ts\":1,\"dur\":1,"
                                 "\"args\":{\"step\":0}}]",
                                 -1, &s, err, sizeof err),
              err, "traceEvents[0]", "recovery mark needs ts, dur and args.restart");
}

static void test_errors(void)
{
    dt_trace_summary s;
    char err[512];
    CHECK_ERR(dt_trace_summarize("{\"traceEvents\":[", -1, &s, err, sizeof err), err,
              "not valid JSON");
    CHECK_ERR(dt_trace_summarize("{}", -1, &s, err, sizeof err), err, "no traceEvents");
    CHECK_ERR(dt_trace_summarize("{\"traceEvents\":[]}", -1, &s, err, sizeof err), err,
              "no events");
    CHECK_ERR(dt_trace_summarize("[{\"ph\":\"X\",\"pid\":0,\"tid\":0,\"ts\":1,\"dur\":1}]", -1, &s,
                                 err, sizeof err),
              err, "no \"step\" events");
    CHECK_ERR(dt_trace_summarize("[{\"ph\":\"X\",\"pid\":0,\"tid\":2,\"ts\":1,\"dur\":1}]", -1, &s,
                                 err, sizeof err),
              err, "without args.step");
    CHECK_ERR(dt_trace_summarize(two_ranks, 5, &s, err, sizeof err), err, "--from-step 5",
              "0..1");
    CHECK_ERR(dt_trace_summarize_file("/nonexistent/t.json", -1, &s, err, sizeof err), err,
              "/nonexistent/t.json");
}

int main(int argc, char **argv)
{
    char dir[256] = "/tmp/dtrain_test_trace_XXXXXX";
    if (argc > 1)
        snprintf(dir, sizeof dir, "%s", argv[1]);
    else if (!mkdtemp(dir))
        return perror("mkdtemp"), 1;
    test_off();
    test_chunks();
    test_threads();
    test_file(dir);
    test_restarted(dir);
    test_no_failure(dir);
    test_two_ranks();
    test_failures();
    test_errors();
    if (argc <= 1) {
        char p[512];
        snprintf(p, sizeof p, "%s/one.json", dir);
        unlink(p);
        rmdir(dir);
    }
    return finish("core.trace");
}
