#include "train/data/sampler.h"

#include <stdlib.h>
#include <string.h>

#include "core/rand.h"
#include "core/str.h"

/* Uniform in [0, n) without modulo bias: draws below 2^64 mod n are
 * rejected, so every remainder is equally likely. */
static uint64_t below(uint64_t *state, uint64_t n)
{
    uint64_t threshold = (0 - n) % n;
    for (;;) {
        uint64_t r = dt_splitmix64(state);
        if (r >= threshold) return r % n;
    }
}

static void build_perm(uint32_t *perm, uint64_t n, uint64_t seed, uint64_t epoch)
{
    /* The epoch goes through the mixer before meeting the seed, so
     * neighbouring (seed, epoch) pairs start far apart. */
    uint64_t state = dt_mix64(seed ^ dt_mix64(epoch + 0x632BE59BD9B4E019ull));
    for (uint64_t i = 0; i < n; i++) perm[i] = (uint32_t)i;
    for (uint64_t i = n - 1; i > 0; i--) {
        uint64_t j = below(&state, i + 1);
        uint32_t t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
}

void dt_sampler_init(dt_sampler *s, uint64_t seed, int shuffle)
{
    memset(s, 0, sizeof *s);
    s->seed = seed;
    s->shuffle = shuffle != 0;
}

void dt_sampler_free(dt_sampler *s)
{
    free(s->perm);
    s->perm = NULL;
    s->perm_n = 0;
}

int dt_sampler_index(dt_sampler *s, uint64_t nseq, uint64_t c, uint64_t *index, char *err,
                     size_t errlen)
{
    if (nseq == 0) {
        dt_strf(err, errlen, "sampler: no sequences to draw from");
        return -1;
    }
    if (!s->shuffle) {
        *index = c % nseq;
        return 0;
    }
    uint64_t epoch = c / nseq;
    if (s->perm_n != nseq || s->perm_epoch != epoch) {
        if (nseq > UINT32_MAX) {
            dt_strf(err, errlen, "sampler: %llu sequences are too many to shuffle (at most %u)",
                    (unsigned long long)nseq, UINT32_MAX);
            return -1;
        }
        if (s->perm_n != nseq) {
            dt_sampler_free(s);
            s->perm = malloc(nseq * sizeof *s->perm);
            if (!s->perm) {
                dt_strf(err, errlen, "sampler: out of memory for %llu sequences",
                        (unsigned long long)nseq);
                return -1;
            }
        }
        build_perm(s->perm, nseq, s->seed, epoch);
        s->perm_n = nseq;
        s->perm_epoch = epoch;
    }
    *index = s->perm[c % nseq];
    return 0;
}
