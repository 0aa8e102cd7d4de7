/*
 * The simulator's event queue: a binary min-heap on time. An event names
 * what happens (a type and an id the engine gives meaning to) and carries
 * a version, so that an event made stale by a later change (a transfer
 * whose rate changed) is skipped when it surfaces instead of being
 * searched for and removed.
 */
#ifndef DT_SIM_HEAP_H
#define DT_SIM_HEAP_H

#include <stddef.h>
#include <stdint.h>

/* 16 bytes, so that four share a cache line: the heap of a 10,000-rank
 * run holds millions and its pops are the simulator's hottest loop. */
typedef struct {
    double t;
    int32_t id;
    uint32_t type_version; /* type in the top 2 bits, version (mod 2^30) below */
} dt_sim_event;

static inline dt_sim_event dt_sim_event_make(double t, int type, int id, uint32_t version)
{
    return (dt_sim_event){t, id, (uint32_t)type << 30 | (version & 0x3fffffffu)};
}
static inline int dt_sim_event_type(const dt_sim_event *e) { return (int)(e->type_version >> 30); }
static inline uint32_t dt_sim_event_version(const dt_sim_event *e)
{
    return e->type_version & 0x3fffffffu;
}

typedef struct {
    dt_sim_event *ev;
    size_t n, cap;
} dt_sim_heap;

/* 0, or -1 out of memory. */
int dt_sim_heap_push(dt_sim_heap *h, dt_sim_event e);
/* The earliest event into *e: 1, or 0 when empty. */
int dt_sim_heap_pop(dt_sim_heap *h, dt_sim_event *e);
static inline const dt_sim_event *dt_sim_heap_top(const dt_sim_heap *h)
{
    return h->n ? &h->ev[0] : NULL;
}
void dt_sim_heap_free(dt_sim_heap *h);

#endif
