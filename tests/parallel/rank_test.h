/* The start of a multi-rank test run under `dtrain launch -n N`: the job's
 * communicator, one compute thread per rank (the ranks share the cores),
 * and every check labelled with its rank. NULL (the reason on stderr) when
 * the job cannot be joined. */
#ifndef DT_TESTS_PARALLEL_RANK_TEST_H
#define DT_TESTS_PARALLEL_RANK_TEST_H

#include <stdio.h>

#include "check.h"
#include "dtrain/comm.h"
#include "kernels/threads.h"

static inline dt_comm *rank_test_start(int *rank, int *size)
{
    dt_comm *comm;
    if (dt_comm_init(&comm)) {
        fprintf(stderr, "comm init: %s\n", dt_last_error());
        return NULL;
    }
    *rank = dt_comm_rank(comm);
    *size = dt_comm_size(comm);
    dt_kernels_set_threads(1);
    check_set_label("rank %d of %d: ", *rank, *size);
    return comm;
}

#endif
