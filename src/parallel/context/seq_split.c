/* The split of a context-parallel attention call. See seq_split.h. */
#include "parallel/context/seq_split.h"

int dt_seq_split_init(dt_seq_split *s, const char *who, dt_comm *cp, int B, int T, int C, int NH,
                      dt_shard_kind kind, char *err, size_t errlen)
{
    int N = dt_comm_size(cp);
    if (dt_seq_shard_check(who, B, T, C, NH, N, kind, err, errlen)) return -1;
    *s = (dt_seq_split){.comm = cp, .rank = dt_comm_rank(cp), .nranks = N, .B = B, .T = T,
                        .C = C, .NH = NH, .kind = kind, .Tl = T / N};
    dt_seq_shard(&s->mine, T, s->rank, N, kind);
    return 0;
}
