/* Buffers handed out and given back: the part of the model a layer holds
 * for a while each step (ZeRO-2/3's gradients of a segment, mixed
 * precision's widened parameters), kept in the same pages from one use to
 * the next. A window (window.h) gives such a part its place in the
 * model's address space by mapping pages there on each use; a virtual
 * machine that shadows the page tables pays for every such change, and
 * for every first touch after it, so a part that comes and goes every
 * step lives in a slot instead and the model is told where.
 *
 * A request takes the smallest free slot of at least its size and at most
 * a quarter more (a layer's slot is not spent on a small part, nor the
 * embeddings' on a layer: each size keeps its own), else a new slot of its
 * size; the pool keeps every slot it made, as many of each size as were
 * ever held at once. Slots of a shared pool are communication memory
 * (alloc.h: dt_alloc_shared): a peer reads one through its own mapping,
 * not by cross-memory attach. They are accounted to the pool's kind while
 * they exist (DT_SLOTS_SHARED), or like a private pool's by the caller
 * while it holds them (DT_SLOTS_SHARED_HELD: a holder that counts what it
 * holds anyway). A private pool's slots are plain heap memory. */
#ifndef DT_CORE_SLOT_POOL_H
#define DT_CORE_SLOT_POOL_H

#include <stddef.h>

#include "core/alloc.h"

typedef struct {
    void *at;
    size_t bytes;
} dt_slot;

enum { DT_SLOTS_PRIVATE, DT_SLOTS_SHARED, DT_SLOTS_SHARED_HELD };

typedef struct {
    int shared;       /* DT_SLOTS_*: communication memory, and who accounts it */
    dt_mem_kind kind;
    dt_slot *free;    /* the slots not handed out */
    dt_slot *out;     /* and those handed out */
    int n_free, n_out, cap;
} dt_slot_pool;

void dt_slot_pool_init(dt_slot_pool *p, int shared, dt_mem_kind kind);
/* A slot of at least `bytes` (its contents what it last held), or NULL when
 * memory runs out. */
void *dt_slot_get(dt_slot_pool *p, size_t bytes);
/* The same, its first `bytes` zeroed: for a buffer that is added into. */
void *dt_slot_get_zeroed(dt_slot_pool *p, size_t bytes);
void dt_slot_put(dt_slot_pool *p, void *slot);
/* Frees every slot, handed out or not. */
void dt_slot_pool_free(dt_slot_pool *p);

#endif
