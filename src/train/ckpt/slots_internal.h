/* The snapshot slots, inside: what slots.c (the slots on this host) and
 * slots_replica.c (each rank's copy on a partner's host) share. Private to
 * src/train/ckpt. */
#ifndef DT_TRAIN_CKPT_SLOTS_INTERNAL_H
#define DT_TRAIN_CKPT_SLOTS_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "core/file.h"
#include "core/sum.h"
#include "train/ckpt/internal.h"
#include "train/ckpt/shard.h"

/* A replica: this rank's shard goes to `to` after each copy, and the shard
 * of `from` (bytes of it) comes into `map`, this host's copy of it. Off
 * (comm NULL) on one host, and where hosts have unequal writer counts. */
typedef struct {
    dt_comm *comm; /* the group's own copy, driven by the copying thread */
    int to, from;
    int fd[DT_CKPT_SLOTS];
    unsigned char *map[DT_CKPT_SLOTS];
    size_t bytes;
} dt_ckpt_replica;

typedef struct {
    float *dst; /* in the mapping */
    const float *src;
    size_t n;
} copy_job;

typedef struct {
    int fd;
    unsigned char *map;
    size_t size;
    dt_sum header; /* the checksum's state after the file's header */
    copy_job *jobs;     /* [np * nbuf], in file order */
} slot_file;

struct dt_ckpt_slots {
    dt_ckpt_crew crew;
    const dt_gpt *layout;
    dt_ckpt_piece *p, *pp; /* this rank's pieces: `at` of the moments, of params */
    int np, nbuf, stage, moments;
    int64_t *all, *bytes_of, *np_of; /* every rank's pieces, shard size, piece count */
    uint64_t sum, *sum_of; /* this rank's last copy's checksum; every rank's, for a save */
    int max;
    char dir[DT_PATH_MAX];
    slot_file f[DT_CKPT_SLOTS];
    int next, cur; /* the slot the next snapshot writes; the one begun */
    long step;     /* the step begun */
    /* The save to disk that goes with it (--save-every), when one does:
     * the run directory and the checkpoint's temporary directory there. */
    char save_dir[DT_PATH_MAX], tmp[DT_PATH_MAX + 128];
    dt_ckpt_replica rep; /* the partner's copy on another host (slots_replica.c) */
};

/* slots_replica.c. Collective over the group, at open: the partners and
 * this host's files for the copy it keeps. */
int dt_ckpt_replica_open(dt_ckpt_slots *s, char *err, size_t errlen);
/* At a begin: the copy kept for slot k no longer counts. */
int dt_ckpt_replica_begin(dt_ckpt_slots *s, int k, char *err, size_t errlen);
/* After this rank's copy into the slot begun (its checksum in s->sum), on
 * the copying thread: the shard to the partner, the partner's source's
 * shard here, and their marks (with rank 0's manifest.part). */
int dt_ckpt_replica_send(dt_ckpt_slots *s, char *err, size_t errlen);
void dt_ckpt_replica_close(dt_ckpt_slots *s);

#endif
