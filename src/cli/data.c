/*
 * `dtrain data`: preparing training data.
 *
 *   dtrain data prepare --input FILE [--out DIR] [--val-fraction F]
 *                       [--tokenizer bytes|gpt2|DIR|FILE] [--split-pattern P]
 *                       [--eot-id N] [--doc-separator S]
 *       splits a text file (byte-level tokens, or a tokenizer's, each
 *       document after end of text) or an llm.c shard into DIR/train.bin
 *       and DIR/val.bin, the validation part being the last fraction F of
 *       the tokens: the same cut `dtrain train` makes when it is given the
 *       file itself and no validation file.
 *   dtrain data info FILE
 *       what a data file holds, as training would read it.
 */
#include "cli/cli.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/atomic_file.h"
#include "core/parse.h"
#include "core/str.h"
#include "tokenizer/tokenizer.h"
#include "train/data/dataset.h"
#include "train/data/shard_write.h"
#include "train/data/spool.h"
#include "train/data/text_tokens.h"

#define DEFAULT_VAL_FRACTION 0.1
#define CHUNK_TOKENS (1u << 20)

static void data_usage(FILE *f)
{
    fprintf(f,
            "usage: dtrain data prepare --input FILE [--out DIR] [--val-fraction F]\n"
            "                           [--tokenizer T] [--split-pattern P] [--eot-id N]\n"
            "                           [--doc-separator S]\n"
            "       dtrain data info FILE\n"
            "\n"
            "prepare  turn FILE into llm.c token shards DIR/train.bin and DIR/val.bin.\n"
            "         A text file becomes byte-level tokens (vocabulary 256), or with\n"
            "         --tokenizer that tokenizer's, each document after the end-of-text\n"
            "         token; an llm.c shard keeps its tokens. The validation part is the\n"
            "         last fraction F of the tokens, the same cut training makes on FILE.\n"
            "  --input FILE        the text file or shard to read (required)\n"
            "  --out DIR           where to write, created if missing (default .)\n"
            "  --val-fraction F    share held out for validation, 0 <= F < 1 (default 0.1;\n"
            "                      0 writes train.bin only)\n"
            "  --tokenizer T       bytes (default); gpt2 (GPT-2's BPE, vocabulary 50257, as\n"
            "                      scripts/deps.sh installs it); a directory holding GPT-2's\n"
            "                      encoder.json and vocab.bpe; or a tiktoken ranks file\n"
            "                      (cl100k_base.tiktoken, Llama 3's tokenizer.model)\n"
            "  --split-pattern P   gpt2 or cl100k: how text is cut before BPE (default:\n"
            "                      gpt2 for GPT-2's files, cl100k for a ranks file)\n"
            "  --eot-id N          a ranks file's end-of-text id (default: the id after\n"
            "                      its last rank; cl100k's own is 100257)\n"
            "  --doc-separator S   documents are the parts of the text between S (\\n, \\r,\n"
            "                      \\t and \\\\ stand for a newline, a carriage return, a\n"
            "                      tab and a backslash); default: the file is one document\n"
            "\n"
            "info     print what FILE holds: its format, tokens, vocabulary and tokenizer.\n"
            "\n"
            "examples:\n"
            "  dtrain data prepare --input shakespeare.txt --out data/shakespeare\n"
            "  dtrain data prepare --input stories.txt --tokenizer gpt2 \\\n"
            "      --doc-separator '<|endoftext|>' --out data/stories\n"
            "  dtrain data info data/shakespeare/train.bin\n");
}

static int usage_error(const char *prog, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

static int usage_error(const char *prog, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "%s: ", prog);
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\nRun 'dtrain data --help' for usage.\n");
    va_end(ap);
    return CLI_EXIT_USAGE;
}

struct prepare_opts {
    const char *input;
    const char *out;
    double val_fraction;
    const char *tokenizer; /* NULL: bytes */
    dt_split split;
    long long eot;         /* -1: the tokenizer's own */
    char sep[256];         /* the separator, escapes replaced */
    size_t seplen;         /* 0: none */
    int help;
};

static int parse_fraction(const char *flag, const char *s, double *out)
{
    double v;
    if (dt_parse_double(s, 0, 1, &v) || v >= 1)
        return usage_error("dtrain data prepare",
                           "invalid value '%s' for %s: expected a number from 0 to below 1", s,
                           flag);
    *out = v;
    return 0;
}

/* S with \n \r \t \\ replaced, into o->sep. */
static int parse_separator(const char *s, struct prepare_opts *o)
{
    static const char *prog = "dtrain data prepare";
    size_t n = 0;
    for (; *s; s++) {
        char c = *s;
        if (c == '\\') {
            const char *from = "nrt\\", *to = "\n\r\t\\", *k = s[1] ? strchr(from, s[1]) : NULL;
            if (!k)
                return usage_error(prog, "--doc-separator: '\\%c' is not \\n, \\r, \\t or \\\\",
                                   s[1] ? s[1] : ' ');
            c = to[k - from];
            s++;
        }
        if (n + 1 >= sizeof o->sep)
            return usage_error(prog, "--doc-separator: longer than %zu bytes", sizeof o->sep - 1);
        o->sep[n++] = c;
    }
    o->seplen = n;
    return 0;
}

/* The value v of flag `which` into o; 0, or a usage error's status. */
static int take(int which, const char *v, struct prepare_opts *o)
{
    static const char *prog = "dtrain data prepare";
    long long eot;
    switch (which) {
    case 0: o->input = v; return 0;
    case 1: o->out = v; return 0;
    case 2: return parse_fraction("--val-fraction", v, &o->val_fraction);
    case 3: o->tokenizer = v; return 0;
    case 4:
        if (dt_split_parse(v, &o->split) == 0) return 0;
        return usage_error(prog, "invalid value '%s' for --split-pattern: expected gpt2 or "
                           "cl100k", v);
    case 5:
        if (dt_parse_integral(v, 0, 0x7FFFFFFE, &eot) != 0)
            return usage_error(prog, "invalid value '%s' for --eot-id: expected an id from 0",
                               v);
        o->eot = eot;
        return 0;
    default: return parse_separator(v, o);
    }
}

/* The tokenizer flags need a tokenizer, and a tokenizer needs text. */
static int check_combination(const struct prepare_opts *o)
{
    static const char *prog = "dtrain data prepare";
    int bytes = !o->tokenizer || strcmp(o->tokenizer, "bytes") == 0;
    const char *lone = o->split ? "--split-pattern" : o->eot >= 0 ? "--eot-id"
                     : o->seplen ? "--doc-separator" : NULL;
    if (bytes && lone)
        return usage_error(prog, "%s needs --tokenizer (gpt2, a directory of GPT-2's files, or "
                           "a ranks file): bytes have no end of text or split", lone);
    return 0;
}

/* Returns 0, or the exit status of a usage error. */
static int parse_prepare(int argc, char **argv, struct prepare_opts *o)
{
    static const char *prog = "dtrain data prepare";
    static const char *flags[] = {"--input", "--out", "--val-fraction", "--tokenizer",
                                  "--split-pattern", "--eot-id", "--doc-separator"};
    const int nflags = (int)(sizeof flags / sizeof flags[0]);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
            o->help = 1;
            continue;
        }
        const char *eq = strchr(a, '=');
        size_t name_len = eq ? (size_t)(eq - a) : strlen(a);
        int which = -1;
        for (int k = 0; k < nflags; k++)
            if (strlen(flags[k]) == name_len && strncmp(a, flags[k], name_len) == 0) which = k;
        if (which < 0) {
            if (a[0] == '-') return usage_error(prog, "unknown option '%.*s'", (int)name_len, a);
            return usage_error(prog, "unexpected argument '%s'", a);
        }
        const char *v = eq ? eq + 1 : (i + 1 < argc ? argv[++i] : NULL);
        if (!v) return usage_error(prog, "option %s needs a value", flags[which]);
        if (*v == '\0') return usage_error(prog, "empty value for %s", flags[which]);
        if (take(which, v, o) != 0) return CLI_EXIT_USAGE;
    }
    if (!o->help && !o->input) return usage_error(prog, "--input FILE is required");
    return o->help ? 0 : check_combination(o);
}

/* Where a part's tokens come from: a dataset, or the spool. */
typedef int (*read_fn)(const void *src, uint64_t at, size_t n, uint32_t *out, char *err,
                       size_t errlen);

static int read_dataset(const void *src, uint64_t at, size_t n, uint32_t *out, char *err,
                        size_t errlen)
{
    return dt_dataset_read(src, at, n, out, err, errlen);
}

static int read_spool(const void *src, uint64_t at, size_t n, uint32_t *out, char *err,
                      size_t errlen)
{
    return dt_spool_read(src, at, n, out, err, errlen);
}

/* Tokens [begin, end) of src into a new shard at path. */
static int write_part(read_fn read, const void *src, uint64_t begin, uint64_t end, int vocab,
                      const dt_tok_ref *tok, const char *path, char *err, size_t errlen)
{
    uint32_t *buf = malloc(CHUNK_TOKENS * sizeof *buf);
    if (!buf) {
        snprintf(err, errlen, "%s: out of memory", path);
        return -1;
    }
    dt_shard_writer w;
    int rc = dt_shard_begin(&w, path, vocab, tok->spec[0] ? tok : NULL, err, errlen);
    for (uint64_t at = begin; rc == 0 && at < end; at += CHUNK_TOKENS) {
        size_t n = end - at < CHUNK_TOKENS ? (size_t)(end - at) : CHUNK_TOKENS;
        rc = read(src, at, n, buf, err, errlen);
        if (rc != 0) {
            dt_shard_abort(&w); /* nothing appears under path */
            break;
        }
        rc = dt_shard_append(&w, buf, n, err, errlen);
    }
    if (rc == 0) rc = dt_shard_commit(&w, err, errlen);
    free(buf);
    return rc;
}

/* n tokens of src, cut at the validation fraction into DIR's two shards. */
static int write_parts(const struct prepare_opts *o, read_fn read, const void *src, uint64_t n,
                       int vocab, const dt_tok_ref *tok, char *err, size_t errlen)
{
    uint64_t split = dt_split_point(n, o->val_fraction);
    char train[DT_PATH_MAX + 16], val[DT_PATH_MAX + 16];
    snprintf(train, sizeof train, "%s/train.bin", o->out);
    snprintf(val, sizeof val, "%s/val.bin", o->out);
    if (split == 0 || (o->val_fraction > 0 && split == n))
        return dt_strf(err, errlen,
                       "%s: %llu tokens are too few to hold out a validation fraction of %g",
                       o->input, (unsigned long long)n, o->val_fraction), -1;
    if (dt_mkdir_p(o->out, err, errlen) != 0) return -1;
    if (write_part(read, src, 0, split, vocab, tok, train, err, errlen) != 0) return -1;
    printf("wrote %s: %llu tokens\n", train, (unsigned long long)split);
    if (split == n) return 0;
    if (write_part(read, src, split, n, vocab, tok, val, err, errlen) != 0) return -1;
    printf("wrote %s: %llu tokens\n", val, (unsigned long long)(n - split));
    return 0;
}

/* A shard, or text as bytes: its tokens as they are. */
static int prepare_tokens(const struct prepare_opts *o, char *err, size_t errlen)
{
    dt_dataset *d;
    if (dt_dataset_open(o->input, &d, err, errlen) != 0) return -1;
    uint64_t n = dt_dataset_ntokens(d);
    int rc = 0;
    if (dt_split_point(n, o->val_fraction) == 0)
        rc = (dt_strf(err, errlen, "%s: %llu tokens are too few to hold out a validation "
                      "fraction of %g", o->input, (unsigned long long)n, o->val_fraction), -1);
    if (rc == 0)
        printf("%s: %llu tokens (%s, vocabulary %d)\n", o->input, (unsigned long long)n,
               dt_dataset_is_text(d) ? "byte-level text" : "llm.c shard", dt_dataset_vocab(d));
    if (rc == 0)
        rc = write_parts(o, read_dataset, d, n, dt_dataset_vocab(d), dt_dataset_tokenizer(d),
                         err, errlen);
    dt_dataset_close(d);
    return rc;
}

static int to_spool(void *ctx, const uint32_t *ids, size_t n, char *err, size_t errlen)
{
    return dt_spool_append(ctx, ids, n, err, errlen);
}

/* That input is text (the dataset's own test: no NUL byte, no shard's
 * magic), not tokens already. */
static int check_text(const char *input, char *err, size_t errlen)
{
    dt_dataset *d;
    if (dt_dataset_open(input, &d, err, errlen) != 0) return -1;
    int text = dt_dataset_is_text(d);
    dt_dataset_close(d);
    if (text) return 0;
    return dt_strf(err, errlen, "%s is an llm.c shard, tokens already: --tokenizer is for text",
                   input), -1;
}

/* Text through a tokenizer, into the spool, then into the shards. */
static int prepare_text(const struct prepare_opts *o, char *err, size_t errlen)
{
    dt_tokenizer *t;
    if (check_text(o->input, err, errlen) != 0 ||
        dt_tokenizer_open(o->tokenizer, o->split, o->eot, &t, err, errlen) != 0)
        return -1;
    const dt_tok_ref *ref = dt_tokenizer_ref(t);
    dt_spool spool = {.fd = -1};
    dt_text_stats st;
    struct stat before;
    int made = stat(o->out, &before) != 0; /* a failure leaves no empty directory behind */
    int rc = dt_mkdir_p(o->out, err, errlen);
    if (rc == 0) rc = dt_spool_open(&spool, o->out, err, errlen);
    if (rc == 0)
        rc = dt_text_tokenize(o->input, t, o->seplen ? o->sep : NULL, o->seplen, to_spool,
                              &spool, &st, err, errlen);
    if (rc == 0 && st.tokens == 0)
        rc = (dt_strf(err, errlen, "%s: empty file, no tokens", o->input), -1);
    if (rc == 0)
        printf("%s: %llu bytes, %llu document%s -> %llu tokens (tokenizer %s, vocabulary %d, "
               "end of text %d)\n", o->input, (unsigned long long)st.bytes,
               (unsigned long long)st.docs, st.docs == 1 ? "" : "s",
               (unsigned long long)st.tokens, ref->spec, ref->vocab, ref->eot);
    if (rc == 0) rc = write_parts(o, read_spool, &spool, spool.n, ref->vocab, ref, err, errlen);
    dt_spool_close(&spool);
    dt_tokenizer_close(t);
    if (rc != 0 && made) rmdir(o->out);
    return rc;
}

static int prepare(const struct prepare_opts *o, char *err, size_t errlen)
{
    if (strlen(o->out) >= DT_PATH_MAX) return dt_strf(err, errlen, "--out: path too long"), -1;
    int bytes = !o->tokenizer || strcmp(o->tokenizer, "bytes") == 0;
    return bytes ? prepare_tokens(o, err, errlen) : prepare_text(o, err, errlen);
}

static int cmd_prepare(int argc, char **argv)
{
    struct prepare_opts o = {.out = ".", .val_fraction = DEFAULT_VAL_FRACTION, .eot = -1};
    int status = parse_prepare(argc, argv, &o);
    if (status != 0) return status;
    if (o.help) {
        data_usage(stdout);
        return 0;
    }
    char err[1024];
    if (prepare(&o, err, sizeof err) != 0) {
        fprintf(stderr, "dtrain data prepare: %s\n", err);
        return 1;
    }
    return 0;
}

static int cmd_info(int argc, char **argv)
{
    if (argc == 2 && (strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "--help") == 0)) {
        data_usage(stdout);
        return 0;
    }
    if (argc != 2) return usage_error("dtrain data info", "expected one FILE");
    char err[1024];
    dt_dataset *d;
    if (dt_dataset_open(argv[1], &d, err, sizeof err) != 0) {
        fprintf(stderr, "dtrain data info: %s\n", err);
        return 1;
    }
    const dt_tok_ref *tok = dt_dataset_tokenizer(d);
    printf("%s: %s, %llu tokens, vocabulary %d", argv[1],
           dt_dataset_is_text(d) ? "text (byte-level tokens)"
           : dt_dataset_width(d) == 4 ? "llm.c token shard (uint32 tokens)" : "llm.c token shard",
           (unsigned long long)dt_dataset_ntokens(d), dt_dataset_vocab(d));
    if (tok->spec[0] && tok->eot >= 0)
        printf(", tokenizer %s (split %s, end of text %d)", tok->spec, dt_split_name(tok->split),
               tok->eot);
    else if (tok->spec[0])
        printf(", tokenizer %s", tok->spec);
    printf("\n");
    dt_dataset_close(d);
    return 0;
}

int cli_data(int argc, char **argv)
{
    if (argc < 2) {
        data_usage(stderr);
        return CLI_EXIT_USAGE;
    }
    const char *sub = argv[1];
    if (strcmp(sub, "-h") == 0 || strcmp(sub, "--help") == 0) {
        data_usage(stdout);
        return 0;
    }
    if (strcmp(sub, "prepare") == 0) return cmd_prepare(argc - 1, argv + 1);
    if (strcmp(sub, "info") == 0) return cmd_info(argc - 1, argv + 1);
    return usage_error("dtrain data", "unknown subcommand '%s' (expected prepare or info)", sub);
}
