/*
 * The link models a simulation can run on: the cost model's built-in
 * defaults, a calibrated JSON file (`dtrain bench comm --calibrate FILE`,
 * comm/cost/model.h), or a named preset of datacenter hardware. A preset
 * fills the same dt_cost_model: the shm kind stands for the links within
 * a host, tcp for those between hosts.
 */
#ifndef DT_SIM_LINKS_H
#define DT_SIM_LINKS_H

#include <stddef.h>
#include <stdio.h>

#include "comm/cost/model.h"

/* name: "builtin", a preset's name, or a file's path. 0, or -1 with a
 * message naming the choices. */
int dt_sim_links(const char *name, dt_cost_model *m, char *err, size_t len);
/* One line per preset, its figures and where they come from, for --help. */
void dt_sim_links_help(FILE *f);

#endif
