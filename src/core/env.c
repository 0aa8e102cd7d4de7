#include "core/env.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

const char *dt_env_str(const char *name)
{
    const char *s = getenv(name);
    return (s && *s) ? s : NULL;
}

int dt_env_long(const char *name, long min, long max, long *out, char *err, size_t errlen)
{
    const char *s = dt_env_str(name);
    if (!s) return 0;
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || *end || v < min || v > max) {
        snprintf(err, errlen, "%s=%s is not an integer in [%ld, %ld]", name, s, min, max);
        return -1;
    }
    *out = v;
    return 1;
}

int dt_env_double(const char *name, double min, double max, double *out, char *err,
                  size_t errlen)
{
    const char *s = dt_env_str(name);
    if (!s) return 0;
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || *end || !(v >= min && v <= max)) {
        snprintf(err, errlen, "%s=%s is not a number in [%g, %g]", name, s, min, max);
        return -1;
    }
    *out = v;
    return 1;
}
