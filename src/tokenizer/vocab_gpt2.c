/* GPT-2's encoder.json and vocab.bpe. See vocab.h. */
#include "tokenizer/vocab.h"

#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

#include "core/file.h"
#include "core/str.h"
#include "tokenizer/unicode.h"

#define MAX_FILE_BYTES (64u << 20)
#define EOT_TEXT "<|endoftext|>"

/* GPT-2 spells a byte as a printable character: the printable bytes of
 * Latin-1 as themselves, the others, in order, as U+0100 onwards. The
 * byte a code point spells, or -1. */
static int byte_of(uint32_t cp)
{
    static int table[324];
    static int filled;
    if (!filled) { /* one thread loads a vocabulary; the table is the same each time */
        for (int i = 0; i < 324; i++) table[i] = -1;
        int extra = 256;
        for (int b = 0; b < 256; b++) {
            int printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
            table[printable ? b : extra++] = b;
        }
        filled = 1;
    }
    return cp < 324 ? table[cp] : -1;
}

/* A token's bytes from its spelling s: their count, or -1 when s spells
 * no bytes. out has room for strlen(s). */
static int spelled_bytes(const char *s, unsigned char *out)
{
    size_t n = strlen(s), k = 0;
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        int cut;
        i += (size_t)dt_utf8_decode((const unsigned char *)s + i, n - i, &cp, &cut);
        int b = byte_of(cp);
        if (b < 0) return -1;
        out[k++] = (unsigned char)b;
    }
    return (int)k;
}

static int load_encoder(dt_vocab *v, const char *path, char *err, size_t errlen)
{
    char *text = dt_read_file(path, MAX_FILE_BYTES, NULL, err, errlen);
    if (!text) return -1;
    cJSON *j = cJSON_Parse(text);
    free(text);
    if (!cJSON_IsObject(j)) {
        cJSON_Delete(j);
        return dt_strf(err, errlen, "%s: not a JSON object of tokens and their ids", path), -1;
    }
    int top = -1, rc = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, j) {
        if (!cJSON_IsNumber(e) || e->valuedouble < 0 || e->valuedouble > 1e8 ||
            e->valuedouble != (int)e->valuedouble) {
            rc = (dt_strf(err, errlen, "%s: token \"%.40s\" has no id (an integer from 0)", path,
                         e->string), -1);
            break;
        }
        top = e->valueint > top ? e->valueint : top;
    }
    if (rc == 0 && dt_vocab_init(v, (uint32_t)top + 1) != 0)
        rc = (dt_strf(err, errlen, "%s: out of memory", path), -1);
    unsigned char buf[1024];
    cJSON_ArrayForEach(e, j) {
        if (rc != 0) break;
        uint32_t id = (uint32_t)e->valueint, other;
        int special = strcmp(e->string, EOT_TEXT) == 0;
        int n = strlen(e->string) < sizeof buf ? spelled_bytes(e->string, buf) : -1;
        if (special) v->eot = (int32_t)id;
        if (!special && n <= 0) {
            rc = (dt_strf(err, errlen, "%s: token \"%.40s\" (id %u) is not spelled in GPT-2's "
                         "alphabet for bytes", path, e->string, id), -1);
        } else if (v->len[id]) {
            rc = (dt_strf(err, errlen, "%s: id %u is given twice (\"%.40s\" has it too)", path,
                         id, e->string), -1);
        } else {
            int got = special ? dt_vocab_set(v, id, EOT_TEXT, strlen(EOT_TEXT), 1, &other)
                              : dt_vocab_set(v, id, buf, (size_t)n, 0, &other);
            if (got == 1)
                rc = (dt_strf(err, errlen, "%s: token \"%.40s\" has ids %u and %u", path,
                             e->string, other, id), -1);
            else if (got < 0)
                rc = (dt_strf(err, errlen, "%s: out of memory", path), -1);
        }
    }
    cJSON_Delete(j);
    return rc;
}

/* A merge's token (its spelling s) into its id, or a message. */
static int token_id(const dt_vocab *v, const char *path, uint32_t line, const char *s,
                    uint32_t *id, char *err, size_t errlen)
{
    unsigned char buf[1024];
    int n = strlen(s) < sizeof buf ? spelled_bytes(s, buf) : -1;
    int64_t got = n > 0 ? dt_vocab_find(v, buf, (size_t)n) : -1;
    if (got < 0)
        return dt_strf(err, errlen, "%s:%u: \"%.40s\" is not a token of encoder.json", path,
                       line, s), -1;
    *id = (uint32_t)got;
    return 0;
}

/* One merge line, "LEFT RIGHT", at rank. */
static int merge_line(dt_vocab *v, const char *path, uint32_t line, char *s, uint32_t rank,
                      char *err, size_t errlen)
{
    char *sp = strchr(s, ' ');
    if (!sp || sp == s || !sp[1] || strchr(sp + 1, ' '))
        return dt_strf(err, errlen, "%s:%u: '%.60s' is not two tokens apart by a space", path,
                       line, s), -1;
    *sp = 0;
    uint32_t left, right;
    if (token_id(v, path, line, s, &left, err, errlen) != 0 ||
        token_id(v, path, line, sp + 1, &right, err, errlen) != 0)
        return -1;
    unsigned char both[2048];
    size_t nl = v->len[left], nr = v->len[right];
    if (nl + nr > sizeof both)
        return dt_strf(err, errlen, "%s:%u: \"%.40s\" and \"%.40s\" merge into a token over "
                       "%zu bytes", path, line, s, sp + 1, sizeof both), -1;
    memcpy(both, v->bytes + v->off[left], nl);
    memcpy(both + nl, v->bytes + v->off[right], nr);
    int64_t id = dt_vocab_find(v, both, nl + nr);
    if (id < 0)
        return dt_strf(err, errlen, "%s:%u: \"%.40s\" and \"%.40s\" merge into a token that "
                       "encoder.json lacks", path, line, s, sp + 1), -1;
    /* A pair listed twice takes its last rank, as GPT-2's dictionary does. */
    if (dt_vocab_add_merge(v, left, right, rank, (uint32_t)id) != 0)
        return dt_strf(err, errlen, "%s: out of memory", path), -1;
    return 0;
}

/* vocab.bpe: a "#version" line, then a merge a line in rank order. */
static int load_merges(dt_vocab *v, const char *path, char *err, size_t errlen)
{
    char *text = dt_read_file(path, MAX_FILE_BYTES, NULL, err, errlen);
    if (!text) return -1;
    uint32_t line = 0, rank = 0;
    int rc = 0;
    for (char *s = text, *nl; rc == 0 && s && *s; s = nl ? nl + 1 : NULL) {
        nl = strchr(s, '\n');
        if (nl) *nl = 0;
        line++;
        if ((line == 1 && s[0] == '#') || !s[0]) continue;
        rc = merge_line(v, path, line, s, rank++, err, errlen);
    }
    free(text);
    if (rc == 0 && rank == 0)
        rc = (dt_strf(err, errlen, "%s: no merges (a line 'LEFT RIGHT' per merge)", path), -1);
    return rc;
}

int dt_vocab_load_gpt2(dt_vocab *v, const char *dir, char *err, size_t errlen)
{
    *v = (dt_vocab){.eot = -1};
    char enc[4200], bpe[4200];
    dt_strf(enc, sizeof enc, "%s/encoder.json", dir);
    dt_strf(bpe, sizeof bpe, "%s/vocab.bpe", dir);
    uint32_t hole;
    int missing;
    int rc = load_encoder(v, enc, err, errlen);
    if (rc == 0 && v->eot < 0)
        rc = (dt_strf(err, errlen, "%s: no %s token", enc, EOT_TEXT), -1);
    if (rc == 0 && dt_vocab_check_dense(v, v->n, &hole) != 0)
        rc = (dt_strf(err, errlen, "%s: no token has id %u: the ids must run from 0 to %u "
                     "without a gap", enc, hole, v->n - 1), -1);
    if (rc == 0 && dt_vocab_find_bytes(v, &missing) != 0)
        rc = (dt_strf(err, errlen, "%s: byte 0x%02x has no token: a byte-level BPE vocabulary "
                     "has one for each of the 256 bytes", enc, missing), -1);
    if (rc == 0) rc = load_merges(v, bpe, err, errlen);
    if (rc != 0) dt_vocab_free(v);
    return rc;
}
