/*
 * The caller's key-value store (dt_kv_ops, include/dtrain/comm.h) behind a
 * dt_store: what dt_comm_init_external's job uses in place of rank 0's
 * server. Waits are cut into slices so that a failure published by
 * another rank, or this job's abort, ends them early; and since there is
 * no control channel, failures travel as two keys of the same store.
 */
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/bootstrap/store.h"
#include "core/timer.h"

/* Longest single wait on a key: how late a published failure may be
 * noticed by a rank waiting in the store. */
#define KV_SLICE_S 0.25
/* How long a rank that saw the failure counter waits for its message,
 * which the first reporter sets right after counting. */
#define KV_ABORT_MSG_WAIT_S 5.0

/* The failure counter (how many ranks reported) and the first report. */
static const char abort_count_key[] = "dtrain/abort";
static const char abort_msg_key[] = "dtrain/abort_msg";

static int kv_failed(int rc, char *err, size_t errlen, const char *what, const char *key)
{
    if (rc == 0) return 0;
    if (!err[0]) snprintf(err, errlen, "%s of '%s' failed (%s)", what, key, dt_strerror(rc));
    return rc < 0 ? rc : DT_ERR_SYSTEM;
}

int dt_kv_set(const dt_kv_ops *ops, void *ctx, const char *key, const void *val, size_t len,
              char *err, size_t errlen)
{
    err[0] = '\0';
    return kv_failed(ops->set(ctx, key, val, len, err, errlen), err, errlen, "set", key);
}

int dt_kv_add(const dt_kv_ops *ops, void *ctx, const char *key, int64_t delta, int64_t *result,
              char *err, size_t errlen)
{
    int64_t v = 0;
    err[0] = '\0';
    int rc = kv_failed(ops->add(ctx, key, delta, &v, err, errlen), err, errlen, "add", key);
    if (rc == 0 && result) *result = v;
    return rc;
}

/* One wait of up to timeout_s; DT_ERR_TIMEOUT leaves err empty. */
static int kv_get_once(const dt_kv_ops *ops, void *ctx, const char *key, double timeout_s,
                       void **val, size_t *len, char *err, size_t errlen)
{
    err[0] = '\0';
    int rc = ops->get(ctx, key, timeout_s, val, len, err, errlen);
    if (rc == DT_ERR_TIMEOUT) {
        err[0] = '\0';
        return rc;
    }
    if (rc == 0 && !*val && *len) rc = DT_ERR_PROTOCOL;
    if (rc == 0) { /* NUL-terminated one byte past the value, as dt_store_get promises */
        char *v = realloc(*val, *len + 1);
        if (!v) {
            free(*val);
            *val = NULL;
            rc = DT_ERR_NOMEM;
        } else {
            v[*len] = '\0';
            *val = v;
        }
    }
    return kv_failed(rc, err, errlen, "get", key);
}

static int fd_readable(int fd)
{
    struct pollfd p = {.fd = fd, .events = POLLIN};
    return fd >= 0 && poll(&p, 1, 0) > 0;
}

int dt_kv_get(const dt_kv_ops *ops, void *ctx, const char *key, void **val, size_t *len,
              uint64_t deadline_ns, int abort_fd, char *err, size_t errlen)
{
    uint64_t start = dt_now_ns();
    *val = NULL;
    *len = 0;
    for (;;) {
        uint64_t now = dt_now_ns();
        double left = deadline_ns > now ? (double)(deadline_ns - now) * 1e-9 : 0;
        int rc = kv_get_once(ops, ctx, key, left < KV_SLICE_S ? left : KV_SLICE_S, val, len,
                             err, errlen);
        if (rc != DT_ERR_TIMEOUT) return rc;
        char msg[512];
        if (fd_readable(abort_fd)) {
            snprintf(err, errlen, "the job aborted while waiting for key '%s'", key);
            return DT_ERR_ABORTED;
        }
        if (dt_kv_poll_abort(ops, ctx, msg, sizeof msg, err, errlen) == 1) {
            snprintf(err, errlen, "the job aborted while waiting for key '%s': %s", key, msg);
            return DT_ERR_ABORTED;
        }
        if (dt_now_ns() >= deadline_ns) {
            snprintf(err, errlen, "timed out after %.1f s waiting for key '%s' in the caller's "
                     "store", (double)(dt_now_ns() - start) * 1e-9, key);
            return DT_ERR_TIMEOUT;
        }
    }
}

int dt_kv_publish_abort(const dt_kv_ops *ops, void *ctx, const char *msg, char *err,
                        size_t errlen)
{
    int64_t n = 0;
    int rc = dt_kv_add(ops, ctx, abort_count_key, 1, &n, err, errlen);
    if (rc == 0 && n == 1) rc = dt_kv_set(ops, ctx, abort_msg_key, msg, strlen(msg), err, errlen);
    return rc;
}

int dt_kv_poll_abort(const dt_kv_ops *ops, void *ctx, char *msg, size_t msglen, char *err,
                     size_t errlen)
{
    int64_t n = 0;
    int rc = dt_kv_add(ops, ctx, abort_count_key, 0, &n, err, errlen);
    if (rc < 0) return rc;
    if (n == 0) return 0;
    void *val = NULL;
    size_t len = 0;
    rc = kv_get_once(ops, ctx, abort_msg_key, KV_ABORT_MSG_WAIT_S, &val, &len, err, errlen);
    if (rc == 0)
        snprintf(msg, msglen, "%.*s", (int)(len < msglen ? len : msglen - 1), (const char *)val);
    else
        snprintf(msg, msglen, "another rank failed (its message did not arrive: %s)",
                 rc == DT_ERR_TIMEOUT ? "timed out" : err);
    free(val);
    return 1;
}
