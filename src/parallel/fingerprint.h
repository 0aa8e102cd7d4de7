/* Whether ranks hold the same bytes, compared by fingerprint (core/hash.h):
 * a min and a max all-reduce of each slot agree exactly when every rank
 * that has the slot holds the same value. A rank without a slot gives the
 * neutral values (INT64_MAX for lo, INT64_MIN for hi). */
#ifndef DT_PARALLEL_FINGERPRINT_H
#define DT_PARALLEL_FINGERPRINT_H

#include <stdint.h>

#include "dtrain/comm.h"

/* lo and hi hold n slots each and are overwritten with the reductions.
 * Collective over c. 1 all agree, 0 not, < 0 a communication error. */
int dt_fingerprints_agree(dt_comm *c, int64_t *lo, int64_t *hi, int n);

#endif
