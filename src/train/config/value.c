/* One option's value: read from a flag's text or a JSON value, checked
 * against the option's type, range and choices, and stored in its field.
 * Messages name the setting as the user wrote it (`who`). */
#include <cjson/cJSON.h>
#include <ctype.h>
#include <errno.h>
#include <float.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "core/parse.h"
#include "core/str.h"
#include "train/config/internal.h"

/* ---- from text or JSON -------------------------------------------------- */

static int text_to_bool(const char *s, long long *out)
{
    static const char *const yes[] = {"1", "true", "yes", "on"};
    static const char *const no[] = {"0", "false", "no", "off"};
    for (int i = 0; i < 4; i++) {
        if (!strcasecmp(s, yes[i])) return *out = 1, 0;
        if (!strcasecmp(s, no[i])) return *out = 0, 0;
    }
    return -1;
}

static int from_text(const dt_cfg_opt *o, const char *who, const char *s, dt_cfg_val *v,
                     char *err, size_t n)
{
    char *end;
    switch (o->type) {
    case T_INT:
    case T_LONG:
        /* Integers may be written 1e3 (as DeepSpeed configs often are), but
         * never 1.5: a fraction silently truncated would hide a mistake. */
        if (!dt_parse_integral(s, LLONG_MIN, LLONG_MAX, &v->i)) return 0;
        return dt_strf(err, n, "%s: '%s' is not an integer", who, s), -1;
    case T_U64:
        errno = 0;
        v->u = strtoull(s, &end, 10);
        if (isdigit((unsigned char)*s) && !*end && !errno) return 0;
        return dt_strf(err, n, "%s: '%s' is not a non-negative integer", who, s), -1;
    case T_DBL:
        if (!dt_parse_double(s, -DBL_MAX, DBL_MAX, &v->d)) return 0;
        return dt_strf(err, n, "%s: '%s' is not a number", who, s), -1;
    case T_BOOL:
        if (!*s && (o->flags & O_OPTVAL)) return v->i = 1, 0; /* a switch: "--flag" alone */
        if (!text_to_bool(s, &v->i)) return 0;
        return dt_strf(err, n, "%s: '%s' is not a boolean (1|0|true|false)", who, s), -1;
    default:
        v->s = s;
        return 0;
    }
}

static int from_json(const dt_cfg_opt *o, const char *who, const cJSON *j, dt_cfg_val *v,
                     char *err, size_t n)
{
    static const char *const expected[] = {"an integer", "an integer", "an integer", "a number",
                                           "a boolean", "a string", "a string", ""};
    int ok = 0;
    double d = j->valuedouble;
    if (o->type <= T_U64 && cJSON_IsNumber(j)) {
        /* Integral and exact: cJSON holds every number as a double. */
        if (d != floor(d) || !(fabs(d) <= 9007199254740992.0))
            return dt_strf(err, n, "%s: %g is not an integer", who, d), -1;
        if (o->type == T_U64 && d < 0)
            return dt_strf(err, n, "%s: %g must be >= 0", who, d), -1;
        v->i = (long long)d, v->u = (unsigned long long)(d < 0 ? 0 : d), ok = 1;
    } else if (o->type == T_DBL && cJSON_IsNumber(j)) {
        v->d = d, ok = 1;
    } else if (o->type == T_BOOL &&
               (cJSON_IsBool(j) || (cJSON_IsNumber(j) && (d == 0 || d == 1)))) {
        v->i = cJSON_IsBool(j) ? cJSON_IsTrue(j) : (long long)d, ok = 1;
    } else if (o->type >= T_STR && cJSON_IsString(j)) {
        v->s = j->valuestring, ok = 1;
    } else if ((o->flags & O_OPTVAL) && cJSON_IsTrue(j)) {
        v->s = "", ok = 1;
    }
    if (!ok) dt_strf(err, n, "%s: expected %s%s", who, expected[o->type],
                     (o->flags & O_OPTVAL) ? " or true" : "");
    return ok ? 0 : -1;
}

/* ---- checks --------------------------------------------------------------- */

static void fmt_bound(const dt_cfg_opt *o, double b, char *buf, size_t n)
{
    if (o->type == T_DBL) dt_strf(buf, n, "%g", b);
    else dt_strf(buf, n, "%lld", (long long)b);
}

/* "must be >= 1", "must be > 0", "must be in [0, 1)"; a bound that is only
 * the type's limit is shown only when it is the one crossed. An option
 * whose bound needs a reason gives it. */
static int range_error(const dt_cfg_opt *o, const char *who, double x, const char *val,
                       char *err, size_t n)
{
    char lo[32], hi[32], why[256] = "";
    fmt_bound(o, o->min, lo, sizeof lo);
    fmt_bound(o, o->max, hi, sizeof hi);
    if (o->bound_why) dt_strf(why, sizeof why, ": %s", o->bound_why);
    const char *gt = (o->flags & O_MINOPEN) ? ">" : ">=";
    int type_max = isinf(o->max) || o->max == DT_CFG_IMAX || o->max == DT_CFG_LMAX;
    if (type_max && x > o->max) dt_strf(err, n, "%s: %s must be <= %s%s", who, val, hi, why);
    else if (type_max) dt_strf(err, n, "%s: %s must be %s %s%s", who, val, gt, lo, why);
    else dt_strf(err, n, "%s: %s must be in %c%s, %s%c%s", who, val,
                 (o->flags & O_MINOPEN) ? '(' : '[', lo, hi,
                 (o->flags & O_MAXOPEN) ? ')' : ']', why);
    return -1;
}

int dt_cfg_check_range(const dt_cfg_opt *o, const char *who, const dt_cfg_val *v, char *err,
                       size_t n)
{
    if (o->type != T_INT && o->type != T_LONG && o->type != T_DBL) return 0;
    double x = o->type == T_DBL ? v->d : (double)v->i;
    char val[40];
    if (o->type == T_DBL) dt_strf(val, sizeof val, "%g", x);
    else dt_strf(val, sizeof val, "%lld", v->i);
    int bad = (o->flags & O_MINOPEN) ? !(x > o->min) : !(x >= o->min);
    bad |= (o->flags & O_MAXOPEN) ? !(x < o->max) : !(x <= o->max);
    return bad ? range_error(o, who, x, val, err, n) : 0;
}

/* The canonical (lower-case) spelling of a choice, or NULL. */
static const char *match_choice(const dt_cfg_opt *o, const char *s, char *buf, size_t n)
{
    if (!*s && (o->flags & O_EMPTYOK)) return "";
    for (const char *p = o->meta; *p;) {
        size_t len = strcspn(p, "|");
        if (len && len == strlen(s) && !strncasecmp(p, s, len) && len < n) {
            memcpy(buf, p, len);
            buf[len] = 0;
            return buf;
        }
        p += len + (p[len] == '|');
    }
    return NULL;
}

int dt_cfg_check_string(const dt_cfg_opt *o, const char *who, const char **s, char *buf,
                        size_t bufn, char *err, size_t n)
{
    if (o->type == T_CHOICE) {
        const char *m = match_choice(o, *s, buf, bufn);
        if (!m)
            return dt_strf(err, n, "%s: unknown value '%s' (one of %s)", who, *s, o->meta), -1;
        *s = m;
    }
    if (strlen(*s) >= o->size)
        return dt_strf(err, n, "%s: value longer than %zu characters", who, o->size - 1), -1;
    return 0;
}

/* ---- storing -------------------------------------------------------------- */

int dt_cfg_store(dt_train_config *c, int idx, dt_cfg_val v, const char *who, char *err,
                 size_t n)
{
    const dt_cfg_opt *o = &dt_cfg_options[idx];
    char *p = (char *)c + o->off, canon[64];
    if (dt_cfg_check_range(o, who, &v, err, n) ||
        (o->type >= T_STR && dt_cfg_check_string(o, who, &v.s, canon, sizeof canon, err, n)))
        return -1;
    switch (o->type) {
    case T_INT:
    case T_BOOL: *(int *)p = (int)v.i; break;
    case T_LONG: *(long *)p = (long)v.i; break;
    case T_U64: *(unsigned long long *)p = v.u; break;
    case T_DBL: *(double *)p = v.d; break;
    default: memmove(p, v.s, strlen(v.s) + 1); break;
    }
    c->given[idx] = 1;
    return o->hook ? o->hook(c, who, err, n) : 0;
}

int dt_cfg_set_text(dt_train_config *c, int idx, const char *who, const char *s, char *err,
                    size_t n)
{
    dt_cfg_val v = {0};
    if (from_text(&dt_cfg_options[idx], who, s, &v, err, n)) return -1;
    return dt_cfg_store(c, idx, v, who, err, n);
}

void dt_cfg_json_who(char *who, size_t n, const char *path, const char *key)
{
    dt_strf(who, n, "%s: %s", path, key);
}

void dt_cfg_format_value(const dt_cfg_opt *o, dt_cfg_val v, char *buf, size_t n)
{
    buf[0] = 0;
    switch (o->type) {
    case T_INT:
    case T_LONG:
    case T_BOOL: dt_strf(buf, n, "%lld", v.i); break;
    case T_U64: dt_strf(buf, n, "%llu", v.u); break;
    case T_DBL:
        dt_strf(buf, n, "%g", v.d);
        if (strtod(buf, NULL) != v.d) dt_strf(buf, n, "%.17g", v.d);
        break;
    case T_STR:
    case T_CHOICE: dt_strf(buf, n, "%s", v.s); break;
    default: break;
    }
}

int dt_cfg_set_json(dt_train_config *c, int idx, const char *path, const char *key,
                    const cJSON *j, char *err, size_t n)
{
    char who[DT_CONFIG_PATH + 128];
    dt_cfg_json_who(who, sizeof who, path, key);
    if ((dt_cfg_options[idx].flags & O_OPTVAL) && cJSON_IsFalse(j)) {
        c->resume_flag = 0, c->resume[0] = 0;
        return 0;
    }
    dt_cfg_val v = {0};
    if (from_json(&dt_cfg_options[idx], who, j, &v, err, n)) return -1;
    return dt_cfg_store(c, idx, v, who, err, n);
}

dt_cfg_val dt_cfg_read_field(const dt_train_config *c, const dt_cfg_opt *o)
{
    const char *p = (const char *)c + o->off;
    dt_cfg_val v = {0};
    switch (o->type) {
    case T_INT:
    case T_BOOL: v.i = *(const int *)p; break;
    case T_LONG: v.i = *(const long *)p; break;
    case T_U64: v.u = *(const unsigned long long *)p; break;
    case T_DBL: v.d = *(const double *)p; break;
    case T_ACTION: break;
    default: v.s = p; break;
    }
    return v;
}
