/* tiktoken's ranks files. See vocab.h. */
#include "tokenizer/vocab.h"

#include <stdlib.h>
#include <string.h>

#include "core/file.h"
#include "core/str.h"

#define MAX_FILE_BYTES (256u << 20)
#define MAX_RANK 0x7FFFFFFEu
/* What a ranks file names its end of text as, for decoding. */
#define EOT_TEXT "<|endoftext|>"

typedef struct {
    uint32_t rank;
    uint32_t line;
    const char *b64; /* the token's text in the file, and its bytes */
    size_t b64_len;
    unsigned char *bytes;
    size_t len;
} entry;

static int b64_value(int c)
{
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    return c == '+' ? 62 : c == '/' ? 63 : -1;
}

/* Standard base64 with its padding: the column of the first wrong
 * character (from 1), or 0 when s decodes, into out (3 n / 4 bytes). */
static size_t b64_decode(const char *s, size_t n, unsigned char *out, size_t *len)
{
    size_t pad = n >= 1 && s[n - 1] == '=' ? (n >= 2 && s[n - 2] == '=' ? 2 : 1) : 0;
    uint32_t acc = 0;
    *len = 0;
    for (size_t i = 0; i < n - pad; i++) {
        int v = b64_value((unsigned char)s[i]);
        if (v < 0) return i + 1;
        acc = acc << 6 | (uint32_t)v;
        if (i % 4 == 3) {
            out[(*len)++] = (unsigned char)(acc >> 16);
            out[(*len)++] = (unsigned char)(acc >> 8);
            out[(*len)++] = (unsigned char)acc;
        }
    }
    if (n % 4) return n + 1; /* cut short: the column after the end */
    if (pad >= 1) out[(*len)++] = (unsigned char)(acc >> (pad == 1 ? 10 : 4));
    if (pad == 1) out[(*len)++] = (unsigned char)(acc >> 2);
    return 0;
}

/* One line, "TOKEN RANK", into e (bytes decoded into e->bytes). */
static int parse_line(const char *path, uint32_t line, const char *s, size_t n, entry *e,
                      char *err, size_t errlen)
{
    const char *sp = memchr(s, ' ', n);
    int ok = sp && sp + 1 < s + n;
    uint64_t r = 0;
    for (const char *q = ok ? sp + 1 : s; ok && q < s + n; q++) {
        ok = *q >= '0' && *q <= '9' && r <= MAX_RANK;
        r = r * 10 + (uint64_t)(*q - '0');
    }
    if (!ok || r > MAX_RANK)
        return dt_strf(err, errlen, "%s:%u: '%.60s' is not 'TOKEN RANK' (a token in base64, "
                       "a space, and its rank from 0 to %u)", path, line, s, MAX_RANK), -1;
    e->rank = (uint32_t)r;
    e->line = line;
    e->b64 = s;
    e->b64_len = (size_t)(sp - s);
    if (e->b64_len == 0)
        return dt_strf(err, errlen, "%s:%u: no token before rank %u", path, line, e->rank), -1;
    size_t col = b64_decode(s, e->b64_len, e->bytes, &e->len);
    const int shown = (int)(e->b64_len < 60 ? e->b64_len : 60);
    if (col > e->b64_len)
        return dt_strf(err, errlen, "%s:%u: token '%.*s' (rank %u) is not base64: its length, "
                       "%zu, is not a multiple of 4", path, line, shown, s, e->rank,
                       e->b64_len), -1;
    if (col)
        return dt_strf(err, errlen, "%s:%u: token '%.*s' (rank %u) is not base64: '%c' at "
                       "column %zu (base64 has A-Z a-z 0-9 + /, and = only at the end)", path,
                       line, shown, s, e->rank, s[col - 1], col), -1;
    return 0;
}

/* Every line of text into *entries, their bytes decoded into *store. */
static int parse_all(const char *path, char *text, size_t len, entry **entries, uint32_t *count,
                     unsigned char **store, char *err, size_t errlen)
{
    size_t lines = 1;
    for (size_t i = 0; i < len; i++) lines += text[i] == '\n';
    entry *es = calloc(lines, sizeof *es);
    unsigned char *out = malloc(len + 1);
    *entries = es;
    *store = out;
    *count = 0;
    if (!es || !out) return dt_strf(err, errlen, "%s: out of memory", path), -1;
    uint32_t line = 0;
    size_t used = 0;
    for (char *s = text, *end = text + len; s < end;) {
        line++;
        char *nl = memchr(s, '\n', (size_t)(end - s));
        size_t n = nl ? (size_t)(nl - s) : (size_t)(end - s);
        if (n && s[n - 1] == '\r') n--;
        if (n) { /* tiktoken skips empty lines */
            s[n] = 0;
            entry *e = &es[(*count)++];
            e->bytes = out + used;
            if (parse_line(path, line, s, n, e, err, errlen) != 0) return -1;
            used += e->len;
        }
        s = nl ? nl + 1 : end;
    }
    return 0;
}

/* The message for a token given twice: e, and the id it came as before. */
static int twice(const char *path, const entry *e, uint32_t other, const uint32_t *line_of,
                 char *err, size_t errlen)
{
    return dt_strf(err, errlen, "%s:%u: token '%.*s' (rank %u) is given twice: line %u gave "
                   "it rank %u; each token must have one rank", path, e->line,
                   (int)(e->b64_len < 60 ? e->b64_len : 60), e->b64, e->rank, line_of[other],
                   other), -1;
}

/* The vocabulary from the parsed lines. */
static int build(dt_vocab *v, const char *path, const entry *es, uint32_t n, int64_t eot,
                 char *err, size_t errlen)
{
    if (n == 0) return dt_strf(err, errlen, "%s: no tokens: a ranks file has a line per token "
                               "('TOKEN RANK', the token in base64)", path), -1;
    uint32_t top = 0;
    for (uint32_t i = 0; i < n; i++) top = es[i].rank > top ? es[i].rank : top;
    if (eot >= 0 && eot <= top)
        return dt_strf(err, errlen, "end of text %lld is a rank of %s already (its ranks run to "
                       "%u): it needs an id of its own, above %u", (long long)eot, path, top,
                       top), -1;
    if (eot > MAX_RANK) return dt_strf(err, errlen, "end of text %lld: at most %u", (long long)eot,
                                       MAX_RANK), -1;
    uint32_t eot_id = eot < 0 ? top + 1 : (uint32_t)eot, other, hole;
    uint32_t *line_of = calloc((size_t)top + 1, sizeof *line_of);
    if (!line_of || dt_vocab_init(v, eot_id + 1) != 0) {
        free(line_of);
        return dt_strf(err, errlen, "%s: out of memory", path), -1;
    }
    int rc = 0;
    for (uint32_t i = 0; rc == 0 && i < n; i++) {
        const entry *e = &es[i];
        if (line_of[e->rank]) {
            rc = (dt_strf(err, errlen, "%s:%u: rank %u is given twice (line %u has it too); "
                         "each rank must name one token", path, e->line, e->rank,
                         line_of[e->rank]), -1);
            break;
        }
        rc = dt_vocab_set(v, e->rank, e->bytes, e->len, 0, &other);
        if (rc == 1) rc = twice(path, e, other, line_of, err, errlen);
        else if (rc < 0) dt_strf(err, errlen, "%s: out of memory", path);
        line_of[e->rank] = e->line;
    }
    free(line_of);
    if (rc == 0 && dt_vocab_check_dense(v, top + 1, &hole) != 0)
        rc = (dt_strf(err, errlen, "%s: no token has rank %u: the ranks must run from 0 to %u "
                     "without a gap", path, hole, top), -1);
    if (rc == 0 && dt_vocab_set(v, eot_id, EOT_TEXT, strlen(EOT_TEXT), 1, &other) != 0)
        rc = (dt_strf(err, errlen, "%s: out of memory", path), -1);
    v->eot = (int32_t)eot_id;
    v->tiktoken = 1;
    int missing;
    if (rc == 0 && dt_vocab_find_bytes(v, &missing) != 0)
        rc = (dt_strf(err, errlen, "%s: byte 0x%02x has no token: a byte-level BPE vocabulary "
                     "has one for each of the 256 bytes", path, missing), -1);
    if (rc == 0 && dt_vocab_merges_from_tokens(v) != 0)
        rc = (dt_strf(err, errlen, "%s: out of memory", path), -1);
    return rc;
}

int dt_vocab_load_ranks(dt_vocab *v, const char *path, int64_t eot, char *err, size_t errlen)
{
    *v = (dt_vocab){.eot = -1};
    size_t len;
    char *text = dt_read_file(path, MAX_FILE_BYTES, &len, err, errlen);
    if (!text) return -1;
    entry *es;
    unsigned char *store;
    uint32_t n;
    int rc = parse_all(path, text, len, &es, &n, &store, err, errlen);
    if (rc == 0) rc = build(v, path, es, n, eot, err, errlen);
    if (rc != 0) dt_vocab_free(v);
    free(text);
    free(es);
    free(store);
    return rc;
}
