/*
 * The default corpus.
 *
 *   test_corpus unit
 *       a corpus built from a made-up fortunes directory: which files count,
 *       their order, the '%' lines, the split, reuse, rebuild of a broken
 *       cache, ranks racing to build it, the message when the package is
 *       missing, and where the cache directory is
 *   test_corpus default CACHE
 *       dt_default_corpus with DTRAIN_CACHE=CACHE; prints the two paths
 *       (test_corpus_py.py checks the text against the package's files)
 */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h" /* tests/check.h */
#include "train/data/corpus.h"
#include "train/data/dataset.h"
#include "train/data/shard_write.h"

static char root[256];

static const char *path_in(const char *name)
{
    static char buf[4][512];
    static int k;
    k = (k + 1) % 4;
    snprintf(buf[k], sizeof buf[k], "%s/%s", root, name);
    return buf[k];
}

static void put(const char *name, const char *content)
{
    FILE *f = fopen(path_in(name), "wb");
    fputs(content, f);
    fclose(f);
}

static void make_sources(void)
{
    mkdir(path_in("src"), 0777);
    mkdir(path_in("src/off"), 0777);
    put("src/b", "two\n%\nthree");
    put("src/a", "one\n%\n");
    put("src/B", "Zero\n%\n");
    put("src/a.dat", "index, not text");
    put("src/.hidden", "hidden\n");
    put("src/off/x", "offensive\n");
    CHECK(symlink("a", path_in("src/a.u8")) == 0, "symlink");
    mkdir(path_in("empty"), 0777);
}

/* All the tokens of train then val, as text. */
static size_t corpus_text(const char *train, const char *val, char *out, size_t cap,
                          uint64_t *ntrain)
{
    char err[512];
    size_t n = 0;
    const char *paths[2] = {train, val};
    for (int k = 0; k < 2; k++) {
        dt_dataset *d;
        if (dt_dataset_open(paths[k], &d, err, sizeof err) != 0) {
            CHECK(0, "%s", err);
            return 0;
        }
        if (k == 0) *ntrain = dt_dataset_ntokens(d);
        for (uint64_t i = 0; i < dt_dataset_ntokens(d) && n < cap; i++)
            out[n++] = (char)dt_dataset_token(d, i);
        dt_dataset_close(d);
    }
    return n;
}

static ino_t inode(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 ? st.st_ino : 0;
}

static void test_build(void)
{
    char err[1024], train[600], val[600], text[256], out[560], src[560];
    snprintf(out, sizeof out, "%s", path_in("cache/fortunes"));
    snprintf(src, sizeof src, "%s", path_in("src"));
    CHECK(dt_corpus_build(src, out, train, val, sizeof train, err, sizeof err) == 0,
          "build: %s", err);
    if (failures) return;
    CHECK(strcmp(train, path_in("cache/fortunes/train.bin")) == 0, "train path %s", train);
    CHECK(strcmp(val, path_in("cache/fortunes/val.bin")) == 0, "val path %s", val);
    uint64_t ntrain = 0;
    size_t n = corpus_text(train, val, text, sizeof text, &ntrain);
    /* byte order: "B" < "a" < "b"; '%' lines become empty lines */
    const char *want = "Zero\n\none\n\ntwo\n\nthree\n";
    CHECK(n == strlen(want) && memcmp(text, want, n) == 0, "corpus text '%.*s'", (int)n, text);
    CHECK(ntrain == 20 && n - ntrain == 2, "split %llu + %llu", (unsigned long long)ntrain,
          (unsigned long long)(n - ntrain));

    ino_t before = inode(train);
    CHECK(dt_corpus_build(src, out, train, val, sizeof train, err, sizeof err) == 0,
          "second build: %s", err);
    CHECK(inode(train) == before, "a valid corpus was rebuilt");

    CHECK(truncate(val, 1030) == 0, "truncate"); /* a broken cache is rebuilt */
    CHECK(dt_corpus_build(src, out, train, val, sizeof train, err, sizeof err) == 0,
          "rebuild: %s", err);
    CHECK(corpus_text(train, val, text, sizeof text, &ntrain) == strlen(want), "rebuilt");
    int files = 0;
    DIR *d = opendir(out);
    struct dirent *e;
    while ((e = readdir(d))) files += e->d_name[0] != '.';
    closedir(d);
    CHECK(files == 2, "%d files in the cache, expected train.bin and val.bin", files);
}

/* Overwrites n bytes at offset off of path, keeping its size. */
static void poke(const char *path, long off, const void *bytes, size_t n)
{
    FILE *f = fopen(path, "r+b");
    CHECK(f && fseek(f, off, SEEK_SET) == 0 && fwrite(bytes, 1, n, f) == n, "poke %s", path);
    if (f) fclose(f);
}

static int vocab_of(const char *path)
{
    char err[512];
    dt_dataset *d;
    if (dt_dataset_open(path, &d, err, sizeof err) != 0) return -1;
    int v = dt_dataset_vocab(d);
    dt_dataset_close(d);
    return v;
}

/* A cached corpus damaged in place, its size still what its header says:
 * a token outside the byte range (which made the model's vocabulary
 * 65536), a header vocabulary other than 256, a validation part that does
 * not match the split. Each is rebuilt, with a line saying why. */
static void test_damaged(void)
{
    char err[1024], train[600], val[600], text[256], out[560], src[560];
    const char *want = "Zero\n\none\n\ntwo\n\nthree\n";
    snprintf(out, sizeof out, "%s", path_in("cache3/fortunes"));
    snprintf(src, sizeof src, "%s", path_in("src"));
    CHECK(dt_corpus_build(src, out, train, val, sizeof train, err, sizeof err) == 0, "%s", err);
    const uint16_t big = 0xffff;
    const int32_t vocab = 1000;
    for (int k = 0; k < 3; k++) {
        ino_t before = inode(train);
        if (k == 0) poke(train, 1024 + 2 * 5, &big, 2);
        if (k == 1) poke(train, 12, &vocab, 4); /* the header's vocabulary slot */
        if (k == 2) {
            const uint32_t xyz[3] = {'x', 'y', 'z'};
            CHECK(dt_shard_write(val, xyz, 3, 256, err, sizeof err) == 0, "%s", err);
        }
        CHECK(dt_corpus_build(src, out, train, val, sizeof train, err, sizeof err) == 0,
              "case %d: %s", k, err);
        CHECK(inode(train) != before, "case %d: the damaged corpus was kept", k);
        CHECK(vocab_of(train) == 256 && vocab_of(val) == 256, "case %d: vocabularies %d %d", k,
              vocab_of(train), vocab_of(val));
        uint64_t ntrain = 0;
        size_t n = corpus_text(train, val, text, sizeof text, &ntrain);
        CHECK(n == strlen(want) && memcmp(text, want, n) == 0, "case %d: text '%.*s'", k, (int)n,
              text);
    }
    /* Damaged, and nothing to rebuild it from: an error that says both. */
    poke(train, 1024 + 2 * 5, &big, 2);
    int rc = dt_corpus_build(path_in("nowhere"), out, train, val, sizeof train, err, sizeof err);
    CHECK_ERR(rc, err, "cache3/fortunes/train.bin", "token 65535", "cannot be rebuilt",
              "apt-get install fortunes");
}

static void test_missing(void)
{
    char err[1024], train[600], val[600];
    int rc = dt_corpus_build(path_in("nowhere"), path_in("c2"), train, val, sizeof train, err,
                             sizeof err);
    CHECK_ERR(rc, err, "nowhere", "apt-get install fortunes", "--data");
    rc = dt_corpus_build(path_in("empty"), path_in("c2"), train, val, sizeof train, err,
                         sizeof err);
    CHECK_ERR(rc, err, "no fortune files in", "empty");
    char small[8];
    rc = dt_corpus_build(path_in("src"), path_in("c2"), small, small, sizeof small, err,
                         sizeof err);
    CHECK_ERR(rc, err, "path too long");
}

/* Ranks of one job all ask for the corpus at once: each builds it and
 * renames its own files into place; all must succeed with whole files. */
static void test_race(void)
{
    enum { RANKS = 6 };
    char outdir[600], src[600];
    snprintf(outdir, sizeof outdir, "%s", path_in("race/fortunes"));
    snprintf(src, sizeof src, "%s", path_in("src"));
    pid_t pids[RANKS];
    for (int r = 0; r < RANKS; r++) {
        pids[r] = fork();
        if (pids[r] == 0) {
            char err[1024], train[600], val[600];
            int rc = dt_corpus_build(src, outdir, train, val, sizeof train, err, sizeof err);
            if (rc != 0) fprintf(stderr, "rank %d: %s\n", r, err);
            _exit(rc == 0 ? 0 : 1);
        }
    }
    for (int r = 0; r < RANKS; r++) {
        int status = -1;
        waitpid(pids[r], &status, 0);
        CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "rank %d failed", r);
    }
    char train[700], val[700], text[256];
    snprintf(train, sizeof train, "%s/train.bin", outdir);
    snprintf(val, sizeof val, "%s/val.bin", outdir);
    uint64_t ntrain;
    CHECK(corpus_text(train, val, text, sizeof text, &ntrain) == 22, "raced corpus");
    int files = 0;
    DIR *d = opendir(outdir);
    struct dirent *e;
    while ((e = readdir(d))) files += e->d_name[0] != '.';
    closedir(d);
    CHECK(files == 2, "%d files after the race (temporary files left?)", files);
}

static void test_cache_dir(void)
{
    char dir[512], err[256];
    setenv("DTRAIN_CACHE", "/x/c", 1);
    setenv("XDG_CACHE_HOME", "/x/xdg", 1);
    setenv("HOME", "/x/home", 1);
    CHECK(dt_cache_dir(dir, sizeof dir, err, sizeof err) == 0 && !strcmp(dir, "/x/c"), "%s", dir);
    unsetenv("DTRAIN_CACHE");
    CHECK(dt_cache_dir(dir, sizeof dir, err, sizeof err) == 0 && !strcmp(dir, "/x/xdg/dtrain"),
          "%s", dir);
    setenv("XDG_CACHE_HOME", "", 1);
    CHECK(dt_cache_dir(dir, sizeof dir, err, sizeof err) == 0 &&
              !strcmp(dir, "/x/home/.cache/dtrain"),
          "%s", dir);
    unsetenv("HOME");
    CHECK_ERR(dt_cache_dir(dir, sizeof dir, err, sizeof err), err, "DTRAIN_CACHE");
}

static int unit(void)
{
    snprintf(root, sizeof root, "/tmp/dtrain_corpus_XXXXXX");
    if (!mkdtemp(root)) {
        perror("mkdtemp");
        return 1;
    }
    make_sources();
    test_build();
    test_damaged();
    test_missing();
    test_race();
    test_cache_dir();
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", root);
    return finish("corpus");
}

int main(int argc, char **argv)
{
    if (argc == 2 && !strcmp(argv[1], "unit")) return unit();
    if (argc == 3 && !strcmp(argv[1], "default")) {
        char err[1024], train[4096], val[4096];
        setenv("DTRAIN_CACHE", argv[2], 1);
        if (dt_default_corpus(train, val, sizeof train, err, sizeof err) != 0) {
            fprintf(stderr, "%s\n", err);
            return 1;
        }
        printf("%s\n%s\n", train, val);
        return 0;
    }
    fprintf(stderr, "usage: %s unit | default CACHE\n", argv[0]);
    return 2;
}
