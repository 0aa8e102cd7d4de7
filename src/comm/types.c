/* Names and sizes of the public enums. */
#include "comm/comm_internal.h"

const char *dt_strerror(int code)
{
    switch (code) {
    case DT_OK: return "ok";
    case DT_ERR_INVALID: return "invalid argument";
    case DT_ERR_SYSTEM: return "system error";
    case DT_ERR_TIMEOUT: return "timeout";
    case DT_ERR_PEER: return "peer lost";
    case DT_ERR_MISMATCH: return "mismatch between ranks";
    case DT_ERR_ABORTED: return "aborted";
    case DT_ERR_NOMEM: return "out of memory";
    case DT_ERR_AUTH: return "authentication failed";
    case DT_ERR_PROTOCOL: return "protocol error";
    default: return "unknown error";
    }
}

const char *dt_dtype_name(dt_dtype t)
{
    static const char *names[] = {"f32", "f64", "bf16", "f16", "i32", "i64", "u8"};
    return (unsigned)t < DT_DTYPE_COUNT ? names[t] : "invalid-dtype";
}

const char *dt_op_name(dt_op op)
{
    static const char *names[] = {"sum", "avg", "max", "min", "prod", "band", "bor", "bxor"};
    return (unsigned)op < DT_OP_COUNT ? names[op] : "invalid-op";
}

size_t dt_dtype_size(dt_dtype t)
{
    static const size_t sizes[] = {4, 8, 2, 2, 4, 8, 1};
    return (unsigned)t < DT_DTYPE_COUNT ? sizes[t] : 0;
}

const char *dt_coll_name(dt_coll_kind k)
{
    static const char *names[] = {"none",      "send",      "barrier",        "broadcast",
                                  "reduce",    "gather",    "scatter",        "allreduce",
                                  "allgather", "reduce_scatter", "alltoall",
                                  "alltoallv"};
    return (unsigned)k < DT_COLL_KIND_COUNT ? names[k] : "unknown";
}
