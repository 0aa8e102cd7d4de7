#include "train/data/dataset.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/str.h"

#if __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "llm.c shards are little-endian and are read in place"
#endif

/* One open file, shared by the dataset opened on it and its views. Tokens
 * are read with pread when a batch needs them, not mapped: a file that
 * another process truncates under a run then gives a short read and a
 * message, where a mapping would kill the process with SIGBUS. */
struct source {
    atomic_int refs;
    int fd;
    char *path;
    uint64_t size;     /* bytes when opened */
    uint64_t data_off; /* where token 0 starts: after the header of a shard */
    int width;         /* bytes a token: 1 (text), 2 or 4 */
    uint64_t ntokens;
    int vocab;
    dt_tok_ref tok;
};

struct dt_dataset {
    struct source *src;
    uint64_t begin, end; /* the tokens this dataset covers */
    char *name;
};

/* Tokens read at a time while scanning a whole file. */
#define SCAN_TOKENS 32768

static void source_release(struct source *s)
{
    if (atomic_fetch_sub(&s->refs, 1) != 1) return;
    if (s->fd >= 0) close(s->fd);
    free(s->path);
    free(s);
}

/* Why a read came up short: the file shrank (the one thing a user does to
 * a file under a run), or the read itself failed. */
static int read_failed(const struct source *s, int e, char *err, size_t errlen)
{
    struct stat st;
    if (fstat(s->fd, &st) == 0 && (uint64_t)st.st_size < s->size)
        dt_strf(err, errlen, "%s shrank from %llu to %llu bytes while training", s->path,
                (unsigned long long)s->size, (unsigned long long)st.st_size);
    else
        dt_strf(err, errlen, "%s: read failed: %s", s->path, e ? strerror(e) : "unexpected end");
    return -1;
}

static int read_at(const struct source *s, uint64_t off, void *buf, size_t n, char *err,
                   size_t errlen)
{
    char *p = buf;
    while (n) {
        ssize_t got = pread(s->fd, p, n, (off_t)off);
        if (got < 0 && errno == EINTR) continue;
        if (got <= 0) return read_failed(s, got < 0 ? errno : 0, err, errlen);
        p += got;
        n -= (size_t)got;
        off += (uint64_t)got;
    }
    return 0;
}

/* A batch checks the size first, so a shrink is reported at the next
 * batch even when the tokens it needs are still there. */
static int check_size(const struct source *s, char *err, size_t errlen)
{
    struct stat st;
    if (fstat(s->fd, &st) == 0 && (uint64_t)st.st_size >= s->size) return 0;
    return read_failed(s, errno, err, errlen);
}

/* Tokens at .. at+n-1 of the file, widened to uint32. */
static int read_tokens(const struct source *s, uint64_t at, size_t n, uint32_t *out, char *err,
                       size_t errlen)
{
    if (s->width == 4) return read_at(s, s->data_off + 4 * at, out, 4 * n, err, errlen);
    /* Narrower tokens are read into the front of out, then widened from
     * the back, where no token is overwritten before it is read. */
    const size_t w = (size_t)s->width;
    for (size_t done = 0; done < n;) {
        size_t k = n - done < 65536 ? n - done : 65536;
        uint32_t *o = out + done;
        if (read_at(s, s->data_off + w * (at + done), o, w * k, err, errlen) != 0) return -1;
        if (w == 2) {
            const uint16_t *t = (const uint16_t *)(void *)o;
            for (size_t i = k; i-- > 0;) o[i] = t[i];
        } else {
            const unsigned char *b = (const unsigned char *)o;
            for (size_t i = k; i-- > 0;) o[i] = b[i];
        }
        done += k;
    }
    return 0;
}

static int open_file(const char *path, struct source *s, char *err, size_t errlen)
{
    s->fd = open(path, O_RDONLY | O_CLOEXEC);
    if (s->fd < 0) {
        dt_strf(err, errlen, "%s: cannot open: %s", path, strerror(errno));
        return -1;
    }
    struct stat st;
    int rc = fstat(s->fd, &st);
    if (rc != 0 || !S_ISREG(st.st_mode)) {
        dt_strf(err, errlen, "%s: %s", path, rc ? strerror(errno) : "not a regular file");
        return -1;
    }
    if (st.st_size == 0) {
        dt_strf(err, errlen, "%s: empty file, no tokens", path);
        return -1;
    }
    s->size = (uint64_t)st.st_size;
    return 0;
}

/* The largest token + 1, in one pass over the file; a token at or beyond
 * the header's vocabulary (hdr_vocab > 0) is refused, as the tokens and
 * their vocabulary disagree. */
static int scan_vocab(struct source *s, int32_t hdr_vocab, char *err, size_t errlen)
{
    uint32_t *buf = malloc(SCAN_TOKENS * sizeof *buf);
    if (!buf) {
        dt_strf(err, errlen, "%s: out of memory", s->path);
        return -1;
    }
    uint32_t top = 0;
    int rc = 0;
    for (uint64_t at = 0; rc == 0 && at < s->ntokens; at += SCAN_TOKENS) {
        size_t n = s->ntokens - at < SCAN_TOKENS ? (size_t)(s->ntokens - at) : SCAN_TOKENS;
        rc = read_tokens(s, at, n, buf, err, errlen);
        for (size_t i = 0; rc == 0 && i < n; i++) {
            top = buf[i] > top ? buf[i] : top;
            if (hdr_vocab <= 0 || buf[i] < (uint32_t)hdr_vocab) continue;
            dt_strf(err, errlen, "%s: token %u at position %llu is beyond the vocabulary of %d "
                    "its header records (ids 0 to %d): the tokens and their vocabulary "
                    "disagree", s->path, buf[i], (unsigned long long)(at + i), hdr_vocab,
                    hdr_vocab - 1);
            rc = -1;
        }
    }
    free(buf);
    if (rc == 0 && top >= INT32_MAX) {
        dt_strf(err, errlen, "%s: token %u is beyond any vocabulary dtrain trains", s->path,
                top);
        rc = -1;
    }
    s->vocab = hdr_vocab > 0 ? hdr_vocab : (int)top + 1;
    return rc;
}

/* The header promises a size; the file must have exactly that, since a
 * shard cut short by a failed copy and a shard with something appended
 * both mean the data is not what the writer wrote. */
static int parse_shard(const char *path, struct source *s, char *err, size_t errlen)
{
    if (s->size < DT_SHARD_HEADER_BYTES) {
        dt_strf(err, errlen,
                "%s: starts with an llm.c shard's magic but is only %llu bytes, shorter "
                "than the %d-byte header: truncated",
                path, (unsigned long long)s->size, DT_SHARD_HEADER_BYTES);
        return -1;
    }
    int32_t hdr[DT_SHARD_HEADER_INTS];
    dt_shard_info info;
    if (read_at(s, 0, hdr, sizeof hdr, err, errlen) != 0 ||
        dt_shard_header_parse(path, hdr, &info, err, errlen) != 0)
        return -1;
    uint64_t want = DT_SHARD_HEADER_BYTES + (uint64_t)info.width * (uint64_t)info.ntokens;
    if (s->size != want) {
        dt_strf(err, errlen,
                "%s: %s: the header says %lld tokens, so the file should be %llu bytes, but it "
                "is %llu",
                path, s->size < want ? "truncated" : "trailing bytes", (long long)info.ntokens,
                (unsigned long long)want, (unsigned long long)s->size);
        return -1;
    }
    s->width = info.width;
    s->data_off = DT_SHARD_HEADER_BYTES;
    s->ntokens = (uint64_t)info.ntokens;
    s->tok = info.tok;
    return scan_vocab(s, info.vocab, err, errlen);
}

/* Text has no NUL bytes; a binary file (weights, a foreign token format)
 * almost always does. Reading one as bytes would train on garbage without a
 * word, so it is refused. */
static int parse_text(const char *path, struct source *s, char *err, size_t errlen)
{
    char buf[65536];
    for (uint64_t at = 0; at < s->size; at += sizeof buf) {
        size_t n = s->size - at < sizeof buf ? (size_t)(s->size - at) : sizeof buf;
        if (read_at(s, at, buf, n, err, errlen) != 0) return -1;
        const char *nul = memchr(buf, 0, n);
        if (nul) {
            dt_strf(err, errlen,
                    "%s: neither an llm.c shard (magic %d or %d) nor text (a NUL byte at "
                    "offset %llu)", path, DT_SHARD_MAGIC, DT_SHARD32_MAGIC,
                    (unsigned long long)(at + (uint64_t)(nul - buf)));
            return -1;
        }
    }
    s->width = 1;
    s->ntokens = s->size;
    s->vocab = 256;
    s->tok = dt_tok_bytes;
    return 0;
}

static int is_shard(const struct source *s)
{
    int32_t magic;
    char err[8];
    return s->size >= 4 && read_at(s, 0, &magic, 4, err, sizeof err) == 0 &&
           dt_shard_magic(magic);
}

static dt_dataset *dataset_new(struct source *src, uint64_t begin, uint64_t end,
                               const char *name)
{
    dt_dataset *d = calloc(1, sizeof *d);
    char *copy = strdup(name);
    if (!d || !copy) {
        free(d);
        free(copy);
        return NULL;
    }
    atomic_fetch_add(&src->refs, 1);
    d->src = src;
    d->begin = begin;
    d->end = end;
    d->name = copy;
    return d;
}

int dt_dataset_open(const char *path, dt_dataset **out, char *err, size_t errlen)
{
    *out = NULL;
    struct source *s = calloc(1, sizeof *s);
    if (s) s->path = strdup(path);
    if (!s || !s->path) {
        free(s);
        dt_strf(err, errlen, "%s: out of memory", path);
        return -1;
    }
    atomic_init(&s->refs, 1);
    s->fd = -1;
    int rc = open_file(path, s, err, errlen);
    if (rc == 0) rc = is_shard(s) ? parse_shard(path, s, err, errlen)
                                  : parse_text(path, s, err, errlen);
    if (rc == 0 && !(*out = dataset_new(s, 0, s->ntokens, path))) {
        dt_strf(err, errlen, "%s: out of memory", path);
        rc = -1;
    }
    source_release(s); /* the dataset holds its own reference */
    return rc;
}

void dt_dataset_close(dt_dataset *d)
{
    if (!d) return;
    source_release(d->src);
    free(d->name);
    free(d);
}

const char *dt_dataset_name(const dt_dataset *d) { return d->name; }
uint64_t dt_dataset_ntokens(const dt_dataset *d) { return d->end - d->begin; }
int dt_dataset_vocab(const dt_dataset *d) { return d->src->vocab; }
int dt_dataset_is_text(const dt_dataset *d) { return d->src->width == 1; }
int dt_dataset_width(const dt_dataset *d) { return d->src->width; }
const dt_tok_ref *dt_dataset_tokenizer(const dt_dataset *d) { return &d->src->tok; }

uint32_t dt_dataset_token(const dt_dataset *d, uint64_t i)
{
    uint32_t t;
    char err[8];
    return dt_dataset_read(d, i, 1, &t, err, sizeof err) == 0 ? t : UINT32_MAX;
}

int dt_dataset_read(const dt_dataset *d, uint64_t begin, size_t n, uint32_t *out, char *err,
                    size_t errlen)
{
    return read_tokens(d->src, d->begin + begin, n, out, err, errlen);
}

uint64_t dt_dataset_nseq(const dt_dataset *d, int T)
{
    uint64_t n = dt_dataset_ntokens(d);
    return T > 0 && n > 0 ? (n - 1) / (uint64_t)T : 0;
}

int dt_dataset_check(const dt_dataset *d, int T, char *err, size_t errlen)
{
    if (T <= 0) {
        dt_strf(err, errlen, "%s: sequence length %d must be positive", d->name, T);
        return -1;
    }
    if (dt_dataset_nseq(d, T) == 0) {
        dt_strf(err, errlen,
                "%s: %llu tokens are too few: one sequence of length %d needs %llu (its "
                "inputs and the next token)",
                d->name, (unsigned long long)dt_dataset_ntokens(d), T,
                (unsigned long long)T + 1);
        return -1;
    }
    return 0;
}

int dt_dataset_batch(const dt_dataset *d, dt_sampler *s, uint64_t first_seq, int B, int T,
                     int32_t *inputs, int32_t *targets, char *err, size_t errlen)
{
    if (B < 0) {
        dt_strf(err, errlen, "%s: batch size %d is negative", d->name, B);
        return -1;
    }
    if (dt_dataset_check(d, T, err, errlen) != 0) return -1;
    if (check_size(d->src, err, errlen) != 0) return -1;
    uint32_t *seq = malloc(((size_t)T + 1) * sizeof *seq); /* inputs, then the next token */
    if (!seq) {
        dt_strf(err, errlen, "%s: out of memory for a sequence of %d", d->name, T);
        return -1;
    }
    uint64_t nseq = dt_dataset_nseq(d, T);
    int rc = 0;
    for (int b = 0; b < B && rc == 0; b++) {
        uint64_t k;
        rc = dt_sampler_index(s, nseq, first_seq + (uint64_t)b, &k, err, errlen);
        if (rc == 0) rc = dt_dataset_read(d, k * (uint64_t)T, (size_t)T + 1, seq, err, errlen);
        int32_t *in = inputs + (size_t)b * (size_t)T;
        int32_t *tg = targets + (size_t)b * (size_t)T;
        for (int t = 0; rc == 0 && t < T; t++) {
            in[t] = (int32_t)seq[t];
            tg[t] = (int32_t)seq[t + 1];
        }
    }
    free(seq);
    return rc;
}

uint64_t dt_split_point(uint64_t ntokens, double val_fraction)
{
    if (!(val_fraction > 0)) return ntokens;
    if (val_fraction >= 1) return 0;
    double val = floor((double)ntokens * val_fraction + 0.5);
    return val >= (double)ntokens ? 0 : ntokens - (uint64_t)val;
}

int dt_dataset_view(const dt_dataset *d, uint64_t begin, uint64_t end, const char *label,
                    dt_dataset **out, char *err, size_t errlen)
{
    *out = NULL;
    uint64_t n = dt_dataset_ntokens(d);
    if (begin > end || end > n) {
        dt_strf(err, errlen, "%s: tokens %llu to %llu are not a range of its %llu tokens",
                d->name, (unsigned long long)begin, (unsigned long long)end,
                (unsigned long long)n);
        return -1;
    }
    char name[1024];
    dt_strf(name, sizeof name, "%s (%s: tokens %llu to %llu)", d->name, label,
            (unsigned long long)(d->begin + begin), (unsigned long long)(d->begin + end));
    *out = dataset_new(d->src, d->begin + begin, d->begin + end, name);
    if (!*out) {
        dt_strf(err, errlen, "%s: out of memory", d->name);
        return -1;
    }
    return 0;
}

int dt_dataset_split(const dt_dataset *d, double val_fraction, dt_dataset **train,
                     dt_dataset **val, char *err, size_t errlen)
{
    *train = *val = NULL;
    uint64_t n = dt_dataset_ntokens(d);
    if (!(val_fraction > 0 && val_fraction < 1)) {
        dt_strf(err, errlen, "%s: validation fraction %g must be between 0 and 1", d->name,
                val_fraction);
        return -1;
    }
    uint64_t p = dt_split_point(n, val_fraction);
    if (p < 2 || n - p < 2) {
        dt_strf(err, errlen,
                "%s: %llu tokens are too few to hold out a validation fraction of %g (each "
                "part needs at least 2 tokens)",
                d->name, (unsigned long long)n, val_fraction);
        return -1;
    }
    if (dt_dataset_view(d, 0, p, "training part", train, err, errlen) != 0) return -1;
    if (dt_dataset_view(d, p, n, "validation part", val, err, errlen) != 0) {
        dt_dataset_close(*train);
        *train = NULL;
        return -1;
    }
    return 0;
}
