/* Aligned allocation with accounting per kind, so that per-rank memory
 * (parameters, gradients, optimizer state, activations, communication
 * buffers) can be reported. */
#ifndef DT_CORE_ALLOC_H
#define DT_CORE_ALLOC_H

#include <stdatomic.h>
#include <stddef.h>

typedef enum {
    DT_MEM_PARAMS = 0,
    DT_MEM_GRADS,
    DT_MEM_OPTIM,
    DT_MEM_ACTS,
    DT_MEM_COMM,
    DT_MEM_OTHER,
    DT_MEM_KIND_COUNT
} dt_mem_kind;

#define DT_ALIGN 64

/* Zeroed, DT_ALIGN-aligned; NULL on failure or size overflow. */
void *dt_alloc(size_t bytes, dt_mem_kind kind);
/* The same from a shared region (shared_mem.h), which ranks on this host
 * read through a mapping when it is sent (comm's shared-memory
 * transport): for the buffers collectives move. Plain dt_alloc where no
 * shared file can be had, and in AddressSanitizer builds (its redzones
 * need the heap). Not inherited by a child of fork(). */
void *dt_alloc_shared(size_t bytes, dt_mem_kind kind);
/* dt_alloc_shared in every build: dt_comm_mem_alloc's. */
void *dt_alloc_region(size_t bytes, dt_mem_kind kind);
void dt_free(void *p);
/* Bytes currently held, and the most ever held, of one kind. */
size_t dt_mem_current(dt_mem_kind kind);
size_t dt_mem_peak(dt_mem_kind kind);
/* Bytes held now and the most ever held, for a kind or anything else
 * counted so (+bytes when taken, -bytes when given back). */
typedef struct {
    _Atomic size_t now, peak;
} dt_mem_counter;
void dt_mem_counter_add(dt_mem_counter *c, long long delta);
/* Counts memory held outside dt_alloc (core/window.h): +bytes when taken,
 * -bytes when given back. */
void dt_mem_account(dt_mem_kind kind, long long delta);
/* Puts the most ever held of a kind back to `bytes` (or to what is held
 * now, if more), after something transient that is no part of what the
 * process holds to do its work was allocated and freed: a measurement's
 * throwaway model (the pipeline's cost partition). Not for a kind that
 * other threads allocate meanwhile: their peak would be lost. */
void dt_mem_restore_peak(dt_mem_kind kind, size_t bytes);
const char *dt_mem_kind_name(dt_mem_kind kind);

#endif
