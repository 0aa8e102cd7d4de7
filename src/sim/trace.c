/* The simulated timeline's recorder and file (trace.h). Like
 * train/trace_file.c, the JSON is printed line by line, not built. */
#include "sim/trace.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/atomic_file.h"
#include "core/trace_json.h"

#define NAME_LEN 40

/* Names are copied: a collective's label lives only as long as its
 * schedule, and the file is written after the run. */
typedef struct {
    char name[NAME_LEN];
    int rank, lane;
    double t0, t1, bytes;
} span;

struct dt_sim_trace {
    int ranks;
    int *slot; /* [ranks]: index among the kept ranks, or -1 */
    int kept;
    span *sp;
    size_t n, cap;
};

/* Every rank up to max; else both ends' hosts and a stride between. */
static void choose(dt_sim_trace *t, int per_host, int max)
{
    int edge = per_host < max / 4 ? per_host : max / 4;
    int stride = t->ranks / (max - 2 * edge > 0 ? max - 2 * edge : 1) + 1;
    for (int r = 0; r < t->ranks; r++) {
        int keep = t->ranks <= max || r < edge || r >= t->ranks - edge || r % stride == 0;
        t->slot[r] = keep ? t->kept++ : -1;
    }
}

dt_sim_trace *dt_sim_trace_new(int ranks, int per_host, int max)
{
    dt_sim_trace *t = calloc(1, sizeof *t);
    if (!t || !(t->slot = malloc((size_t)ranks * sizeof *t->slot))) {
        free(t);
        return NULL;
    }
    t->ranks = ranks;
    choose(t, per_host, max);
    return t;
}

void dt_sim_trace_free(dt_sim_trace *t)
{
    if (!t) return;
    free(t->slot);
    free(t->sp);
    free(t);
}

int dt_sim_trace_kept(const dt_sim_trace *t) { return t->kept; }

void dt_sim_trace_span(void *ctx, int rank, dt_trace_lane lane, const char *name, double t0,
                       double t1, double bytes)
{
    dt_sim_trace *t = ctx;
    if (t->slot[rank] < 0) return;
    if (t->n == t->cap) {
        size_t cap = t->cap ? 2 * t->cap : 1024;
        span *s = realloc(t->sp, cap * sizeof *s);
        if (!s) return; /* the span is lost; the run goes on */
        t->sp = s;
        t->cap = cap;
    }
    span *s = &t->sp[t->n++];
    snprintf(s->name, sizeof s->name, "%s", name ? name : "?");
    s->rank = rank;
    s->lane = (int)lane;
    s->t0 = t0;
    s->t1 = t1;
    s->bytes = bytes;
}

/* ---- the file ----------------------------------------------------------------- */

/* Names are the simulator's own literals and algorithm names: no quotes
 * or control characters to escape. */
static void put_span(FILE *f, const span *s, int step, int *first)
{
    dt_trace_json_next(f, first);
    fprintf(f, "{\"name\":\"%s\",\"cat\":\"%s\",\"ph\":\"X\",\"pid\":%d,\"tid\":%d,"
               "\"ts\":%.3f,\"dur\":%.3f", s->name, dt_trace_lane_cats[s->lane], s->rank,
            s->lane, s->t0 * 1e6, (s->t1 - s->t0) * 1e6);
    if (step)
        fputs(",\"args\":{\"step\":0}", f);
    else if (s->bytes >= 0)
        fprintf(f, ",\"args\":{\"bytes\":%.0f}", s->bytes);
    fputs("}", f);
}

/* Each kept rank's step: from 0 to its last span's end. */
static void put_steps(FILE *f, const dt_sim_trace *t, int *first)
{
    double *end = calloc((size_t)t->ranks, sizeof *end);
    if (!end) return;
    for (size_t i = 0; i < t->n; i++)
        if (t->sp[i].t1 > end[t->sp[i].rank]) end[t->sp[i].rank] = t->sp[i].t1;
    for (int r = 0; r < t->ranks; r++) {
        if (t->slot[r] < 0) continue;
        span s = {"step", r, DT_TRACE_STEP, 0, end[r], -1};
        put_span(f, &s, 1, first);
    }
    free(end);
}

static void put_other(FILE *f, const dt_sim_trace *t)
{
    fprintf(f, "\"otherData\":{\"producer\":\"dtrain simulate\",\"ranks\":%d,"
               "\"clock\":\"simulated seconds from 0\",\"ranks_shown\":[", t->ranks);
    const char *sep = "";
    for (int r = 0; r < t->ranks; r++)
        if (t->slot[r] >= 0) fprintf(f, "%s%d", sep, r), sep = ",";
    fputs("]}}\n", f);
}

static int render(const dt_sim_trace *t, char **buf, size_t *len)
{
    FILE *f = open_memstream(buf, len);
    if (!f) return -1;
    int first = 1;
    fputs("{\"traceEvents\":[\n", f);
    for (int r = 0; r < t->ranks; r++)
        if (t->slot[r] >= 0) dt_trace_json_rank(f, r, &first);
    for (size_t i = 0; i < t->n; i++) put_span(f, &t->sp[i], 0, &first);
    put_steps(f, t, &first);
    fputs("\n],\n\"displayTimeUnit\":\"ms\",\n", f);
    put_other(f, t);
    int bad = ferror(f);
    if (fclose(f) != 0 || bad) {
        free(*buf);
        *buf = NULL;
        return -1;
    }
    return 0;
}

int dt_sim_trace_write(const dt_sim_trace *t, const char *path, char *err, size_t len)
{
    char *buf = NULL;
    size_t n = 0;
    if (render(t, &buf, &n)) {
        snprintf(err, len, "--trace %s: out of memory for the file's text", path);
        return -1;
    }
    char why[1024];
    int rc = dt_afile_write_file(path, buf, n, why, sizeof why);
    if (rc) snprintf(err, len, "--trace %s: %s", path, why);
    free(buf);
    return rc ? -1 : 0;
}
