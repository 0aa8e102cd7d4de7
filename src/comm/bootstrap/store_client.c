/*
 * A request connection to the store (store.h): SET, GET, ADD and the
 * barrier made of them, each a request and its reply. Replies to GETs that
 * timed out are recognised by their id and dropped, so a timeout leaves
 * the stream in step; a transfer that fails half-way does not, and breaks
 * the connection for good. An external store (dt_store_external) takes
 * the same three calls to the caller's callbacks instead.
 */
#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "comm/bootstrap/store.h"
#include "comm/bootstrap/store_wire.h"
#include "comm/transport/net.h"
#include "core/timer.h"
#include "dtrain/comm.h"

#define NS_PER_S 1000000000ull
#define MIN_IO_TIMEOUT_NS (5 * NS_PER_S)
#define CANCEL_TIMEOUT_NS (1 * NS_PER_S)

struct dt_store {
    int fd;
    uint32_t last_id;
    uint64_t io_timeout_ns; /* bound for requests that take no deadline; 0 = none */
    int broken;             /* the stream is out of step; every call fails */
    int abort_fd;           /* readable once the job aborted: waits end; -1 = none */
    char addr[300];
    char err[768];
    const dt_kv_ops *kv; /* an external store's callbacks, or NULL */
    void *kv_ctx;
};

static char server_name[64] = "rank 0";

void dt_store_set_server_name(const char *who)
{
    snprintf(server_name, sizeof server_name, "%s", who);
}

const char *dt_store_server_name(void) { return server_name; }

static int store_fail(dt_store *s, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static int store_fail(dt_store *s, int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(s->err, sizeof s->err, fmt, ap);
    va_end(ap);
    return code;
}

static uint64_t io_deadline(const dt_store *s)
{
    return s->io_timeout_ns ? dt_now_ns() + s->io_timeout_ns : 0;
}

/* A transfer failed part-way: later calls must not read the rest of it as
 * a new message. */
static int store_broke(dt_store *s, int rc, const char *doing, const char *why)
{
    s->broken = 1;
    if (rc == DT_ERR_PEER)
        return store_fail(s, rc, "lost the connection to the store at %s while %s (%s died or "
                          "was killed?)", s->addr, doing, dt_store_server_name());
    if (rc == DT_ERR_TIMEOUT)
        return store_fail(s, rc, "the store at %s stalled in the middle of a message while %s",
                          s->addr, doing);
    return store_fail(s, rc, "store at %s: %s while %s", s->addr,
                      why && *why ? why : "socket error", doing);
}

static int check_key(dt_store *s, const char *key)
{
    size_t len = key ? strlen(key) : 0;
    if (len >= 1 && len <= DT_STORE_MAX_KEY) return 0;
    return store_fail(s, DT_ERR_INVALID, "store key must be 1..%d bytes long (got %zu)",
                      DT_STORE_MAX_KEY, len);
}

/* Read replies until the one for id; earlier ones are answers to GETs that
 * timed out and are dropped. A DT_ERR_TIMEOUT before the reply starts leaves
 * the stream in step. */
/* Wait until a reply starts (0), the deadline passes, or the job aborts. */
static int wait_reply(dt_store *s, uint64_t deadline_ns)
{
    if (s->abort_fd < 0) return dt_net_wait(s->fd, POLLIN, deadline_ns);
    for (;;) {
        int ms = dt_net_poll_ms(deadline_ns);
        if (ms == 0) return DT_ERR_TIMEOUT;
        struct pollfd p[2] = {{.fd = s->fd, .events = POLLIN}, {.fd = s->abort_fd, .events = POLLIN}};
        int r = poll(p, 2, ms);
        if (r > 0 && p[0].revents) return 0;
        if (r > 0 && p[1].revents) return DT_ERR_ABORTED;
        if (r < 0 && errno != EINTR) return DT_ERR_SYSTEM;
    }
}

static int await_reply(dt_store *s, uint32_t id, uint64_t deadline_ns, const char *doing,
                       dt_wire_hdr *rh, unsigned char **body)
{
    for (;;) {
        int rc = wait_reply(s, deadline_ns);
        if (rc == DT_ERR_ABORTED) return store_fail(s, rc, "the job aborted while %s", doing);
        if (rc) return rc == DT_ERR_TIMEOUT ? rc : store_broke(s, rc, doing, "poll failed");
        char why[160] = "";
        rc = dt_wire_read(s->fd, rh, body, io_deadline(s), why, sizeof why);
        if (rc) return store_broke(s, rc, doing, why);
        if (rh->type != DT_WIRE_REPLY) {
            free(*body);
            *body = NULL;
            return store_broke(s, DT_ERR_PROTOCOL, doing, "unexpected message type");
        }
        if (rh->id == id) return 0;
        free(*body);
        *body = NULL;
    }
}

/* Send one request and wait for its reply until deadline_ns. On success the
 * reply's status was 0 and *body holds its value. */
static int store_call(dt_store *s, dt_wire_hdr *h, const char *key, const void *val,
                      uint64_t deadline_ns, const char *doing, dt_wire_hdr *rh,
                      unsigned char **body)
{
    *body = NULL;
    if (s->broken)
        return store_fail(s, DT_ERR_PEER,
                          "the connection to the store at %s broke earlier; cannot go on %s",
                          s->addr, doing);
    if (++s->last_id == 0) s->last_id = 1;
    h->id = s->last_id;
    int rc = dt_wire_send(s->fd, h, key, val, io_deadline(s));
    if (rc) return store_broke(s, rc, doing, "send failed");
    rc = await_reply(s, h->id, deadline_ns, doing, rh, body);
    if (rc) return rc;
    if (rh->a != 0) {
        int code = rh->a < 0 ? rh->a : DT_ERR_PROTOCOL;
        rc = store_fail(s, code, "the store at %s refused %s: %s", s->addr, doing,
                        (const char *)*body);
        free(*body);
        *body = NULL;
    }
    return rc;
}

int dt_store_connect(const char *host, int port, const char *secret, uint64_t deadline_ns,
                     dt_store **out, char *err, size_t errlen)
{
    *out = NULL;
    uint64_t start = dt_now_ns();
    int fd;
    int rc = dt_wire_dial(host, port, secret, deadline_ns, &fd, err, errlen);
    if (rc) return rc;
    dt_store *s = calloc(1, sizeof *s);
    if (!s) {
        snprintf(err, errlen, "out of memory");
        close(fd);
        return DT_ERR_NOMEM;
    }
    s->fd = fd;
    s->abort_fd = -1;
    /* The caller's connect budget (DTRAIN_TIMEOUT, in practice) also bounds
     * each later request that takes no deadline of its own. */
    if (deadline_ns) {
        uint64_t budget = deadline_ns > start ? deadline_ns - start : 0;
        s->io_timeout_ns = budget > MIN_IO_TIMEOUT_NS ? budget : MIN_IO_TIMEOUT_NS;
    }
    dt_net_host_port(s->addr, sizeof s->addr, host, port);
    *out = s;
    return 0;
}

static int store_set_until(dt_store *s, const char *key, const void *val, size_t len,
                           uint64_t deadline_ns)
{
    if (check_key(s, key)) return DT_ERR_INVALID;
    if (s->kv) return dt_kv_set(s->kv, s->kv_ctx, key, val, len, s->err, sizeof s->err);
    if (len && !val)
        return store_fail(s, DT_ERR_INVALID, "store value for '%s' is NULL", key);
    if (len > DT_STORE_MAX_VALUE)
        return store_fail(s, DT_ERR_INVALID, "store value for '%s' is %zu bytes; the limit is %u",
                          key, len, DT_STORE_MAX_VALUE);
    dt_wire_hdr h = {.type = DT_WIRE_SET, .key_len = (uint32_t)strlen(key), .val_len = (uint32_t)len};
    dt_wire_hdr rh;
    unsigned char *body;
    int rc = store_call(s, &h, key, val, deadline_ns, "setting a key", &rh, &body);
    if (rc == DT_ERR_TIMEOUT && !s->broken)
        return store_fail(s, rc, "timed out setting key '%s' in the store at %s (%s stopped or "
                          "hung?)", key, s->addr, dt_store_server_name());
    free(body);
    return rc;
}

int dt_store_set(dt_store *s, const char *key, const void *val, size_t len)
{
    return store_set_until(s, key, val, len, io_deadline(s));
}

/* Tell the server to forget a GET we stopped waiting for. */
static void send_cancel(dt_store *s, uint32_t id)
{
    dt_wire_hdr h = {.type = DT_WIRE_CANCEL, .id = id};
    if (dt_wire_send(s->fd, &h, NULL, NULL, dt_now_ns() + CANCEL_TIMEOUT_NS) != 0) s->broken = 1;
}

int dt_store_get(dt_store *s, const char *key, void **val, size_t *len, uint64_t deadline_ns)
{
    *val = NULL;
    *len = 0;
    if (check_key(s, key)) return DT_ERR_INVALID;
    if (s->kv)
        return dt_kv_get(s->kv, s->kv_ctx, key, val, len, deadline_ns, s->abort_fd, s->err,
                         sizeof s->err);
    uint64_t start = dt_now_ns();
    dt_wire_hdr h = {.type = DT_WIRE_GET, .key_len = (uint32_t)strlen(key)};
    dt_wire_hdr rh;
    unsigned char *body;
    int rc = store_call(s, &h, key, NULL, deadline_ns, "waiting for a key", &rh, &body);
    if (rc == DT_ERR_ABORTED && !s->broken) send_cancel(s, h.id);
    if (rc == DT_ERR_TIMEOUT && !s->broken) {
        send_cancel(s, h.id);
        return store_fail(s, rc, "timed out after %.1f s waiting for key '%s' in the store at %s",
                          (double)(dt_now_ns() - start) * 1e-9, key, s->addr);
    }
    if (rc) return rc;
    *val = body;
    *len = rh.val_len;
    return 0;
}

static int store_add_until(dt_store *s, const char *key, int64_t delta, int64_t *result,
                           uint64_t deadline_ns)
{
    if (check_key(s, key)) return DT_ERR_INVALID;
    if (s->kv) return dt_kv_add(s->kv, s->kv_ctx, key, delta, result, s->err, sizeof s->err);
    unsigned char d[8];
    dt_wire_put_i64(d, delta);
    dt_wire_hdr h = {.type = DT_WIRE_ADD, .key_len = (uint32_t)strlen(key), .val_len = 8};
    dt_wire_hdr rh;
    unsigned char *body;
    int rc = store_call(s, &h, key, d, deadline_ns, "adding to a counter", &rh, &body);
    if (rc == DT_ERR_TIMEOUT && !s->broken)
        return store_fail(s, rc, "timed out adding to counter '%s' in the store at %s (%s "
                          "stopped or hung?)", key, s->addr, dt_store_server_name());
    if (rc) return rc;
    if (rh.val_len != 8) {
        free(body);
        return store_broke(s, DT_ERR_PROTOCOL, "adding to a counter", "malformed ADD reply");
    }
    if (result) *result = dt_wire_get_i64(body);
    free(body);
    return 0;
}

int dt_store_add(dt_store *s, const char *key, int64_t delta, int64_t *result)
{
    return store_add_until(s, key, delta, result, io_deadline(s));
}

/* The counter key counts arrivals over every use of the barrier; arrival k
 * belongs to round (k-1)/n, and the last arrival of a round opens it by
 * setting "<key>/open.<round>". So the same key can be used again. */
int dt_store_barrier(dt_store *s, const char *key, int n, uint64_t deadline_ns)
{
    if (check_key(s, key)) return DT_ERR_INVALID;
    if (n < 1) return store_fail(s, DT_ERR_INVALID, "barrier '%s' needs n >= 1, got %d", key, n);
    char open_key[DT_STORE_MAX_KEY + 40];
    if (strlen(key) + 32 > DT_STORE_MAX_KEY)
        return store_fail(s, DT_ERR_INVALID, "barrier key '%.40s...' is too long", key);
    uint64_t start = dt_now_ns();
    uint64_t step_deadline = deadline_ns ? deadline_ns : io_deadline(s);
    int64_t arrived;
    int rc = store_add_until(s, key, 1, &arrived, step_deadline);
    if (rc) return rc;
    int64_t round = (arrived - 1) / n;
    snprintf(open_key, sizeof open_key, "%s/open.%" PRId64, key, round);
    if (arrived % n == 0) {
        rc = store_set_until(s, open_key, "1", 1, step_deadline);
        if (rc) return rc;
    }
    void *v;
    size_t len;
    rc = dt_store_get(s, open_key, &v, &len, deadline_ns);
    if (rc == 0) {
        free(v);
        return 0;
    }
    if (rc != DT_ERR_TIMEOUT) return rc;
    /* Say how many made it, which usually points at the missing ones. */
    int64_t now_arrived;
    if (store_add_until(s, key, 0, &now_arrived, dt_now_ns() + CANCEL_TIMEOUT_NS) != 0)
        now_arrived = arrived;
    return store_fail(s, DT_ERR_TIMEOUT, "barrier '%s' timed out after %.1f s: %" PRId64 " of %d arrived",
                      key, (double)(dt_now_ns() - start) * 1e-9, now_arrived - round * n, n);
}

void dt_store_set_abort_fd(dt_store *s, int fd) { s->abort_fd = fd; }

const char *dt_store_error(const dt_store *s) { return s ? s->err : "no store connection"; }

void dt_store_close(dt_store *s)
{
    if (!s) return;
    if (s->fd >= 0) close(s->fd);
    free(s);
}

int dt_store_external(const dt_kv_ops *ops, void *ctx, dt_store **out)
{
    dt_store *s = calloc(1, sizeof *s);
    *out = s;
    if (!s) return DT_ERR_NOMEM;
    s->fd = -1;
    s->abort_fd = -1;
    s->kv = ops;
    s->kv_ctx = ctx;
    snprintf(s->addr, sizeof s->addr, "the caller's store");
    return 0;
}
