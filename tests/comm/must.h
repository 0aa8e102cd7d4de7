/* The comm tests' stop at a failed call: the rank (in the communicator
 * the call ran on), the call, its code and the communicator's message,
 * then exit status 1. */
#ifndef DT_TESTS_COMM_MUST_H
#define DT_TESTS_COMM_MUST_H

#include <stdio.h>
#include <stdlib.h>

#include "dtrain/comm.h"

static inline void must(dt_comm *c, int rc, const char *what)
{
    if (rc == 0) return;
    fprintf(stderr, "rank %d: %s returned %d (%s): %s\n", dt_comm_rank(c), what, rc,
            dt_strerror(rc), dt_comm_error(c));
    exit(1);
}

#endif
