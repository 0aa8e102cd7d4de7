/* Atomic checkpoints with exact resumption. See ckpt/checkpoint.h. */
#include "train/ckpt/checkpoint.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/atomic_file.h"
#include "core/file.h"
#include "core/parse.h"
#include "core/str.h"
#include "train/ckpt/internal.h"
#include "train/ckpt/shard.h"
#include "train/weights/weights.h"

#define CKPT_PREFIX "ckpt-"

/* ---- the run directory -------------------------------------------------- */

void dt_ckpt_remove_tree(const char *dir)
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

/* The step of a checkpoint directory's name ("ckpt-" and digits only), or
 * -1 for any other name. */
static long name_step(const char *name)
{
    size_t k = strlen(CKPT_PREFIX);
    long step;
    if (strncmp(name, CKPT_PREFIX, k) != 0 || strspn(name + k, "0123456789") != strlen(name + k))
        return -1;
    return dt_parse_long(name + k, 0, DT_CKPT_STEP_MAX, &step) == 0 ? step : -1;
}

static int cmp_long(const void *a, const void *b)
{
    long x = *(const long *)a, y = *(const long *)b;
    return (x > y) - (x < y);
}

/* The steps of out_dir's checkpoints, ascending (malloc'd; NULL and 0
 * when there are none or the directory cannot be read). Sorted as
 * numbers, not names: past step 99999999 the names grow a digit. */
static long *list_steps(const char *out_dir, int *count)
{
    *count = 0;
    DIR *d = opendir(out_dir);
    if (!d) return NULL;
    long *steps = NULL;
    int n = 0, cap = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        long step = name_step(e->d_name);
        if (step < 0) continue;
        if (n == cap) {
            cap = cap ? 2 * cap : 16;
            long *grown = realloc(steps, (size_t)cap * sizeof *steps);
            if (!grown) break;
            steps = grown;
        }
        steps[n++] = step;
    }
    closedir(d);
    if (n > 1) qsort(steps, (size_t)n, sizeof *steps, cmp_long);
    *count = n;
    return steps;
}

void dt_ckpt_dir_path(char *buf, size_t len, const char *out_dir, long step)
{
    dt_strf(buf, len, "%s/" CKPT_PREFIX "%08ld", out_dir, step);
}

/* Removes temporary directories that crashed saves left, then checkpoints
 * older than `current` beyond the keep - 1 newest of them; nothing newer
 * than `current` is touched. */
void dt_ckpt_prune(const char *out_dir, long current, long keep)
{
    char path[DT_PATH_MAX + 256];
    DIR *d = opendir(out_dir);
    struct dirent *e;
    while (d && (e = readdir(d)) != NULL) {
        if (strncmp(e->d_name, "." CKPT_PREFIX, strlen(CKPT_PREFIX) + 1) != 0 ||
            !strstr(e->d_name, ".tmp."))
            continue;
        dt_strf(path, sizeof path, "%s/%s", out_dir, e->d_name);
        dt_ckpt_remove_tree(path);
    }
    if (d) closedir(d);
    int n;
    long *steps = list_steps(out_dir, &n);
    int older = 0;
    while (older < n && steps[older] < current) older++;
    for (int i = 0; i < older && (long)(older - i) > keep - 1; i++) {
        dt_ckpt_dir_path(path, sizeof path, out_dir, steps[i]);
        dt_ckpt_remove_tree(path);
    }
    free(steps);
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

/* ---- saving ------------------------------------------------------------- */

static int write_contents(const char *dir, const dt_gpt *m, const dt_optimizer *o,
                          const char *state_text, char *err, size_t errlen)
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
    dt_strf(path, sizeof path, "%s/state.json", dir);
    return dt_afile_write_file(path, state_text, strlen(state_text), err, errlen);
}

int dt_ckpt_make_record(const char *out_dir, const dt_gpt *m, const dt_optimizer *o,
                        const dt_ckpt_state *state, dt_ckpt_record *r, char *err, size_t errlen)
{
    *r = (dt_ckpt_record){.run = *state, .optimizer = o->kind, .optimizer_step = o->t,
                          .model = m->cfg};
    char *text = dt_ckpt_state_format(r);
    if (!text) {
        dt_strf(err, errlen, "%s: out of memory for the checkpoint state", out_dir);
        return -1;
    }
    dt_ckpt_record back;
    char path[DT_PATH_MAX + 64], why[1024];
    dt_strf(path, sizeof path, "the state of step %ld", state->step);
    int rc = dt_ckpt_state_parse(path, text, &back, why, sizeof why);
    free(text);
    if (rc == 0) return 0;
    dt_strf(err, errlen, "%s: not saving a checkpoint that could not be resumed: %s", out_dir,
            why);
    return -1;
}

void dt_ckpt_tmp_path(char *buf, size_t len, const char *out_dir, long step, long tag)
{
    dt_strf(buf, len, "%s/." CKPT_PREFIX "%08ld.tmp.%ld", out_dir, step, tag);
}

int dt_ckpt_make_tmp(const char *out_dir, long step, long tag, char *tmp, size_t tmplen,
                     char *err, size_t errlen)
{
    if (dt_mkdir_p(out_dir, err, errlen) != 0) return -1;
    dt_ckpt_tmp_path(tmp, tmplen, out_dir, step, tag);
    dt_ckpt_remove_tree(tmp);
    if (mkdir(tmp, 0777) == 0) return 0;
    dt_strf(err, errlen, "%s: cannot create: %s", tmp, strerror(errno));
    return -1;
}

/* Moves the finished temporary directory into place and points `latest`
 * at it. When `latest` cannot be written, the new directory is withdrawn
 * again (the old one of the same step swapped back), so that the run
 * directory is what it was before the save. */
int dt_ckpt_publish(const char *out_dir, long step, const char *tmp, char *err, size_t errlen)
{
    char final[DT_PATH_MAX + 128], latest[DT_PATH_MAX + 16], line[80];
    dt_ckpt_dir_path(final, sizeof final, out_dir, step);
    struct stat st;
    int exchange = stat(final, &st) == 0;
    int rc = exchange ? renameat2(AT_FDCWD, tmp, AT_FDCWD, final, RENAME_EXCHANGE)
                      : rename(tmp, final);
    if (rc != 0) {
        dt_strf(err, errlen, "%s: cannot move into place: %s", final, strerror(errno));
        dt_ckpt_remove_tree(tmp);
        return -1;
    }
    dt_fsync_dir(out_dir);
    dt_strf(latest, sizeof latest, "%s/latest", out_dir);
    dt_strf(line, sizeof line, CKPT_PREFIX "%08ld\n", step);
    if (dt_afile_write_file(latest, line, strlen(line), err, errlen) == 0) {
        if (exchange) dt_ckpt_remove_tree(tmp); /* now the old checkpoint */
        return 0;
    }
    if (!exchange)
        dt_ckpt_remove_tree(final);
    else if (renameat2(AT_FDCWD, tmp, AT_FDCWD, final, RENAME_EXCHANGE) == 0)
        dt_ckpt_remove_tree(tmp);
    dt_fsync_dir(out_dir);
    size_t used = strlen(err);
    if (used < errlen)
        dt_strf(err + used, errlen - used,
                " (the checkpoint of step %ld is withdrawn: %s is as it was before this save)",
                step, out_dir);
    return -1;
}

int dt_ckpt_save(const char *out_dir, const dt_gpt *m, const dt_optimizer *o,
                 const dt_ckpt_state *state, long keep_last, char *path_out, size_t path_len,
                 char *err, size_t errlen)
{
    char why[512], tmp[DT_PATH_MAX + 128];
    if (dt_weights_check_finite(m, m->params, "", why, sizeof why) != 0) {
        dt_strf(err, errlen,
                "%s: refusing to save non-finite weights: %s (step %ld is not saved; the last "
                "checkpoint is untouched)",
                out_dir, why, state->step);
        return -1;
    }
    dt_ckpt_record r;
    if (dt_ckpt_make_record(out_dir, m, o, state, &r, err, errlen) != 0) return -1;
    char *text = dt_ckpt_state_format(&r);
    if (!text) return dt_strf(err, errlen, "%s: out of memory", out_dir), -1;
    int rc = dt_ckpt_make_tmp(out_dir, state->step, (long)getpid(), tmp, sizeof tmp, err, errlen);
    if (rc == 0 && write_contents(tmp, m, o, text, err, errlen) != 0) {
        dt_ckpt_remove_tree(tmp);
        rc = -1;
    }
    free(text);
    if (rc == 0) rc = dt_ckpt_publish(out_dir, state->step, tmp, err, errlen);
    if (rc != 0) return -1;
    dt_ckpt_prune(out_dir, state->step, keep_last > 0 ? keep_last : 1);
    if (path_out) dt_ckpt_dir_path(path_out, path_len, out_dir, state->step);
    return 0;
}

/* ---- loading ------------------------------------------------------------ */

/* Whether dir is a checkpoint: a whole-model one's state.json or a
 * sharded one's manifest, or shards whose manifest is lost (reading it
 * says so, rather than passing over it). */
static int is_checkpoint(const char *dir)
{
    char path[DT_PATH_MAX + 32];
    struct stat st;
    dt_strf(path, sizeof path, "%s/state.json", dir);
    if (stat(path, &st) == 0) return 1;
    dt_strf(path, sizeof path, "%s/" DT_CKPT_MANIFEST, dir);
    return stat(path, &st) == 0 || dt_ckpt_has_shards(dir);
}

/* The newest checkpoint directory of a run that has no `latest`. */
static int newest(const char *where, char *dir, size_t dirlen)
{
    int n;
    long *steps = list_steps(where, &n);
    int found = 0;
    for (int i = n - 1; i >= 0 && !found; i--) {
        dt_ckpt_dir_path(dir, dirlen, where, steps[i]);
        found = is_checkpoint(dir);
    }
    free(steps);
    return found;
}

int dt_ckpt_resolve(const char *where, char *dir, size_t dirlen, char *err, size_t errlen)
{
    char path[DT_PATH_MAX + 32];
    struct stat st;
    if (is_checkpoint(where)) {
        dt_strf(dir, dirlen, "%s", where);
        return 0;
    }
    dt_strf(path, sizeof path, "%s/latest", where);
    if (stat(path, &st) != 0 && errno == ENOENT && newest(where, dir, dirlen)) return 0;
    char e2[256];
    char *text = dt_read_file(path, 4096, NULL, e2, sizeof e2);
    if (!text) {
        dt_strf(err, errlen,
                "%s: no checkpoint to resume from (neither %s/state.json, %s/" DT_CKPT_MANIFEST
                " nor %s)",
                where, where, where, path);
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
