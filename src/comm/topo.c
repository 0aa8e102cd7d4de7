/*
 * The host map of a communicator and the rule for which link joins two of
 * its members (topo.h).
 */
#include "comm/topo.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "comm/bootstrap/store.h"
#include "comm/comm_internal.h"
#include "core/env.h"

static const char *link_names[DT_LINK_KINDS] = {"shm", "tcp", "mpi"};

const char *dt_link_kind_name(dt_link_kind k)
{
    return (unsigned)k < DT_LINK_KINDS ? link_names[k] : "?";
}

/* A comma list in DTRAIN_HOSTNAME names each rank's host in rank order
 * ("a,a,b": ranks 0 and 1 on a, rank 2 on b), for uneven layouts under
 * one launcher. */
static int fake_hostname(int rank, char *out, size_t len)
{
    const char *v = dt_env_str("DTRAIN_HOSTNAME");
    if (!v) return 0;
    int n = 1;
    for (const char *s = v; *s; s++) n += *s == ',';
    const char *s = v;
    for (int i = 0; i < rank % n; i++) s = strchr(s, ',') + 1;
    size_t k = strcspn(s, ",");
    snprintf(out, len, "%.*s", (int)(k < len ? k : len - 1), s);
    return 1;
}

void dt_topo_read_host(dt_job *job)
{
    if (!fake_hostname(job->rank, job->hostname, sizeof job->hostname) &&
        gethostname(job->hostname, sizeof job->hostname) != 0)
        snprintf(job->hostname, sizeof job->hostname, "unknown");
    job->hostname[sizeof job->hostname - 1] = '\0';
    FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");
    if (f) {
        if (!fgets(job->boot_id, sizeof job->boot_id, f)) job->boot_id[0] = '\0';
        fclose(f);
        job->boot_id[strcspn(job->boot_id, "\n")] = '\0';
    }
}

/* Rank r's host, which it publishes as it joins. Over the world, a
 * timeout means that rank never joined: say so rather than name the key. */
static int get_host(dt_comm *c, int r, char **name)
{
    char key[32];
    size_t len;
    snprintf(key, sizeof key, "host/%d", r);
    if (strcmp(c->id, "w") != 0) return dt_comm_store_get(c, key, (void **)name, &len);
    char k[DT_STORE_MAX_KEY];
    snprintf(k, sizeof k, "%s/%s", c->id, key);
    pthread_mutex_lock(&c->job->store_lock);
    int rc = dt_store_get(c->job->store, k, (void **)name, &len, dt_comm_deadline(c));
    pthread_mutex_unlock(&c->job->store_lock);
    if (rc == DT_ERR_TIMEOUT)
        return dt_comm_fail(c, rc, r,
                            "rank %d never joined the job: no word from it in %.1f s "
                            "(DTRAIN_TIMEOUT); was it started, and did it fail before joining? "
                            "(see its output)",
                            r, c->job->timeout_s);
    if (rc)
        return dt_comm_fail(c, rc, -1, "store get of '%s' failed: %s", k,
                            dt_store_error(c->job->store));
    return 0;
}

/* The boot id part of a published host ("name boot_id"), or NULL where
 * none was read. */
static const char *boot_part(const char *published)
{
    const char *b = strrchr(published, ' ');
    return b && b[1] ? b + 1 : NULL;
}

/* Members that run on this one's kernel: ranks posing as hosts of their
 * own (DTRAIN_HOSTNAME, a namespace's hostname) still share its CPUs. */
static int count_kernel_ranks(const dt_comm *c, char **names)
{
    const char *mine = boot_part(names[c->rank]);
    int n = 0;
    for (int r = 0; mine && r < c->size; r++) {
        const char *theirs = boot_part(names[r]);
        n += theirs && !strcmp(theirs, mine);
    }
    return n;
}

int dt_topo_find_hosts(dt_comm *c)
{
    char me[400], key[32];
    int n = snprintf(me, sizeof me, "%s %s", c->job->hostname, c->job->boot_id);
    snprintf(key, sizeof key, "host/%d", c->rank);
    int rc = dt_comm_store_set(c, key, me, (size_t)n < sizeof me ? (size_t)n : sizeof me - 1);
    char **names = calloc((size_t)c->size, sizeof *names);
    if (!names) return DT_ERR_NOMEM;
    for (int r = 0; r < c->size && rc == 0; r++) {
        rc = get_host(c, r, &names[r]);
        if (rc < 0) break;
        c->host_of[r] = r;
        for (int q = 0; q < r; q++)
            if (!strcmp(names[q], names[r])) {
                c->host_of[r] = c->host_of[q];
                break;
            }
    }
    if (rc == 0) c->kernel_ranks = count_kernel_ranks(c, names);
    for (int r = 0; r < c->size; r++) free(names[r]);
    free(names);
    return rc;
}

void dt_topo_layout(dt_comm *c)
{
    c->local_rank = c->local_size = c->nhosts = 0;
    for (int r = 0; r < c->size; r++) {
        if (c->host_of[r] == c->host_of[c->rank]) {
            c->local_size++;
            if (r < c->rank) c->local_rank++;
        }
        int first = 1;
        for (int q = 0; q < r && first; q++) first = c->host_of[q] != c->host_of[r];
        c->nhosts += first;
    }
}

dt_link_kind dt_topo_link(const dt_comm *c, int a, int b)
{
    if (c->job->use_mpi) return DT_LINK_MPI;
    if (c->host_of[a] == c->host_of[b] && !c->job->force_tcp) return DT_LINK_SHM;
    return DT_LINK_TCP;
}

int dt_topo_uses(const dt_comm *c, dt_link_kind k)
{
    for (int a = 0; a < c->size; a++)
        for (int b = 0; b < a; b++)
            if (dt_topo_link(c, a, b) == k) return 1;
    return 0;
}
