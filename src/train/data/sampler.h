/* The order in which a training run visits sequences. The trainer keeps
 * one counter c of sequences consumed since the start of the run; the
 * sequence for c is
 *
 *     c % nseq                  without shuffling,
 *     perm_e[c % nseq]          with shuffling, e = c / nseq the epoch,
 *
 * where perm_e is a Fisher-Yates permutation drawn from splitmix64 seeded
 * by (seed, e). The whole state of a data stream is therefore (seed,
 * shuffle, c): a resumed run that restores c sees exactly the sequences
 * the interrupted run would have seen, on any number of ranks. */
#ifndef DT_TRAIN_DATA_SAMPLER_H
#define DT_TRAIN_DATA_SAMPLER_H

#include <stddef.h>
#include <stdint.h>

typedef struct {
    uint64_t seed;
    int shuffle;
    /* The cached permutation: perm_epoch's, of perm_n sequences. It is
     * rebuilt when the epoch or nseq changes, so use one sampler per
     * stream (training, validation) and per thread. */
    uint64_t perm_epoch;
    uint64_t perm_n; /* 0: nothing cached */
    uint32_t *perm;
} dt_sampler;

void dt_sampler_init(dt_sampler *s, uint64_t seed, int shuffle);
void dt_sampler_free(dt_sampler *s);
/* The sequence index (0..nseq-1) for counter c. Fails only for nseq 0,
 * for more than 2^32 sequences with shuffling, or out of memory. */
int dt_sampler_index(dt_sampler *s, uint64_t nseq, uint64_t c, uint64_t *index, char *err,
                     size_t errlen);

#endif
