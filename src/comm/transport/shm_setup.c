/*
 * Setting up the shared-memory transport (shm_layout.h): each rank makes
 * its inbox segment, the ranks of a host map each other's, check whether
 * they may read each other's memory (cross-memory attach), and link up.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/uio.h>
#include <unistd.h>

#include "comm/bootstrap/identity.h"
#include "comm/topo.h"
#include "comm/transport/shm.h"
#include "comm/transport/shm_layout.h"
#include "comm/transport/transport.h"
#include "core/env.h"
#include "core/log.h"

static const uint64_t probe_value = 0x6474726169e5c0deull;

/* ---- names ---------------------------------------------------------------- */

/* Every segment of a job is named dtrain-<job id>-...; the job id is
 * letters and digits only (identity.h), so no job's prefix is another's. */
static void job_prefix(const char *job_id, char *buf, size_t len)
{
    snprintf(buf, len, "dtrain-%s-", job_id);
}

/* The inbox of member rank of c. */
static void segment_name(const dt_comm *c, int rank, char *buf, size_t len)
{
    char prefix[DT_JOB_ID_MAX + 16];
    job_prefix(c->job->job_id, prefix, sizeof prefix);
    snprintf(buf, len, "/%s%08x-%d", prefix, c->tag, c->world_rank[rank]);
}

int dt_shm_remove_job(const char *job_id, char *err, size_t errlen)
{
    char prefix[DT_JOB_ID_MAX + 16];
    job_prefix(job_id, prefix, sizeof prefix);
    DIR *d = opendir("/dev/shm");
    if (!d) return 0;
    int rc = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (strncmp(e->d_name, prefix, strlen(prefix)) != 0) continue;
        if (unlinkat(dirfd(d), e->d_name, 0) < 0 && errno != ENOENT && rc == 0) {
            snprintf(err, errlen, "cannot remove /dev/shm/%s: %s", e->d_name, strerror(errno));
            rc = -1;
        }
    }
    closedir(d);
    return rc;
}

static void publish(dt_comm *c, struct dt_shm_comm *sc, shm_inbox *wake_me)
{
    pthread_mutex_lock(&c->job->lock);
    c->shm = sc;
    if (sc) sc->wake_me = wake_me;
    pthread_mutex_unlock(&c->job->lock);
}

/* ---- setup -------------------------------------------------------------- */

/* Bytes free in /dev/shm, where shm_open makes segments. */
static uint64_t shm_free_bytes(void)
{
    struct statvfs v;
    if (statvfs("/dev/shm", &v) != 0) return UINT64_MAX;
    return (uint64_t)v.f_bavail * (uint64_t)v.f_frsize;
}

/* The segment's pages are reserved now (tmpfs allocates them otherwise at
 * first touch, and a full /dev/shm then kills the process with SIGBUS in
 * the middle of a collective). */
static int reserve(dt_comm *c, struct dt_shm_comm *sc, int fd)
{
    int e = posix_fallocate(fd, 0, (off_t)sc->seg_bytes);
    if (e == 0) return 0;
    if (e == ENOSPC)
        return dt_comm_fail(c, DT_ERR_SYSTEM, -1,
                            "no room in /dev/shm for the shared-memory rings: segment %s needs "
                            "%zu bytes and /dev/shm has %llu bytes free (give /dev/shm more "
                            "room, for example docker run --shm-size=1g, or set "
                            "DTRAIN_TRANSPORT=tcp)",
                            sc->name, sc->seg_bytes, (unsigned long long)shm_free_bytes());
    return dt_comm_fail(c, DT_ERR_SYSTEM, -1, "reserving %zu bytes for %s in /dev/shm: %s",
                        sc->seg_bytes, sc->name, strerror(e));
}

static int create_inbox(dt_comm *c, struct dt_shm_comm *sc)
{
    segment_name(c, c->rank, sc->name, sizeof sc->name);
    int fd = shm_open(sc->name, O_CREAT | O_EXCL | O_RDWR, 0600);
    if (fd < 0 && errno == EEXIST) { /* left by a crashed run with the same job id */
        shm_unlink(sc->name);
        fd = shm_open(sc->name, O_CREAT | O_EXCL | O_RDWR, 0600);
    }
    if (fd < 0)
        return dt_comm_fail(c, DT_ERR_SYSTEM, -1, "shm_open(%s): %s", sc->name, strerror(errno));
    int rc = reserve(c, sc, fd);
    if (rc < 0) {
        close(fd);
        shm_unlink(sc->name);
        return rc;
    }
    void *p = mmap(NULL, sc->seg_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (p == MAP_FAILED) {
        shm_unlink(sc->name);
        return dt_comm_fail(c, DT_ERR_SYSTEM, -1, "mmap(%s): %s", sc->name, strerror(errno));
    }
    sc->me = p;
    sc->me->segment_bytes = sc->seg_bytes;
    sc->me->ring_bytes = sc->ring_bytes;
    sc->me->pid = (int32_t)getpid();
    sc->me->nlocal = sc->nlocal;
    sc->me->probe_addr = (uint64_t)(uintptr_t)&probe_value;
    sc->me->pull_min = sc->pull_min;
    atomic_store_explicit(&sc->me->magic, SHM_MAGIC, memory_order_release);
    return 0;
}

/* Whether a peer's inbox of size bytes has the layout we expect. */
static int layout_ok(const shm_inbox *in, size_t bytes, int nlocal)
{
    uint64_t rb = in->ring_bytes;
    return bytes >= sizeof *in && in->magic == SHM_MAGIC && in->nlocal == nlocal &&
           rb >= LINE && (rb & (rb - 1)) == 0 && in->segment_bytes == bytes &&
           shm_segment_size(rb, nlocal) == bytes;
}

static int open_inbox(dt_comm *c, struct dt_shm_comm *sc, int peer, int peer_local)
{
    char name[128];
    segment_name(c, peer, name, sizeof name);
    int fd = shm_open(name, O_RDWR, 0);
    if (fd < 0)
        return dt_comm_fail(c, DT_ERR_SYSTEM, peer, "opening rank %d's segment %s: %s", peer,
                            name, strerror(errno));
    struct stat st;
    void *p = MAP_FAILED;
    if (fstat(fd, &st) == 0 && st.st_size > 0)
        p = mmap(NULL, (size_t)st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (p == MAP_FAILED)
        return dt_comm_fail(c, DT_ERR_SYSTEM, peer, "mapping %s: %s", name, strerror(errno));
    if (!layout_ok(p, (size_t)st.st_size, sc->nlocal)) {
        munmap(p, (size_t)st.st_size);
        return dt_comm_fail(c, DT_ERR_PROTOCOL, peer,
                            "rank %d's segment %s has a different layout (another dtrain "
                            "version?)",
                            peer, name);
    }
    sc->maps[peer_local] = p;
    sc->map_bytes[peer_local] = (size_t)st.st_size;
    return 0;
}

/* Can we read the peer's memory? The peer's verdict about us is what
 * decides whether we may post CMA sends to it. */
static int cma_works(pid_t pid, uint64_t addr)
{
    uint64_t v = 0;
    struct iovec local = {&v, sizeof v}, remote = {(void *)(uintptr_t)addr, sizeof v};
    return process_vm_readv(pid, &local, 1, &remote, 1, 0) == (ssize_t)sizeof v &&
           v == probe_value;
}

/* Ring size: streaming through a ring that stays in cache beat pulling
 * by cross-memory attach on the reference machine (an AMD EPYC, where the
 * kernel's copy and page pinning cost more than the second copy saves),
 * so rings are as large as a budget of 16 MiB per rank and communicator
 * allows, at most 2 MiB each, and as /dev/shm has room for: each
 * communicator takes at most half of what is free there, shared among its
 * ranks on the host (a container's /dev/shm is 64 MiB by default), down to
 * 4 KiB rings. Cross-memory attach is kept (auto) for when that leaves
 * rings small, and for the collectives that only move data from the size
 * shm_probe.c measures pulling to be cheaper from, on CPUs where it is;
 * DTRAIN_SHM_CMA=1 or 0 forces it on or off, and DTRAIN_SHM_RING_KB
 * forces the size.
 *
 * With more ranks on the host than cores the ranks take turns on the
 * cores, so every copy costs a core that another rank waits for, and
 * what stays in cache decides: rings are then at most CROWDED_RING, and
 * messages stream through them (but where pulls were measured cheaper:
 * on an Intel Xeon, 4 ranks on 2 cores, a 256 KiB-4 MiB all-to-all-v ran
 * 1.3-1.5x faster pulled from 32 KiB up). Four ranks' twelve rings of
 * 2 MiB swept 24 MiB through a 32 MiB last-level cache; pulling by cross-memory
 * attach instead pays the kernel's copy and page pinning, which cost
 * more than the ring's second copy through a ring that stays in cache
 * (4 ranks on 2 cores, an all-to-all-v of 256 KiB in 50 us instead of 78
 * with 2 MiB rings and pulls from 256 KiB, 16 MiB in 6.2 ms instead of
 * 8.2). */
#define RING_BUDGET (16u << 20)
#define RING_MAX (2u << 20)
#define RING_MIN (64u << 10)
#define RING_FLOOR (4u << 10)       /* the smallest rings, when /dev/shm is short */
#define CMA_AUTO_BELOW (512u << 10) /* auto: CMA when rings are smaller than this */
#define CROWDED_RING (256u << 10)

static uint64_t default_ring_bytes(int npeers)
{
    uint64_t r = RING_MAX;
    while (r > RING_MIN && r * (uint64_t)npeers > RING_BUDGET) r /= 2;
    return r;
}

/* The largest rings up to ring whose segment fits this rank's share of
 * /dev/shm. */
static uint64_t fit_rings(dt_comm *c, uint64_t ring, int nlocal)
{
    uint64_t free_bytes = shm_free_bytes(), share = free_bytes / 2 / (uint64_t)nlocal;
    uint64_t want = ring;
    while (ring > RING_FLOOR && shm_segment_size(ring, nlocal) > share) ring /= 2;
    if (ring < want && c->local_rank == 0)
        DT_WARN("/dev/shm has %llu KiB free: shared-memory rings of %llu KiB instead of %llu "
                "(a larger /dev/shm is faster, for example docker run --shm-size=1g)",
                (unsigned long long)(free_bytes >> 10), (unsigned long long)(ring >> 10),
                (unsigned long long)(want >> 10));
    return ring;
}

/* Auto: pull from the size this machine was measured to favour pulling
 * (shm_probe.c). Local rank 0 measures, alone (the others wait in the
 * next barrier), and every rank takes its figure from rank 0's inbox, so
 * that a host's ranks agree. */
static void measure_pull_min(dt_comm *c, struct dt_shm_comm *sc)
{
    dt_shm_probe_result m;
    sc->pull_min = dt_shm_probe_pull_min(&m);
    if (c->rank == 0)
        DT_DEBUG("shm: ring %.2f GB/s, pull %.2f GB/s + %.2f us: pulling from %zu B%s",
                 m.stream_rate / 1e9, m.pull_rate / 1e9, m.pull_fixed * 1e6,
                 sc->pull_min == SIZE_MAX ? (size_t)0 : sc->pull_min,
                 sc->pull_min == SIZE_MAX ? " (never)" : "");
}

static int read_settings(dt_comm *c, struct dt_shm_comm *sc, int nlocal)
{
    char err[256];
    long ring_kb = -1, cma_min = -1, cma = -1, map = -1;
    if (dt_env_long("DTRAIN_SHM_RING_KB", 4, 1 << 20, &ring_kb, err, sizeof err) < 0 ||
        dt_env_long("DTRAIN_SHM_CMA_MIN", 0, 1L << 40, &cma_min, err, sizeof err) < 0 ||
        dt_env_long("DTRAIN_SHM_CMA", 0, 1, &cma, err, sizeof err) < 0 ||
        dt_env_long("DTRAIN_SHM_MAP", 0, 1, &map, err, sizeof err) < 0)
        return dt_comm_fail(c, DT_ERR_INVALID, -1, "%s", err);
    if (ring_kb > 0 && (ring_kb & (ring_kb - 1)))
        return dt_comm_fail(c, DT_ERR_INVALID, -1,
                            "DTRAIN_SHM_RING_KB=%ld must be a power of two", ring_kb);
    uint64_t ring = ring_kb > 0 ? (uint64_t)ring_kb << 10
                                : fit_rings(c, default_ring_bytes(nlocal - 1), nlocal);
    int measure = cma < 0 && cma_min < 0;
    sc->no_pulls = cma == 0;
    sc->no_maps = map == 0;
    if (cma < 0) cma = ring < CMA_AUTO_BELOW;
    sc->cma_min = cma ? (size_t)(cma_min >= 0 ? cma_min : 1 << 20) : SIZE_MAX;
    sc->pull_min = SIZE_MAX;
    if (measure && sc->my_local == 0) measure_pull_min(c, sc);
    int crowded = nlocal > sysconf(_SC_NPROCESSORS_ONLN);
    if (crowded && ring_kb <= 0 && ring > CROWDED_RING) ring = CROWDED_RING;
    sc->ring_bytes = ring;
    return 0;
}

static int link_peers(dt_comm *c, struct dt_shm_comm *sc, const int *local_ranks)
{
    for (int i = 0; i < sc->nlocal; i++) {
        if (i == sc->my_local) continue;
        shm_link *l = calloc(1, sizeof *l);
        if (!l) return dt_comm_fail(c, DT_ERR_NOMEM, -1, "out of memory");
        l->base.ops = &dt_shm_link_ops;
        l->base.peer = local_ranks[i];
        l->sc = sc;
        l->peer_local = i;
        l->peer_inbox = sc->maps[i];
        l->peer_pid = l->peer_inbox->pid;
        l->out_bytes = l->peer_inbox->ring_bytes;
        l->in_bytes = sc->ring_bytes;
        l->out = shm_inbox_ring(sc->maps[i], l->out_bytes, sc->my_local);
        l->in = shm_inbox_ring(sc->me, l->in_bytes, i);
        l->can_pull = !sc->no_pulls && l->peer_inbox->cma_ok[sc->my_local];
        l->use_cma = (sc->cma_min != SIZE_MAX || sc->pull_min != SIZE_MAX) && l->can_pull;
        c->links[local_ranks[i]] = &l->base;
    }
    return 0;
}

/* peers: communicator ranks on this host other than us, ascending. */
int dt_shm_setup(dt_comm *c, const int *peers, int npeers)
{
    if (npeers == 0) {
        /* Alone on our host: we still count in the others' barriers (a
         * host of one beside hosts of several used to hang here). */
        if (!dt_topo_uses(c, DT_LINK_SHM)) return 0;
        int rc = dt_comm_store_barrier(c, "shm-created");
        return rc < 0 ? rc : dt_comm_store_barrier(c, "shm-mapped");
    }
    if (npeers + 1 > 256)
        return dt_comm_fail(c, DT_ERR_INVALID, -1, "more than 256 ranks on one host");
    struct dt_shm_comm *sc = calloc(1, sizeof *sc);
    if (!sc) return dt_comm_fail(c, DT_ERR_NOMEM, -1, "out of memory");
    publish(c, sc, NULL);
    /* Yama may restrict process_vm_readv to ancestors; allow our peers. */
    prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY, 0, 0, 0);

    int local_ranks[256], n = 0;
    for (int i = 0, placed = 0; i < npeers || !placed; n++) {
        if (!placed && (i == npeers || peers[i] > c->rank)) {
            sc->my_local = n;
            local_ranks[n] = c->rank;
            placed = 1;
        } else {
            local_ranks[n] = peers[i++];
        }
    }
    sc->nlocal = n;
    int rc = read_settings(c, sc, n);
    if (rc < 0) return rc;
    sc->seg_bytes = shm_segment_size(sc->ring_bytes, n);
    sc->maps = calloc((size_t)n, sizeof *sc->maps);
    sc->map_bytes = calloc((size_t)n, sizeof *sc->map_bytes);
    sc->reduce_buf = malloc(REDUCE_PIECE);
    if (!sc->maps || !sc->map_bytes || !sc->reduce_buf)
        return dt_comm_fail(c, DT_ERR_NOMEM, -1, "out of memory");
    if ((rc = create_inbox(c, sc)) < 0) return rc;
    publish(c, sc, sc->me);
    sc->maps[sc->my_local] = sc->me;
    sc->map_bytes[sc->my_local] = sc->seg_bytes;
    if ((rc = dt_comm_store_barrier(c, "shm-created")) < 0) goto out;
    for (int i = 0; i < n && rc == 0; i++)
        if (i != sc->my_local) rc = open_inbox(c, sc, local_ranks[i], i);
    if (rc < 0) goto out;
    sc->pull_min = (size_t)((shm_inbox *)sc->maps[0])->pull_min;
    for (int i = 0; i < n; i++)
        if (i != sc->my_local) {
            shm_inbox *in = sc->maps[i];
            sc->me->cma_ok[i] = (unsigned char)cma_works((pid_t)in->pid, in->probe_addr);
        }
    rc = dt_comm_store_barrier(c, "shm-mapped");
    if (rc == 0) rc = link_peers(c, sc, local_ranks);
out:
    /* Every peer has mapped it (or setup failed): the name is no longer needed. */
    shm_unlink(sc->name);
    return rc;
}

void dt_shm_teardown(dt_comm *c)
{
    struct dt_shm_comm *sc = c->shm;
    if (!sc) return;
    publish(c, NULL, NULL);
    for (int i = 0; i < sc->nlocal; i++)
        if (sc->maps && sc->maps[i]) munmap(sc->maps[i], sc->map_bytes[i]);
    free(sc->maps);
    free(sc->map_bytes);
    free(sc->reduce_buf);
    free(sc);
}

