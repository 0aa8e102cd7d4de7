#include "core/log.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int log_rank = -1;
static int log_level = DT_LOG_WARN;
static pthread_once_t level_once = PTHREAD_ONCE_INIT;

static int parse_level(void)
{
    const char *s = getenv("DTRAIN_LOG");
    if (!s || !*s) return DT_LOG_WARN;
    if (!strcmp(s, "error")) return DT_LOG_ERROR;
    if (!strcmp(s, "warn")) return DT_LOG_WARN;
    if (!strcmp(s, "info")) return DT_LOG_INFO;
    if (!strcmp(s, "debug")) return DT_LOG_DEBUG;
    fprintf(stderr, "dtrain: DTRAIN_LOG=%s is not one of error, warn, info, debug; using warn\n", s);
    return DT_LOG_WARN;
}

void dt_log_set_rank(int rank) { log_rank = rank; }

/* Several threads may log first at once; the level is read exactly once. */
static void init_level(void) { log_level = parse_level(); }

int dt_log_enabled(int level)
{
    pthread_once(&level_once, init_level);
    return level <= log_level;
}

void dt_log(int level, const char *fmt, ...)
{
    static const char *names[] = {"error", "warn", "info", "debug"};
    if (!dt_log_enabled(level)) return;
    char line[1024];
    int n = log_rank >= 0 ? snprintf(line, sizeof line, "dtrain[%d] %s: ", log_rank, names[level])
                          : snprintf(line, sizeof line, "dtrain %s: ", names[level]);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line + n, sizeof line - (size_t)n, fmt, ap);
    va_end(ap);
    /* One write per line so that lines of concurrent ranks do not interleave. */
    fprintf(stderr, "%s\n", line);
}
