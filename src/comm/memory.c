/*
 * The public communication memory (dtrain/comm.h): dt_alloc_shared's
 * blocks, counted as communication buffers in the memory table.
 */
#include "core/alloc.h"
#include "dtrain/comm.h"

void *dt_comm_mem_alloc(size_t bytes) { return dt_alloc_shared(bytes, DT_MEM_COMM); }

void dt_comm_mem_free(void *p) { dt_free(p); }
