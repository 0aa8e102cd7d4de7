/* Comparing fingerprints across ranks. See fingerprint.h. */
#include "parallel/fingerprint.h"

#include <string.h>

int dt_fingerprints_agree(dt_comm *c, int64_t *lo, int64_t *hi, int n)
{
    int rc = dt_allreduce(c, lo, lo, (size_t)n, DT_I64, DT_MIN);
    if (rc == 0) rc = dt_allreduce(c, hi, hi, (size_t)n, DT_I64, DT_MAX);
    if (rc != 0) return rc;
    return memcmp(lo, hi, (size_t)n * sizeof *lo) == 0;
}
