/*
 * Measured paths for fp32 products (see matmul_paths.h).
 *
 * The file is a list of lines "<transA> <transB> <M> <N> <K> <path>
 * <sgemm GFLOP/s> <primitive GFLOP/s>", one per shape class, and two more
 * rates (sgemm and the primitive in pieces) where the class was timed in
 * pieces too; appended under flock(2) by whichever process measured first.
 * Lines starting with '#' and lines that do not parse (a write cut short)
 * are skipped. A process keeps
 * what it has read or measured in a table, so the file is read again only
 * when a class is missing.
 */
#include "kernels/matmul_paths.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <unistd.h>

#include "core/file.h"
#include "core/log.h"

/* The other path replaces the rule only when at least this much faster:
 * a shape both paths run equally well keeps the rule's bits on every CPU. */
#define SWITCH_GAIN 1.10
#define ROUNDS 5 /* the first warms up (and creates the primitive) */
/* Past this many seconds of timing a class stops after its second round:
 * a product of seconds (a large model's) is timed once each way. */
#define BUDGET_S 0.3

typedef struct {
    dt_mm_class c;
    dt_mm_path path;
} entry;

static const char *const names[DT_MM_PATHS] = {"primitive", "sgemm", "primitive/k256",
                                               "sgemm/k256"};
_Static_assert(DT_MM_K_PIECE == 256, "the paths' names give the piece");

/* The file's rate columns, in order (the paths a class was not timed on
 * are left out: they are the last two). */
static const dt_mm_path columns[DT_MM_PATHS] = {DT_MM_SGEMM, DT_MM_PRIMITIVE, DT_MM_SGEMM_PIECES,
                                                DT_MM_PRIMITIVE_PIECES};

/* Whether a class is timed in pieces too: a long reduction (K at least M
 * and N: the weight gradients, summed over the tokens) of 4 pieces or
 * more. Other shapes are timed on the two kernels whole. */
static int pieces_apply(const dt_mm_class *c)
{
    return c->K >= 4 * DT_MM_K_PIECE && c->K >= c->M && c->K >= c->N;
}

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static char *file_path; /* NULL: the rule only */
static entry *table;
static int entries, capacity;
static int timed_classes;
static double timed_seconds;

int dt_mm_class_size(int n)
{
    if (n <= 1) return n < 0 ? 0 : n;
    int p = 1;
    while (p < n) p *= 2; /* p/2 < n <= p */
    return p >= 4 && p / 4 * 3 >= n ? p / 4 * 3 : p;
}

static int same_class(const dt_mm_class *a, const dt_mm_class *b)
{
    return a->transA == b->transA && a->transB == b->transB && a->M == b->M && a->N == b->N &&
           a->K == b->K;
}

static const entry *find(const dt_mm_class *c)
{
    for (int i = 0; i < entries; i++)
        if (same_class(&table[i].c, c)) return &table[i];
    return NULL;
}

static int add(const dt_mm_class *c, dt_mm_path path)
{
    if (find(c)) return 0;
    if (entries == capacity) {
        int cap = capacity ? 2 * capacity : 64;
        entry *t = realloc(table, (size_t)cap * sizeof *t);
        if (!t) return -1;
        table = t, capacity = cap;
    }
    table[entries++] = (entry){*c, path};
    return 0;
}

static int parse_line(const char *line, entry *e)
{
    char path[24], tail;
    double rate[DT_MM_PATHS];
    int n = sscanf(line, "%d %d %d %d %d %23s %lf %lf %lf %lf %c", &e->c.transA, &e->c.transB,
                   &e->c.M, &e->c.N, &e->c.K, path, &rate[0], &rate[1], &rate[2], &rate[3], &tail);
    if ((n != 8 && n != 10) || (e->c.transA | e->c.transB) & ~1 || e->c.M < 0 || e->c.N < 0 ||
        e->c.K < 0)
        return -1;
    for (int p = 0; p < DT_MM_PATHS; p++)
        if (!strcmp(path, names[p])) return e->path = (dt_mm_path)p, 0;
    return -1;
}

/* A file of more than this is not one dtrain wrote (a line per class). */
#define MAX_FILE_BYTES (4u << 20)

/* A line that does not parse, other than a last one cut short: a hand's
 * edit gone wrong, said once per process (its class is timed again). */
static void warn_bad_line(const char *path, const char *line)
{
    static int warned;
    if (warned++) return;
    DT_WARN("matrix-product paths %s: skipping the line '%.80s': a line reads '<transA> <transB> "
            "<M> <N> <K> <path> <GFLOP/s>...' with path sgemm, primitive, sgemm/k256 or "
            "primitive/k256; that shape class is timed again",
            path, line);
}

/* Every line of the file into the table (those it lacks); *torn: the file
 * ends inside a line (a write cut short), which the next line must not
 * continue. A file that does not exist holds nothing. */
static int load(const char *path, int *torn, char *err, size_t errlen)
{
    size_t len;
    *torn = 0;
    if (access(path, F_OK) != 0 && errno == ENOENT) return 0;
    char *text = dt_read_file(path, MAX_FILE_BYTES, &len, err, errlen);
    if (!text) return -1;
    *torn = len > 0 && text[len - 1] != '\n';
    char *save = NULL;
    for (char *line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        entry e;
        if (line[0] == '#') continue;
        if (parse_line(line, &e) == 0)
            add(&e.c, e.path);
        else if (!(*torn && line + strlen(line) == text + len))
            warn_bad_line(path, line);
    }
    free(text);
    return 0;
}

int dt_mm_paths_use(const char *file, char *err, size_t errlen)
{
    pthread_mutex_lock(&lock);
    free(file_path);
    file_path = NULL;
    entries = 0;
    int rc = 0;
    if (file) {
        int torn;
        char why[256];
        if (load(file, &torn, why, sizeof why) != 0) {
            snprintf(err, errlen, "matrix-product paths: %s", why);
            rc = -1;
        }
        if (rc == 0 && !(file_path = strdup(file))) {
            snprintf(err, errlen, "matrix-product paths: out of memory");
            rc = -1;
        }
    }
    pthread_mutex_unlock(&lock);
    return rc;
}

/* Seconds of the fastest timed run of each of the n paths (after one to
 * warm up), taken in turn; the fastest, if it beats the rule (paths[0]) by
 * SWITCH_GAIN, else the rule; -1 when a path failed. */
static int measure(dt_mm_time_fn time, void *ctx, const dt_mm_path *paths, int n,
                   double best[DT_MM_PATHS])
{
    for (int i = 0; i < DT_MM_PATHS; i++) best[i] = 1e30;
    double spent = 0;
    timed_classes++;
    for (int r = 0; r < ROUNDS && (r < 2 || spent < BUDGET_S); r++)
        for (int i = 0; i < n; i++) {
            double s = time(ctx, paths[i]);
            if (s < 0) return -1;
            spent += s;
            timed_seconds += s;
            if (r > 0 && s < best[paths[i]]) best[paths[i]] = s;
        }
    dt_mm_path fastest = paths[0];
    for (int i = 1; i < n; i++)
        if (best[paths[i]] < best[fastest]) fastest = paths[i];
    return best[fastest] * SWITCH_GAIN <= best[paths[0]] ? (int)fastest : (int)paths[0];
}

/* The paths a class is timed on, the rule first; returns how many. */
static int candidates(const dt_mm_class *c, dt_mm_path rule, dt_mm_path *paths)
{
    int n = 0;
    paths[n++] = rule;
    paths[n++] = rule == DT_MM_SGEMM ? DT_MM_PRIMITIVE : DT_MM_SGEMM;
    if (pieces_apply(c)) paths[n++] = DT_MM_SGEMM_PIECES, paths[n++] = DT_MM_PRIMITIVE_PIECES;
    return n;
}

/* Measures a class missing from the table and the file, appends it to the
 * file; called with the lock held, and the file locked. */
static dt_mm_path measure_and_record(int fd, int torn, const dt_mm_class *c, double timed_flops,
                                     dt_mm_path rule, dt_mm_time_fn time, void *ctx)
{
    double best[DT_MM_PATHS];
    dt_mm_path paths[DT_MM_PATHS];
    int n = candidates(c, rule, paths);
    int chosen = measure(time, ctx, paths, n, best);
    if (chosen < 0) return rule; /* a path failed: the caller's product reports it */
    char line[200];
    int len = snprintf(line, sizeof line, "%s%d %d %d %d %d %s", torn ? "\n" : "", c->transA,
                       c->transB, c->M, c->N, c->K, names[chosen]);
    for (int i = 0; i < DT_MM_PATHS; i++)
        if (best[columns[i]] < 1e30) /* timed */
            len += snprintf(line + len, sizeof line - (size_t)len, " %.1f",
                            timed_flops / best[columns[i]] * 1e-9);
    len += snprintf(line + len, sizeof line - (size_t)len, "\n");
    if (write(fd, line, (size_t)len) != len)
        DT_WARN("matrix-product paths %s: %s; the choice for %d x %d x %d holds in this process "
                "only", file_path, strerror(errno), c->M, c->N, c->K);
    add(c, (dt_mm_path)chosen);
    return (dt_mm_path)chosen;
}

/* The file's answer, or a measurement written to it, under its lock. */
static dt_mm_path choose_with_file(const dt_mm_class *c, double timed_flops, dt_mm_path rule,
                                   dt_mm_time_fn time, void *ctx)
{
    int fd = open(file_path, O_RDWR | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd < 0) {
        DT_WARN("matrix-product paths %s: %s; the shapes not decided yet take the fixed rule",
                file_path, strerror(errno));
        free(file_path);
        file_path = NULL; /* the classes decided so far keep their paths */
        return rule;
    }
    while (flock(fd, LOCK_EX) != 0 && errno == EINTR) {
    }
    int torn;
    char why[256];
    const entry *e = load(file_path, &torn, why, sizeof why) == 0 ? find(c) : NULL;
    dt_mm_path path = e ? e->path : measure_and_record(fd, torn, c, timed_flops, rule, time, ctx);
    flock(fd, LOCK_UN);
    close(fd);
    return path;
}

dt_mm_path dt_mm_path_choose(int transA, int transB, int M, int N, int K, dt_mm_path rule,
                             double timed_flops, dt_mm_time_fn time, void *ctx)
{
    if (2.0 * M * N * K < DT_MM_PATHS_MIN_FLOPS) return rule;
    dt_mm_class c = {!!transA, !!transB, dt_mm_class_size(M), dt_mm_class_size(N),
                     dt_mm_class_size(K)};
    pthread_mutex_lock(&lock);
    const entry *e = find(&c);
    dt_mm_path path = e          ? e->path
                      : file_path ? choose_with_file(&c, timed_flops, rule, time, ctx)
                                  : rule;
    pthread_mutex_unlock(&lock);
    return path;
}

void dt_mm_paths_timed(int *classes, double *seconds)
{
    pthread_mutex_lock(&lock);
    *classes = timed_classes, *seconds = timed_seconds;
    pthread_mutex_unlock(&lock);
}
