/* The job's timeline file: clocks aligned to rank 0's, every rank's events
 * sent to rank 0 (a count, then the records: there is no gatherv), and
 * rank 0 writing Trace Event JSON; under restarts, the earlier attempts'
 * events from each rank's spool and rank 0's marks of the failures. See
 * trace_file.h.
 *
 * The JSON is printed, not built as a cJSON tree: a long run holds
 * hundreds of thousands of events, and each is one line whose strings are
 * the recorder's literal names. */
#include "train/trace_file.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/atomic_file.h"
#include "core/env.h"
#include "core/str.h"
#include "core/timer.h"
#include "core/trace.h"
#include "core/trace_json.h"
#include "train/trace_marks.h"
#include "train/trace_spool.h"

#define SYNC_ROUNDS 8

/* Nanoseconds to add to this process's clock to read rank 0's. */
static long long clock_offset_ns;
static int clock_estimated; /* the offsets were measured, not known to be 0 */

/* ---- clocks --------------------------------------------------------------- */

long long dt_trace_clock_offset_ns(void) { return clock_offset_ns; }

/* Rank 0's side with peer: SYNC_ROUNDS pings; the peer answers with its
 * clock. The round trip of least delay was disturbed least, and its
 * midpoint is when the peer read its clock. */
static int measure_peer(dt_comm *w, int peer, long long *peer_minus_mine)
{
    uint64_t best = UINT64_MAX;
    for (int k = 0; k < SYNC_ROUNDS; k++) {
        long long t1 = 0, t0 = (long long)dt_now_ns();
        int rc = dt_send(w, &t0, 1, DT_I64, peer);
        if (rc == 0) rc = dt_recv(w, &t1, 1, DT_I64, peer);
        if (rc) return rc;
        long long t2 = (long long)dt_now_ns();
        if ((uint64_t)(t2 - t0) < best) {
            best = (uint64_t)(t2 - t0);
            *peer_minus_mine = t1 - (t0 + (t2 - t0) / 2);
        }
    }
    return 0;
}

static int answer_pings(dt_comm *w)
{
    for (int k = 0; k < SYNC_ROUNDS; k++) {
        long long ping, now;
        int rc = dt_recv(w, &ping, 1, DT_I64, 0);
        now = (long long)dt_now_ns();
        if (rc == 0) rc = dt_send(w, &now, 1, DT_I64, 0);
        if (rc) return rc;
    }
    return dt_recv(w, &clock_offset_ns, 1, DT_I64, 0);
}

int dt_trace_sync_clock(dt_comm *world)
{
    clock_offset_ns = 0;
    clock_estimated = 0;
    if (!world || dt_comm_size(world) == 1) return 0;
    const char *force = dt_env_str("DTRAIN_TRACE_CLOCK_SYNC");
    int one_host = dt_comm_local_size(world) == dt_comm_size(world);
    if (one_host && !(force && strcmp(force, "1") == 0)) return 0;
    clock_estimated = 1;
    if (dt_comm_rank(world) != 0) return answer_pings(world);
    for (int r = 1; r < dt_comm_size(world); r++) {
        long long off = 0;
        int rc = measure_peer(world, r, &off);
        off = -off; /* what the peer adds to read rank 0's clock */
        if (rc == 0) rc = dt_send(world, &off, 1, DT_I64, r);
        if (rc) return rc;
    }
    return 0;
}

/* ---- events on the wire ----------------------------------------------------- */

/* What a rank sends first: its event count, events dropped, its offset. */
typedef struct {
    long long n, dropped, offset_ns;
} wire_head;

/* This rank's events as records (malloc'd, NULL when none): under
 * restarts, its earlier attempts' from the spool, then this attempt's. */
static int local_events(dt_trace_record **out, wire_head *h)
{
    dt_trace_event *ev;
    dt_trace_record *earlier;
    size_t n, dropped, k;
    *out = NULL;
    if (dt_trace_spool_earlier(&earlier, &k)) return -1;
    if (dt_trace_snapshot(&ev, &n, &dropped)) return free(earlier), -1;
    h->n = (long long)(k + n);
    h->dropped = (long long)dropped;
    h->offset_ns = clock_offset_ns;
    if (k + n > 0 && !(*out = realloc(earlier, (k + n) * sizeof **out))) {
        free(earlier);
        free(ev);
        return -1;
    }
    int attempt = (int)dt_trace_spool_attempt();
    for (size_t i = 0; i < n; i++)
        dt_trace_record_of(&ev[i], clock_offset_ns, attempt, &(*out)[k + i]);
    free(ev);
    return 0;
}

static int send_events(dt_comm *w, char *err, size_t errlen)
{
    dt_trace_record *ev;
    wire_head h = {0, 0, clock_offset_ns};
    if (local_events(&ev, &h)) h.n = 0; /* out of memory: the rank's row stays empty */
    int rc = dt_send(w, &h, 3, DT_I64, 0);
    if (rc == 0 && h.n > 0) rc = dt_send(w, ev, (size_t)h.n * sizeof *ev, DT_U8, 0);
    free(ev);
    if (rc) dt_strf(err, errlen, "--trace: sending this rank's events to rank 0: %s",
                    dt_comm_error(w));
    return rc ? -1 : 0;
}

/* ---- rank 0: the file --------------------------------------------------------- */

typedef struct {
    int ranks;
    dt_trace_record **ev; /* per rank */
    wire_head *head;      /* per rank */
    dt_trace_marks *marks; /* the job's restarts, or NULL */
    int restarts;          /* before the attempt writing; > 0: args.attempt on every event */
} job_events;

static void job_free(job_events *j)
{
    for (int r = 0; j->ev && r < j->ranks; r++) free(j->ev[r]);
    free(j->ev);
    free(j->head);
    dt_trace_marks_free(j->marks);
}

static int gather_events(dt_comm *w, job_events *j, char *err, size_t errlen)
{
    j->ranks = w ? dt_comm_size(w) : 1;
    j->ev = calloc((size_t)j->ranks, sizeof *j->ev);
    j->head = calloc((size_t)j->ranks, sizeof *j->head);
    if (!j->ev || !j->head || local_events(&j->ev[0], &j->head[0]))
        return dt_strf(err, errlen, "--trace: out of memory for the events"), -1;
    for (int r = 1; r < j->ranks; r++) {
        wire_head *h = &j->head[r];
        int rc = dt_recv(w, h, 3, DT_I64, r);
        if (rc == 0 && h->n > 0 && !(j->ev[r] = malloc((size_t)h->n * sizeof(dt_trace_record))))
            return dt_strf(err, errlen, "--trace: out of memory for rank %d's events", r), -1;
        if (rc == 0 && h->n > 0)
            rc = dt_recv(w, j->ev[r], (size_t)h->n * sizeof(dt_trace_record), DT_U8, r);
        if (rc)
            return dt_strf(err, errlen, "--trace: receiving rank %d's events: %s", r,
                           dt_comm_error(w)), -1;
    }
    return 0;
}

/* Only the fields that are present. */
static void put_args(FILE *f, const dt_trace_record *e, int restarts)
{
    const char *sep = "";
    fputs(",\"args\":{", f);
    const struct { const char *key; int32_t v; } ints[] = {
        {"step", e->step}, {"micro", e->micro}, {"stage", e->stage}, {"peer", e->peer}};
    for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++) {
        if (ints[i].v < 0) continue;
        fprintf(f, "%s\"%s\":%d", sep, ints[i].key, (int)ints[i].v);
        sep = ",";
    }
    int lo = e->layer_lo, hi = e->layer_hi;
    if (lo >= 0 || hi >= 0) {
        if (lo >= 0 && hi >= 0)
            fprintf(f, "%s\"layers\":\"%d-%d\"", sep, lo, hi);
        else
            fprintf(f, "%s\"layers\":\"%d\"", sep, lo >= 0 ? lo : hi);
        sep = ",";
    }
    if (e->bytes >= 0) fprintf(f, "%s\"bytes\":%lld", sep, (long long)e->bytes), sep = ",";
    if (restarts && e->attempt >= 0) fprintf(f, "%s\"attempt\":%d", sep, (int)e->attempt);
    fputc('}', f);
}

static void put_event(FILE *f, int rank, const dt_trace_record *e, long long t0, int restarts,
                      int *first)
{
    int lane = e->lane >= 0 && e->lane < DT_TRACE_LANES ? e->lane : 0;
    dt_trace_json_next(f, first);
    fputs("{\"name\":", f);
    dt_trace_json_str(f, e->name);
    fprintf(f, ",\"cat\":\"%s\",\"ph\":\"X\",\"pid\":%d,\"tid\":%d,\"ts\":%.3f,\"dur\":%.3f",
            dt_trace_lane_cats[lane], rank, lane, (double)(e->start_ns - t0) * 1e-3,
            (double)(e->end_ns - e->start_ns) * 1e-3);
    put_args(f, e, restarts);
    fputc('}', f);
}

/* The earliest start of any rank's event or of a restart's mark (0 when
 * there are none). */
static long long job_t0(const job_events *j)
{
    long long t0 = j->marks ? dt_trace_marks_t0(j->marks) : 0;
    int any = j->marks != NULL;
    for (int r = 0; r < j->ranks; r++)
        for (long long i = 0; i < j->head[r].n; i++)
            if (!any || j->ev[r][i].start_ns < t0) t0 = j->ev[r][i].start_ns, any = 1;
    return t0;
}

static void put_other(FILE *f, const job_events *j, long long t0)
{
    fprintf(f, "\"otherData\":{\"producer\":\"dtrain\",\"ranks\":%d,", j->ranks);
    if (j->restarts) fprintf(f, "\"attempts\":%d,", j->restarts + 1);
    fprintf(f, "\"t0_ns\":%lld,\"clock\":\"%s\",\"clock_offsets_ns\":[", t0,
            clock_estimated ? "CLOCK_MONOTONIC, offsets to rank 0 estimated by ping-pong"
                            : "CLOCK_MONOTONIC shared by all ranks (one host)");
    for (int r = 0; r < j->ranks; r++) fprintf(f, "%s%lld", r ? "," : "", j->head[r].offset_ns);
    fputs("],\"dropped_events\":[", f);
    for (int r = 0; r < j->ranks; r++) fprintf(f, "%s%lld", r ? "," : "", j->head[r].dropped);
    fputs("]}}\n", f);
}

/* The whole file into a malloc'd buffer. */
static int render(const job_events *j, char **buf, size_t *len)
{
    FILE *f = open_memstream(buf, len);
    if (!f) return -1;
    long long t0 = job_t0(j);
    int first = 1;
    fputs("{\"traceEvents\":[\n", f);
    for (int r = 0; r < j->ranks; r++) dt_trace_json_rank(f, r, &first);
    for (int r = 0; r < j->ranks; r++)
        for (long long i = 0; i < j->head[r].n; i++)
            put_event(f, r, &j->ev[r][i], t0, j->restarts, &first);
    if (j->marks) dt_trace_marks_put(f, j->marks, t0, &first);
    fputs("\n],\n\"displayTimeUnit\":\"ms\",\n", f);
    put_other(f, j, t0);
    int bad = ferror(f);
    if (fclose(f) != 0 || bad) {
        free(*buf);
        *buf = NULL;
        return -1;
    }
    return 0;
}

int dt_trace_write(dt_comm *world, const char *path, char *err, size_t errlen)
{
    if (world && dt_comm_rank(world) != 0) return send_events(world, err, errlen);
    job_events j = {0};
    char *buf = NULL;
    size_t len = 0;
    int rc = gather_events(world, &j, err, errlen);
    long attempt = dt_trace_spool_attempt();
    j.restarts = attempt > 0 ? (int)attempt : 0;
    j.marks = dt_trace_marks_read();
    if (rc == 0 && render(&j, &buf, &len))
        rc = (dt_strf(err, errlen, "--trace %s: out of memory for the file's text", path), -1);
    if (rc == 0) {
        char why[1024];
        rc = dt_afile_write_file(path, buf, len, why, sizeof why);
        if (rc) dt_strf(err, errlen, "--trace %s: %s", path, why);
    }
    free(buf);
    job_free(&j);
    return rc ? -1 : 0;
}
