/* Reading configuration from environment variables, with validation:
 * a malformed value is an error that names the variable, never a silent
 * default. */
#ifndef DT_CORE_ENV_H
#define DT_CORE_ENV_H

#include <stddef.h>

/* Each returns 1 if the variable is set and valid (value in *out), 0 if it is
 * unset or empty (*out untouched), -1 if malformed (message in err). */
int dt_env_long(const char *name, long min, long max, long *out, char *err, size_t errlen);
int dt_env_double(const char *name, double min, double max, double *out, char *err,
                  size_t errlen);
/* The value, or NULL when unset or empty. */
const char *dt_env_str(const char *name);

#endif
