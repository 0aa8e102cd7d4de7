/*
 * Token data, the sampler and the shard writer.
 *
 *   test_dataset unit
 *       shards (good, truncated, trailing bytes, bad version, ...), text,
 *       sequences and batches, views and the validation split, the
 *       sampler's orders and exact resumption, the shard writer
 *   test_dataset perm SEED EPOCH N
 *       prints the shuffled order of epoch EPOCH, for the Python copy of
 *       the algorithm in test_sampler_py.py to compare
 *   test_dataset same-split FILE FRACTION TRAIN VAL
 *       checks that the shards `dtrain data prepare` wrote hold the same
 *       tokens as the views dt_dataset_split makes of FILE
 */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h" /* tests/check.h */
#include "train/data/dataset.h"
#include "train/data/sampler.h"
#include "train/data/shard_write.h"

static char dir[256];

static const char *path_in(const char *name)
{
    static char buf[4][512];
    static int k;
    k = (k + 1) % 4;
    snprintf(buf[k], sizeof buf[k], "%s/%s", dir, name);
    return buf[k];
}

/* An llm.c shard whose header says `count` tokens and which holds
 * `actual` tokens, token i being (i * mult) % 65536. */
static const char *shard(const char *name, int32_t version, int32_t count, int actual, int mult)
{
    const char *p = path_in(name);
    int32_t hdr[256] = {DT_SHARD_MAGIC, version, count};
    FILE *f = fopen(p, "wb");
    fwrite(hdr, sizeof hdr, 1, f);
    for (int i = 0; i < actual; i++) {
        uint16_t t = (uint16_t)((i * mult) % 65536);
        fwrite(&t, 2, 1, f);
    }
    fclose(f);
    return p;
}

static const char *text(const char *name, const char *content, size_t n)
{
    const char *p = path_in(name);
    FILE *f = fopen(p, "wb");
    fwrite(content, 1, n, f);
    fclose(f);
    return p;
}

static int open_err(const char *path, char *err, size_t errlen)
{
    dt_dataset *d;
    int rc = dt_dataset_open(path, &d, err, errlen);
    if (rc == 0) dt_dataset_close(d);
    return rc;
}

static void test_files(void)
{
    char err[1024];
    dt_dataset *d;
    const char *p = shard("good.bin", 1, 1001, 1001, 7);
    CHECK(dt_dataset_open(p, &d, err, sizeof err) == 0, "good shard: %s", err);
    if (failures) return;
    CHECK(dt_dataset_ntokens(d) == 1001 && !dt_dataset_is_text(d), "good shard");
    CHECK(dt_dataset_vocab(d) == 7001, "vocab %d", dt_dataset_vocab(d)); /* 1000 * 7 + 1 */
    CHECK(dt_dataset_token(d, 3) == 21 && dt_dataset_token(d, 1000) == 7000, "tokens");
    CHECK(strcmp(dt_dataset_name(d), p) == 0, "name");
    dt_dataset_close(d);

    p = shard("trunc.bin", 1, 100, 99, 1);
    CHECK_ERR(open_err(p, err, sizeof err), err, p, "truncated", "says 100 tokens",
              "should be 1224 bytes, but it is 1222");
    p = shard("trail.bin", 1, 100, 101, 1);
    CHECK_ERR(open_err(p, err, sizeof err), err, p, "trailing bytes", "1224 bytes, but it is 1226");
    p = shard("v2.bin", 2, 10, 10, 1);
    CHECK_ERR(open_err(p, err, sizeof err), err, p, "version 2 is not supported");
    p = shard("zero.bin", 1, 0, 0, 1);
    CHECK_ERR(open_err(p, err, sizeof err), err, p, "gives 0 tokens");
    p = shard("neg.bin", 1, -5, 0, 1);
    CHECK_ERR(open_err(p, err, sizeof err), err, p, "gives -5 tokens");
    int32_t magic = DT_SHARD_MAGIC;
    p = text("short.bin", (const char *)&magic, 4);
    CHECK_ERR(open_err(p, err, sizeof err), err, p, "only 4 bytes", "1024-byte header");

    p = text("hello.txt", "hello world", 11);
    CHECK(dt_dataset_open(p, &d, err, sizeof err) == 0, "text: %s", err);
    if (failures) return;
    CHECK(dt_dataset_is_text(d) && dt_dataset_vocab(d) == 256 && dt_dataset_ntokens(d) == 11,
          "text");
    CHECK(dt_dataset_token(d, 0) == 'h' && dt_dataset_token(d, 10) == 'd', "text tokens");
    CHECK(dt_dataset_check(d, 10, err, sizeof err) == 0, "11 tokens hold one sequence of 10");
    CHECK_ERR(dt_dataset_check(d, 11, err, sizeof err), err, "hello.txt",
              "11 tokens are too few", "sequence of length 11 needs 12");
    CHECK_ERR(dt_dataset_check(d, 0, err, sizeof err), err, "sequence length 0");
    dt_dataset_close(d);
    p = text("hi.txt", "\xff\x01\x80", 3);
    CHECK(dt_dataset_open(p, &d, err, sizeof err) == 0, "binary text: %s", err);
    CHECK(dt_dataset_token(d, 0) == 255 && dt_dataset_token(d, 2) == 128, "bytes unsigned");
    dt_dataset_close(d);

    p = text("empty.txt", "", 0);
    CHECK_ERR(open_err(p, err, sizeof err), err, p, "empty file");
    CHECK_ERR(open_err(path_in("missing"), err, sizeof err), err, "missing", "cannot open");
    CHECK_ERR(open_err(dir, err, sizeof err), err, dir, "not a regular file");
}

static void test_batches(void)
{
    char err[1024];
    dt_dataset *d;
    dt_sampler s;
    const char *p = shard("seq.bin", 1, 1001, 1001, 1); /* token i is i */
    CHECK(dt_dataset_open(p, &d, err, sizeof err) == 0, "%s", err);
    if (failures) return;
    CHECK(dt_dataset_nseq(d, 10) == 100 && dt_dataset_nseq(d, 1000) == 1 &&
              dt_dataset_nseq(d, 1001) == 0 && dt_dataset_nseq(d, 3) == 333,
          "nseq");
    dt_sampler_init(&s, 7, 0);
    int32_t in[3 * 10], tg[3 * 10];
    CHECK(dt_dataset_batch(d, &s, 0, 3, 10, in, tg, err, sizeof err) == 0, "%s", err);
    for (int i = 0; i < 30; i++)
        CHECK(in[i] == i && tg[i] == i + 1, "batch [%d]: %d %d", i, in[i], tg[i]);
    /* counter 199 is the last sequence of epoch 1, then 200 wraps to 0 */
    CHECK(dt_dataset_batch(d, &s, 199, 2, 10, in, tg, err, sizeof err) == 0, "%s", err);
    CHECK(in[0] == 990 && tg[9] == 1000 && in[10] == 0 && tg[19] == 10, "wrap");
    CHECK_ERR(dt_dataset_batch(d, &s, 0, 1, 1001, in, tg, err, sizeof err), err, "too few");
    dt_sampler_free(&s);
    dt_dataset_close(d);
}

/* A file truncated under a run (by another process) is an error naming
 * the file and both sizes at the next batch, even one whose tokens are
 * still there; never a SIGBUS. */
static void test_shrink(void)
{
    char err[1024], text_buf[20000];
    dt_dataset *d, *tr, *va;
    dt_sampler s;
    int32_t in[2 * 100], tg[2 * 100];
    dt_sampler_init(&s, 1, 0);
    const char *p = shard("shrink.bin", 1, 1001, 1001, 1); /* 1024 + 2002 bytes */
    int rc = dt_dataset_open(p, &d, err, sizeof err);
    CHECK(rc == 0, "%s", err);
    if (rc) return;
    CHECK(dt_dataset_split(d, 0.1, &tr, &va, err, sizeof err) == 0, "%s", err);
    CHECK(dt_dataset_batch(d, &s, 0, 2, 10, in, tg, err, sizeof err) == 0, "%s", err);
    CHECK(truncate(p, 1500) == 0, "truncate");
    CHECK_ERR(dt_dataset_batch(d, &s, 0, 2, 10, in, tg, err, sizeof err), err,
              "shrink.bin shrank from 3026 to 1500 bytes while training");
    CHECK_ERR(dt_dataset_batch(va, &s, 0, 1, 10, in, tg, err, sizeof err), err,
              "shrink.bin shrank from 3026 to 1500 bytes while training");
    dt_dataset_close(tr);
    dt_dataset_close(va);
    dt_dataset_close(d);

    memset(text_buf, 'a', sizeof text_buf);
    p = text("shrink.txt", text_buf, sizeof text_buf);
    rc = dt_dataset_open(p, &d, err, sizeof err);
    CHECK(rc == 0, "%s", err);
    if (rc) return;
    CHECK(truncate(p, 100) == 0, "truncate");
    CHECK_ERR(dt_dataset_batch(d, &s, 150, 2, 100, in, tg, err, sizeof err), err,
              "shrink.txt shrank from 20000 to 100 bytes while training");
    dt_dataset_close(d);
    dt_sampler_free(&s);
}

static void test_views(void)
{
    char err[1024];
    dt_dataset *d, *tr, *va;
    CHECK(dt_split_point(1000, 0.1) == 900 && dt_split_point(10, 0.1) == 9, "split point");
    CHECK(dt_split_point(5, 0.5) == 2 && dt_split_point(7, 0) == 7 &&
              dt_split_point(1001, 0.1) == 901 && dt_split_point(3, 0.1) == 3,
          "split point rounding");
    const char *p = shard("split.bin", 1, 1001, 1001, 3);
    CHECK(dt_dataset_open(p, &d, err, sizeof err) == 0, "%s", err);
    if (failures) return;
    CHECK(dt_dataset_split(d, 0.1, &tr, &va, err, sizeof err) == 0, "split: %s", err);
    if (failures) return;
    dt_dataset_close(d); /* the views keep the mapping */
    CHECK(dt_dataset_ntokens(tr) == 901 && dt_dataset_ntokens(va) == 100, "parts");
    CHECK(dt_dataset_token(tr, 900) == 2700 && dt_dataset_token(va, 0) == 2703, "boundary");
    CHECK(dt_dataset_vocab(tr) == 3001 && dt_dataset_vocab(va) == 3001, "vocab of the file");
    CHECK(strstr(dt_dataset_name(va), "validation part: tokens 901 to 1001"), "%s",
          dt_dataset_name(va));
    dt_sampler s;
    dt_sampler_init(&s, 1, 0);
    int32_t in[10], tg[10];
    CHECK(dt_dataset_batch(va, &s, 8, 1, 10, in, tg, err, sizeof err) == 0, "%s", err);
    CHECK(in[0] == 3 * 981 && tg[9] == 3 * 991, "last val sequence: %d %d", in[0], tg[9]);
    CHECK(dt_dataset_nseq(va, 10) == 9, "val nseq %llu",
          (unsigned long long)dt_dataset_nseq(va, 10)); /* 100 tokens, 99 targets */
    dt_dataset *sub;
    CHECK(dt_dataset_view(va, 10, 20, "piece", &sub, err, sizeof err) == 0, "%s", err);
    CHECK(dt_dataset_token(sub, 0) == 3 * 911 && dt_dataset_ntokens(sub) == 10, "view of view");
    dt_dataset_close(sub);
    CHECK_ERR(dt_dataset_view(va, 50, 101, "x", &sub, err, sizeof err), err, "not a range");
    CHECK_ERR(dt_dataset_split(va, 0, &sub, &sub, err, sizeof err), err, "between 0 and 1");
    CHECK_ERR(dt_dataset_split(va, 1, &sub, &sub, err, sizeof err), err, "between 0 and 1");
    dt_dataset *tiny;
    CHECK(dt_dataset_view(va, 0, 3, "tiny", &tiny, err, sizeof err) == 0, "%s", err);
    CHECK_ERR(dt_dataset_split(tiny, 0.1, &sub, &sub, err, sizeof err), err,
              "3 tokens are too few to hold out");
    dt_dataset_close(tiny);
    dt_sampler_free(&s);
    dt_dataset_close(tr);
    dt_dataset_close(va);
}

static void epoch_order(uint64_t seed, uint64_t epoch, uint64_t n, uint64_t *out)
{
    dt_sampler s;
    char err[256];
    dt_sampler_init(&s, seed, 1);
    for (uint64_t i = 0; i < n; i++)
        CHECK(dt_sampler_index(&s, n, epoch * n + i, &out[i], err, sizeof err) == 0, "%s", err);
    dt_sampler_free(&s);
}

static int is_permutation(const uint64_t *x, uint64_t n)
{
    char seen[1000] = {0};
    for (uint64_t i = 0; i < n; i++) {
        if (x[i] >= n || seen[x[i]]) return 0;
        seen[x[i]] = 1;
    }
    return 1;
}

static void test_sampler(void)
{
    enum { N = 100 };
    uint64_t e0[N], e1[N], again[N], other[N];
    char err[256];
    dt_sampler s;
    dt_sampler_init(&s, 5, 0);
    uint64_t k;
    for (uint64_t c = 0; c < 3 * N; c++) {
        CHECK(dt_sampler_index(&s, N, c, &k, err, sizeof err) == 0 && k == c % N, "in order");
    }
    CHECK(dt_sampler_index(&s, 0, 0, &k, err, sizeof err) != 0, "nseq 0");
    dt_sampler_free(&s);

    epoch_order(42, 0, N, e0);
    epoch_order(42, 1, N, e1);
    epoch_order(42, 0, N, again);
    epoch_order(43, 0, N, other);
    CHECK(is_permutation(e0, N) && is_permutation(e1, N), "each epoch is a permutation");
    CHECK(memcmp(e0, e1, sizeof e0) != 0, "epochs 0 and 1 in the same order");
    CHECK(memcmp(e0, again, sizeof e0) == 0, "same seed, different order");
    CHECK(memcmp(e0, other, sizeof e0) != 0, "seeds 42 and 43 give the same order");
    int fixed = 0;
    for (int i = 0; i < N; i++) fixed += e0[i] == (uint64_t)i;
    CHECK(fixed < 10, "epoch 0 barely shuffled (%d fixed points)", fixed);
    for (uint64_t n = 1; n <= 3; n++) {
        uint64_t small[3];
        epoch_order(9, 4, n, small);
        CHECK(is_permutation(small, n), "permutation of %llu", (unsigned long long)n);
    }

    /* A run that stops anywhere and resumes with a fresh sampler at the
     * same counter sees the same sequences as one that never stopped. */
    uint64_t straight[5 * N];
    dt_sampler_init(&s, 2024, 1);
    for (uint64_t c = 0; c < 5 * N; c++) dt_sampler_index(&s, N, c, &straight[c], err, 256);
    dt_sampler_free(&s);
    for (uint64_t start = 0; start < 5 * N; start += 37) {
        dt_sampler r;
        dt_sampler_init(&r, 2024, 1);
        for (uint64_t c = start; c < 5 * N && c < start + 150; c++) {
            CHECK(dt_sampler_index(&r, N, c, &k, err, sizeof err) == 0 && k == straight[c],
                  "resumed at %llu, counter %llu", (unsigned long long)start,
                  (unsigned long long)c);
        }
        dt_sampler_free(&r);
    }
}

/* Batches straddling epochs, from a resumed sampler, equal the rows of
 * one long batch. */
static void test_shuffled_batches(void)
{
    char err[1024];
    dt_dataset *d;
    const char *p = shard("shuf.bin", 1, 1001, 1001, 1);
    CHECK(dt_dataset_open(p, &d, err, sizeof err) == 0, "%s", err);
    if (failures) return;
    enum { T = 10, B = 250 };
    static int32_t in[B * T], tg[B * T], in2[7 * T], tg2[7 * T];
    dt_sampler s;
    dt_sampler_init(&s, 77, 1);
    CHECK(dt_dataset_batch(d, &s, 0, B, T, in, tg, err, sizeof err) == 0, "%s", err);
    dt_sampler_free(&s);
    for (int b = 0; b < B; b++) {
        CHECK(in[b * T] % T == 0, "sequence starts on a multiple of T");
        for (int t = 0; t < T; t++)
            CHECK(in[b * T + t] == in[b * T] + t && tg[b * T + t] == in[b * T + t] + 1,
                  "row %d", b);
    }
    for (uint64_t first = 95; first < B - 7; first += 50) {
        dt_sampler r;
        dt_sampler_init(&r, 77, 1);
        CHECK(dt_dataset_batch(d, &r, first, 7, T, in2, tg2, err, sizeof err) == 0, "%s", err);
        CHECK(memcmp(in2, in + first * T, sizeof in2) == 0 &&
                  memcmp(tg2, tg + first * T, sizeof tg2) == 0,
              "batch at %llu", (unsigned long long)first);
        dt_sampler_free(&r);
    }
    dt_dataset_close(d);
}

static int count_files(void)
{
    int n = 0;
    DIR *dd = opendir(dir);
    struct dirent *e;
    while ((e = readdir(dd)))
        if (e->d_name[0] != '.') n++;
    closedir(dd);
    return n;
}

/* A shard written by hand: a header with vocab in its slot, then tokens. */
static const char *shard_with_vocab(const char *name, int32_t vocab, const uint16_t *tok, int n)
{
    const char *p = path_in(name);
    int32_t hdr[256] = {DT_SHARD_MAGIC, 1, n, vocab};
    FILE *f = fopen(p, "wb");
    fwrite(hdr, sizeof hdr, 1, f);
    fwrite(tok, 2, (size_t)n, f);
    fclose(f);
    return p;
}

static long file_size(const char *p)
{
    struct stat st;
    return stat(p, &st) == 0 ? (long)st.st_size : -1;
}

static void test_writer(void)
{
    char err[1024];
    uint32_t tok[3000];
    for (int i = 0; i < 3000; i++) tok[i] = (uint32_t)(i * 31) % 65536;
    int before = count_files();
    const char *p = path_in("written.bin");
    CHECK(dt_shard_write(p, tok, 3000, 0, err, sizeof err) == 0, "%s", err);
    CHECK(count_files() == before + 1, "temporary file left");
    dt_dataset *d;
    CHECK(dt_dataset_open(p, &d, err, sizeof err) == 0, "%s", err);
    if (failures) return;
    uint32_t back[3000];
    CHECK(dt_dataset_read(d, 0, 3000, back, err, sizeof err) == 0, "%s", err);
    CHECK(dt_dataset_ntokens(d) == 3000 && memcmp(back, tok, sizeof tok) == 0, "round trip");
    CHECK(dt_dataset_vocab(d) == 65535, "vocab %d", dt_dataset_vocab(d)); /* max i*31 % 2^16 */
    CHECK(dt_dataset_width(d) == 2 && file_size(p) == 1024 + 2 * 3000, "uint16 shard");
    dt_dataset_close(d);

    /* the header's vocabulary is the data's, when it is one a uint16 can need */
    CHECK(dt_shard_write(p, tok, 2, 300, err, sizeof err) == 0, "%s", err);
    CHECK(dt_dataset_open(p, &d, err, sizeof err) == 0, "%s", err);
    CHECK(dt_dataset_vocab(d) == 300, "header vocab 300: %d", dt_dataset_vocab(d));
    dt_dataset_close(d);
    const uint16_t two[2] = {0, 31};
    p = shard_with_vocab("implausible.bin", 70000, two, 2); /* no uint16 token needs it */
    CHECK(dt_dataset_open(p, &d, err, sizeof err) == 0, "%s", err);
    CHECK(dt_dataset_vocab(d) == 32, "header vocab 70000 in a uint16 shard: %d",
          dt_dataset_vocab(d));
    dt_dataset_close(d);
    /* a token beyond the header's vocabulary: the file is refused, naming both */
    p = shard_with_vocab("beyond.bin", 10, two, 2);
    CHECK_ERR(open_err(p, err, sizeof err), err, p, "token 31 at position 1",
              "beyond the vocabulary of 10");
    /* and the writer refuses to write one */
    before = count_files();
    CHECK_ERR(dt_shard_write(path_in("w10.bin"), tok, 2, 10, err, sizeof err), err, "w10.bin",
              "token 31 (at position 1) is beyond the vocabulary of 10");
    CHECK(count_files() == before, "a refused shard left a file");

    dt_shard_writer w;
    CHECK(dt_shard_begin(&w, path_in("bytes.bin"), 256, &dt_tok_bytes, err, sizeof err) == 0,
          "%s", err);
    CHECK(dt_shard_append_bytes(&w, (const unsigned char *)"\xff" "ab", 3, err, 1024) == 0, "a");
    CHECK(dt_shard_append(&w, tok, 2, err, sizeof err) == 0, "%s", err);
    CHECK(dt_shard_commit(&w, err, sizeof err) == 0, "%s", err);
    CHECK(dt_dataset_open(path_in("bytes.bin"), &d, err, sizeof err) == 0, "%s", err);
    CHECK(dt_dataset_read(d, 0, 5, back, err, sizeof err) == 0, "%s", err);
    CHECK(back[0] == 255 && back[1] == 'a' && back[3] == 0 && back[4] == 31, "bytes");
    CHECK(dt_dataset_vocab(d) == 256, "byte shard vocab %d", dt_dataset_vocab(d));
    CHECK(strcmp(dt_dataset_tokenizer(d)->spec, "bytes") == 0, "bytes recorded");
    dt_dataset_close(d);

    before = count_files();
    CHECK(dt_shard_begin(&w, path_in("none.bin"), 0, NULL, err, sizeof err) == 0, "%s", err);
    CHECK_ERR(dt_shard_commit(&w, err, sizeof err), err, "none.bin", "no tokens");
    CHECK(dt_shard_begin(&w, path_in("gone.bin"), 0, NULL, err, sizeof err) == 0, "%s", err);
    CHECK(dt_shard_append(&w, tok, 100, err, sizeof err) == 0, "%s", err);
    CHECK(access(path_in("gone.bin"), F_OK) != 0, "a shard is visible before its commit");
    dt_shard_abort(&w);
    CHECK(count_files() == before, "an aborted shard left a file");
}

/* A vocabulary over 65,536 takes llm.c's uint32 shard (magic 20240801,
 * version 7), and the tokenizer's record comes back as it went. */
static void test_wide(void)
{
    char err[1024];
    enum { N = 5000, V = 128256 };
    static uint32_t tok[N], back[N];
    for (int i = 0; i < N; i++) tok[i] = (uint32_t)((uint64_t)i * 2654435761u % V);
    tok[7] = V - 1;
    dt_tok_ref ref = {.spec = "/some/where/tokenizer.model", .split = DT_SPLIT_CL100K,
                      .eot = 128000, .vocab = V, .fingerprint = 0x0123456789abcdefull};
    const char *p = path_in("wide.bin");
    dt_shard_writer w;
    CHECK(dt_shard_begin(&w, p, V, &ref, err, sizeof err) == 0, "%s", err);
    CHECK(dt_shard_append(&w, tok, N, err, sizeof err) == 0, "%s", err);
    CHECK(dt_shard_commit(&w, err, sizeof err) == 0, "%s", err);
    int32_t hdr[4] = {0};
    FILE *f = fopen(p, "rb");
    CHECK(f && fread(hdr, 4, 4, f) == 4, "header");
    if (f) fclose(f);
    CHECK(hdr[0] == 20240801 && hdr[1] == 7 && hdr[2] == N && hdr[3] == V,
          "header %d %d %d %d", hdr[0], hdr[1], hdr[2], hdr[3]);
    CHECK(file_size(p) == 1024 + 4L * N, "size %ld", file_size(p));
    dt_dataset *d;
    CHECK(dt_dataset_open(p, &d, err, sizeof err) == 0, "%s", err);
    if (failures) return;
    CHECK(dt_dataset_read(d, 0, N, back, err, sizeof err) == 0, "%s", err);
    CHECK(memcmp(back, tok, sizeof tok) == 0, "uint32 round trip");
    CHECK(dt_dataset_vocab(d) == V && dt_dataset_width(d) == 4, "vocab %d", dt_dataset_vocab(d));
    const dt_tok_ref *got = dt_dataset_tokenizer(d);
    CHECK(strcmp(got->spec, ref.spec) == 0 && got->split == ref.split && got->eot == ref.eot &&
          got->vocab == V && got->fingerprint == ref.fingerprint, "record: %s %d %d %d %llx",
          got->spec, got->split, got->eot, got->vocab, (unsigned long long)got->fingerprint);
    int32_t in[4], tg[4];
    dt_sampler s;
    dt_sampler_init(&s, 0, 0);
    CHECK(dt_dataset_batch(d, &s, 0, 1, 4, in, tg, err, sizeof err) == 0, "%s", err);
    CHECK(in[0] == (int32_t)tok[0] && tg[3] == (int32_t)tok[4], "batch of uint32 tokens");
    dt_dataset_close(d);
}

static void remove_dir(void)
{
    DIR *dd = opendir(dir);
    struct dirent *e;
    while ((e = readdir(dd)))
        if (e->d_name[0] != '.') unlink(path_in(e->d_name));
    closedir(dd);
    rmdir(dir);
}

static int unit(void)
{
    snprintf(dir, sizeof dir, "/tmp/dtrain_ds_XXXXXX");
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        return 1;
    }
    test_files();
    test_batches();
    test_shrink();
    test_views();
    test_sampler();
    test_shuffled_batches();
    test_writer();
    test_wide();
    remove_dir();
    return finish("dataset");
}

static int print_perm(uint64_t seed, uint64_t epoch, uint64_t n)
{
    dt_sampler s;
    char err[256];
    dt_sampler_init(&s, seed, 1);
    for (uint64_t i = 0; i < n; i++) {
        uint64_t k;
        if (dt_sampler_index(&s, n, epoch * n + i, &k, err, sizeof err) != 0) {
            fprintf(stderr, "%s\n", err);
            return 1;
        }
        printf("%llu\n", (unsigned long long)k);
    }
    dt_sampler_free(&s);
    return 0;
}

static int same_split(const char *file, double frac, const char *train, const char *val)
{
    char err[1024];
    dt_dataset *d, *tr, *va, *ftr, *fva;
    if (dt_dataset_open(file, &d, err, sizeof err) ||
        dt_dataset_split(d, frac, &tr, &va, err, sizeof err) ||
        dt_dataset_open(train, &ftr, err, sizeof err) ||
        dt_dataset_open(val, &fva, err, sizeof err)) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    dt_dataset *views[2] = {tr, va}, *files[2] = {ftr, fva};
    for (int k = 0; k < 2; k++) {
        uint64_t n = dt_dataset_ntokens(views[k]);
        CHECK(n == dt_dataset_ntokens(files[k]), "part %d: %llu tokens vs %llu", k,
              (unsigned long long)n, (unsigned long long)dt_dataset_ntokens(files[k]));
        for (uint64_t i = 0; i < n && !failures; i++)
            CHECK(dt_dataset_token(views[k], i) == dt_dataset_token(files[k], i),
                  "part %d token %llu", k, (unsigned long long)i);
    }
    dt_dataset_close(d);
    dt_dataset_close(tr);
    dt_dataset_close(va);
    dt_dataset_close(ftr);
    dt_dataset_close(fva);
    return finish("same-split");
}

int main(int argc, char **argv)
{
    if (argc == 2 && !strcmp(argv[1], "unit")) return unit();
    if (argc == 5 && !strcmp(argv[1], "perm"))
        return print_perm(strtoull(argv[2], NULL, 0), strtoull(argv[3], NULL, 0),
                          strtoull(argv[4], NULL, 0));
    if (argc == 6 && !strcmp(argv[1], "same-split"))
        return same_split(argv[2], atof(argv[3]), argv[4], argv[5]);
    fprintf(stderr, "usage: %s unit | perm SEED EPOCH N | same-split FILE FRAC TRAIN VAL\n",
            argv[0]);
    return 2;
}
