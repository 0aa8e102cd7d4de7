#include "core/str.h"

#include <string.h>

#include <stdio.h>

int dt_vstrf(char *buf, size_t len, const char *fmt, va_list ap)
{
    if (!len) return 0;
    int n = vsnprintf(buf, len, fmt, ap);
    return n < 0 ? 0 : ((size_t)n >= len ? (int)len - 1 : n);
}

int dt_strf(char *buf, size_t len, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = dt_vstrf(buf, len, fmt, ap);
    va_end(ap);
    return n;
}

int dt_ends_with(const char *s, const char *suffix)
{
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && strcmp(s + a - b, suffix) == 0;
}

void dt_str_divisors(char *buf, size_t cap, int n)
{
    size_t len = 0;
    buf[0] = '\0';
    for (int d = 1; d <= n; d++) {
        if (n % d) continue;
        const char *sep = len == 0 ? "" : d == n ? " or " : ", ";
        int w = snprintf(buf + len, cap - len, "%s%d", sep, d);
        if (w < 0 || (size_t)w >= cap - len) break;
        len += (size_t)w;
    }
}
