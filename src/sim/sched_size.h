/*
 * The size of a collective's recording (sim/coll.h) before it is made:
 * what each algorithm of src/comm/algo records over all ranks (its steps,
 * their sends and receives, its local copies and reductions), counted in
 * closed form from the structure of its code. Recording a schedule that
 * cannot fit took minutes and gigabytes before the recorder ran out of
 * room; from the counts it is refused at once, naming an algorithm that
 * fits, or, when none does, the most ranks at which one would.
 * `ctest -R sim.size` holds every count against real recordings.
 */
#ifndef DT_SIM_SCHED_SIZE_H
#define DT_SIM_SCHED_SIZE_H

#include <stddef.h>

#include "comm/algo/blocks.h"
#include "comm/algo/table.h"
#include "sim/world.h"

typedef struct {
    double steps;  /* steps recorded, over all ranks */
    double ops;    /* their sends and receives */
    double locals; /* local copies and reductions that take time */
} dt_sim_entries;

/* What algorithm al records for call a on every rank of w: exact, but
 * for reduce-scatters of more than 16 TiB (where a dry run's stand-in
 * buffers overlap and ring and halving add a copy a rank). 0, or -1 for
 * an algorithm with no closed form here (MPI's, which never runs in the
 * simulator). */
int dt_sim_sched_entries(const dt_sim_world *w, const dt_algo *al, const dt_coll_args *a,
                         dt_sim_entries *out);

/* The bytes of that recording, at least *lo and at most *hi: an entry's
 * variable-length integers take between one byte and what the world's
 * largest peer distance and the call's `bytes` need. */
void dt_sim_sched_bytes(const dt_sim_world *w, size_t bytes, const dt_sim_entries *e,
                        double *lo, double *hi);

/* Whether al's recording of a can fit in `cap` bytes: 0, or -1 when it
 * cannot, with a message naming the cheapest algorithm (by the cost
 * model) that surely fits, or the most ranks at which one would. */
int dt_sim_sched_fits(dt_sim_world *w, const dt_algo *al, const dt_coll_args *a, double cap,
                      char *err, size_t len);

/* After a recording ran out of room: what would fit instead, as above,
 * into err (for "the schedule ... needs more than N GiB; ..."). */
void dt_sim_sched_suggest(dt_sim_world *w, const dt_algo *al, const dt_coll_args *a, double cap,
                          char *err, size_t len);

#endif
