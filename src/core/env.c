#include "core/env.h"

#include <stdio.h>
#include <stdlib.h>

#include "core/parse.h"

const char *dt_env_str(const char *name)
{
    const char *s = getenv(name);
    return (s && *s) ? s : NULL;
}

int dt_env_long(const char *name, long min, long max, long *out, char *err, size_t errlen)
{
    const char *s = dt_env_str(name);
    if (!s) return 0;
    long v;
    if (dt_parse_long(s, min, max, &v)) {
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
    double v;
    if (dt_parse_double(s, min, max, &v)) {
        snprintf(err, errlen, "%s=%s is not a number in [%g, %g]", name, s, min, max);
        return -1;
    }
    *out = v;
    return 1;
}
