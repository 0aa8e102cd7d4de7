#include "core/parse.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* strtol and strtod skip leading blanks, and strtod also takes hex, "nan"
 * and "inf": a number here starts with a sign, a digit or a point and
 * holds no x. */
static int looks_decimal(const char *s)
{
    const char *p = (*s == '-' || *s == '+') ? s + 1 : s;
    return (*p >= '0' && *p <= '9') || (*p == '.' && p[1] >= '0' && p[1] <= '9')
               ? !strpbrk(s, "xX")
               : 0;
}

int dt_parse_long(const char *s, long min, long max, long *out)
{
    if (!s || !looks_decimal(s)) return -1;
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || *end || v < min || v > max) return -1;
    *out = v;
    return 0;
}

int dt_parse_double(const char *s, double min, double max, double *out)
{
    if (!s || !looks_decimal(s)) return -1;
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || *end || !(v >= min && v <= max)) return -1;
    *out = v;
    return 0;
}

int dt_parse_integral(const char *s, long long min, long long max, long long *out)
{
    if (!s || !looks_decimal(s)) return -1;
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (*end) { /* not plain digits: perhaps 1e3 */
        double d = strtod(s, &end);
        if (*end || !(fabs(d) <= 9e15) || d != floor(d)) return -1;
        v = (long long)d;
    } else if (errno) {
        return -1;
    }
    if (v < min || v > max) return -1;
    *out = v;
    return 0;
}

int dt_parse_u64(const char *s, uint64_t max, uint64_t *out)
{
    if (!s || *s < '0' || *s > '9') return -1;
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || *end || v > max) return -1;
    *out = v;
    return 0;
}
