/* A --config file: one JSON object whose keys are dtrain's options in
 * snake_case and DeepSpeed's (config/deepspeed.c). Within one file
 * DeepSpeed's optimizer section is applied first, then its other keys (a
 * scheduler's warmup_max_lr replaces optimizer.params.lr, as in
 * DeepSpeed), then dtrain's own keys. Otherwise two keys of a file that
 * set one option must agree: a snake_case key and a DeepSpeed key with
 * different values are refused, naming both, and so is a key written
 * twice in one object (JSON keeps both; the last would win unseen). */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/file.h"
#include "core/log.h"
#include "core/str.h"
#include "train/config/internal.h"

/* ---- two keys for one option ----------------------------------------------- */

/* Option o's value in c, strings copied into buf (the field may change). */
static dt_cfg_val value_now(const dt_train_config *c, const dt_cfg_opt *o, char *buf, size_t n)
{
    dt_cfg_val v = dt_cfg_read_field(c, o);
    if (o->type == T_STR || o->type == T_CHOICE) dt_strf(buf, n, "%s", v.s), v.s = buf;
    return v;
}

static int same_value(const dt_cfg_opt *o, dt_cfg_val a, dt_cfg_val b)
{
    switch (o->type) {
    case T_U64: return a.u == b.u;
    case T_DBL: return a.d == b.d;
    case T_STR:
    case T_CHOICE: return !strcmp(a.s, b.s);
    default: return a.i == b.i;
    }
}

/* After `key` set option idx, whose value before was `was`. */
static int note_key(dt_cfg_file *f, const dt_train_config *c, int idx, const char *key,
                    dt_cfg_val was, const char *why, char *err, size_t n)
{
    const dt_cfg_opt *o = &dt_cfg_options[idx];
    char buf[DT_CONFIG_PATH + 32], a[DT_CONFIG_PATH + 32], b[DT_CONFIG_PATH + 32];
    dt_cfg_val now = value_now(c, o, buf, sizeof buf);
    if (f->key[idx][0] && !same_value(o, was, now)) {
        dt_cfg_format_value(o, was, a, sizeof a);
        dt_cfg_format_value(o, now, b, sizeof b);
        return dt_strf(err, n, "%s: %s (%s) and %s (%s) both set --%s, to different values%s%s; "
                       "keep one of the keys, or give both the same value", f->path,
                       f->key[idx], a, key, b, o->flag, why ? ": " : "", why ? why : ""), -1;
    }
    dt_strf(f->key[idx], sizeof f->key[idx], "%s", key);
    return 0;
}

int dt_cfg_file_set_json(dt_cfg_file *f, dt_train_config *c, int idx, const char *key,
                         const cJSON *j, const char *why, char *err, size_t n)
{
    char buf[DT_CONFIG_PATH + 32];
    dt_cfg_val was = value_now(c, &dt_cfg_options[idx], buf, sizeof buf);
    if (dt_cfg_set_json(c, idx, f->path, key, j, err, n)) return -1;
    return note_key(f, c, idx, key, was, why, err, n);
}

int dt_cfg_file_store(dt_cfg_file *f, dt_train_config *c, int idx, const char *key,
                      dt_cfg_val v, char *err, size_t n)
{
    char buf[DT_CONFIG_PATH + 32], who[DT_CONFIG_PATH + 192];
    dt_cfg_val was = value_now(c, &dt_cfg_options[idx], buf, sizeof buf);
    dt_cfg_json_who(who, sizeof who, f->path, key);
    if (dt_cfg_store(c, idx, v, who, err, n)) return -1;
    return note_key(f, c, idx, key, was, NULL, err, n);
}

/* ---- reading the file ------------------------------------------------------ */

/* Which pass applies a top-level item: 0 DeepSpeed's optimizer section,
 * 1 DeepSpeed's other keys, 2 dtrain's own keys (and unknown-key warnings). */
static int json_item(dt_cfg_file *f, dt_train_config *c, const cJSON *it, int pass, char *err,
                     size_t n)
{
    int rc = dt_cfg_deepspeed_item(f, c, it, pass, err, n);
    if (rc <= 0) return rc;
    int alias, idx = dt_cfg_find_json(it->string, &alias);
    if (idx < 0) {
        if (pass == 2) DT_WARN("%s: unknown key '%s' (ignored)", f->path, it->string);
        return 0;
    }
    return pass == (alias ? 1 : 2) ? dt_cfg_file_set_json(f, c, idx, it->string, it, NULL, err, n)
                                   : 0;
}

static int by_name(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* A key the object holds twice, or NULL; sorted, so that a file of a
 * million keys takes no time. *oom where there was no memory to sort. */
static const char *key_twice(const cJSON *obj, int *oom)
{
    size_t k = 0, count = 0;
    for (const cJSON *it = obj->child; it; it = it->next) count++;
    const char **names = malloc((count ? count : 1) * sizeof *names);
    if (!names) return *oom = 1, NULL;
    for (const cJSON *it = obj->child; it; it = it->next) names[k++] = it->string;
    qsort(names, count, sizeof *names, by_name);
    const char *twice = NULL;
    for (size_t i = 1; i < count && !twice; i++)
        if (!strcmp(names[i - 1], names[i])) twice = names[i];
    free(names);
    return twice;
}

/* No object in j (whose key path is `at`, "" at the top) holds a key
 * twice. */
static int check_duplicates(const char *path, const cJSON *j, const char *at, char *err,
                            size_t n)
{
    int oom = 0;
    const char *twice = cJSON_IsObject(j) ? key_twice(j, &oom) : NULL;
    if (oom) return dt_strf(err, n, "%s: out of memory", path), -1;
    if (twice)
        return dt_strf(err, n, "%s: key '%s%s%s' appears twice in one object (JSON keeps both, "
                       "and one would win unseen): write it once", path, at, *at ? "." : "",
                       twice), -1;
    int i = 0;
    for (const cJSON *it = j->child; it; it = it->next, i++) {
        char sub[256];
        if (cJSON_IsObject(j)) snprintf(sub, sizeof sub, "%s%s%s", at, *at ? "." : "", it->string);
        else snprintf(sub, sizeof sub, "%s[%d]", at, i);
        if (check_duplicates(path, it, sub, err, n)) return -1;
    }
    return 0;
}

/* "FILE:LINE:COLUMN: what" for the byte at `at` of text. */
static int text_error(const char *path, const char *text, const char *at, const char *what,
                      char *err, size_t n)
{
    int line = 1, col = 1;
    for (const char *p = text; at && p < at; p++) {
        if (*p == '\n') line++, col = 1;
        else col++;
    }
    dt_strf(err, n, "%s:%d:%d: %s", path, line, col, what);
    return -1;
}

/* Only blank space may follow the object: a second object or stray text
 * would otherwise be dropped without a word. */
static int check_rest(const char *path, const char *text, size_t len, const char *end,
                      char *err, size_t n)
{
    const char *p = end;
    while (p < text + len && *p && strchr(" \t\r\n", *p)) p++;
    if (p == text + len) return 0;
    char what[96];
    dt_strf(what, sizeof what, "text after the JSON object (byte %zu); a config file holds one "
            "object", (size_t)(p - text));
    return text_error(path, text, p, what, err, n);
}

static cJSON *parse_file(const char *path, char *err, size_t n)
{
    size_t len;
    char *text = dt_read_file(path, (size_t)64 << 20, &len, err, n);
    if (!text) return NULL;
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(text, len, &end, 0);
    if (!root) {
        text_error(path, text, end, "invalid JSON", err, n);
    } else if (!cJSON_IsObject(root)) {
        dt_strf(err, n, "%s: the top level must be a JSON object", path);
        cJSON_Delete(root), root = NULL;
    } else if (check_rest(path, text, len, end, err, n) ||
               check_duplicates(path, root, "", err, n)) {
        cJSON_Delete(root), root = NULL;
    }
    free(text);
    return root;
}

int dt_config_load_json(dt_train_config *c, const char *path, char *err, size_t errlen)
{
    cJSON *root = parse_file(path, err, errlen);
    dt_cfg_file *f = root ? calloc(1, sizeof *f) : NULL;
    if (!f) {
        if (root) dt_strf(err, errlen, "%s: out of memory", path);
        cJSON_Delete(root);
        return -1;
    }
    f->path = path;
    int rc = 0;
    for (int pass = 0; pass < 3 && !rc; pass++) {
        const cJSON *it;
        cJSON_ArrayForEach(it, root)
            if ((rc = json_item(f, c, it, pass, err, errlen))) break;
    }
    free(f);
    cJSON_Delete(root);
    return rc;
}
