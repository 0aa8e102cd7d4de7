/*
 * `dtrain data`: preparing training data.
 *
 *   dtrain data prepare --input FILE [--out DIR] [--val-fraction F]
 *       splits a text file (byte-level tokens) or an llm.c shard into
 *       DIR/train.bin and DIR/val.bin, the validation part being the last
 *       fraction F of the tokens: the same cut `dtrain train` makes when
 *       it is given the file itself and no validation file.
 *   dtrain data info FILE
 *       what a data file holds, as training would read it.
 */
#include "cli/cli.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/atomic_file.h"
#include "train/data/dataset.h"
#include "train/data/shard_write.h"
#include "core/parse.h"

#define DEFAULT_VAL_FRACTION 0.1
#define CHUNK_TOKENS (1u << 20)

static void data_usage(FILE *f)
{
    fprintf(f,
            "usage: dtrain data prepare --input FILE [--out DIR] [--val-fraction F]\n"
            "       dtrain data info FILE\n"
            "\n"
            "prepare  turn FILE into llm.c token shards DIR/train.bin and DIR/val.bin.\n"
            "         A text file becomes byte-level tokens (vocabulary 256); an llm.c\n"
            "         shard keeps its tokens. The validation part is the last fraction F\n"
            "         of the tokens, the same cut training makes on FILE itself.\n"
            "  --input FILE        the text file or shard to read (required)\n"
            "  --out DIR           where to write, created if missing (default .)\n"
            "  --val-fraction F    share held out for validation, 0 <= F < 1 (default 0.1;\n"
            "                      0 writes train.bin only)\n"
            "\n"
            "info     print what FILE holds: its format, tokens and vocabulary.\n"
            "\n"
            "examples:\n"
            "  dtrain data prepare --input shakespeare.txt --out data/shakespeare\n"
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

/* Returns 0, or the exit status of a usage error. */
static int parse_prepare(int argc, char **argv, struct prepare_opts *o)
{
    static const char *prog = "dtrain data prepare";
    static const char *flags[] = {"--input", "--out", "--val-fraction"};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
            o->help = 1;
            continue;
        }
        const char *eq = strchr(a, '=');
        size_t name_len = eq ? (size_t)(eq - a) : strlen(a);
        int which = -1;
        for (int k = 0; k < 3; k++)
            if (strlen(flags[k]) == name_len && strncmp(a, flags[k], name_len) == 0) which = k;
        if (which < 0) {
            if (a[0] == '-') return usage_error(prog, "unknown option '%.*s'", (int)name_len, a);
            return usage_error(prog, "unexpected argument '%s'", a);
        }
        const char *v = eq ? eq + 1 : (i + 1 < argc ? argv[++i] : NULL);
        if (!v) return usage_error(prog, "option %s needs a value", flags[which]);
        if (*v == '\0') return usage_error(prog, "empty value for %s", flags[which]);
        if (which == 0) o->input = v;
        if (which == 1) o->out = v;
        if (which == 2 && parse_fraction(flags[which], v, &o->val_fraction) != 0)
            return CLI_EXIT_USAGE;
    }
    if (!o->help && !o->input) return usage_error(prog, "--input FILE is required");
    return 0;
}

/* Tokens [begin, end) of d into a new shard at path. */
static int write_part(const dt_dataset *d, uint64_t begin, uint64_t end, const char *path,
                      char *err, size_t errlen)
{
    uint16_t *buf = malloc(CHUNK_TOKENS * sizeof *buf);
    if (!buf) {
        snprintf(err, errlen, "%s: out of memory", path);
        return -1;
    }
    dt_shard_writer w;
    int rc = dt_shard_begin(&w, path, dt_dataset_vocab(d), err, errlen);
    for (uint64_t at = begin; rc == 0 && at < end; at += CHUNK_TOKENS) {
        size_t n = end - at < CHUNK_TOKENS ? (size_t)(end - at) : CHUNK_TOKENS;
        rc = dt_dataset_read(d, at, n, buf, err, errlen);
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

static int prepare(const struct prepare_opts *o, char *err, size_t errlen)
{
    dt_dataset *d;
    if (dt_dataset_open(o->input, &d, err, errlen) != 0) return -1;
    uint64_t n = dt_dataset_ntokens(d);
    uint64_t split = dt_split_point(n, o->val_fraction);
    int rc = -1;
    char train[DT_PATH_MAX + 16], val[DT_PATH_MAX + 16];
    if (strlen(o->out) >= DT_PATH_MAX) {
        snprintf(err, errlen, "--out: path too long");
        goto done;
    }
    snprintf(train, sizeof train, "%s/train.bin", o->out);
    snprintf(val, sizeof val, "%s/val.bin", o->out);
    if (split == 0 || (o->val_fraction > 0 && split == n)) {
        snprintf(err, errlen,
                 "%s: %llu tokens are too few to hold out a validation fraction of %g",
                 o->input, (unsigned long long)n, o->val_fraction);
        goto done;
    }
    if (dt_mkdir_p(o->out, err, errlen) != 0) goto done;
    if (write_part(d, 0, split, train, err, errlen) != 0) goto done;
    printf("%s: %llu tokens (%s, vocabulary %d)\n", o->input, (unsigned long long)n,
           dt_dataset_is_text(d) ? "byte-level text" : "llm.c shard", dt_dataset_vocab(d));
    printf("wrote %s: %llu tokens\n", train, (unsigned long long)split);
    if (split < n) {
        if (write_part(d, split, n, val, err, errlen) != 0) goto done;
        printf("wrote %s: %llu tokens\n", val, (unsigned long long)(n - split));
    }
    rc = 0;
done:
    dt_dataset_close(d);
    return rc;
}

static int cmd_prepare(int argc, char **argv)
{
    struct prepare_opts o = {NULL, ".", DEFAULT_VAL_FRACTION, 0};
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
    printf("%s: %s, %llu tokens, vocabulary %d\n", argv[1],
           dt_dataset_is_text(d) ? "text (byte-level tokens)" : "llm.c token shard",
           (unsigned long long)dt_dataset_ntokens(d), dt_dataset_vocab(d));
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
