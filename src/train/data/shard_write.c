#include "train/data/shard_write.h"

#include <string.h>

#include "core/str.h"
#include "train/data/dataset.h"

#if __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "llm.c shards are little-endian and are written from memory as they are"
#endif

int dt_shard_begin(dt_shard_writer *w, const char *path, int vocab, char *err, size_t errlen)
{
    w->ntokens = 0;
    w->vocab = vocab;
    if (dt_afile_open(&w->file, path, err, errlen) != 0) return -1;
    /* The real header goes in at commit, once the count is known. */
    static const int32_t zeros[DT_SHARD_HEADER_INTS];
    return dt_afile_write(&w->file, zeros, sizeof zeros, err, errlen);
}

static int reserve(dt_shard_writer *w, size_t n, char *err, size_t errlen)
{
    if (w->ntokens + n <= DT_SHARD_MAX_TOKENS) return 0;
    dt_strf(err, errlen, "%s: more than %llu tokens, the most one llm.c shard can hold",
            w->file.path, DT_SHARD_MAX_TOKENS);
    dt_afile_abort(&w->file);
    return -1;
}

int dt_shard_append(dt_shard_writer *w, const uint16_t *tokens, size_t n, char *err,
                    size_t errlen)
{
    if (reserve(w, n, err, errlen) != 0) return -1;
    if (dt_afile_write(&w->file, tokens, n * sizeof *tokens, err, errlen) != 0) return -1;
    w->ntokens += n;
    return 0;
}

int dt_shard_append_bytes(dt_shard_writer *w, const unsigned char *bytes, size_t n, char *err,
                          size_t errlen)
{
    uint16_t buf[16384];
    while (n) {
        size_t k = n < 16384 ? n : 16384;
        for (size_t i = 0; i < k; i++) buf[i] = bytes[i];
        if (dt_shard_append(w, buf, k, err, errlen) != 0) return -1;
        bytes += k;
        n -= k;
    }
    return 0;
}

int dt_shard_commit(dt_shard_writer *w, char *err, size_t errlen)
{
    if (w->ntokens == 0) {
        dt_strf(err, errlen, "%s: no tokens to write", w->file.path);
        dt_afile_abort(&w->file);
        return -1;
    }
    int32_t hdr[DT_SHARD_VOCAB_SLOT + 1] = {DT_SHARD_MAGIC, DT_SHARD_VERSION,
                                            (int32_t)w->ntokens, w->vocab};
    if (dt_afile_pwrite(&w->file, 0, hdr, sizeof hdr, err, errlen) != 0) return -1;
    return dt_afile_commit(&w->file, err, errlen);
}

void dt_shard_abort(dt_shard_writer *w) { dt_afile_abort(&w->file); }

int dt_shard_write(const char *path, const uint16_t *tokens, size_t n, int vocab, char *err,
                   size_t errlen)
{
    dt_shard_writer w;
    if (dt_shard_begin(&w, path, vocab, err, errlen) != 0) return -1;
    if (dt_shard_append(&w, tokens, n, err, errlen) != 0) return -1;
    return dt_shard_commit(&w, err, errlen);
}
