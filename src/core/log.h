/* Logging to stderr, prefixed with the rank. Level from DTRAIN_LOG
 * (error, warn, info, debug; default warn). */
#ifndef DT_CORE_LOG_H
#define DT_CORE_LOG_H

enum { DT_LOG_ERROR = 0, DT_LOG_WARN, DT_LOG_INFO, DT_LOG_DEBUG };

void dt_log_set_rank(int rank);
int dt_log_enabled(int level);
void dt_log(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#define DT_WARN(...) dt_log(DT_LOG_WARN, __VA_ARGS__)
#define DT_INFO(...) dt_log(DT_LOG_INFO, __VA_ARGS__)
#define DT_DEBUG(...) dt_log(DT_LOG_DEBUG, __VA_ARGS__)

#endif
