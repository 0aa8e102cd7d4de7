/*
 * The tokenizers against hand-worked cases and, with test_oracle.py,
 * against node's.
 *
 *   test_tokenizer unit GPT2_DIR
 *       the split patterns piece by piece (both, on the cases where they
 *       and the regex engines differ), splitting text that arrives in
 *       parts, merges worked by hand on a small ranks file, a piece of
 *       300,000 bytes, ranks files with a duplicate rank or token, bad
 *       base64, a gap, a missing byte; GPT-2 files with an unknown merge;
 *       decoding and fingerprints (GPT2_DIR: encoder.json and vocab.bpe)
 *   test_tokenizer roundtrip SPEC FILE [EOT]
 *       decode(encode(FILE)) is FILE, and FILE encoded as it arrives in
 *       parts gives the same ids as encoded whole
 *   test_tokenizer unicode CLASSES
 *       each code point's class (CLASSES: a byte per code point, as node's
 *       regex engine has it; 255 for a surrogate or a code point it has
 *       not assigned) is what the tables say
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h" /* tests/check.h */
#include "core/atomic_file.h"
#include "core/file.h"
#include "tokenizer/split.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/unicode.h"

static char dir[256];

static const char *path_in(const char *name)
{
    static char buf[4][512];
    static int k;
    k = (k + 1) % 4;
    snprintf(buf[k], sizeof buf[k], "%s/%s", dir, name);
    return buf[k];
}

static const char *write_text(const char *name, const char *text)
{
    const char *p = path_in(name);
    FILE *f = fopen(p, "wb");
    fputs(text, f);
    fclose(f);
    return p;
}

/* ---- the split patterns ------------------------------------------------- */

/* text's pieces by p, joined by '|'. */
static void pieces(dt_split p, const char *text, char *out, size_t cap)
{
    size_t n = strlen(text), at = 0, o = 0;
    while (at < n && o + 1 < cap) {
        size_t k = dt_split_next(p, (const unsigned char *)text + at, n - at, 1);
        if (k == 0) break;
        if (at && o + 1 < cap) out[o++] = '|';
        for (size_t i = 0; i < k && o + 1 < cap; i++) out[o++] = text[at + i];
        at += k;
    }
    out[o] = 0;
}

static void test_split(void)
{
    /* pattern, text, its pieces: worked by hand from the regex, leftmost
     * alternative first */
    static const struct {
        dt_split p;
        const char *text, *want;
    } cases[] = {
        {DT_SPLIT_GPT2, "Hello world", "Hello| world"},
        {DT_SPLIT_GPT2, "a  b", "a| | b"},                /* \s+(?!\S) leaves the last */
        {DT_SPLIT_GPT2, "a   ", "a|   "},                 /* at the end it takes all */
        {DT_SPLIT_GPT2, "a \n b", "a| \n| b"},
        {DT_SPLIT_GPT2, "\t\tx", "\t|\t|x"},              /* a lone white space: \s+ */
        {DT_SPLIT_GPT2, "\n\n\nx", "\n\n|\n|x"},
        {DT_SPLIT_GPT2, "it's", "it|'s"},
        {DT_SPLIT_GPT2, "IT'S", "IT|'|S"},                /* GPT-2's contractions have a case */
        {DT_SPLIT_GPT2, "we'll've", "we|'ll|'ve"},
        {DT_SPLIT_GPT2, "'''s", "'''|s"},
        {DT_SPLIT_GPT2, "x123abc", "x|123|abc"},
        {DT_SPLIT_GPT2, "a 123456", "a| 123456"},
        {DT_SPLIT_GPT2, "foo!!! !!", "foo|!!!| !!"},
        {DT_SPLIT_GPT2, "naïve café", "naïve| café"},
        {DT_SPLIT_GPT2, "hi😀😀x", "hi|😀😀|x"},
        {DT_SPLIT_GPT2, "e\xcc\x81t", "e|\xcc\x81|t"},    /* a combining mark is neither L nor N */
        {DT_SPLIT_GPT2, "a\xff\xfe" "b", "a|\xff\xfe|b"}, /* bytes that are not UTF-8: other */
        {DT_SPLIT_GPT2, "a\xe2\x82", "a|\xe2\x82"},       /* a character cut short */
        /* U+0085 is White_Space (tiktoken's and Python's \s; not JavaScript's) */
        {DT_SPLIT_GPT2, "a\xc2\x85\xc2\x85" "b", "a|\xc2\x85|\xc2\x85|b"},
        /* U+FEFF is not (JavaScript's \s has it) */
        {DT_SPLIT_GPT2, "a \xef\xbb\xbf" "b", "a| \xef\xbb\xbf|b"},
        /* " ?" is the ASCII space only: an ideographic one stands alone */
        {DT_SPLIT_GPT2, "x\xe3\x80\x80\xe3\x80\x80y", "x|\xe3\x80\x80|\xe3\x80\x80|y"},
        {DT_SPLIT_CL100K, "Hello world", "Hello| world"},
        {DT_SPLIT_CL100K, "IT'S we'LL x'Ve", "IT|'S| we|'LL| x|'Ve"},
        {DT_SPLIT_CL100K, "x'\xc5\xbf", "x|'\xc5\xbf"}, /* (?i) folds long s to s */
        {DT_SPLIT_GPT2, "x'\xc5\xbf", "x|'|\xc5\xbf"},
        {DT_SPLIT_CL100K, "1234567", "123|456|7"},
        {DT_SPLIT_CL100K, " 123", " |123"},
        {DT_SPLIT_CL100K, "(word \tword", "(word| |\tword"},
        {DT_SPLIT_CL100K, "\nword", "\n|word"},
        {DT_SPLIT_CL100K, "a\n\n  b", "a|\n\n| | b"},
        {DT_SPLIT_CL100K, "x  \n  y", "x|  \n| | y"},
        {DT_SPLIT_CL100K, "foo!!!\n\nbar", "foo|!!!\n\n|bar"},
        {DT_SPLIT_CL100K, " !!\r\n", " !!\r\n"},
        {DT_SPLIT_CL100K, "abc   ", "abc|   "},
        {DT_SPLIT_CL100K, "😀x 😀", "😀x| 😀"},
        {DT_SPLIT_CL100K, "a\xc2\x85\xc2\x85" "b", "a|\xc2\x85|\xc2\x85" "b"},
    };
    char got[256];
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        pieces(cases[i].p, cases[i].text, got, sizeof got);
        CHECK(strcmp(got, cases[i].want) == 0, "%s: '%s' splits as '%s', not '%s'",
              dt_split_name(cases[i].p), cases[i].text, got, cases[i].want);
    }
    CHECK(dt_uc_class(0x85) == DT_UC_SPACE && dt_uc_class(0xFEFF) == DT_UC_OTHER &&
          dt_uc_class(0x3000) == DT_UC_SPACE && dt_uc_class(0x1F600) == DT_UC_OTHER &&
          dt_uc_class(0x20000) == DT_UC_LETTER && dt_uc_class(0x2162) == DT_UC_NUMBER &&
          dt_uc_class(0x110000) == DT_UC_OTHER, "classes");
}

/* Text that arrives in two parts splits as it does whole: for every cut,
 * what the first part's pieces leave unfinished goes on with the rest. */
static void test_split_streaming(void)
{
    static const char text[] = "Hi  there,\r\n\n  it's   42 fine!!\n\n  naïve\xe3\x80\x80😀x 123456 "
                               "IT'S\t\tend  \xc2\x85 \xff\xe2\x82 e\xcc\x81   ";
    const size_t n = sizeof text - 1;
    for (dt_split p = DT_SPLIT_GPT2; p <= DT_SPLIT_CL100K; p++) {
        char whole[512], parts[512];
        pieces(p, text, whole, sizeof whole);
        for (size_t cut = 0; cut <= n; cut++) {
            size_t at = 0, o = 0, k;
            const unsigned char *s = (const unsigned char *)text;
            while (at < cut && (k = dt_split_next(p, s + at, cut - at, 0)) > 0) {
                if (at) parts[o++] = '|';
                memcpy(parts + o, text + at, k);
                o += k;
                at += k;
            }
            while (at < n && (k = dt_split_next(p, s + at, n - at, 1)) > 0) {
                if (at) parts[o++] = '|';
                memcpy(parts + o, text + at, k);
                o += k;
                at += k;
            }
            parts[o] = 0;
            CHECK(strcmp(parts, whole) == 0, "%s, cut at %zu: '%s' against '%s'", dt_split_name(p),
                  cut, parts, whole);
        }
    }
}

/* ---- merges on a ranks file made by hand ------------------------------- */

static const char *b64(const unsigned char *p, size_t n)
{
    static char out[4][64];
    static int k;
    static const char *abc = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    char *o = out[k = (k + 1) % 4];
    size_t j = 0;
    for (size_t i = 0; i < n; i += 3) {
        uint32_t v = (uint32_t)p[i] << 16 | (i + 1 < n ? (uint32_t)p[i + 1] << 8 : 0) |
                     (i + 2 < n ? p[i + 2] : 0);
        o[j++] = abc[v >> 18];
        o[j++] = abc[v >> 12 & 63];
        o[j++] = i + 1 < n ? abc[v >> 6 & 63] : '=';
        o[j++] = i + 2 < n ? abc[v & 63] : '=';
    }
    o[j] = 0;
    return o;
}

/* The 256 bytes at ranks 0-255, then extra tokens from 256 on. */
static const char *ranks_file(const char *name, const char *const *extra, int nextra)
{
    static char text[16384];
    size_t o = 0;
    for (int b = 0; b < 256; b++) {
        unsigned char c = (unsigned char)b;
        o += (size_t)snprintf(text + o, sizeof text - o, "%s %d\n", b64(&c, 1), b);
    }
    for (int i = 0; i < nextra; i++)
        o += (size_t)snprintf(text + o, sizeof text - o, "%s %d\n",
                              b64((const unsigned char *)extra[i], strlen(extra[i])), 256 + i);
    return write_text(name, text);
}

/* The ids of text, as a string "1 2 3". */
static void ids_of(dt_tokenizer *t, const char *text, char *out, size_t cap)
{
    dt_tok_ids ids = {0};
    size_t used, o = 0;
    CHECK(dt_tokenizer_encode(t, text, strlen(text), 1, &ids, &used) == 0, "encode");
    out[0] = 0;
    for (size_t i = 0; i < ids.n; i++)
        o += (size_t)snprintf(out + o, cap - o, i ? " %u" : "%u", ids.v[i]);
    dt_tok_ids_free(&ids);
}

static void test_merges(void)
{
    char err[1024], got[256];
    static const char *extra[] = {"ab", "bc", "abc", "aa", "xyz"}; /* ranks 256-260 */
    const char *p = ranks_file("small.tiktoken", extra, 5);
    dt_tokenizer *t;
    CHECK(dt_tokenizer_open(p, DT_SPLIT_NONE, -1, &t, err, sizeof err) == 0, "%s", err);
    if (failures) return;
    const dt_tok_ref *ref = dt_tokenizer_ref(t);
    CHECK(ref->vocab == 262 && ref->eot == 261 && ref->split == DT_SPLIT_CL100K,
          "vocab %d eot %d split %d", ref->vocab, ref->eot, ref->split);
    static const struct {
        const char *text, *want;
    } cases[] = {
        {"abcd", "258 100"},   /* ab (256) first, then ab+c is abc (258); d stays */
        {"abc", "258"},        /* a token whole is that token (tiktoken) */
        {"aaa", "259 97"},     /* the leftmost of equal ranks first */
        {"aaaa", "259 259"},
        {"bca", "257 97"},
        {"xyz", "260"},        /* reached as a whole: x+y is no token */
        {"xyzw", "120 121 122 119"},
        {"a b", "97 32 98"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        ids_of(t, cases[i].text, got, sizeof got);
        CHECK(strcmp(got, cases[i].want) == 0, "'%s': %s, not %s", cases[i].text, got,
              cases[i].want);
    }
    size_t len;
    const unsigned char *b = dt_tokenizer_decode(t, 258, &len);
    CHECK(b && len == 3 && memcmp(b, "abc", 3) == 0, "decode 258");
    b = dt_tokenizer_decode(t, 261, &len);
    CHECK(b && len == 13 && memcmp(b, "<|endoftext|>", 13) == 0, "decode end of text");
    CHECK(!dt_tokenizer_decode(t, 262, &len), "an id past the vocabulary decodes");
    uint64_t fp = ref->fingerprint;
    dt_tokenizer_close(t);

    /* the same file: the same fingerprint; another end of text, another */
    CHECK(dt_tokenizer_open(p, DT_SPLIT_NONE, -1, &t, err, sizeof err) == 0, "%s", err);
    CHECK(dt_tokenizer_ref(t)->fingerprint == fp, "fingerprint differs on the same file");
    dt_tok_ref rec = *dt_tokenizer_ref(t);
    dt_tokenizer_close(t);
    CHECK(dt_tokenizer_open(p, DT_SPLIT_NONE, 300, &t, err, sizeof err) == 0, "%s", err);
    CHECK(dt_tokenizer_ref(t)->fingerprint != fp && dt_tokenizer_ref(t)->vocab == 301 &&
          dt_tokenizer_ref(t)->eot == 300, "--eot-id 300");
    dt_tokenizer_close(t);
    /* a record opened again: refused when the file changed under it */
    CHECK(dt_tokenizer_open_ref(&rec, NULL, &t, err, sizeof err) == 0, "%s", err);
    dt_tokenizer_close(t);
    static const char *changed[] = {"ab", "bc", "abc", "aa", "xyw"};
    ranks_file("small.tiktoken", changed, 5);
    CHECK_ERR(dt_tokenizer_open_ref(&rec, NULL, &t, err, sizeof err), err, "small.tiktoken",
              "is not the one recorded");
    CHECK_ERR(dt_tokenizer_open(p, DT_SPLIT_NONE, 258, &t, err, sizeof err), err,
              "end of text 258 is a rank of", "above 260");
}

/* ---- ranks files and GPT-2 files that are wrong ------------------------ */

static void expect_ranks_error(const char *name, const char *text, const char *a, const char *b)
{
    char err[1024];
    dt_tokenizer *t;
    const char *p = write_text(name, text);
    CHECK_ERR(dt_tokenizer_open(p, DT_SPLIT_NONE, -1, &t, err, sizeof err), err, name, a, b);
}

static void test_bad_ranks(void)
{
    expect_ranks_error("duprank", "IQ== 0\nIg== 0\n", ":2: rank 0 is given twice",
                       "(line 1 has it too)");
    expect_ranks_error("b64char", "IQ== 0\nI!== 1\n", ":2: token 'I!==' (rank 1) is not base64",
                       "'!' at column 2");
    expect_ranks_error("b64len", "IQ= 0\n", "token 'IQ=' (rank 0) is not base64",
                       "its length, 3, is not a multiple of 4");
    expect_ranks_error("b64pad", "I=Q= 0\n", "is not base64", "'=' at column 2");
    expect_ranks_error("noline", "IQ==0\n", ":1: 'IQ==0' is not 'TOKEN RANK'", "base64");
    expect_ranks_error("norank", "IQ== x\n", ":1: 'IQ== x' is not 'TOKEN RANK'", "a space");
    expect_ranks_error("tworanks", "IQ== 5 6\n", "is not 'TOKEN RANK'", "its rank");
    expect_ranks_error("hugerank", "IQ== 99999999999\n", "is not 'TOKEN RANK'", "2147483646");
    expect_ranks_error("empty", "\n\n", "no tokens", "TOKEN RANK");
    char err[1024];
    dt_tokenizer *t;
    static const char *dup_token[] = {"ab", "ab"};
    const char *p = ranks_file("duptoken", dup_token, 2);
    CHECK_ERR(dt_tokenizer_open(p, DT_SPLIT_NONE, -1, &t, err, sizeof err), err,
              "duptoken:258: token 'YWI=' (rank 257) is given twice", "line 257 gave it rank 256");
    /* a gap: rank 7 missing, 256 given */
    char text[8192];
    size_t o = 0;
    for (int b = 0; b < 257; b++) {
        unsigned char c = (unsigned char)(b == 256 ? 7 : b);
        if (b != 7) o += (size_t)snprintf(text + o, sizeof text - o, "%s %d\n", b64(&c, 1), b);
    }
    expect_ranks_error("gap", text, "no token has rank 7", "from 0 to 256 without a gap");
    /* byte 0xff has no token of its own */
    o = 0;
    for (int b = 0; b < 255; b++) {
        unsigned char c = (unsigned char)b;
        o += (size_t)snprintf(text + o, sizeof text - o, "%s %d\n", b64(&c, 1), b);
    }
    snprintf(text + o, sizeof text - o, "YWI= 255\n");
    expect_ranks_error("nobyte", text, "byte 0xff has no token", "256 bytes");
}

static void test_bad_gpt2(const char *gpt2_dir)
{
    char err[1024], path[600];
    dt_tokenizer *t;
    const char *d = path_in("gpt2bad");
    mkdir(d, 0755);
    snprintf(path, sizeof path, "%s/encoder.json", gpt2_dir);
    size_t len;
    char *enc = dt_read_file(path, 64 << 20, &len, err, sizeof err);
    CHECK(enc != NULL, "%s", err);
    if (!enc) return;
    snprintf(path, sizeof path, "%s/encoder.json", d);
    CHECK(dt_afile_write_file(path, enc, len, err, sizeof err) == 0, "%s", err);
    free(enc);
    snprintf(path, sizeof path, "%s/vocab.bpe", d);
    FILE *f = fopen(path, "w");
    fputs("#version: 0.2\nĠ t\nĠt he\nqqqqqqqqqqqq x\n", f);
    fclose(f);
    CHECK_ERR(dt_tokenizer_open(d, DT_SPLIT_NONE, -1, &t, err, sizeof err), err,
              "vocab.bpe:4: \"qqqqqqqqqqqq\" is not a token of encoder.json");
    f = fopen(path, "w");
    fputs("#version: 0.2\nĠ t\nĠt\n", f);
    fclose(f);
    CHECK_ERR(dt_tokenizer_open(d, DT_SPLIT_NONE, -1, &t, err, sizeof err), err,
              "vocab.bpe:3: 'Ġt' is not two tokens apart by a space");
    CHECK_ERR(dt_tokenizer_open(gpt2_dir, DT_SPLIT_NONE, 7, &t, err, sizeof err), err,
              "another id is for a ranks file");
    CHECK_ERR(dt_tokenizer_open(path_in("nowhere"), DT_SPLIT_NONE, -1, &t, err, sizeof err), err,
              "nowhere: no such file or directory", "tiktoken ranks file");
}

/* ---- GPT-2: a long piece, decoding -------------------------------------- */

static int roundtrip(dt_tokenizer *t, const unsigned char *text, size_t n, const char *what);

static void test_gpt2(const char *gpt2_dir)
{
    char err[1024], got[256];
    dt_tokenizer *t;
    CHECK(dt_tokenizer_open(gpt2_dir, DT_SPLIT_NONE, -1, &t, err, sizeof err) == 0, "%s", err);
    if (failures) return;
    const dt_tok_ref *ref = dt_tokenizer_ref(t);
    CHECK(ref->vocab == 50257 && ref->eot == 50256 && ref->split == DT_SPLIT_GPT2, "gpt2 ref");
    /* GPT-2's ids for this text, as its encoder gives them */
    ids_of(t, "Hello world, it's 2024!", got, sizeof got);
    CHECK(strcmp(got, "15496 995 11 340 338 48609 0") == 0, "gpt2 ids: %s", got);
    /* a line of 300,000 letters is one piece: merged in n log n */
    const size_t n = 300000;
    unsigned char *text = malloc(n);
    for (size_t i = 0; i < n; i++) text[i] = (unsigned char)('a' + (i * 7 + i / 13) % 26);
    roundtrip(t, text, n, "a piece of 300,000 letters");
    /* bytes that are no UTF-8 at all */
    for (size_t i = 0; i < n; i++) text[i] = (unsigned char)(rnd_u64() >> 56);
    roundtrip(t, text, n, "random bytes");
    free(text);
    dt_tokenizer_close(t);
}

/* ---- decode(encode(x)) -------------------------------------------------- */

/* decode(encode(text)) == text, and text encoded in parts of random sizes
 * (final only for the last) gives the ids of text encoded whole. */
static int roundtrip(dt_tokenizer *t, const unsigned char *text, size_t n, const char *what)
{
    dt_tok_ids whole = {0}, parts = {0};
    size_t used, at = 0, len;
    CHECK(dt_tokenizer_encode(t, text, n, 1, &whole, &used) == 0 && used == n, "%s", what);
    unsigned char *back = malloc(n + 1);
    size_t o = 0;
    for (size_t i = 0; i < whole.n; i++) {
        const unsigned char *b = dt_tokenizer_decode(t, whole.v[i], &len);
        CHECK(b && o + len <= n, "%s: token %zu (%u) decodes to nothing, or too much", what, i,
              whole.v[i]);
        if (!b || o + len > n) break;
        memcpy(back + o, b, len);
        o += len;
    }
    CHECK(o == n && memcmp(back, text, n) == 0, "%s: decode(encode(x)) differs from x", what);
    /* Parts of up to 64 kB arrive, as from a file; what is not encoded
     * yet goes again with the next. */
    for (size_t end = 0; at < n;) {
        end += 1 + (size_t)(rnd_u64() % 65536);
        if (end > n) end = n;
        CHECK(dt_tokenizer_encode(t, text + at, end - at, end == n, &parts, &used) == 0, "%s",
              what);
        at += used;
    }
    CHECK(parts.n == whole.n && memcmp(parts.v, whole.v, whole.n * sizeof *whole.v) == 0,
          "%s: encoded in parts, %zu ids, whole %zu (or other ids)", what, parts.n, whole.n);
    free(back);
    dt_tok_ids_free(&whole);
    dt_tok_ids_free(&parts);
    return failures;
}

static int cmd_roundtrip(const char *spec, const char *file, const char *eot)
{
    char err[1024];
    dt_tokenizer *t;
    if (dt_tokenizer_open(spec, DT_SPLIT_NONE, eot ? atol(eot) : -1, &t, err, sizeof err)) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    size_t n;
    char *text = dt_read_file(file, 1u << 30, &n, err, sizeof err);
    CHECK(text != NULL, "%s", err);
    if (text) roundtrip(t, (const unsigned char *)text, n, file);
    printf("%s: %zu bytes with %s\n", file, n, dt_tokenizer_ref(t)->spec);
    free(text);
    dt_tokenizer_close(t);
    return finish("roundtrip");
}

static int cmd_unicode(const char *file)
{
    char err[1024];
    size_t n;
    unsigned char *want = (unsigned char *)dt_read_file(file, 2u << 20, &n, err, sizeof err);
    CHECK(want && n == 0x110000, "%s", want ? "not a byte per code point" : err);
    for (uint32_t cp = 0; want && n == 0x110000 && cp < 0x110000; cp++)
        if (want[cp] != 255)
            CHECK(dt_uc_class(cp) == want[cp], "U+%04X: class %d, node says %d", cp,
                  dt_uc_class(cp), want[cp]);
    free(want);
    return finish("unicode");
}

int main(int argc, char **argv)
{
    if (argc == 3 && strcmp(argv[1], "unicode") == 0) return cmd_unicode(argv[2]);
    if ((argc == 4 || argc == 5) && strcmp(argv[1], "roundtrip") == 0)
        return cmd_roundtrip(argv[2], argv[3], argc == 5 ? argv[4] : NULL);
    if (argc != 3 || strcmp(argv[1], "unit") != 0) {
        fprintf(stderr, "usage: %s unit GPT2_DIR | roundtrip SPEC FILE [EOT] | unicode FILE\n",
                argv[0]);
        return 2;
    }
    snprintf(dir, sizeof dir, "/tmp/dtrain-test-tokenizer-XXXXXX");
    if (!mkdtemp(dir)) return 1;
    test_split();
    test_split_streaming();
    test_merges();
    test_bad_ranks();
    test_bad_gpt2(argv[2]);
    test_gpt2(argv[2]);
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
    return finish("tokenizer unit");
}
