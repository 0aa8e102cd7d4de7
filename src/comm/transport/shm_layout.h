/*
 * The shared-memory transport's layout, shared by its message path
 * (shm.c) and its setup (shm_setup.c).
 *
 * Each rank of a communicator owns one segment, its inbox: a header with
 * a doorbell, then, for every local peer, a byte ring that only that peer
 * writes into. Ring positions are monotonic byte counters; the sender owns
 * `head`, the receiver `tail`, each on its own cache line. Each inbox says
 * the size of its rings, which its owner chose by the room in /dev/shm
 * when it made it, so rings of different ranks may differ in size.
 */
#ifndef DT_COMM_TRANSPORT_SHM_LAYOUT_H
#define DT_COMM_TRANSPORT_SHM_LAYOUT_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "comm/comm_internal.h"

#define SHM_MAGIC 0x4d485354445452ull /* "RTDTSHM" */
#define LINE 64
#define REDUCE_PIECE (256u << 10) /* CMA reductions go through a cache-sized buffer */
/* A sender has at most a step's ops in flight on a link, so at most that
 * many tickets await their acknowledgement, each in a slot of its own. */
#define SHM_CMA_SLOTS DT_P2P_MAX_OPS

typedef struct {
    _Alignas(LINE) _Atomic uint64_t head; /* bytes written by the sender */
    _Alignas(LINE) _Atomic uint64_t tail; /* bytes consumed by the receiver */
    /* CMA tickets the receiver finished, ticket t in slot t % SHM_CMA_SLOTS:
     * it may pull them out of order (a message queued before its receive
     * came is pulled when that receive does), and the sender waits for
     * each of its own. */
    _Alignas(LINE) _Atomic uint64_t cma_done[SHM_CMA_SLOTS];
    _Alignas(LINE) unsigned char data[];   /* ring_bytes follow */
} shm_ring;

typedef struct {
    _Atomic uint64_t magic; /* written last: the segment is ready */
    uint64_t segment_bytes;
    uint64_t ring_bytes;
    int32_t pid;
    int32_t nlocal;
    uint64_t probe_addr; /* address of a known value, for the CMA check */
    uint64_t pull_min;   /* local rank 0's measured pull_min, which every rank takes */
    _Alignas(LINE) _Atomic uint32_t doorbell;
    _Alignas(LINE) _Atomic uint32_t sleeping;
    _Alignas(LINE) unsigned char cma_ok[256]; /* [sender local index]: we can pull from it */
} shm_inbox;

typedef struct {
    dt_link base;
    struct dt_shm_comm *sc;
    int peer_local;          /* peer's index among local members */
    shm_ring *out;           /* our ring inside the peer's inbox */
    shm_ring *in;            /* the peer's ring inside our inbox */
    shm_inbox *peer_inbox;
    pid_t peer_pid;
    int use_cma;             /* we may post CMA sends to the peer */
    int can_pull;            /* the peer may pull from us (mapped pulls need no threshold) */
    struct shm_peer_maps *peer_mem; /* receiver side: the peer's regions we mapped */
    uint64_t out_bytes;       /* size of the out ring (the peer's inbox's rings) */
    uint64_t in_bytes;        /* size of the in ring (our inbox's rings) */
    uint64_t head, tail_seen; /* sender side: our head, last tail we read */
    uint64_t head_pub;        /* the head the receiver was last shown */
    uint64_t tail;            /* receiver side: our tail */
    uint64_t tail_pub;        /* the tail the sender was last shown */
    uint64_t cma_sent;        /* tickets handed out */
} shm_link;

struct dt_shm_comm {
    char name[128];
    shm_inbox *me;
    /* `me` once it is mapped, for the doorbell's wake: the store's monitor thread
     * may wake a communicator that is still being set up or torn down, so
     * this and c->shm change only under job->lock, which the waker holds. */
    shm_inbox *wake_me;
    size_t seg_bytes;    /* of our inbox */
    uint64_t ring_bytes; /* of our inbox's rings; each peer's inbox says its own */
    size_t cma_min;      /* messages from this size up are pulled by CMA (SIZE_MAX: never) */
    /* Auto: messages of collectives that only move data are pulled from
     * this size up, as local rank 0 measured it (shm_probe.c; SIZE_MAX:
     * never, or not auto). */
    size_t pull_min;
    int no_pulls; /* DTRAIN_SHM_CMA=0: every message streams through the ring */
    int no_maps;  /* DTRAIN_SHM_MAP=0: peers' communication memory pulled by CMA */
    int my_local;
    int nlocal;
    void **maps;   /* [nlocal] mapped inboxes, ours included */
    size_t *map_bytes; /* [nlocal] their sizes */
    void *reduce_buf;
};

static inline size_t shm_ring_stride(uint64_t ring_bytes) { return sizeof(shm_ring) + ring_bytes; }

static inline size_t shm_header_size(void) { return (sizeof(shm_inbox) + LINE - 1) / LINE * LINE; }

/* The ring that sender_local writes into, inside an inbox. */
static inline shm_ring *shm_inbox_ring(void *inbox, uint64_t ring_bytes, int sender_local)
{
    return (shm_ring *)((char *)inbox + shm_header_size() +
                        (size_t)sender_local * shm_ring_stride(ring_bytes));
}

static inline size_t shm_segment_size(uint64_t ring_bytes, int nlocal)
{
    return shm_header_size() + (size_t)nlocal * shm_ring_stride(ring_bytes);
}

/* What shm_probe.c measured: the ring's and the pull's rates (bytes/s),
 * the pull's fixed cost (s), and the size from which pulling is cheaper
 * (SIZE_MAX: never, or the kernel refuses). */
typedef struct {
    double stream_rate, pull_rate, pull_fixed;
    size_t pull_min;
} dt_shm_probe_result;

/* The measured crossover (once per process; out, when not NULL, gets the
 * figures behind it). */
size_t dt_shm_probe_pull_min(dt_shm_probe_result *out);

/* The link's operations (shm.c), for the links that setup makes. */
extern const dt_link_ops dt_shm_link_ops;

#endif
