/* A --config file: one JSON object whose keys are dtrain's options in
 * snake_case and DeepSpeed's (config_deepspeed.c). Within one file
 * DeepSpeed's optimizer section is applied first, then its other keys (so
 * a scheduler's warmup_max_lr beats optimizer.params.lr, as in DeepSpeed),
 * then dtrain's own keys, which win over both. */
#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

#include "core/file.h"
#include "core/log.h"
#include "core/str.h"
#include "train/config_internal.h"

/* Which pass applies a top-level item: 0 DeepSpeed's optimizer section,
 * 1 DeepSpeed's other keys, 2 dtrain's own keys (and unknown-key warnings). */
static int json_item(dt_train_config *c, const char *path, const cJSON *it, int pass, char *err,
                     size_t n)
{
    int rc = dt_cfg_deepspeed_item(c, path, it, pass, err, n);
    if (rc <= 0) return rc;
    int alias, idx = dt_cfg_find_json(it->string, &alias);
    if (idx < 0) {
        if (pass == 2) DT_WARN("%s: unknown key '%s' (ignored)", path, it->string);
        return 0;
    }
    return pass == (alias ? 1 : 2) ? dt_cfg_set_json(c, idx, path, it->string, it, err, n) : 0;
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
    } else if (check_rest(path, text, len, end, err, n)) {
        cJSON_Delete(root), root = NULL;
    }
    free(text);
    return root;
}

int dt_config_load_json(dt_train_config *c, const char *path, char *err, size_t errlen)
{
    cJSON *root = parse_file(path, err, errlen);
    if (!root) return -1;
    int rc = 0;
    for (int pass = 0; pass < 3 && !rc; pass++) {
        const cJSON *it;
        cJSON_ArrayForEach(it, root)
            if ((rc = json_item(c, path, it, pass, err, errlen))) break;
    }
    cJSON_Delete(root);
    return rc;
}
