/*
 * The public communication memory (dtrain/comm.h): shared regions'
 * blocks (dt_alloc_region), counted as communication buffers in the memory table.
 */
#include "core/alloc.h"
#include "dtrain/comm.h"

void *dt_comm_mem_alloc(size_t bytes) { return dt_alloc_region(bytes, DT_MEM_COMM); }

void dt_comm_mem_free(void *p) { dt_free(p); }
