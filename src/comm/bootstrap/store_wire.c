/*
 * The store's wire format (store_wire.h): encoding and checking headers,
 * whole messages over a blocking-style socket, and dialling the store.
 */
#include "comm/bootstrap/store_wire.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "comm/bootstrap/auth.h"
#include "comm/bootstrap/store.h"
#include "comm/transport/net.h"
#include "core/timer.h"
#include "dtrain/comm.h"

#define WIRE_MAGIC 0x5344u

static void put_u32(unsigned char *p, uint32_t v)
{
    p[0] = (unsigned char)v;
    p[1] = (unsigned char)(v >> 8);
    p[2] = (unsigned char)(v >> 16);
    p[3] = (unsigned char)(v >> 24);
}

static uint32_t get_u32(const unsigned char *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

void dt_wire_put_i64(unsigned char *p, int64_t v)
{
    put_u32(p, (uint32_t)((uint64_t)v & 0xffffffffu));
    put_u32(p + 4, (uint32_t)((uint64_t)v >> 32));
}

int64_t dt_wire_get_i64(const unsigned char *p)
{
    return (int64_t)((uint64_t)get_u32(p) | (uint64_t)get_u32(p + 4) << 32);
}

void dt_wire_encode(const dt_wire_hdr *h, unsigned char *p)
{
    p[0] = h->type;
    p[1] = h->flag;
    p[2] = (unsigned char)(WIRE_MAGIC & 0xff);
    p[3] = (unsigned char)(WIRE_MAGIC >> 8);
    put_u32(p + 4, h->id);
    put_u32(p + 8, (uint32_t)h->a);
    put_u32(p + 12, (uint32_t)h->b);
    put_u32(p + 16, h->key_len);
    put_u32(p + 20, h->val_len);
}

void dt_wire_decode(const unsigned char *p, dt_wire_hdr *h)
{
    h->type = p[0];
    h->flag = p[1];
    h->id = get_u32(p + 4);
    h->a = (int32_t)get_u32(p + 8);
    h->b = (int32_t)get_u32(p + 12);
    h->key_len = get_u32(p + 16);
    h->val_len = get_u32(p + 20);
}

static int check_key_len(uint32_t key_len, char *why, size_t len)
{
    if (key_len >= 1 && key_len <= DT_STORE_MAX_KEY) return 0;
    snprintf(why, len, "key length %" PRIu32 " is outside 1..%d", key_len, DT_STORE_MAX_KEY);
    return -1;
}

static int check_val_len(uint32_t val_len, uint32_t limit, char *why, size_t len)
{
    if (val_len <= limit) return 0;
    snprintf(why, len, "value length %" PRIu32 " exceeds the limit of %" PRIu32, val_len, limit);
    return -1;
}

static int check_no_key(const dt_wire_hdr *h, char *why, size_t len)
{
    if (h->key_len == 0) return 0;
    snprintf(why, len, "message type %u must carry no key", h->type);
    return -1;
}

static int check_empty(const dt_wire_hdr *h, char *why, size_t len)
{
    if (h->key_len == 0 && h->val_len == 0) return 0;
    snprintf(why, len, "message type %u must carry no key or value", h->type);
    return -1;
}

/* Validate a header before any of its lengths is used: 0, or -1 with the
 * reason in why. */
int dt_wire_check(const unsigned char *raw, const dt_wire_hdr *h, char *why, size_t len)
{
    if ((raw[2] | raw[3] << 8) != WIRE_MAGIC) {
        snprintf(why, len, "bad magic (not a dtrain store message, or out of step)");
        return -1;
    }
    switch (h->type) {
    case DT_WIRE_SET:
        if (check_key_len(h->key_len, why, len)) return -1;
        return check_val_len(h->val_len, DT_STORE_MAX_VALUE, why, len);
    case DT_WIRE_GET:
        if (check_key_len(h->key_len, why, len)) return -1;
        return check_val_len(h->val_len, 0, why, len);
    case DT_WIRE_ADD:
        if (check_key_len(h->key_len, why, len)) return -1;
        if (h->val_len == 8) return 0;
        snprintf(why, len, "ADD carries %" PRIu32 " value bytes instead of 8", h->val_len);
        return -1;
    case DT_WIRE_CANCEL:
    case DT_WIRE_HELLO:
    case DT_WIRE_HEARTBEAT:
    case DT_WIRE_BYE:
    case DT_WIRE_LEFT:
        return check_empty(h, why, len);
    case DT_WIRE_FAIL:
    case DT_WIRE_ABORT:
        if (check_no_key(h, why, len)) return -1;
        return check_val_len(h->val_len, DT_STORE_MAX_MSG, why, len);
    case DT_WIRE_REPLY:
        if (check_no_key(h, why, len)) return -1;
        return check_val_len(h->val_len, DT_STORE_MAX_VALUE, why, len);
    default:
        snprintf(why, len, "unknown message type %u", h->type);
        return -1;
    }
}

/* Blocking-style send of one message (clients and the monitor). */
int dt_wire_send(int fd, const dt_wire_hdr *h, const void *key, const void *val,
                    uint64_t deadline_ns)
{
    unsigned char buf[DT_WIRE_HDR_SIZE + DT_STORE_MAX_KEY];
    dt_wire_encode(h, buf);
    if (h->key_len) memcpy(buf + DT_WIRE_HDR_SIZE, key, h->key_len);
    int rc = dt_net_write_all(fd, buf, DT_WIRE_HDR_SIZE + h->key_len, deadline_ns);
    if (rc == 0 && h->val_len) rc = dt_net_write_all(fd, val, h->val_len, deadline_ns);
    return rc;
}

/* Blocking-style read of one message (clients and the monitor). *body gets
 * key and value in one malloc'd block with a NUL after them. */
int dt_wire_read(int fd, dt_wire_hdr *h, unsigned char **body, uint64_t deadline_ns, char *why,
                    size_t whylen)
{
    unsigned char raw[DT_WIRE_HDR_SIZE];
    *body = NULL;
    int rc = dt_net_read_all(fd, raw, DT_WIRE_HDR_SIZE, deadline_ns);
    if (rc) return rc;
    dt_wire_decode(raw, h);
    if (dt_wire_check(raw, h, why, whylen)) return DT_ERR_PROTOCOL;
    size_t n = (size_t)h->key_len + h->val_len;
    unsigned char *b = malloc(n + 1);
    if (!b) {
        snprintf(why, whylen, "out of memory for a %zu-byte message", n);
        return DT_ERR_NOMEM;
    }
    rc = dt_net_read_all(fd, b, n, deadline_ns);
    if (rc) {
        free(b);
        return rc;
    }
    b[n] = 0;
    *body = b;
    return 0;
}

int dt_wire_dial(const char *host, int port, const char *secret, uint64_t deadline_ns,
                 int *out_fd, char *err, size_t errlen)
{
    char why[512];
    int fd;
    int rc = dt_net_connect(host, port, deadline_ns, &fd, why, sizeof why);
    if (rc) {
        snprintf(err, errlen, "cannot reach the store on %s: %s", dt_store_server_name(), why);
        return rc;
    }
    dt_net_tune(fd);
    rc = dt_auth_client(fd, secret, DT_WIRE_AUTH_CONTEXT, deadline_ns, why, sizeof why);
    if (rc) {
        snprintf(err, errlen, "%s", why);
        close(fd);
        return rc;
    }
    *out_fd = fd;
    return 0;
}
