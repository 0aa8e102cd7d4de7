/* Numbers read from text a user typed (flags, environment variables,
 * files): the whole string must be one decimal number inside [min, max].
 * No leading blanks, no hexadecimal, no "nan" or "inf", nothing after the
 * number; what strtol/strtod would quietly accept or cut short is refused,
 * so a typo is an error rather than a different value. */
#ifndef DT_CORE_PARSE_H
#define DT_CORE_PARSE_H

#include <stdint.h>

/* 0 with the value in *out, or -1 (out untouched). */
int dt_parse_long(const char *s, long min, long max, long *out);
int dt_parse_double(const char *s, double min, double max, double *out);
/* An integer that may be written in scientific notation ("1e3", as
 * DeepSpeed configs often are) but never with a fraction ("1.5"). */
int dt_parse_integral(const char *s, long long min, long long max, long long *out);
/* Plain digits, no sign, at most max (which may be UINT64_MAX): a count or
 * a seed kept as a decimal string because a JSON number would round it. */
int dt_parse_u64(const char *s, uint64_t max, uint64_t *out);

#endif
