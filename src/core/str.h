/* Formatting into fixed buffers where truncating a long message is the
 * intended behaviour (error texts), so no caller has to check for it. */
#ifndef DT_CORE_STR_H
#define DT_CORE_STR_H

#include <stdarg.h>
#include <stddef.h>

int dt_strf(char *buf, size_t len, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
int dt_vstrf(char *buf, size_t len, const char *fmt, va_list ap);
/* Whether s ends with suffix. */
int dt_ends_with(const char *s, const char *suffix);
/* "1, 2, 3, 4, 6 or 12": the divisors of n, for a message that says which
 * split sizes would work (truncated to fit). */
void dt_str_divisors(char *buf, size_t len, int n);

#endif
