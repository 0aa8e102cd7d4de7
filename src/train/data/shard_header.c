/* An llm.c shard's header, written and read. See shard_header.h. */
#include "train/data/shard_header.h"

#include <string.h>

#include "core/str.h"

#define SPEC_BYTES ((DT_SHARD_HEADER_INTS - DT_SHARD_SPEC_SLOT) * 4)

_Static_assert(DT_TOK_SPEC_MAX <= SPEC_BYTES, "a recorded spec must fit in the header");

int dt_shard_magic(int32_t first) { return first == DT_SHARD_MAGIC || first == DT_SHARD32_MAGIC; }

void dt_shard_header_fill(int32_t hdr[DT_SHARD_HEADER_INTS], const dt_shard_info *info)
{
    memset(hdr, 0, DT_SHARD_HEADER_BYTES);
    int wide = info->width == 4;
    hdr[0] = wide ? DT_SHARD32_MAGIC : DT_SHARD_MAGIC;
    hdr[1] = wide ? DT_SHARD32_VERSION : DT_SHARD_VERSION;
    hdr[2] = (int32_t)info->ntokens;
    hdr[DT_SHARD_VOCAB_SLOT] = info->vocab;
    if (!info->tok.spec[0]) return;
    hdr[4] = DT_SHARD_TOK_MARK;
    hdr[5] = (int32_t)info->tok.split;
    hdr[6] = info->tok.eot;
    hdr[8] = (int32_t)(uint32_t)info->tok.fingerprint;
    hdr[9] = (int32_t)(uint32_t)(info->tok.fingerprint >> 32);
    memcpy(hdr + DT_SHARD_SPEC_SLOT, info->tok.spec, strlen(info->tok.spec));
}

/* The tokenizer record, when the header holds one. */
static int parse_tok(const char *path, const int32_t *hdr, dt_shard_info *info, char *err,
                     size_t errlen)
{
    dt_tok_ref *t = &info->tok;
    memset(t, 0, sizeof *t);
    if (hdr[4] != DT_SHARD_TOK_MARK) return 0;
    const char *spec = (const char *)(hdr + DT_SHARD_SPEC_SLOT);
    size_t len = strnlen(spec, SPEC_BYTES);
    if (len == 0 || len >= DT_TOK_SPEC_MAX || hdr[5] < DT_SPLIT_NONE || hdr[5] > DT_SPLIT_CL100K ||
        hdr[6] < -1 || hdr[6] >= info->vocab)
        return dt_strf(err, errlen, "%s: the header's tokenizer record is damaged (spec of %zu "
                       "bytes, split %d, end of text %d, vocabulary %d)", path, len, hdr[5],
                       hdr[6], info->vocab), -1;
    memcpy(t->spec, spec, len);
    t->split = (dt_split)hdr[5];
    t->eot = hdr[6];
    t->vocab = info->vocab;
    t->fingerprint = (uint64_t)(uint32_t)hdr[8] | (uint64_t)(uint32_t)hdr[9] << 32;
    return 0;
}

int dt_shard_header_parse(const char *path, const int32_t hdr[DT_SHARD_HEADER_INTS],
                          dt_shard_info *info, char *err, size_t errlen)
{
    memset(info, 0, sizeof *info);
    int wide = hdr[0] == DT_SHARD32_MAGIC;
    int want = wide ? DT_SHARD32_VERSION : DT_SHARD_VERSION;
    if (hdr[1] != want)
        return dt_strf(err, errlen, "%s: llm.c shard version %d is not supported (magic %d "
                       "has version %d: %s tokens)", path, hdr[1], hdr[0], want,
                       wide ? "uint32" : "uint16"), -1;
    if (hdr[2] <= 0)
        return dt_strf(err, errlen, "%s: llm.c shard header gives %d tokens; a shard needs at "
                       "least one", path, hdr[2]), -1;
    info->width = wide ? 4 : 2;
    info->ntokens = hdr[2];
    /* Only a value the tokens' width can need: a foreign writer's garbage
     * in the slot must not size a model. */
    int32_t vocab = hdr[DT_SHARD_VOCAB_SLOT];
    int plausible = vocab > 0 && (wide || vocab <= DT_SHARD_U16_VOCAB);
    info->vocab = plausible ? vocab : 0;
    return plausible ? parse_tok(path, hdr, info, err, errlen) : 0;
}
