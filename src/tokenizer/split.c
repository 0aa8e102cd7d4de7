/* The two split patterns, scanned by hand. See split.h.
 *
 * Each alternative of the regex becomes a test at the piece's first
 * character, in the regex's order; the first that matches gives the
 * piece, as the leftmost-first alternation does. A scan that reads the
 * end of the bytes while more may follow sets `more`: the piece is then
 * not known yet. */
#include "tokenizer/split.h"

#include <string.h>

#include "tokenizer/unicode.h"

#define END (-1)

typedef struct {
    const unsigned char *s;
    size_t n;
    int final;
    int more; /* the scan read the end of bytes that go on */
} scan;

static inline int ascii_class(unsigned c)
{
    if ((c | 0x20) - 'a' < 26) return DT_UC_LETTER;
    if (c - '0' < 10) return DT_UC_NUMBER;
    if (c == ' ' || c - 9 < 5) return DT_UC_SPACE;
    return DT_UC_OTHER;
}

/* The class of the character at i and its length (*len); END at the end. */
static inline int class_at(scan *sc, size_t i, int *len)
{
    if (i >= sc->n) {
        sc->more |= !sc->final;
        *len = 0;
        return END;
    }
    if (sc->s[i] < 0x80) {
        *len = 1;
        return ascii_class(sc->s[i]);
    }
    uint32_t cp;
    int cut;
    *len = dt_utf8_decode(sc->s + i, sc->n - i, &cp, &cut);
    sc->more |= cut && !sc->final;
    return cp == DT_UC_INVALID ? DT_UC_OTHER : dt_uc_class(cp);
}

/* The byte at i, or END. */
static inline int byte_at(scan *sc, size_t i)
{
    if (i < sc->n) return sc->s[i];
    sc->more |= !sc->final;
    return END;
}

/* Where the run of class cls that goes on at i ends. */
static size_t run_end(scan *sc, size_t i, int cls)
{
    int len;
    while (class_at(sc, i, &len) == cls) i += (size_t)len;
    return i;
}

/* Where a run of \r and \n from i ends. */
static size_t crlf_end(scan *sc, size_t i)
{
    for (int b = byte_at(sc, i); b == '\r' || b == '\n'; b = byte_at(sc, ++i)) {
    }
    return i;
}

static int lower(int b) { return b >= 'A' && b <= 'Z' ? b + 32 : b; }

/* The length of a contraction at i (which holds '), or 0: 's 't 're 've
 * 'm 'll 'd, any case when fold is set (long s for s too). */
static size_t contraction(scan *sc, size_t i, int fold)
{
    int b1 = byte_at(sc, i + 1);
    if (fold && b1 == 0xC5 && byte_at(sc, i + 2) == 0xBF) return 3; /* 'ſ */
    if (fold) b1 = lower(b1);
    if (b1 == 's' || b1 == 't' || b1 == 'm' || b1 == 'd') return 2;
    if (b1 != 'r' && b1 != 'v' && b1 != 'l') return 0;
    int b2 = byte_at(sc, i + 2);
    if (fold) b2 = lower(b2);
    return b2 == (b1 == 'l' ? 'l' : 'e') ? 3 : 0;
}

/* The whitespace alternatives at i, a white space character: with
 * newlines (cl100k's \s*[\r\n]+), up to the run's last \r or \n when it
 * has one; then \s+(?!\S), the run but its last character when
 * something follows it (that character starts the next piece); then \s+,
 * a lone character. */
static size_t space(scan *sc, size_t i, int newlines)
{
    size_t j = i, last = i, nl_end = 0;
    int len, cls;
    while ((cls = class_at(sc, j, &len)) == DT_UC_SPACE) {
        if (sc->s[j] == '\r' || sc->s[j] == '\n') nl_end = j + 1;
        last = j;
        j += (size_t)len;
    }
    if (newlines && nl_end) return nl_end - i;
    if (cls == END || last == i) return j - i;
    return last - i;
}

static size_t gpt2(scan *sc, size_t i)
{
    const int b = sc->s[i];
    if (b == '\'') {
        size_t k = contraction(sc, i, 0);
        if (k) return k;
    }
    int len, cls;
    if (b == ' ') {
        cls = class_at(sc, i + 1, &len);
        if (cls != DT_UC_SPACE && cls != END) return run_end(sc, i + 1 + len, cls) - i;
    }
    cls = class_at(sc, i, &len);
    if (cls != DT_UC_SPACE) return run_end(sc, i + len, cls) - i;
    return space(sc, i, 0);
}

static size_t cl100k(scan *sc, size_t i)
{
    const int b = sc->s[i];
    if (b == '\'') {
        size_t k = contraction(sc, i, 1);
        if (k) return k;
    }
    int len, len1;
    const int cls = class_at(sc, i, &len);
    if (cls == DT_UC_LETTER) return run_end(sc, i + len, DT_UC_LETTER) - i;
    if (cls != DT_UC_NUMBER && b != '\r' && b != '\n' &&
        class_at(sc, i + len, &len1) == DT_UC_LETTER)
        return run_end(sc, i + len + len1, DT_UC_LETTER) - i;
    if (cls == DT_UC_NUMBER) {
        size_t j = i + len;
        for (int k = 1; k < 3 && class_at(sc, j, &len1) == DT_UC_NUMBER; k++) j += len1;
        return j - i;
    }
    if (b == ' ' && class_at(sc, i + 1, &len1) == DT_UC_OTHER)
        return crlf_end(sc, run_end(sc, i + 1 + len1, DT_UC_OTHER)) - i;
    if (cls == DT_UC_OTHER) return crlf_end(sc, run_end(sc, i + len, DT_UC_OTHER)) - i;
    return space(sc, i, 1);
}

size_t dt_split_next(dt_split p, const unsigned char *text, size_t n, int final)
{
    scan sc = {text, n, final, 0};
    size_t k = p == DT_SPLIT_CL100K ? cl100k(&sc, 0) : gpt2(&sc, 0);
    return sc.more ? 0 : k;
}

const char *dt_split_name(dt_split p)
{
    return p == DT_SPLIT_GPT2 ? "gpt2" : p == DT_SPLIT_CL100K ? "cl100k" : "none";
}

int dt_split_parse(const char *name, dt_split *out)
{
    if (strcmp(name, "gpt2") == 0) return *out = DT_SPLIT_GPT2, 0;
    if (strcmp(name, "cl100k") == 0) return *out = DT_SPLIT_CL100K, 0;
    return -1;
}
