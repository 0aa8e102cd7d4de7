/*
 * Per-thread matmul workspaces, kept under a pthread key so that a worker
 * thread's buffers go when it ends.
 */
#include "kernels/matmul_workspace.h"

#include <pthread.h>

#include "core/alloc.h"

static pthread_key_t workspace_key;
static pthread_once_t workspace_once = PTHREAD_ONCE_INIT;

static void free_workspace(void *arg)
{
    dt_mm_workspace *ws = arg;
    if (ws->stream) dnnl_stream_destroy(ws->stream);
    dt_free(ws->scratch);
    dt_free(ws->a16);
    dt_free(ws->b16);
    dt_free(ws->shared16);
    dt_free(ws->a32);
    dt_free(ws->b32);
    dt_free(ws->c32);
    dt_free(ws);
}

static void create_workspace_key(void) { pthread_key_create(&workspace_key, free_workspace); }

dt_mm_workspace *dt_mm_thread_workspace(dnnl_engine_t engine)
{
    pthread_once(&workspace_once, create_workspace_key);
    dt_mm_workspace *ws = pthread_getspecific(workspace_key);
    if (ws) return ws;
    ws = dt_alloc(sizeof *ws, DT_MEM_ACTS);
    if (!ws) return NULL;
    if (dnnl_stream_create(&ws->stream, engine, dnnl_stream_default_flags) != dnnl_success ||
        pthread_setspecific(workspace_key, ws) != 0) {
        free_workspace(ws);
        return NULL;
    }
    return ws;
}

int dt_mm_reserve(void **buf, size_t *have, size_t bytes, dt_mem_kind kind)
{
    if (*have >= bytes) return 0;
    dt_free(*buf);
    *buf = dt_alloc(bytes, kind);
    *have = *buf ? bytes : 0;
    return *buf ? 0 : -1;
}
