/* Each rank's events of a restarted job kept in shared memory step by step
 * and read back by the next attempt. See trace_spool.h. */
#include "train/trace_spool.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/file.h"
#include "core/str.h"

#define SPOOL_MAX ((size_t)1 << 32) /* a file larger than this is not one of ours */

static struct {
    FILE *f;            /* NULL: not writing */
    char dir[256];
    int rank;
    long attempt;       /* -1: not opened */
    long long offset_ns;
    size_t written;     /* events of the recorder spooled so far */
} sp = {.attempt = -1};

void dt_trace_record_of(const dt_trace_event *e, long long offset_ns, int attempt,
                        dt_trace_record *r)
{
    memset(r, 0, sizeof *r);
    dt_strf(r->name, sizeof r->name, "%s", e->name ? e->name : "?");
    r->lane = (int32_t)e->lane;
    r->step = e->a.step;
    r->micro = e->a.micro;
    r->stage = e->a.stage;
    r->layer_lo = e->a.layer_lo;
    r->layer_hi = e->a.layer_hi;
    r->peer = e->a.peer;
    r->attempt = attempt;
    r->bytes = e->a.bytes;
    r->start_ns = (long long)e->start_ns + offset_ns;
    r->end_ns = (long long)e->end_ns + offset_ns;
}

static void spool_path(char *buf, size_t len, const char *dir, int rank, long attempt)
{
    dt_strf(buf, len, "%s/trace-%d.%ld", dir, rank, attempt);
}

int dt_trace_spool_open(const char *dir, int rank, long attempt, long long offset_ns, char *err,
                        size_t errlen)
{
    char path[320];
    dt_trace_spool_close();
    /* The earlier attempts' files are read back even when this one's
     * cannot be written. */
    dt_strf(sp.dir, sizeof sp.dir, "%s", dir);
    sp.rank = rank;
    sp.attempt = attempt;
    sp.offset_ns = offset_ns;
    sp.written = 0;
    spool_path(path, sizeof path, dir, rank, attempt);
    if (!(sp.f = fopen(path, "we")))
        return dt_strf(err, errlen, "--trace: cannot keep this attempt's events in %s for a "
                       "restart: %s", path, strerror(errno)), -1;
    return 0;
}

long dt_trace_spool_attempt(void) { return sp.attempt; }

static void stop_writing(void)
{
    if (sp.f) fclose(sp.f);
    sp.f = NULL;
}

void dt_trace_spool_close(void)
{
    stop_writing();
    sp.attempt = -1;
}

/* Whole records only, and flushed: a rank killed between steps leaves
 * every step it completed. */
static int append(const dt_trace_event *ev, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        dt_trace_record r;
        dt_trace_record_of(&ev[i], sp.offset_ns, (int)sp.attempt, &r);
        if (fwrite(&r, sizeof r, 1, sp.f) != 1) return -1;
    }
    return fflush(sp.f);
}

int dt_trace_spool_step(char *err, size_t errlen)
{
    if (!sp.f) return 0;
    dt_trace_event *ev;
    size_t n, dropped;
    errno = 0;
    int rc = dt_trace_snapshot_from(sp.written, &ev, &n, &dropped);
    if (rc == 0) rc = append(ev, n);
    const int e = errno;
    free(ev);
    if (rc == 0) {
        sp.written += n;
        return 0;
    }
    char path[320];
    spool_path(path, sizeof path, sp.dir, sp.rank, sp.attempt);
    dt_strf(err, errlen, "--trace: keeping this attempt's events in %s failed (%s); from here "
            "on a failure loses them from the trace", path, e ? strerror(e) : "?");
    stop_writing();
    return -1;
}

/* A record as a spool file holds it: a name that ends, a lane, an end not
 * before its start. A file torn or overwritten mid-record fails this. */
static int record_ok(const dt_trace_record *r)
{
    return memchr(r->name, '\0', sizeof r->name) && r->lane >= 0 && r->lane < DT_TRACE_LANES &&
           r->end_ns >= r->start_ns;
}

/* Appends the valid records of one file to *out. 0, or -1 out of memory. */
static int read_one(const char *path, dt_trace_record **out, size_t *n)
{
    char err[512];
    size_t len = 0;
    char *buf = dt_read_file(path, SPOOL_MAX, &len, err, sizeof err);
    if (!buf) return 0; /* that attempt's rank kept nothing here */
    size_t k = len / sizeof(dt_trace_record);
    dt_trace_record *grown = k ? realloc(*out, (*n + k) * sizeof **out) : *out;
    if (k && !grown) {
        free(buf);
        return -1;
    }
    *out = grown;
    for (size_t i = 0; i < k; i++) {
        dt_trace_record r;
        memcpy(&r, buf + i * sizeof r, sizeof r);
        if (record_ok(&r)) (*out)[(*n)++] = r;
    }
    free(buf);
    return 0;
}

int dt_trace_spool_earlier(dt_trace_record **out, size_t *n)
{
    *out = NULL;
    *n = 0;
    for (long a = 0; a < sp.attempt; a++) {
        char path[320];
        spool_path(path, sizeof path, sp.dir, sp.rank, a);
        if (read_one(path, out, n) == 0) continue;
        free(*out);
        *out = NULL;
        *n = 0;
        return -1;
    }
    return 0;
}
