/* See text_tokens.h. The text is read into a buffer; what the tokenizer
 * cannot finish yet (a piece whose end the next bytes could move, or
 * bytes that may begin a separator) stays at its front for the next read,
 * and the buffer grows when one piece fills it. */
#include "train/data/text_tokens.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/str.h"

#define READ_BYTES (1u << 20)
#define FLUSH_TOKENS (1u << 20)

typedef struct {
    dt_tokenizer *tok;
    dt_tok_ids ids;
    dt_tokens_sink sink;
    void *ctx;
    dt_text_stats *st;
    int doc_open; /* the current document's end of text is out */
} job;

static int flush(job *j, size_t min, char *err, size_t errlen)
{
    if (j->ids.n < min || j->ids.n == 0) return 0;
    j->st->tokens += j->ids.n;
    int rc = j->sink(j->ctx, j->ids.v, j->ids.n, err, errlen);
    j->ids.n = 0;
    return rc;
}

/* Tokens of text[0..n) of the current document (final: its last bytes);
 * *used: how many bytes were encoded. */
static int encode(job *j, const char *text, size_t n, int final, size_t *used, char *err,
                  size_t errlen)
{
    *used = 0;
    if (n == 0) return 0;
    if (!j->doc_open) {
        if (dt_tok_ids_push(&j->ids, (uint32_t)dt_tokenizer_ref(j->tok)->eot) != 0)
            return dt_strf(err, errlen, "out of memory for tokens"), -1;
        j->doc_open = 1;
        j->st->docs++;
    }
    if (dt_tokenizer_encode(j->tok, text, n, final, &j->ids, used) != 0)
        return dt_strf(err, errlen, "out of memory for tokens"), -1;
    return flush(j, FLUSH_TOKENS, err, errlen);
}

/* Encodes what buf[0..len) allows: whole documents up to each separator,
 * then of the last one as much as is certain (all of it at eof). Returns
 * the bytes consumed, or -1. */
static long long consume(job *j, const char *buf, size_t len, int eof, const char *sep,
                         size_t seplen, char *err, size_t errlen)
{
    size_t pos = 0, used;
    for (;;) {
        const char *q = sep ? memmem(buf + pos, len - pos, sep, seplen) : NULL;
        if (!q) break;
        size_t end = (size_t)(q - buf);
        if (encode(j, buf + pos, end - pos, 1, &used, err, errlen) != 0) return -1;
        j->doc_open = 0;
        pos = end + seplen;
    }
    /* Bytes that may start a separator wait for the next read. */
    size_t limit = len;
    if (!eof && sep) limit = len - pos > seplen - 1 ? len - (seplen - 1) : pos;
    if (encode(j, buf + pos, limit - pos, eof, &used, err, errlen) != 0) return -1;
    return (long long)(pos + used);
}

static int read_more(int fd, const char *path, char *buf, size_t room, size_t *got, char *err,
                     size_t errlen)
{
    for (;;) {
        ssize_t r = read(fd, buf, room);
        if (r >= 0) return *got = (size_t)r, 0;
        if (errno != EINTR)
            return dt_strf(err, errlen, "%s: read failed: %s", path, strerror(errno)), -1;
    }
}

static int run(job *j, int fd, const char *path, const char *sep, size_t seplen, char *err,
               size_t errlen)
{
    size_t cap = READ_BYTES, len = 0;
    char *buf = malloc(cap);
    int rc = buf ? 0 : (dt_strf(err, errlen, "out of memory"), -1), eof = 0;
    while (rc == 0 && !eof) {
        if (len == cap) { /* one piece, or a document's start, fills the buffer */
            char *grown = realloc(buf, 2 * cap);
            if (!grown) {
                rc = (dt_strf(err, errlen, "%s: out of memory for a piece of %zu bytes", path,
                              cap), -1);
                break;
            }
            buf = grown;
            cap *= 2;
        }
        size_t got;
        rc = read_more(fd, path, buf + len, cap - len, &got, err, errlen);
        if (rc != 0) break;
        eof = got == 0;
        len += got;
        j->st->bytes += got;
        long long used = consume(j, buf, len, eof, sep, seplen, err, errlen);
        if (used < 0) rc = -1;
        else memmove(buf, buf + used, len -= (size_t)used);
    }
    free(buf);
    return rc;
}

int dt_text_tokenize(const char *path, dt_tokenizer *t, const char *sep, size_t seplen,
                     dt_tokens_sink sink, void *ctx, dt_text_stats *st, char *err,
                     size_t errlen)
{
    memset(st, 0, sizeof *st);
    if (dt_tokenizer_ref(t)->eot < 0)
        return dt_strf(err, errlen, "the %s tokenizer has no end of text to put between "
                       "documents", dt_tokenizer_ref(t)->spec), -1;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return dt_strf(err, errlen, "%s: cannot open: %s", path, strerror(errno)), -1;
    job j = {t, {0}, sink, ctx, st, 0};
    int rc = run(&j, fd, path, seplen ? sep : NULL, seplen, err, errlen);
    if (rc == 0) rc = flush(&j, 0, err, errlen);
    close(fd);
    dt_tok_ids_free(&j.ids);
    return rc;
}
