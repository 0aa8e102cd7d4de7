#include "train/dataset.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/str.h"

#if __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "llm.c shards are little-endian and are read in place"
#endif

/* One mapped file, shared by the dataset opened on it and its views. */
struct mapping {
    atomic_int refs;
    void *map;
    size_t map_size;
    const uint8_t *bytes; /* text: one token per byte */
    const uint16_t *u16;  /* shard: one token per uint16, else NULL */
    uint64_t ntokens;
    int vocab;
};

struct dt_dataset {
    struct mapping *m;
    uint64_t begin, end; /* the tokens this dataset covers */
    char *name;
};

static void mapping_release(struct mapping *m)
{
    if (atomic_fetch_sub(&m->refs, 1) != 1) return;
    if (m->map) munmap(m->map, m->map_size);
    free(m);
}

static int map_whole(const char *path, struct mapping *m, char *err, size_t errlen)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        dt_strf(err, errlen, "%s: cannot open: %s", path, strerror(errno));
        return -1;
    }
    struct stat st;
    int rc = fstat(fd, &st);
    if (rc != 0 || !S_ISREG(st.st_mode)) {
        dt_strf(err, errlen, "%s: %s", path, rc ? strerror(errno) : "not a regular file");
        close(fd);
        return -1;
    }
    if (st.st_size == 0) {
        dt_strf(err, errlen, "%s: empty file, no tokens", path);
        close(fd);
        return -1;
    }
    m->map_size = (size_t)st.st_size;
    m->map = mmap(NULL, m->map_size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (m->map == MAP_FAILED) {
        m->map = NULL;
        dt_strf(err, errlen, "%s: cannot map: %s", path, strerror(errno));
        return -1;
    }
    return 0;
}

/* The header promises a size; the file must have exactly that, since a
 * shard cut short by a failed copy and a shard with something appended
 * both mean the data is not what the writer wrote. */
static int parse_shard(const char *path, struct mapping *m, char *err, size_t errlen)
{
    if (m->map_size < DT_SHARD_HEADER_BYTES) {
        dt_strf(err, errlen,
                "%s: starts with the llm.c shard magic %d but is only %zu bytes, shorter "
                "than the %d-byte header: truncated",
                path, DT_SHARD_MAGIC, m->map_size, DT_SHARD_HEADER_BYTES);
        return -1;
    }
    int32_t hdr[DT_SHARD_VOCAB_SLOT + 1];
    memcpy(hdr, m->map, sizeof hdr);
    if (hdr[1] != DT_SHARD_VERSION) {
        dt_strf(err, errlen, "%s: llm.c shard version %d is not supported (expected %d)", path,
                hdr[1], DT_SHARD_VERSION);
        return -1;
    }
    if (hdr[2] <= 0) {
        dt_strf(err, errlen, "%s: llm.c shard header gives %d tokens; a shard needs at least one",
                path, hdr[2]);
        return -1;
    }
    uint64_t want = DT_SHARD_HEADER_BYTES + 2 * (uint64_t)hdr[2];
    if (m->map_size != want) {
        dt_strf(err, errlen,
                "%s: %s: the header says %d tokens, so the file should be %llu bytes, but it "
                "is %zu",
                path, m->map_size < want ? "truncated" : "trailing bytes", hdr[2],
                (unsigned long long)want, m->map_size);
        return -1;
    }
    m->u16 = (const uint16_t *)((const char *)m->map + DT_SHARD_HEADER_BYTES);
    m->ntokens = (uint64_t)hdr[2];
    uint16_t top = 0;
    for (uint64_t i = 0; i < m->ntokens; i++) top = m->u16[i] > top ? m->u16[i] : top;
    m->vocab = top + 1;
    /* Only a value a uint16 token can need: a foreign writer's garbage in
     * the slot must not size a model. */
    int32_t hint = hdr[DT_SHARD_VOCAB_SLOT];
    if (hint > m->vocab && hint <= 65536) m->vocab = hint;
    return 0;
}

/* Text has no NUL bytes; a binary file (weights, a foreign token format)
 * almost always does. Reading one as bytes would train on garbage without a
 * word, so it is refused. */
static int check_text(const char *path, const struct mapping *m, char *err, size_t errlen)
{
    const char *nul = memchr(m->map, 0, m->map_size);
    if (!nul) return 0;
    dt_strf(err, errlen,
            "%s: neither an llm.c shard (magic %d) nor text (a NUL byte at offset %zu)", path,
            DT_SHARD_MAGIC, (size_t)(nul - (const char *)m->map));
    return -1;
}

static int is_shard(const struct mapping *m)
{
    int32_t magic;
    if (m->map_size < 4) return 0;
    memcpy(&magic, m->map, 4);
    return magic == DT_SHARD_MAGIC;
}

static dt_dataset *dataset_new(struct mapping *m, uint64_t begin, uint64_t end,
                               const char *name)
{
    dt_dataset *d = calloc(1, sizeof *d);
    char *copy = strdup(name);
    if (!d || !copy) {
        free(d);
        free(copy);
        return NULL;
    }
    atomic_fetch_add(&m->refs, 1);
    d->m = m;
    d->begin = begin;
    d->end = end;
    d->name = copy;
    return d;
}

int dt_dataset_open(const char *path, dt_dataset **out, char *err, size_t errlen)
{
    *out = NULL;
    struct mapping *m = calloc(1, sizeof *m);
    if (!m) {
        dt_strf(err, errlen, "%s: out of memory", path);
        return -1;
    }
    atomic_init(&m->refs, 1);
    if (map_whole(path, m, err, errlen) != 0) goto fail;
    if (is_shard(m)) {
        if (parse_shard(path, m, err, errlen) != 0) goto fail;
    } else {
        if (check_text(path, m, err, errlen) != 0) goto fail;
        m->bytes = m->map;
        m->ntokens = m->map_size;
        m->vocab = 256;
    }
    *out = dataset_new(m, 0, m->ntokens, path);
    if (!*out) {
        dt_strf(err, errlen, "%s: out of memory", path);
        goto fail;
    }
    mapping_release(m); /* the dataset holds its own reference */
    return 0;
fail:
    mapping_release(m);
    return -1;
}

void dt_dataset_close(dt_dataset *d)
{
    if (!d) return;
    mapping_release(d->m);
    free(d->name);
    free(d);
}

const char *dt_dataset_name(const dt_dataset *d) { return d->name; }
uint64_t dt_dataset_ntokens(const dt_dataset *d) { return d->end - d->begin; }
int dt_dataset_vocab(const dt_dataset *d) { return d->m->vocab; }
int dt_dataset_is_text(const dt_dataset *d) { return d->m->u16 == NULL; }

uint32_t dt_dataset_token(const dt_dataset *d, uint64_t i)
{
    uint64_t at = d->begin + i;
    return d->m->u16 ? d->m->u16[at] : d->m->bytes[at];
}

void dt_dataset_read(const dt_dataset *d, uint64_t begin, size_t n, uint16_t *out)
{
    uint64_t at = d->begin + begin;
    if (d->m->u16) {
        memcpy(out, d->m->u16 + at, n * sizeof *out);
        return;
    }
    for (size_t i = 0; i < n; i++) out[i] = d->m->bytes[at + i];
}

uint64_t dt_dataset_nseq(const dt_dataset *d, int T)
{
    uint64_t n = dt_dataset_ntokens(d);
    return T > 0 && n > 0 ? (n - 1) / (uint64_t)T : 0;
}

int dt_dataset_check(const dt_dataset *d, int T, char *err, size_t errlen)
{
    if (T <= 0) {
        dt_strf(err, errlen, "%s: sequence length %d must be positive", d->name, T);
        return -1;
    }
    if (dt_dataset_nseq(d, T) == 0) {
        dt_strf(err, errlen,
                "%s: %llu tokens are too few: one sequence of length %d needs %llu (its "
                "inputs and the next token)",
                d->name, (unsigned long long)dt_dataset_ntokens(d), T,
                (unsigned long long)T + 1);
        return -1;
    }
    return 0;
}

int dt_dataset_batch(const dt_dataset *d, dt_sampler *s, uint64_t first_seq, int B, int T,
                     int32_t *inputs, int32_t *targets, char *err, size_t errlen)
{
    if (B < 0) {
        dt_strf(err, errlen, "%s: batch size %d is negative", d->name, B);
        return -1;
    }
    if (dt_dataset_check(d, T, err, errlen) != 0) return -1;
    uint64_t nseq = dt_dataset_nseq(d, T);
    for (int b = 0; b < B; b++) {
        uint64_t k;
        if (dt_sampler_index(s, nseq, first_seq + (uint64_t)b, &k, err, errlen) != 0) return -1;
        uint64_t at = d->begin + k * (uint64_t)T;
        int32_t *in = inputs + (size_t)b * (size_t)T;
        int32_t *tg = targets + (size_t)b * (size_t)T;
        if (d->m->u16) {
            const uint16_t *p = d->m->u16 + at;
            for (int t = 0; t < T; t++) {
                in[t] = p[t];
                tg[t] = p[t + 1];
            }
        } else {
            const uint8_t *p = d->m->bytes + at;
            for (int t = 0; t < T; t++) {
                in[t] = p[t];
                tg[t] = p[t + 1];
            }
        }
    }
    return 0;
}

uint64_t dt_split_point(uint64_t ntokens, double val_fraction)
{
    if (!(val_fraction > 0)) return ntokens;
    if (val_fraction >= 1) return 0;
    double val = floor((double)ntokens * val_fraction + 0.5);
    return val >= (double)ntokens ? 0 : ntokens - (uint64_t)val;
}

int dt_dataset_view(const dt_dataset *d, uint64_t begin, uint64_t end, const char *label,
                    dt_dataset **out, char *err, size_t errlen)
{
    *out = NULL;
    uint64_t n = dt_dataset_ntokens(d);
    if (begin > end || end > n) {
        dt_strf(err, errlen, "%s: tokens %llu to %llu are not a range of its %llu tokens",
                d->name, (unsigned long long)begin, (unsigned long long)end,
                (unsigned long long)n);
        return -1;
    }
    char name[1024];
    dt_strf(name, sizeof name, "%s (%s: tokens %llu to %llu)", d->name, label,
            (unsigned long long)(d->begin + begin), (unsigned long long)(d->begin + end));
    *out = dataset_new(d->m, d->begin + begin, d->begin + end, name);
    if (!*out) {
        dt_strf(err, errlen, "%s: out of memory", d->name);
        return -1;
    }
    return 0;
}

int dt_dataset_split(const dt_dataset *d, double val_fraction, dt_dataset **train,
                     dt_dataset **val, char *err, size_t errlen)
{
    *train = *val = NULL;
    uint64_t n = dt_dataset_ntokens(d);
    if (!(val_fraction > 0 && val_fraction < 1)) {
        dt_strf(err, errlen, "%s: validation fraction %g must be between 0 and 1", d->name,
                val_fraction);
        return -1;
    }
    uint64_t p = dt_split_point(n, val_fraction);
    if (p < 2 || n - p < 2) {
        dt_strf(err, errlen,
                "%s: %llu tokens are too few to hold out a validation fraction of %g (each "
                "part needs at least 2 tokens)",
                d->name, (unsigned long long)n, val_fraction);
        return -1;
    }
    if (dt_dataset_view(d, 0, p, "training part", train, err, errlen) != 0) return -1;
    if (dt_dataset_view(d, p, n, "validation part", val, err, errlen) != 0) {
        dt_dataset_close(*train);
        *train = NULL;
        return -1;
    }
    return 0;
}
