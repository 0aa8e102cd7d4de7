#include "core/slot_pool.h"

#include <stdlib.h>
#include <string.h>

void dt_slot_pool_init(dt_slot_pool *p, int shared, dt_mem_kind kind)
{
    *p = (dt_slot_pool){.shared = shared, .kind = kind};
}

/* Room in both lists for one more slot. */
static int grow(dt_slot_pool *p)
{
    if (p->n_free + p->n_out < p->cap) return 0;
    int cap = p->cap ? 2 * p->cap : 8;
    dt_slot *f = realloc(p->free, (size_t)cap * sizeof *f);
    if (f) p->free = f;
    dt_slot *o = f ? realloc(p->out, (size_t)cap * sizeof *o) : NULL;
    if (o) p->out = o;
    if (!o) return -1;
    p->cap = cap;
    return 0;
}

static void *make(const dt_slot_pool *p, size_t bytes)
{
    if (p->shared == DT_SLOTS_SHARED_HELD) {
        void *at = dt_alloc_shared(bytes, p->kind);
        if (at) dt_mem_account(p->kind, -(long long)bytes); /* the holder counts it */
        return at;
    }
    if (p->shared) return dt_alloc_shared(bytes, p->kind);
    return aligned_alloc(DT_ALIGN, (bytes + DT_ALIGN - 1) / DT_ALIGN * DT_ALIGN);
}

void *dt_slot_get(dt_slot_pool *p, size_t bytes)
{
    int best = -1;
    for (int i = 0; i < p->n_free; i++) {
        const size_t b = p->free[i].bytes;
        if (b < bytes || b > bytes + bytes / 4) continue;
        if (best < 0 || b < p->free[best].bytes) best = i;
    }
    dt_slot s;
    if (best >= 0) {
        s = p->free[best];
        p->free[best] = p->free[--p->n_free];
    } else {
        if (grow(p) || !(s.at = make(p, bytes))) return NULL;
        s.bytes = bytes;
    }
    p->out[p->n_out++] = s;
    return s.at;
}

void *dt_slot_get_zeroed(dt_slot_pool *p, size_t bytes)
{
    void *s = dt_slot_get(p, bytes);
    if (s) memset(s, 0, bytes);
    return s;
}

void dt_slot_put(dt_slot_pool *p, void *slot)
{
    for (int i = 0; slot && i < p->n_out; i++)
        if (p->out[i].at == slot) {
            p->free[p->n_free++] = p->out[i];
            p->out[i] = p->out[--p->n_out];
            return;
        }
}

void dt_slot_pool_free(dt_slot_pool *p)
{
    for (int i = 0; i < p->n_free + p->n_out; i++) {
        const dt_slot *s = i < p->n_free ? &p->free[i] : &p->out[i - p->n_free];
        void *at = s->at;
        if (p->shared == DT_SLOTS_SHARED_HELD) dt_mem_account(p->kind, (long long)s->bytes);
        if (p->shared) dt_free(at);
        else free(at);
    }
    free(p->free);
    free(p->out);
    *p = (dt_slot_pool){0};
}
