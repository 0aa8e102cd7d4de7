/* Each rank's snapshot kept on a second host too, so that the loss of a
 * whole host (its ranks and its shared memory with them) loses no
 * snapshot: after its copy into the slot, a rank sends the slot's shard to
 * its partner, the rank with its place on the next host, which keeps it as
 * that host's copy of the shard (the same file name, with its own mark), so
 * that recovery (slots_recover.c) finds it like any other. Rank 0 sends its
 * manifest.part along. The partners form rings over the hosts, one per
 * place on a host, so every rank sends one shard and receives one: one
 * all-to-all-v on a communicator of the copying thread's own. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/atomic_file.h"
#include "core/str.h"
#include "train/ckpt/slots_internal.h"

/* The group's member with place `place` among those on `host` (a host as
 * dt_comm_host_of names it: in a split group, a parent's rank), or -1. */
static int member_at(dt_comm *g, int n, int host, int place)
{
    for (int r = 0; r < n; r++)
        if (dt_comm_host_of(g, r) == host && place-- == 0) return r;
    return -1;
}

/* The partners of this rank: 0, or 1 when there are none (one host, or
 * hosts with unequal numbers of writers). */
static int find_partners(dt_ckpt_slots *s, int *to, int *from)
{
    dt_comm *g = s->crew.group;
    const int n = s->crew.size, me = s->crew.rank;
    if (!g) return 1;
    int *lead = malloc((size_t)n * sizeof *lead), nh = 0, place = 0, mine = -1, equal = 1;
    if (!lead) return 1;
    for (int r = 0; r < n; r++) {
        const int h = dt_comm_host_of(g, r);
        if (member_at(g, r, h, 0) < 0) lead[nh++] = h; /* the first member on it */
        if (r < me && h == dt_comm_host_of(g, me)) place++;
    }
    for (int h = 0; h < nh; h++) {
        if (lead[h] == dt_comm_host_of(g, me)) mine = h;
        equal = equal && member_at(g, n, lead[h], dt_comm_local_size(g) - 1) >= 0 &&
                member_at(g, n, lead[h], dt_comm_local_size(g)) < 0;
    }
    int rc = 1;
    if (nh > 1 && equal && mine >= 0) {
        *to = member_at(g, n, lead[(mine + 1) % nh], place);
        *from = member_at(g, n, lead[(mine + nh - 1) % nh], place);
        rc = *to < 0 || *from < 0;
    }
    free(lead);
    return rc;
}

/* Slot k's file for the copy of `from`'s shard, sized and mapped (kept
 * from an attempt before when its size is right: its mark stays good). */
static int open_copy(dt_ckpt_slots *s, int k, char *err, size_t errlen)
{
    dt_ckpt_replica *r = &s->rep;
    char name[64], path[DT_PATH_MAX + 128], mark[DT_PATH_MAX + 64];
    struct stat st;
    dt_ckpt_shard_name(name, sizeof name, r->from, s->crew.size);
    dt_ckpt_slot_path(path, sizeof path, s->dir, k, name);
    dt_ckpt_slot_mark_path(mark, sizeof mark, s->dir, k, r->from);
    r->fd[k] = open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (r->fd[k] < 0 || fstat(r->fd[k], &st) != 0)
        return dt_strf(err, errlen, "%s: %s", path, strerror(errno)), -1;
    if ((size_t)st.st_size != r->bytes) {
        if (unlink(mark) != 0 && errno != ENOENT)
            return dt_strf(err, errlen, "%s: %s", mark, strerror(errno)), -1;
        if (ftruncate(r->fd[k], (off_t)r->bytes) != 0)
            return dt_strf(err, errlen, "%s: %s", path, strerror(errno)), -1;
    }
    void *m = mmap(NULL, r->bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, r->fd[k],
                   0);
    if (m == MAP_FAILED) return dt_strf(err, errlen, "%s: mmap: %s", path, strerror(errno)), -1;
    r->map[k] = m;
    return 0;
}

int dt_ckpt_replica_open(dt_ckpt_slots *s, char *err, size_t errlen)
{
    dt_ckpt_replica *r = &s->rep;
    r->fd[0] = r->fd[1] = -1;
    if (!s->crew.group || dt_comm_local_size(s->crew.group) == s->crew.size) return 0;
    /* Every member takes part in the split, partners or not. */
    int off = find_partners(s, &r->to, &r->from);
    if (dt_comm_split(s->crew.group, off ? DT_UNDEFINED : 0, s->crew.rank, &r->comm))
        return dt_strf(err, errlen, "snapshot replicas: %s", dt_comm_error(s->crew.group)), -1;
    if (off) return 0;
    r->bytes = (size_t)s->bytes_of[r->from];
    for (int k = 0; k < DT_CKPT_SLOTS; k++)
        if (open_copy(s, k, err, errlen)) return -1;
    return 0;
}

int dt_ckpt_replica_begin(dt_ckpt_slots *s, int k, char *err, size_t errlen)
{
    char mark[DT_PATH_MAX + 64];
    if (!s->rep.comm) return 0;
    dt_ckpt_slot_mark_path(mark, sizeof mark, s->dir, k, s->rep.from);
    if (unlink(mark) != 0 && errno != ENOENT)
        return dt_strf(err, errlen, "%s: %s", mark, strerror(errno)), -1;
    return 0;
}

/* Rank 0's manifest.part of the slot begun to its partner; its length went
 * ahead with the marks. */
static int move_part(dt_ckpt_slots *s, int64_t got, char *err, size_t errlen)
{
    dt_ckpt_replica *r = &s->rep;
    char path[DT_PATH_MAX + 64];
    dt_ckpt_slot_path(path, sizeof path, s->dir, s->cur, DT_CKPT_SLOT_PART);
    if (s->crew.rank == 0) {
        size_t len;
        char *text = dt_read_file(path, DT_CKPT_MANIFEST_BYTES, &len, err, errlen);
        int rc = text ? dt_send(r->comm, text, len, DT_U8, r->to) : -1;
        free(text);
        return rc ? -1 : 0;
    }
    if (r->from != 0) return 0;
    char *text = malloc((size_t)got + 1);
    if (!text) return dt_strf(err, errlen, "out of memory"), -1;
    int rc = dt_recv(r->comm, text, (size_t)got, DT_U8, 0);
    if (rc == 0) rc = dt_afile_write_file(path, text, (size_t)got, err, errlen);
    free(text);
    return rc ? -1 : 0;
}

int dt_ckpt_replica_send(dt_ckpt_slots *s, char *err, size_t errlen)
{
    dt_ckpt_replica *r = &s->rep;
    if (!r->comm) return 0;
    err[0] = 0;
    const int n = dt_comm_size(r->comm), k = s->cur;
    size_t *c = calloc((size_t)n * 4, sizeof *c);
    if (!c) return dt_strf(err, errlen, "out of memory"), -1;
    size_t *sc = c, *so = c + n, *rc = c + 2 * n, *ro = c + 3 * n;
    sc[r->to] = s->f[k].size;
    rc[r->from] = r->bytes;
    int bad = dt_alltoallv(r->comm, s->f[k].map, sc, so, r->map[k], rc, ro, DT_U8);
    /* The marks (step, bytes, checksum) and rank 0's manifest.part length. */
    int64_t mine[4] = {s->step, (int64_t)s->f[k].size, (int64_t)s->sum, 0}, theirs[4] = {0};
    char path[DT_PATH_MAX + 64];
    struct stat st;
    dt_ckpt_slot_path(path, sizeof path, s->dir, k, DT_CKPT_SLOT_PART);
    if (s->crew.rank == 0 && stat(path, &st) == 0) mine[3] = (int64_t)st.st_size;
    sc[r->to] = rc[r->from] = 4;
    if (!bad) bad = dt_alltoallv(r->comm, mine, sc, so, theirs, rc, ro, DT_I64);
    free(c);
    if (bad) return dt_strf(err, errlen, "snapshot replicas: %s", dt_comm_error(r->comm)), -1;
    if ((s->crew.rank == 0 || r->from == 0) && move_part(s, theirs[3], err, errlen)) {
        if (!err[0]) dt_strf(err, errlen, "snapshot replicas: %s", dt_comm_error(r->comm));
        return -1;
    }
    if (theirs[0] != s->step || (size_t)theirs[1] != r->bytes)
        return dt_strf(err, errlen, "snapshot replicas: rank %d sent step %" PRId64 ", %" PRId64
                       " bytes; expected step %ld, %zu bytes (a bug)", r->from, theirs[0],
                       theirs[1], s->step, r->bytes), -1;
    char line[96];
    dt_ckpt_slot_mark_path(path, sizeof path, s->dir, k, r->from);
    dt_strf(line, sizeof line, "%ld %zu %016" PRIx64 "\n", s->step, r->bytes,
            (uint64_t)theirs[2]);
    return dt_afile_write_file(path, line, strlen(line), err, errlen);
}

void dt_ckpt_replica_close(dt_ckpt_slots *s)
{
    dt_ckpt_replica *r = &s->rep;
    for (int k = 0; k < DT_CKPT_SLOTS; k++) {
        if (r->map[k]) munmap(r->map[k], r->bytes);
        if (r->fd[k] >= 0) close(r->fd[k]);
    }
    if (r->comm) dt_comm_destroy(r->comm);
}
