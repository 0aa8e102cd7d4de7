/*
 * Measured paths for fp32 products (see matmul_paths.h).
 *
 * The file is a list of lines "<transA> <transB> <M> <N> <K> <path>
 * <sgemm GFLOP/s> <primitive GFLOP/s>", one per shape class, appended under
 * flock(2) by whichever process measured first; lines starting with '#' and
 * lines that do not parse (a write cut short) are skipped. A process keeps
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
    int sgemm;
} entry;

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

static int add(const dt_mm_class *c, int sgemm)
{
    if (find(c)) return 0;
    if (entries == capacity) {
        int cap = capacity ? 2 * capacity : 64;
        entry *t = realloc(table, (size_t)cap * sizeof *t);
        if (!t) return -1;
        table = t, capacity = cap;
    }
    table[entries++] = (entry){*c, sgemm};
    return 0;
}

static int parse_line(const char *line, entry *e)
{
    char path[16], tail;
    double gs, gp;
    int n = sscanf(line, "%d %d %d %d %d %15s %lf %lf %c", &e->c.transA, &e->c.transB, &e->c.M,
                   &e->c.N, &e->c.K, path, &gs, &gp, &tail);
    if (n != 8 || (e->c.transA | e->c.transB) & ~1 || e->c.M < 0 || e->c.N < 0 || e->c.K < 0)
        return -1;
    if (!strcmp(path, "sgemm")) e->sgemm = 1;
    else if (!strcmp(path, "primitive")) e->sgemm = 0;
    else return -1;
    return 0;
}

/* A file of more than this is not one dtrain wrote (a line per class). */
#define MAX_FILE_BYTES (4u << 20)

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
        if (line[0] != '#' && parse_line(line, &e) == 0) add(&e.c, e.sgemm);
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

/* Seconds of the fastest timed run of each path (after one to warm up),
 * taken in turn; 1 when sgemm should run, 0 for the primitive. */
static int measure(dt_mm_time_fn time, void *ctx, int rule_sgemm, double best[2])
{
    best[0] = best[1] = 1e30; /* [primitive, sgemm] */
    double spent = 0;
    timed_classes++;
    for (int r = 0; r < ROUNDS && (r < 2 || spent < BUDGET_S); r++)
        for (int i = 0; i < 2; i++) {
            int path = i ? !rule_sgemm : rule_sgemm;
            double s = time(ctx, path);
            if (s < 0) return -1;
            spent += s;
            timed_seconds += s;
            if (r > 0 && s < best[path]) best[path] = s;
        }
    return best[!rule_sgemm] * SWITCH_GAIN <= best[rule_sgemm] ? !rule_sgemm : rule_sgemm;
}

/* Measures a class missing from the table and the file, appends it to the
 * file; called with the lock held, and the file locked. */
static int measure_and_record(int fd, int torn, const dt_mm_class *c, double timed_flops,
                              int rule_sgemm, dt_mm_time_fn time, void *ctx)
{
    double best[2];
    int sgemm = measure(time, ctx, rule_sgemm, best);
    if (sgemm < 0) return rule_sgemm; /* a path failed: the caller's product reports it */
    char line[160];
    int n = snprintf(line, sizeof line, "%s%d %d %d %d %d %s %.1f %.1f\n", torn ? "\n" : "",
                     c->transA, c->transB, c->M, c->N, c->K, sgemm ? "sgemm" : "primitive",
                     timed_flops / best[1] * 1e-9, timed_flops / best[0] * 1e-9);
    if (write(fd, line, (size_t)n) != n)
        DT_WARN("matrix-product paths %s: %s; the choice for %d x %d x %d holds in this process "
                "only", file_path, strerror(errno), c->M, c->N, c->K);
    add(c, sgemm);
    return sgemm;
}

/* The file's answer, or a measurement written to it, under its lock. */
static int choose_with_file(const dt_mm_class *c, double timed_flops, int rule_sgemm,
                            dt_mm_time_fn time, void *ctx)
{
    int fd = open(file_path, O_RDWR | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd < 0) {
        DT_WARN("matrix-product paths %s: %s; the shapes not decided yet take the fixed rule",
                file_path, strerror(errno));
        free(file_path);
        file_path = NULL; /* the classes decided so far keep their paths */
        return rule_sgemm;
    }
    while (flock(fd, LOCK_EX) != 0 && errno == EINTR) {
    }
    int torn;
    char why[256];
    const entry *e = load(file_path, &torn, why, sizeof why) == 0 ? find(c) : NULL;
    int sgemm =
        e ? e->sgemm : measure_and_record(fd, torn, c, timed_flops, rule_sgemm, time, ctx);
    flock(fd, LOCK_UN);
    close(fd);
    return sgemm;
}

int dt_mm_path_choose(int transA, int transB, int M, int N, int K, int rule_sgemm,
                      double timed_flops, dt_mm_time_fn time, void *ctx)
{
    if (2.0 * M * N * K < DT_MM_PATHS_MIN_FLOPS) return rule_sgemm;
    dt_mm_class c = {!!transA, !!transB, dt_mm_class_size(M), dt_mm_class_size(N),
                     dt_mm_class_size(K)};
    pthread_mutex_lock(&lock);
    const entry *e = find(&c);
    int sgemm = e          ? e->sgemm
                : file_path ? choose_with_file(&c, timed_flops, rule_sgemm, time, ctx)
                            : rule_sgemm;
    pthread_mutex_unlock(&lock);
    return sgemm;
}

void dt_mm_paths_timed(int *classes, double *seconds)
{
    pthread_mutex_lock(&lock);
    *classes = timed_classes, *seconds = timed_seconds;
    pthread_mutex_unlock(&lock);
}
