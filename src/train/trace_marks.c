/* A restarted job's attempts, failures and recoveries: lines in a file of
 * the job's directory, read back into the timeline. See trace_marks.h.
 *
 * The file (one mark a line, times in ns):
 *   attempt K BEGAN_NS
 *   failure K FAILURE_NS RANK HOW...      (RANK ? when the launcher did not say)
 *   recovery K FAILURE_NS TOOK_NS FROM_STEP LOST   (LOST -1: unknown) */
#include "train/trace_marks.h"

#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "core/str.h"
#include "core/trace_json.h"

#define HOW_LEN 96
#define MARKS_FILE "trace-marks"

typedef enum { MARK_ATTEMPT, MARK_FAILURE, MARK_RECOVERY } mark_kind;

typedef struct {
    mark_kind kind;
    long attempt;          /* the restart count: of the attempt, or the failure's */
    long long ns, dur_ns;  /* dur: a recovery's */
    long rank, from, lost; /* -1: unknown */
    char how[HOW_LEN];
} mark;

struct dt_trace_marks {
    mark *m;
    size_t n;
};

static struct {
    char path[320]; /* empty: no marks kept */
    long attempt;
} mk;

/* One line appended (first: the file started afresh); a mark that cannot
 * be written is left out, as the snapshots' history does. */
static void add_line(int first, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void add_line(int first, const char *fmt, ...)
{
    FILE *f = fopen(mk.path, first ? "we" : "ae");
    if (!f) return;
    va_list ap;
    va_start(ap, fmt);
    vfprintf(f, fmt, ap);
    va_end(ap);
    fclose(f);
}

int dt_trace_marks_open(const char *dir, long attempt, uint64_t began_ns, uint64_t failure_ns,
                        const char *failed_rank, const char *how, char *err, size_t errlen)
{
    mk.path[0] = '\0';
    char path[sizeof mk.path];
    dt_strf(path, sizeof path, "%s/" MARKS_FILE, dir);
    FILE *f = fopen(path, attempt == 0 ? "we" : "ae");
    if (!f)
        return dt_strf(err, errlen, "--trace: cannot keep the job's restarts in %s: %s", path,
                       strerror(errno)), -1;
    fclose(f);
    memcpy(mk.path, path, sizeof path);
    mk.attempt = attempt;
    add_line(0, "attempt %ld %llu\n", attempt, (unsigned long long)began_ns);
    if (attempt == 0 || failure_ns == 0) return 0;
    /* The launcher's words, on one line. */
    char words[HOW_LEN];
    dt_strf(words, sizeof words, "%s", how && how[0] ? how : "failed");
    for (char *c = words; *c; c++)
        if (*c == '\n' || *c == '\r') *c = ' ';
    add_line(0, "failure %ld %llu %s %s\n", attempt, (unsigned long long)failure_ns,
             failed_rank && failed_rank[0] ? failed_rank : "?", words);
    return 0;
}

void dt_trace_mark_recovery(uint64_t failure_ns, uint64_t took_ns, long from_step, long lost)
{
    if (!mk.path[0] || mk.attempt == 0) return;
    add_line(0, "recovery %ld %llu %llu %ld %ld\n", mk.attempt, (unsigned long long)failure_ns,
             (unsigned long long)took_ns, from_step, lost);
}

/* Whether the file marks the failure of restart k already. */
static int marked(long k)
{
    FILE *f = fopen(mk.path, "re");
    char line[256];
    long attempt;
    int found = 0;
    while (f && !found && fgets(line, sizeof line, f))
        found = sscanf(line, "failure %ld", &attempt) == 1 && attempt == k;
    if (f) fclose(f);
    return found;
}

void dt_trace_marks_backfill(const char *failures)
{
    if (!mk.path[0] || !failures) return;
    for (const char *at = failures; *at;) {
        const char *end = strchr(at, '\n');
        const size_t len = end ? (size_t)(end - at) : strlen(at);
        char line[256];
        long k;
        unsigned long long ns;
        int rank, used = 0;
        dt_strf(line, sizeof line, "%.*s", (int)(len < sizeof line ? len : sizeof line - 1),
                at);
        if (sscanf(line, "%ld %llu %d %n", &k, &ns, &rank, &used) == 3 && used &&
            k < mk.attempt && !marked(k))
            add_line(0, "failure %ld %llu %d %s\n", k, ns, rank, line + used);
        at += len + (end != NULL);
    }
}

void dt_trace_marks_close(void) { mk.path[0] = '\0'; }

/* ---- reading them back ------------------------------------------------------------ */

/* One line into m: 1, or 0 for a line that is not a mark (a torn one). */
static int parse_line(char *line, mark *m)
{
    char kind[16], who[16];
    unsigned long long a = 0, b = 0;
    int used = 0;
    memset(m, 0, sizeof *m);
    m->rank = m->from = m->lost = -1;
    line[strcspn(line, "\n")] = '\0';
    if (sscanf(line, "%15s %ld %llu%n", kind, &m->attempt, &a, &used) < 3) return 0;
    m->ns = (long long)a;
    const char *rest = line + used;
    if (strcmp(kind, "attempt") == 0) {
        m->kind = MARK_ATTEMPT;
        return 1;
    }
    if (strcmp(kind, "failure") == 0) {
        int at = 0;
        if (sscanf(rest, " %15s %n", who, &at) < 1 || !rest[at]) return 0;
        m->kind = MARK_FAILURE;
        if (strcmp(who, "?") != 0 && sscanf(who, "%ld", &m->rank) != 1) return 0;
        dt_strf(m->how, sizeof m->how, "%s", rest + at);
        return 1;
    }
    if (strcmp(kind, "recovery") != 0 || sscanf(rest, "%llu %ld %ld", &b, &m->from, &m->lost) != 3)
        return 0;
    m->kind = MARK_RECOVERY;
    m->dur_ns = (long long)b;
    return 1;
}

dt_trace_marks *dt_trace_marks_read(void)
{
    FILE *f = mk.path[0] ? fopen(mk.path, "re") : NULL;
    if (!f) return NULL;
    dt_trace_marks *t = calloc(1, sizeof *t);
    size_t cap = 0;
    int failures = 0;
    char line[256];
    while (t && fgets(line, sizeof line, f)) {
        mark m;
        if (!parse_line(line, &m)) continue;
        if (t->n == cap) {
            cap = cap ? 2 * cap : 16;
            mark *g = realloc(t->m, cap * sizeof *g);
            if (!g) break;
            t->m = g;
        }
        t->m[t->n++] = m;
        failures += m.kind == MARK_FAILURE;
    }
    fclose(f);
    if (t && failures) return t;
    dt_trace_marks_free(t);
    return NULL;
}

long long dt_trace_marks_t0(const dt_trace_marks *m)
{
    long long t0 = m->n ? m->m[0].ns : 0;
    for (size_t i = 1; i < m->n; i++)
        if (m->m[i].ns < t0) t0 = m->m[i].ns;
    return t0;
}

static void put_mark(FILE *f, const mark *m, long long t0)
{
    static const char *const names[] = {"attempt", "failure", "recovery"};
    fprintf(f, "{\"name\":\"%s\",\"cat\":\"restart\",\"ph\":\"%s\",\"pid\":0,\"tid\":%d,"
               "\"ts\":%.3f,", names[m->kind], m->kind == MARK_RECOVERY ? "X" : "i",
            DT_TRACE_MARKS_TID, (double)(m->ns - t0) * 1e-3);
    if (m->kind == MARK_ATTEMPT) {
        fprintf(f, "\"s\":\"p\",\"args\":{\"attempt\":%ld}}", m->attempt);
    } else if (m->kind == MARK_FAILURE) {
        /* Global: a line across every rank's rows. */
        fprintf(f, "\"s\":\"g\",\"args\":{\"restart\":%ld,", m->attempt);
        if (m->rank >= 0) fprintf(f, "\"rank\":%ld,", m->rank);
        fputs("\"how\":", f);
        dt_trace_json_str(f, m->how);
        fputs("}}", f);
    } else {
        fprintf(f, "\"dur\":%.3f,\"args\":{\"restart\":%ld,\"from_step\":%ld",
                (double)m->dur_ns * 1e-3, m->attempt, m->from);
        if (m->lost >= 0) fprintf(f, ",\"steps_lost\":%ld", m->lost);
        fputs("}}", f);
    }
}

void dt_trace_marks_put(FILE *f, const dt_trace_marks *m, long long t0, int *first)
{
    dt_trace_json_next(f, first);
    fprintf(f, "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":0,\"tid\":%d,"
               "\"args\":{\"name\":\"restarts\"}}", DT_TRACE_MARKS_TID);
    for (size_t i = 0; i < m->n; i++) {
        dt_trace_json_next(f, first);
        put_mark(f, &m->m[i], t0);
    }
}

void dt_trace_marks_free(dt_trace_marks *m)
{
    if (m) free(m->m);
    free(m);
}
