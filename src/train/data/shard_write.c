#include "train/data/shard_write.h"

#include <string.h>

#include "core/str.h"

#if __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "llm.c shards are little-endian and are written from memory as they are"
#endif

/* Tokens narrowed to the file's width at a time. */
#define CHUNK 16384

int dt_shard_begin(dt_shard_writer *w, const char *path, int vocab, const dt_tok_ref *tok,
                   char *err, size_t errlen)
{
    memset(&w->info, 0, sizeof w->info);
    w->info.vocab = vocab;
    w->info.width = dt_shard_width(vocab);
    if (tok) w->info.tok = *tok;
    if (dt_afile_open(&w->file, path, err, errlen) != 0) return -1;
    /* The real header goes in at commit, once the count is known. */
    static const int32_t zeros[DT_SHARD_HEADER_INTS];
    return dt_afile_write(&w->file, zeros, sizeof zeros, err, errlen);
}

/* Room for n more tokens, each of tokens below the vocabulary. */
static int check(dt_shard_writer *w, const uint32_t *tokens, size_t n, char *err, size_t errlen)
{
    if (w->info.ntokens + n > DT_SHARD_MAX_TOKENS) {
        dt_strf(err, errlen, "%s: more than %llu tokens, the most one llm.c shard can hold",
                w->file.path, DT_SHARD_MAX_TOKENS);
        dt_afile_abort(&w->file);
        return -1;
    }
    uint32_t limit = w->info.vocab > 0 ? (uint32_t)w->info.vocab : DT_SHARD_U16_VOCAB;
    for (size_t i = 0; i < n; i++) {
        if (tokens[i] < limit) continue;
        dt_strf(err, errlen, "%s: token %u (at position %llu) is beyond the vocabulary of %u",
                w->file.path, tokens[i], (unsigned long long)(w->info.ntokens + i), limit);
        dt_afile_abort(&w->file);
        return -1;
    }
    return 0;
}

int dt_shard_append(dt_shard_writer *w, const uint32_t *tokens, size_t n, char *err,
                    size_t errlen)
{
    if (check(w, tokens, n, err, errlen) != 0) return -1;
    if (w->info.width == 4) {
        if (dt_afile_write(&w->file, tokens, 4 * n, err, errlen) != 0) return -1;
    } else {
        uint16_t buf[CHUNK];
        for (size_t at = 0; at < n; at += CHUNK) {
            size_t k = n - at < CHUNK ? n - at : CHUNK;
            for (size_t i = 0; i < k; i++) buf[i] = (uint16_t)tokens[at + i];
            if (dt_afile_write(&w->file, buf, 2 * k, err, errlen) != 0) return -1;
        }
    }
    w->info.ntokens += (int64_t)n;
    return 0;
}

int dt_shard_append_bytes(dt_shard_writer *w, const unsigned char *bytes, size_t n, char *err,
                          size_t errlen)
{
    uint32_t buf[CHUNK];
    while (n) {
        size_t k = n < CHUNK ? n : CHUNK;
        for (size_t i = 0; i < k; i++) buf[i] = bytes[i];
        if (dt_shard_append(w, buf, k, err, errlen) != 0) return -1;
        bytes += k;
        n -= k;
    }
    return 0;
}

int dt_shard_commit(dt_shard_writer *w, char *err, size_t errlen)
{
    if (w->info.ntokens == 0) {
        dt_strf(err, errlen, "%s: no tokens to write", w->file.path);
        dt_afile_abort(&w->file);
        return -1;
    }
    int32_t hdr[DT_SHARD_HEADER_INTS];
    dt_shard_header_fill(hdr, &w->info);
    if (dt_afile_pwrite(&w->file, 0, hdr, sizeof hdr, err, errlen) != 0) return -1;
    return dt_afile_commit(&w->file, err, errlen);
}

void dt_shard_abort(dt_shard_writer *w) { dt_afile_abort(&w->file); }

int dt_shard_write(const char *path, const uint32_t *tokens, size_t n, int vocab, char *err,
                   size_t errlen)
{
    dt_shard_writer w;
    if (dt_shard_begin(&w, path, vocab, NULL, err, errlen) != 0) return -1;
    if (dt_shard_append(&w, tokens, n, err, errlen) != 0) return -1;
    return dt_shard_commit(&w, err, errlen);
}
