/*
 * The store's keys: a hash table of values, counters kept as decimal
 * text, and the GETs that wait for a key to appear.
 */
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/bootstrap/store_server.h"
#include "core/hash.h"
#include "core/parse.h"
#include "dtrain/comm.h"

static entry *table_find(dt_store_server *s, const unsigned char *key, uint32_t len)
{
    uint64_t h = dt_fnv1a64(key, len);
    for (entry *e = s->buckets[h % s->nbuckets]; e; e = e->next)
        if (e->hash == h && e->key_len == len && memcmp(e->key, key, len) == 0) return e;
    return NULL;
}

/* Double the buckets when the chains grow long; on failure keep going with
 * long chains. */
static void table_grow(dt_store_server *s)
{
    size_t n = s->nbuckets * 2;
    entry **b = calloc(n, sizeof *b);
    if (!b) return;
    for (size_t i = 0; i < s->nbuckets; i++) {
        entry *e = s->buckets[i];
        while (e) {
            entry *next = e->next;
            e->next = b[e->hash % n];
            b[e->hash % n] = e;
            e = next;
        }
    }
    free(s->buckets);
    s->buckets = b;
    s->nbuckets = n;
}

static unsigned char *copy_bytes(const void *src, size_t len)
{
    unsigned char *p = malloc(len + 1);
    if (!p) return NULL;
    if (len) memcpy(p, src, len);
    p[len] = 0;
    return p;
}

/* Set key to val; NULL when out of memory. */
static entry *table_put(dt_store_server *s, const unsigned char *key, uint32_t key_len,
                        const void *val, uint32_t val_len)
{
    unsigned char *v = copy_bytes(val, val_len);
    if (!v) return NULL;
    entry *e = table_find(s, key, key_len);
    if (e) {
        free(e->val);
        e->val = v;
        e->val_len = val_len;
        return e;
    }
    e = calloc(1, sizeof *e);
    if (!e || !(e->key = copy_bytes(key, key_len))) {
        free(e);
        free(v);
        return NULL;
    }
    e->key_len = key_len;
    e->val = v;
    e->val_len = val_len;
    e->hash = dt_fnv1a64(key, key_len);
    e->next = s->buckets[e->hash % s->nbuckets];
    s->buckets[e->hash % s->nbuckets] = e;
    if (++s->nentries > s->nbuckets) table_grow(s);
    return e;
}

static int waiter_add(dt_store_server *s, conn *c, uint32_t id, const unsigned char *key,
                      uint32_t key_len)
{
    if (s->nwaiters == s->waiters_cap) {
        int cap = s->waiters_cap ? s->waiters_cap * 2 : 64;
        waiter *p = realloc(s->waiters, (size_t)cap * sizeof *p);
        if (!p) return -1;
        s->waiters = p;
        s->waiters_cap = cap;
    }
    unsigned char *k = copy_bytes(key, key_len);
    if (!k) return -1;
    s->waiters[s->nwaiters++] = (waiter){.c = c, .id = id, .key_len = key_len, .key = k};
    c->nwaiters++;
    return 0;
}

/* Remove the waiters for which match() holds, keeping the others in order. */
static void waiters_remove(dt_store_server *s, int (*match)(const waiter *, const void *),
                           const void *arg, const entry *answer)
{
    int j = 0;
    for (int i = 0; i < s->nwaiters; i++) {
        waiter *w = &s->waiters[i];
        if (!match(w, arg)) {
            s->waiters[j++] = *w;
            continue;
        }
        if (answer) dt_srv_reply(w->c, w->id, 0, answer->val, answer->val_len);
        w->c->nwaiters--;
        free(w->key);
    }
    s->nwaiters = j;
}

static int waiter_wants(const waiter *w, const void *arg)
{
    const entry *e = arg;
    return w->key_len == e->key_len && memcmp(w->key, e->key, e->key_len) == 0;
}

static int waiter_of_conn(const waiter *w, const void *arg) { return w->c == arg; }

typedef struct {
    const conn *c;
    uint32_t id;
} waiter_ref;

static int waiter_is(const waiter *w, const void *arg)
{
    const waiter_ref *r = arg;
    return w->c == r->c && w->id == r->id;
}

void dt_srv_forget_waiters(dt_store_server *s, conn *c) { waiters_remove(s, waiter_of_conn, c, NULL); }

int dt_srv_keys_init(dt_store_server *s)
{
    s->nbuckets = FIRST_BUCKETS;
    s->buckets = calloc(s->nbuckets, sizeof *s->buckets);
    return s->buckets ? 0 : -1;
}

void dt_srv_keys_free(dt_store_server *s)
{
    for (int i = 0; i < s->nwaiters; i++) free(s->waiters[i].key);
    for (size_t i = 0; s->buckets && i < s->nbuckets; i++) {
        entry *e = s->buckets[i];
        while (e) {
            entry *next = e->next;
            free(e->key);
            free(e->val);
            free(e);
            e = next;
        }
    }
    free(s->buckets);
    free(s->waiters);
}

/* ---- requests ---- */

void dt_srv_on_set(dt_store_server *s, conn *c, const dt_wire_hdr *h, const unsigned char *body)
{
    entry *e = table_put(s, body, h->key_len, body + h->key_len, h->val_len);
    if (!e) {
        dt_srv_reply_error(c, h->id, DT_ERR_NOMEM, "the store is out of memory");
        return;
    }
    dt_srv_reply(c, h->id, 0, NULL, 0);
    waiters_remove(s, waiter_wants, e, e);
}

void dt_srv_on_get(dt_store_server *s, conn *c, const dt_wire_hdr *h, const unsigned char *body)
{
    entry *e = table_find(s, body, h->key_len);
    if (e) {
        dt_srv_reply(c, h->id, 0, e->val, e->val_len);
        return;
    }
    if (c->nwaiters >= MAX_WAITERS_PER_CONN) {
        dt_srv_drop(c, 1, "more than %d GETs waiting at once", MAX_WAITERS_PER_CONN);
        return;
    }
    if (waiter_add(s, c, h->id, body, h->key_len))
        dt_srv_reply_error(c, h->id, DT_ERR_NOMEM, "the store is out of memory");
}

/* A counter's value: absent is 0; anything but a whole decimal int64 is an
 * error. */
static int parse_counter(const entry *e, int64_t *out)
{
    *out = 0;
    if (!e) return 0;
    long v;
    /* The value is NUL-terminated, but may hold a NUL of its own. */
    if (strlen((const char *)e->val) != e->val_len ||
        dt_parse_long((const char *)e->val, LONG_MIN, LONG_MAX, &v))
        return -1;
    *out = v;
    return 0;
}

void dt_srv_on_add(dt_store_server *s, conn *c, const dt_wire_hdr *h, const unsigned char *body)
{
    int64_t delta = dt_wire_get_i64(body + h->key_len);
    int64_t cur, sum;
    if (parse_counter(table_find(s, body, h->key_len), &cur)) {
        dt_srv_reply_error(c, h->id, DT_ERR_INVALID,
                           "ADD on key '%.*s', which does not hold an integer", (int)h->key_len,
                           (const char *)body);
        return;
    }
    if (__builtin_add_overflow(cur, delta, &sum)) {
        dt_srv_reply_error(c, h->id, DT_ERR_INVALID, "ADD on key '%.*s' overflows int64",
                           (int)h->key_len, (const char *)body);
        return;
    }
    char text[32];
    int len = snprintf(text, sizeof text, "%" PRId64, sum);
    entry *e = table_put(s, body, h->key_len, text, (uint32_t)len);
    if (!e) {
        dt_srv_reply_error(c, h->id, DT_ERR_NOMEM, "the store is out of memory");
        return;
    }
    unsigned char result[8];
    dt_wire_put_i64(result, sum);
    dt_srv_reply(c, h->id, 0, result, sizeof result);
    waiters_remove(s, waiter_wants, e, e);
}

void dt_srv_on_cancel(dt_store_server *s, conn *c, const dt_wire_hdr *h)
{
    waiter_ref ref = {.c = c, .id = h->id};
    waiters_remove(s, waiter_is, &ref, NULL);
}

