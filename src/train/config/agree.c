/* The check that every rank was started with the same run-shaping options.
 * See config/agree.h. */
#include "train/config/agree.h"

#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/hash.h"
#include "core/str.h"
#include "train/config/internal.h"

/* Every option of the table, in the order a difference is reported: the
 * model, the batch, how the work is shared, the numbers, the data, the
 * run's length and outputs. */
static const struct {
    const char *flag;
    int rule;
} rules[] = {
    /* The model's shape: the layers each rank holds, every buffer's size. */
    {"n-layer", DT_AGREE_VALUE},
    {"n-head", DT_AGREE_VALUE},
    {"n-embd", DT_AGREE_VALUE},
    {"vocab-size", DT_AGREE_VALUE},
    {"block-size", DT_AGREE_VALUE},
    {"blocks", DT_AGREE_VALUE},
    {"num-experts", DT_AGREE_VALUE},
    {"moe-ffn-hidden-size", DT_AGREE_VALUE},
    {"arch", DT_AGREE_VALUE},
    {"n-kv-head", DT_AGREE_VALUE},
    {"ffn-hidden-size", DT_AGREE_VALUE},
    {"rope-theta", DT_AGREE_VALUE},
    {"norm-eps", DT_AGREE_VALUE},
    {"tie-word-embeddings", DT_AGREE_VALUE},
    {"moe-router-topk", DT_AGREE_VALUE},
    {"moe-expert-capacity-factor", DT_AGREE_VALUE},
    {"moe-aux-loss-coeff", DT_AGREE_VALUE},
    {"moe-z-loss-coeff", DT_AGREE_VALUE},
    {"moe-router-enable-expert-bias", DT_AGREE_VALUE},
    {"moe-router-bias-update-rate", DT_AGREE_VALUE},
    {"moe-router-force-load-balancing", DT_AGREE_VALUE},
    {"init", DT_AGREE_VALUE},
    /* The batch: the sizes of the activations sent, the micro-batches. */
    {"batch-size", DT_AGREE_VALUE},
    {"seq-len", DT_AGREE_VALUE},
    {"grad-accum", DT_AGREE_VALUE},
    {"train-batch-size", DT_AGREE_VALUE},
    /* How the work is shared: groups, schedules, collectives and their sizes. */
    {"strategy", DT_AGREE_VALUE},
    {"pp", DT_AGREE_VALUE},
    {"tp", DT_AGREE_VALUE},
    {"dp", DT_AGREE_VALUE},
    {"cp", DT_AGREE_VALUE},
    {"ep", DT_AGREE_VALUE},
    {"sequence-parallel", DT_AGREE_VALUE},
    {"offload-optimizer", DT_AGREE_VALUE},
    {"offload-param", DT_AGREE_VALUE},
    {"zero-quantized-weights", DT_AGREE_VALUE},
    {"zero-quant-block", DT_AGREE_VALUE},
    {"zero-hpz-partition-size", DT_AGREE_VALUE},
    {"zero-quantized-gradients", DT_AGREE_VALUE},
    {"zero-qgz-bits", DT_AGREE_VALUE},
    {"nvme-path", DT_AGREE_SET},
    {"offload-overlap", DT_AGREE_VALUE},
    {"offload-buffers", DT_AGREE_FREE},
    {"sub-group-size", DT_AGREE_FREE},
    {"aio-block-size", DT_AGREE_FREE},
    {"aio-queue-depth", DT_AGREE_FREE},
    {"cp-algo", DT_AGREE_VALUE},
    {"pp-schedule", DT_AGREE_VALUE},
    {"pp-virtual", DT_AGREE_VALUE},
    {"pp-partition", DT_AGREE_VALUE},
    {"zero-stage", DT_AGREE_VALUE},
    {"zero-prefetch", DT_AGREE_VALUE},
    {"zero-reshard-after-forward", DT_AGREE_VALUE},
    {"zero-prefetch-elems", DT_AGREE_VALUE},
    {"zero-max-live", DT_AGREE_VALUE},
    {"zero-persist", DT_AGREE_VALUE},
    {"bucket-mb", DT_AGREE_VALUE},
    {"devices", DT_AGREE_VALUE},
    {"servers", DT_AGREE_VALUE},
    {"ps-mode", DT_AGREE_VALUE},
    {"staleness", DT_AGREE_VALUE},
    {"fixed-staleness", DT_AGREE_VALUE},
    {"compress", DT_AGREE_VALUE},
    {"comm-algo", DT_AGREE_VALUE},
    /* The numbers: precision, initialization, the order of the data. */
    {"dtype", DT_AGREE_VALUE},
    {"comm-dtype", DT_AGREE_VALUE},
    {"grad-accum-dtype", DT_AGREE_VALUE},
    {"recompute", DT_AGREE_VALUE},
    {"seed", DT_AGREE_VALUE},
    {"shuffle", DT_AGREE_VALUE},
    {"data", DT_AGREE_VALUE},
    {"val-data", DT_AGREE_VALUE},
    {"val-fraction", DT_AGREE_VALUE},
    /* The optimizer and its schedule: replicas drift apart otherwise. */
    {"steps", DT_AGREE_VALUE},
    {"optimizer", DT_AGREE_VALUE},
    {"lr", DT_AGREE_VALUE},
    {"min-lr", DT_AGREE_VALUE},
    {"min-lr-ratio", DT_AGREE_VALUE},
    {"lr-schedule", DT_AGREE_VALUE},
    {"warmup-steps", DT_AGREE_VALUE},
    {"beta1", DT_AGREE_VALUE},
    {"beta2", DT_AGREE_VALUE},
    {"eps", DT_AGREE_VALUE},
    {"weight-decay", DT_AGREE_VALUE},
    {"momentum", DT_AGREE_VALUE},
    {"grad-clip", DT_AGREE_VALUE},
    /* Evaluations and checkpoints are collective; every rank loads the
     * same checkpoint and writes its shards next to the others'. */
    {"eval-every", DT_AGREE_VALUE},
    {"eval-batches", DT_AGREE_VALUE},
    {"out", DT_AGREE_VALUE},
    {"save-every", DT_AGREE_VALUE},
    {"keep-last", DT_AGREE_VALUE},
    {"snapshot-every", DT_AGREE_VALUE},
    {"resume", DT_AGREE_VALUE},
    /* Written by one rank, but every rank takes part (gathers, clocks). */
    {"save-final", DT_AGREE_SET},
    {"save-dtype", DT_AGREE_VALUE},
    {"trace", DT_AGREE_SET},
    /* This rank's own business. The preset's name: its sizes are compared. */
    {"model", DT_AGREE_FREE},
    {"threads", DT_AGREE_FREE},
    {"print-every", DT_AGREE_FREE},
    {"log-ranks", DT_AGREE_FREE},
    {"log-json", DT_AGREE_FREE},
    {"moe-per-layer-logging", DT_AGREE_FREE},
    {"profile", DT_AGREE_FREE},
};

enum { NRULES = (int)(sizeof rules / sizeof rules[0]), TEXT = 160 };

int dt_config_agree_rule(const char *flag)
{
    for (int i = 0; i < NRULES; i++)
        if (!strcmp(rules[i].flag, flag)) return rules[i].rule;
    return -1;
}

const char *dt_config_agree_flag(int i)
{
    return i >= 0 && i < NRULES ? rules[i].flag : NULL;
}

static const dt_cfg_opt *option(int k)
{
    int i = dt_cfg_find_flag(rules[k].flag, strlen(rules[k].flag));
    return i >= 0 ? &dt_cfg_options[i] : NULL;
}

static int is_text(const dt_cfg_opt *o) { return o->type == T_STR || o->type == T_CHOICE; }

static int is_path(const dt_cfg_opt *o)
{
    static const size_t paths[] = {
        offsetof(dt_train_config, data),    offsetof(dt_train_config, val_data),
        offsetof(dt_train_config, init),    offsetof(dt_train_config, out_dir),
        offsetof(dt_train_config, resume),
    };
    for (size_t i = 0; i < sizeof paths / sizeof paths[0]; i++)
        if (o->off == paths[i]) return 1;
    return 0;
}

/* Option o's text; a file's as the absolute path it names here (its
 * directory's, for one not made yet), so that "data.bin" and
 * "/work/data.bin" agree from /work, and "data.bin" from two directories
 * does not. */
static const char *text_value(const dt_train_config *c, const dt_cfg_opt *o, char *buf,
                              size_t n)
{
    const char *s = dt_cfg_read_field(c, o).s;
    if (!is_path(o) || !s[0]) return s;
    char real[PATH_MAX];
    if (realpath(s, real)) return dt_strf(buf, n, "%s", real), buf;
    const char *slash = strrchr(s, '/');
    char dir[PATH_MAX];
    if (slash) dt_strf(dir, sizeof dir, "%.*s", (int)(slash - s), s);
    else dt_strf(dir, sizeof dir, ".");
    if (!dir[0]) dt_strf(dir, sizeof dir, "/");
    if (!realpath(dir, real)) return s;
    dt_strf(buf, n, "%s/%s", strcmp(real, "/") ? real : "", slash ? slash + 1 : s);
    return buf;
}

/* Option k's fingerprint on this rank. */
static uint64_t fingerprint(const dt_train_config *c, int k)
{
    const dt_cfg_opt *o = option(k);
    if (!o) return 0;
    dt_cfg_val v = dt_cfg_read_field(c, o);
    char buf[PATH_MAX + 8];
    if (is_text(o) && rules[k].rule == DT_AGREE_VALUE) v.s = text_value(c, o, buf, sizeof buf);
    if (o->off == offsetof(dt_train_config, seq_len) && v.i == 0) v.i = c->block_size;
    if (o->off == offsetof(dt_train_config, blocks)) /* one spelling of the same blocks */
        dt_blocks_canonical(c->blocks, buf, sizeof buf), v.s = buf;
    if (o->off == offsetof(dt_train_config, resume))
        return c->resume_flag ? dt_fnv1a64_str(v.s) | 1 : 0;
    if (is_text(o)) return rules[k].rule == DT_AGREE_SET ? v.s[0] != 0 : dt_fnv1a64_str(v.s);
    switch (o->type) {
    case T_U64: return v.u;
    case T_DBL: {
        uint64_t bits;
        double d = v.d == 0 ? 0.0 : v.d; /* -0 as 0 */
        memcpy(&bits, &d, sizeof bits);
        return bits;
    }
    default: return (uint64_t)v.i;
    }
}

/* How a value reads in the message. Texts come from their rank (text);
 * numbers from the fingerprint itself. */
static void describe(int k, uint64_t fp, const char *text, char *buf, size_t n)
{
    const dt_cfg_opt *o = option(k);
    if (!o || rules[k].rule == DT_AGREE_SET) {
        dt_strf(buf, n, "%s", fp ? "set" : "unset");
    } else if (o->off == offsetof(dt_train_config, resume) && fp && !text[0]) {
        dt_strf(buf, n, "given without a directory (the latest in --out)");
    } else if (is_text(o)) {
        if (!text[0]) dt_strf(buf, n, "unset");
        else dt_strf(buf, n, "'%s'", text);
    } else if (o->type == T_DBL) {
        double d;
        memcpy(&d, &fp, sizeof d);
        /* The shortest spelling that reads back as the same number. */
        for (int digits = 1; digits <= 17; digits++) {
            dt_strf(buf, n, "%.*g", digits, d);
            if (strtod(buf, NULL) == d) break;
        }
    } else if (o->type == T_U64) {
        dt_strf(buf, n, "%llu", (unsigned long long)fp);
    } else {
        dt_strf(buf, n, "%lld", (long long)(int64_t)fp);
    }
}

/* Option k's text, long ones cut in the middle (a path's start and its
 * file name both tell). */
static void text_of(const dt_train_config *c, int k, char out[TEXT])
{
    const dt_cfg_opt *o = option(k);
    char buf[PATH_MAX + 8];
    const char *s = o && is_text(o) ? text_value(c, o, buf, sizeof buf) : "";
    size_t len = strlen(s);
    memset(out, 0, TEXT);
    if (len < TEXT) {
        memcpy(out, s, len);
        return;
    }
    size_t head = 48, tail = TEXT - 1 - head - 3;
    memcpy(out, s, head);
    memcpy(out + head, "...", 3);
    memcpy(out + head + 3, s + len - tail, tail);
}

int dt_config_agree(dt_comm *world, const dt_train_config *c, char *err, size_t errlen)
{
    if (!world || dt_comm_size(world) <= 1) return 0;
    const int size = dt_comm_size(world);
    uint64_t mine[NRULES];
    int checked[NRULES], nchecked = 0;
    for (int k = 0; k < NRULES; k++)
        if (rules[k].rule != DT_AGREE_FREE) {
            checked[nchecked] = k;
            mine[nchecked++] = fingerprint(c, k);
        }
    uint64_t *all = malloc((size_t)size * (size_t)nchecked * sizeof *all);
    if (!all) return dt_strf(err, errlen, "checking that the ranks' options agree: out of memory"), -1;
    if (dt_allgather(world, mine, all, (size_t)nchecked, DT_I64) != 0) {
        dt_strf(err, errlen, "checking that the ranks' options agree: %s", dt_comm_error(world));
        free(all);
        return -1;
    }
    /* The first option that differs, between rank 0 and the lowest rank
     * that holds another value; then the names of the others. The same
     * on every rank: they all hold the same table. */
    int first = -1, other = -1;
    char also[400] = "";
    size_t used = 0;
    int more = 0;
    for (int j = 0; j < nchecked; j++) {
        int r = 1;
        while (r < size && all[(size_t)r * (size_t)nchecked + (size_t)j] == all[j]) r++;
        if (r == size) continue;
        if (first < 0) {
            first = j;
            other = r;
        } else if (used + strlen(rules[checked[j]].flag) + 8 < sizeof also) {
            used += (size_t)dt_strf(also + used, sizeof also - used, "%s--%s",
                                    more ? ", " : "", rules[checked[j]].flag);
            more++;
        }
    }
    if (first < 0) {
        free(all);
        return 0;
    }
    const int k = checked[first];
    const uint64_t fp0 = all[first], fpr = all[(size_t)other * (size_t)nchecked + (size_t)first];
    free(all);
    /* A text differs: its two spellings travel too (only then, and on
     * every rank alike, as every rank found the same difference). */
    char texts0[TEXT] = "", textsr[TEXT] = "";
    const dt_cfg_opt *o = option(k);
    if (o && is_text(o) && rules[k].rule == DT_AGREE_VALUE) {
        char *texts = malloc((size_t)size * TEXT), own[TEXT];
        if (!texts)
            return dt_strf(err, errlen, "checking that the ranks' options agree: out of memory"),
                   -1;
        text_of(c, k, own);
        if (dt_allgather(world, own, texts, TEXT, DT_U8) != 0) {
            dt_strf(err, errlen, "checking that the ranks' options agree: %s",
                    dt_comm_error(world));
            free(texts);
            return -1;
        }
        memcpy(texts0, texts, TEXT);
        memcpy(textsr, texts + (size_t)other * TEXT, TEXT);
        texts0[TEXT - 1] = textsr[TEXT - 1] = '\0';
        free(texts);
    }
    char v0[TEXT + 64], vr[TEXT + 64];
    describe(k, fp0, texts0, v0, sizeof v0);
    describe(k, fpr, textsr, vr, sizeof vr);
    dt_strf(err, errlen,
            "options differ between ranks: --%s is %s on rank 0 but %s on rank %d%s%s%s (start "
            "every rank with the same options)",
            rules[k].flag, v0, vr, other, more ? ", and " : "", also,
            more ? (more > 1 ? " differ too" : " differs too") : "");
    return -1;
}
