/* Atomic checkpoints with exact resumption. See checkpoint.h. */
#include "train/checkpoint.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/file.h"
#include "core/str.h"
#include "core/atomic_file.h"
#include "train/weights.h"

#define CKPT_PREFIX "ckpt-"

/* ---- small file helpers --------------------------------------------------- */

static void remove_tree(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    char path[DT_PATH_MAX + 256];
    while ((e = readdir(d)) != NULL) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
        dt_strf(path, sizeof path, "%s/%s", dir, e->d_name);
        unlink(path);
    }
    closedir(d);
    rmdir(dir);
}

/* ---- state.json ------------------------------------------------------------ */

static char *state_to_json(const dt_ckpt_state *s, const dt_optimizer *o)
{
    cJSON *j = cJSON_CreateObject();
    cJSON_AddNumberToObject(j, "format", 1);
    cJSON_AddNumberToObject(j, "step", (double)s->step);
    /* 64-bit values as strings: JSON numbers are doubles. */
    char buf[32];
    dt_strf(buf, sizeof buf, "%llu", (unsigned long long)s->seq_counter);
    cJSON_AddStringToObject(j, "seq_counter", buf);
    dt_strf(buf, sizeof buf, "%llu", (unsigned long long)s->seed);
    cJSON_AddStringToObject(j, "seed", buf);
    cJSON_AddNumberToObject(j, "shuffle", s->shuffle);
    cJSON_AddNumberToObject(j, "seq_len", s->seq_len);
    cJSON_AddNumberToObject(j, "global_batch", (double)s->global_batch);
    cJSON_AddNumberToObject(j, "last_loss", s->last_loss);
    dt_strf(buf, sizeof buf, "%llu", (unsigned long long)s->data_tokens);
    cJSON_AddStringToObject(j, "data_tokens", buf);
    cJSON_AddStringToObject(j, "optimizer", dt_opt_kind_name(o->kind));
    cJSON_AddNumberToObject(j, "optimizer_step", (double)o->t);
    char *text = j ? cJSON_Print(j) : NULL;
    cJSON_Delete(j);
    return text;
}

static int json_u64(const cJSON *j, const char *key, uint64_t *out)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, key);
    if (cJSON_IsString(v)) {
        char *end;
        *out = strtoull(v->valuestring, &end, 10);
        return *end == 0 ? 0 : -1;
    }
    if (cJSON_IsNumber(v) && v->valuedouble >= 0) {
        *out = (uint64_t)v->valuedouble;
        return 0;
    }
    return -1;
}

static int json_long(const cJSON *j, const char *key, long *out)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, key);
    if (!cJSON_IsNumber(v)) return -1;
    *out = (long)v->valuedouble;
    return 0;
}

static int state_from_json(const char *path, const char *text, dt_ckpt_state *s,
                           dt_optimizer *o, char *err, size_t errlen)
{
    cJSON *j = cJSON_Parse(text);
    long shuffle = 0, seq_len = 0, opt_t = 0;
    const cJSON *opt = cJSON_GetObjectItemCaseSensitive(j, "optimizer");
    dt_opt_kind kind;
    int bad = !j || json_long(j, "step", &s->step) || json_u64(j, "seq_counter", &s->seq_counter) ||
              json_u64(j, "seed", &s->seed) || json_long(j, "shuffle", &shuffle) ||
              json_long(j, "seq_len", &seq_len) || json_long(j, "global_batch", &s->global_batch) ||
              json_long(j, "optimizer_step", &opt_t) || !cJSON_IsString(opt) ||
              dt_opt_kind_parse(opt->valuestring, &kind) != 0;
    if (!bad && kind != o->kind) {
        dt_strf(err, errlen, "%s: the checkpoint was trained with %s, this run uses %s", path,
                opt->valuestring, dt_opt_kind_name(o->kind));
        cJSON_Delete(j);
        return -1;
    }
    if (!bad && json_u64(j, "data_tokens", &s->data_tokens) != 0) s->data_tokens = 0;
    const cJSON *loss = cJSON_GetObjectItemCaseSensitive(j, "last_loss");
    s->last_loss = cJSON_IsNumber(loss) ? loss->valuedouble : 0.0;
    cJSON_Delete(j);
    if (bad) {
        dt_strf(err, errlen, "%s: malformed or incomplete checkpoint state", path);
        return -1;
    }
    s->shuffle = (int)shuffle;
    s->seq_len = (int)seq_len;
    o->t = opt_t;
    return 0;
}

/* ---- saving ------------------------------------------------------------- */

static int write_contents(const char *dir, const dt_gpt *m, const dt_optimizer *o,
                          const dt_ckpt_state *state, char *err, size_t errlen)
{
    char path[DT_PATH_MAX + 64];
    dt_strf(path, sizeof path, "%s/model.safetensors", dir);
    if (dt_weights_save(m, path, err, errlen) != 0) return -1;
    if (o->m) {
        const float *bufs[2] = {o->m, o->v};
        const char *prefixes[2] = {"exp_avg.", "exp_avg_sq."};
        dt_strf(path, sizeof path, "%s/optimizer.safetensors", dir);
        if (dt_weights_write(m, bufs, prefixes, o->v ? 2 : 1, path, err, errlen) != 0) return -1;
    }
    char *text = state_to_json(state, o);
    if (!text) {
        dt_strf(err, errlen, "%s: out of memory for the checkpoint state", dir);
        return -1;
    }
    dt_strf(path, sizeof path, "%s/state.json", dir);
    int rc = dt_afile_write_file(path, text, strlen(text), err, errlen);
    free(text);
    return rc;
}

static int ckpt_name_cmp(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Removes checkpoints older than `current` beyond the keep - 1 newest of
 * them, and temporary directories that crashed saves left. Names sort by
 * step because the step is zero-padded; nothing newer than `current` is
 * touched. */
static void prune(const char *out_dir, const char *current, long keep)
{
    DIR *d = opendir(out_dir);
    if (!d) return;
    char *names[4096];
    int n = 0;
    struct dirent *e;
    char path[DT_PATH_MAX + 256];
    while ((e = readdir(d)) != NULL && n < 4096) {
        if (strncmp(e->d_name, CKPT_PREFIX, strlen(CKPT_PREFIX)) == 0 &&
            strcmp(e->d_name, current) < 0)
            names[n++] = strdup(e->d_name);
        else if (strncmp(e->d_name, "." CKPT_PREFIX, strlen(CKPT_PREFIX) + 1) == 0 &&
                 strstr(e->d_name, ".tmp.")) {
            dt_strf(path, sizeof path, "%s/%s", out_dir, e->d_name);
            remove_tree(path);
        }
    }
    closedir(d);
    qsort(names, (size_t)n, sizeof names[0], ckpt_name_cmp);
    for (int i = 0; i < n; i++) {
        if (names[i] && (long)(n - i) > keep - 1) {
            dt_strf(path, sizeof path, "%s/%s", out_dir, names[i]);
            remove_tree(path);
        }
        free(names[i]);
    }
}

int dt_ckpt_exists(const char *out_dir)
{
    DIR *d = opendir(out_dir);
    if (!d) return 0;
    struct dirent *e;
    int found = 0;
    while (!found && (e = readdir(d)) != NULL)
        found = strncmp(e->d_name, CKPT_PREFIX, strlen(CKPT_PREFIX)) == 0 ||
                strcmp(e->d_name, "latest") == 0;
    closedir(d);
    return found;
}

int dt_ckpt_save(const char *out_dir, const dt_gpt *m, const dt_optimizer *o,
                 const dt_ckpt_state *state, long keep_last, char *path_out, size_t path_len,
                 char *err, size_t errlen)
{
    char name[64], tmp[DT_PATH_MAX + 128], final[DT_PATH_MAX + 128];
    if (dt_mkdir_p(out_dir, err, errlen) != 0) return -1;
    dt_strf(name, sizeof name, CKPT_PREFIX "%08ld", state->step);
    dt_strf(tmp, sizeof tmp, "%s/.%s.tmp.%d", out_dir, name, (int)getpid());
    dt_strf(final, sizeof final, "%s/%s", out_dir, name);
    remove_tree(tmp);
    if (mkdir(tmp, 0777) != 0) {
        dt_strf(err, errlen, "%s: cannot create: %s", tmp, strerror(errno));
        return -1;
    }
    if (write_contents(tmp, m, o, state, err, errlen) != 0) {
        remove_tree(tmp);
        return -1;
    }
    /* A checkpoint of the same step already there (a run saving twice) is
     * swapped with the new one in a single atomic exchange, so the name
     * never stops holding a complete checkpoint. */
    struct stat st;
    int exchange = stat(final, &st) == 0;
    int rc = exchange ? renameat2(AT_FDCWD, tmp, AT_FDCWD, final, RENAME_EXCHANGE)
                      : rename(tmp, final);
    if (rc != 0) {
        dt_strf(err, errlen, "%s: cannot move into place: %s", final, strerror(errno));
        remove_tree(tmp);
        return -1;
    }
    dt_fsync_dir(out_dir);
    if (exchange) remove_tree(tmp); /* now the old checkpoint */
    char latest[DT_PATH_MAX + 16], line[80];
    dt_strf(latest, sizeof latest, "%s/latest", out_dir);
    dt_strf(line, sizeof line, "%s\n", name);
    if (dt_afile_write_file(latest, line, strlen(line), err, errlen) != 0) return -1;
    prune(out_dir, name, keep_last > 0 ? keep_last : 1);
    if (path_out) dt_strf(path_out, path_len, "%s", final);
    return 0;
}

/* ---- loading ------------------------------------------------------------ */

int dt_ckpt_resolve(const char *where, char *dir, size_t dirlen, char *err, size_t errlen)
{
    char path[DT_PATH_MAX + 32];
    struct stat st;
    dt_strf(path, sizeof path, "%s/state.json", where);
    if (stat(path, &st) == 0) {
        dt_strf(dir, dirlen, "%s", where);
        return 0;
    }
    dt_strf(path, sizeof path, "%s/latest", where);
    char e2[256];
    char *text = dt_read_file(path, 4096, NULL, e2, sizeof e2);
    if (!text) {
        dt_strf(err, errlen, "%s: no checkpoint to resume from (neither %s/state.json nor %s)",
                where, where, path);
        return -1;
    }
    text[strcspn(text, "\r\n")] = 0;
    if (strchr(text, '/') || text[0] == 0 || text[0] == '.') {
        dt_strf(err, errlen, "%s: names '%s', not a checkpoint directory", path, text);
        free(text);
        return -1;
    }
    dt_strf(dir, dirlen, "%s/%s", where, text);
    free(text);
    return 0;
}

int dt_ckpt_model_config(const char *dir, dt_gpt_config *cfg, char *err, size_t errlen)
{
    char path[DT_PATH_MAX + 32];
    dt_strf(path, sizeof path, "%s/model.safetensors", dir);
    return dt_weights_inspect(path, cfg, err, errlen);
}

int dt_ckpt_load(const char *dir, dt_gpt *m, dt_optimizer *o, dt_ckpt_state *state, char *err,
                 size_t errlen)
{
    char path[DT_PATH_MAX + 32];
    dt_strf(path, sizeof path, "%s/state.json", dir);
    char *text = dt_read_file(path, 1 << 20, NULL, err, errlen);
    if (!text) return -1;
    int rc = state_from_json(path, text, state, o, err, errlen);
    free(text);
    if (rc != 0) return -1;
    dt_strf(path, sizeof path, "%s/model.safetensors", dir);
    if (dt_weights_load(m, path, err, errlen) != 0) return -1;
    if (!o->m) return 0;
    dt_st_file f;
    dt_strf(path, sizeof path, "%s/optimizer.safetensors", dir);
    if (dt_st_open(path, &f, err, errlen) != 0) return -1;
    rc = dt_weights_read(m, o->m, &f, "exp_avg.", err, errlen);
    if (rc == 0 && o->v) rc = dt_weights_read(m, o->v, &f, "exp_avg_sq.", err, errlen);
    dt_st_close(&f);
    return rc;
}
