#include "train/data/corpus.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/str.h"
#include "core/atomic_file.h"
#include "train/data/dataset.h"
#include "train/data/shard_write.h"

int dt_cache_dir(char *dir, size_t len, char *err, size_t errlen)
{
    const char *v = getenv("DTRAIN_CACHE");
    int n;
    if (v && *v) {
        n = snprintf(dir, len, "%s", v);
    } else if ((v = getenv("XDG_CACHE_HOME")) && *v) {
        n = snprintf(dir, len, "%s/dtrain", v);
    } else if ((v = getenv("HOME")) && *v) {
        n = snprintf(dir, len, "%s/.cache/dtrain", v);
    } else {
        dt_strf(err, errlen, "no cache directory: set DTRAIN_CACHE (or HOME)");
        return -1;
    }
    if (n < 0 || (size_t)n >= len) {
        dt_strf(err, errlen, "cache directory path too long ('%.64s...')", v);
        return -1;
    }
    return 0;
}

/* ------------------------------------------------------------------ */
/* The source files                                                    */
/* ------------------------------------------------------------------ */

static int is_fortune_file(const char *dir, const char *name)
{
    if (name[0] == '.' || dt_ends_with(name, ".dat") || dt_ends_with(name, ".u8")) return 0;
    char path[DT_PATH_MAX];
    struct stat st;
    if (snprintf(path, sizeof path, "%s/%s", dir, name) >= (int)sizeof path) return 0;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static void free_names(char **names, int n)
{
    for (int i = 0; i < n; i++) free(names[i]);
    free(names);
}

/* The file names in byte order, independent of locale and of the order
 * the file system returns them in. */
static int list_sources(const char *dir, char ***out, int *count)
{
    *out = NULL;
    *count = 0;
    DIR *d = opendir(dir);
    if (!d) return 0;
    char **names = NULL;
    int n = 0, cap = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (!is_fortune_file(dir, e->d_name)) continue;
        if (n == cap) {
            cap = cap ? 2 * cap : 64;
            char **grown = realloc(names, (size_t)cap * sizeof *names);
            if (!grown) goto oom;
            names = grown;
        }
        if (!(names[n] = strdup(e->d_name))) goto oom;
        n++;
    }
    closedir(d);
    if (n > 1) qsort(names, (size_t)n, sizeof *names, cmp_str);
    *out = names;
    *count = n;
    return 0;
oom:
    closedir(d);
    free_names(names, n);
    return -1;
}

/* ------------------------------------------------------------------ */
/* The text                                                            */
/* ------------------------------------------------------------------ */

struct text {
    unsigned char *p;
    size_t len, cap;
};

static int text_put(struct text *t, const void *s, size_t n)
{
    if (t->len + n > t->cap) {
        size_t cap = t->cap ? t->cap : (1u << 20);
        while (t->len + n > cap) cap *= 2;
        unsigned char *p = realloc(t->p, cap);
        if (!p) return -1;
        t->p = p;
        t->cap = cap;
    }
    memcpy(t->p + t->len, s, n);
    t->len += n;
    return 0;
}

/* A line holding only '%' ends an entry; it becomes an empty line, so
 * the corpus reads as paragraphs of English rather than a file format. */
static int append_fortunes(struct text *t, const unsigned char *s, size_t n)
{
    size_t i = 0;
    while (i < n) {
        const unsigned char *nl = memchr(s + i, '\n', n - i);
        size_t end = nl ? (size_t)(nl - s) + 1 : n;
        int separator = s[i] == '%' && (end - i == 2 || (end - i == 1 && !nl));
        if (text_put(t, separator ? (const unsigned char *)"\n" : s + i,
                     separator ? 1 : end - i) != 0)
            return -1;
        i = end;
    }
    if (n && s[n - 1] != '\n') return text_put(t, "\n", 1);
    return 0;
}

static int append_file(struct text *t, const char *path, char *err, size_t errlen)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        dt_strf(err, errlen, "%s: cannot open: %s", path, strerror(errno));
        return -1;
    }
    unsigned char *buf = NULL;
    size_t len = 0, cap = 0;
    int rc = 0;
    for (;;) {
        if (len == cap) {
            cap = cap ? 2 * cap : (1u << 16);
            unsigned char *grown = realloc(buf, cap);
            if (!grown) {
                rc = -1;
                break;
            }
            buf = grown;
        }
        size_t got = fread(buf + len, 1, cap - len, f);
        len += got;
        if (got == 0) break;
    }
    if (ferror(f)) {
        dt_strf(err, errlen, "%s: read failed", path);
        rc = -1;
    } else if (rc != 0 || append_fortunes(t, buf, len) != 0) {
        dt_strf(err, errlen, "%s: out of memory", path);
        rc = -1;
    }
    fclose(f);
    free(buf);
    return rc;
}

static int read_sources(const char *src_dir, struct text *t, int *nfiles, char *err,
                        size_t errlen)
{
    char **names;
    int n;
    if (list_sources(src_dir, &names, &n) != 0) {
        dt_strf(err, errlen, "%s: out of memory listing the directory", src_dir);
        return -1;
    }
    if (n == 0) {
        dt_strf(err, errlen,
                "no fortune files in %s: the default corpus needs Debian's fortunes package "
                "(apt-get install fortunes); or give your own data with --data FILE",
                src_dir);
        return -1;
    }
    for (int i = 0; i < n; i++) {
        char path[DT_PATH_MAX];
        dt_strf(path, sizeof path, "%s/%s", src_dir, names[i]);
        if (append_file(t, path, err, errlen) != 0) {
            free_names(names, n);
            return -1;
        }
    }
    free_names(names, n);
    *nfiles = n;
    return 0;
}

/* ------------------------------------------------------------------ */
/* The shards                                                          */
/* ------------------------------------------------------------------ */

static int write_shard(const char *path, const unsigned char *bytes, size_t n, char *err,
                       size_t errlen)
{
    dt_shard_writer w;
    if (dt_shard_begin(&w, path, 256, &dt_tok_bytes, err, errlen) != 0) return -1;
    if (dt_shard_append_bytes(&w, bytes, n, err, errlen) != 0) return -1;
    return dt_shard_commit(&w, err, errlen);
}

/* The first token outside the byte range, as a reason; 0 when none is. */
static int find_non_byte(const dt_dataset *d, const char *path, char *why, size_t len)
{
    uint32_t buf[16384];
    uint64_t n = dt_dataset_ntokens(d);
    for (uint64_t at = 0; at < n; at += 16384) {
        size_t k = n - at < 16384 ? (size_t)(n - at) : 16384;
        if (dt_dataset_read(d, at, k, buf, why, len) != 0) return -1;
        for (size_t i = 0; i < k; i++) {
            if (buf[i] < 256) continue;
            dt_strf(why, len, "%s holds token %u at position %llu, outside the byte range 0..255",
                    path, buf[i], (unsigned long long)(at + i));
            return -1;
        }
    }
    return 0;
}

/* Whether path is a byte-level shard as build() writes it; else why not.
 * A damaged token would otherwise make the model's vocabulary 65536. */
static int check_shard(const char *path, uint64_t *ntokens, char *why, size_t len)
{
    dt_dataset *d;
    if (dt_dataset_open(path, &d, why, len) != 0) return -1;
    int rc = 0;
    if (dt_dataset_is_text(d)) {
        dt_strf(why, len, "%s is not an llm.c shard", path);
        rc = -1;
    } else if (find_non_byte(d, path, why, len) != 0) {
        rc = -1;
    } else if (dt_dataset_vocab(d) != 256) {
        dt_strf(why, len, "%s: its header gives a vocabulary of %d, not the 256 of bytes", path,
                dt_dataset_vocab(d));
        rc = -1;
    }
    *ntokens = dt_dataset_ntokens(d);
    dt_dataset_close(d);
    return rc;
}

/* 0: the cache holds a whole corpus; 1: nothing (or part of one: ranks
 * racing to build it publish one file, then the other); -1: something
 * damaged, with the reason in why. */
static int cache_state(const char *train_path, const char *val_path, char *why, size_t len)
{
    if (access(train_path, F_OK) != 0 || access(val_path, F_OK) != 0) return 1;
    uint64_t ntrain, nval;
    if (check_shard(train_path, &ntrain, why, len) != 0 ||
        check_shard(val_path, &nval, why, len) != 0)
        return -1;
    if (dt_split_point(ntrain + nval, DT_CORPUS_VAL_FRACTION) == ntrain) return 0;
    dt_strf(why, len, "%s and %s do not split one corpus (%llu and %llu tokens)", train_path,
            val_path, (unsigned long long)ntrain, (unsigned long long)nval);
    return -1;
}

static int build(const char *src_dir, const char *out_dir, const char *train_path,
                 const char *val_path, char *err, size_t errlen)
{
    struct text t = {0};
    int nfiles = 0;
    int rc = read_sources(src_dir, &t, &nfiles, err, errlen);
    uint64_t split = dt_split_point(t.len, DT_CORPUS_VAL_FRACTION);
    if (rc == 0 && (split == 0 || split == t.len)) {
        dt_strf(err, errlen, "%s: %zu bytes of text are too few to split", src_dir, t.len);
        rc = -1;
    }
    if (rc == 0) rc = write_shard(train_path, t.p, split, err, errlen);
    if (rc == 0) rc = write_shard(val_path, t.p + split, t.len - split, err, errlen);
    if (rc == 0)
        fprintf(stderr,
                "dtrain: built the default corpus from Debian's fortunes package (%d files "
                "in %s): %llu training and %llu validation byte tokens in %s\n",
                nfiles, src_dir, (unsigned long long)split, (unsigned long long)(t.len - split),
                out_dir);
    free(t.p);
    return rc;
}

int dt_corpus_build(const char *src_dir, const char *out_dir, char *train_path, char *val_path,
                    size_t len, char *err, size_t errlen)
{
    int a = snprintf(train_path, len, "%s/train.bin", out_dir);
    int b = snprintf(val_path, len, "%s/val.bin", out_dir);
    if (a < 0 || b < 0 || (size_t)a >= len || (size_t)b >= len) {
        dt_strf(err, errlen, "%s: path too long", out_dir);
        return -1;
    }
    char why[1024];
    int state = cache_state(train_path, val_path, why, sizeof why);
    if (state == 0) return 0;
    if (state < 0) fprintf(stderr, "dtrain: the cached corpus is damaged (%s): rebuilding it\n", why);
    int rc = dt_mkdir_p(out_dir, err, errlen);
    if (rc == 0) rc = build(src_dir, out_dir, train_path, val_path, err, errlen);
    if (rc != 0 && state < 0) {
        char cause[1024];
        dt_strf(cause, sizeof cause, "%s", err);
        dt_strf(err, errlen, "%s, and the cache cannot be rebuilt: %s", why, cause);
    }
    return rc;
}

int dt_data_files(const char *data, const char *val_data, char *train_path, char *val_path,
                  size_t len, char *err, size_t errlen)
{
    if (!data[0]) {
        if (dt_default_corpus(train_path, val_path, len, err, errlen)) return -1;
        if (val_data[0]) dt_strf(val_path, len, "%s", val_data);
        return 0;
    }
    dt_strf(train_path, len, "%s", data);
    dt_strf(val_path, len, "%s", val_data);
    return 0;
}

int dt_default_corpus(char *train_path, char *val_path, size_t len, char *err, size_t errlen)
{
    char cache[DT_PATH_MAX], dir[DT_PATH_MAX + 16];
    if (dt_cache_dir(cache, sizeof cache, err, errlen) != 0) return -1;
    dt_strf(dir, sizeof dir, "%s/fortunes", cache);
    return dt_corpus_build(DT_FORTUNES_DIR, dir, train_path, val_path, len, err, errlen);
}
