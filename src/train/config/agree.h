/* Whether every rank of a job was started with the same run-shaping
 * options. Ranks started by hand, by mpirun with different argv or by srun
 * can differ, and a difference in an option that shapes the collective
 * sequence (--pp splits the job into other groups, --grad-accum changes
 * the number of sends, --bucket-mb the sizes of the all-reduces) ends in a
 * hang or a confusing mismatch deep inside a step, one that changes only
 * the numbers (--lr, --seed) in replicas that silently drift apart.
 *
 * dt_config_agree compares the options as given (after --config files and
 * the preset, before dt_config_validate infers anything), so that it can
 * run before a rank refuses its own options: with --pp 3 on one rank of
 * two and --pp 2 on the other, both say the options differ. Each option of
 * the table (config/table.c) has a rule here: its value must agree, only
 * whether it is set must agree (an output file written by one rank), or it
 * may differ (threads, logging); test_config_audit fails when an option
 * has no rule. */
#ifndef DT_TRAIN_CONFIG_AGREE_H
#define DT_TRAIN_CONFIG_AGREE_H

#include <stddef.h>

#include "dtrain/comm.h"
#include "train/config/config.h"

/* Collective over world (NULL: one process, nothing to compare): every rank
 * contributes a fingerprint of each option that must agree (one
 * all-gather), and, only when one differs and it is a text, the two texts
 * to show (a second all-gather). Every rank then returns the same verdict:
 * 0 when all agree, else -1 with
 *   options differ between ranks: --pp is 2 on rank 0 but 1 on rank 1, and
 *   --grad-accum differs too (start every rank with the same options)
 * naming the first option that differs (in the order of the rules), rank 0
 * and the lowest rank whose value differs from rank 0's, then the other
 * options that differ. A communication failure is -1 with the
 * communicator's message. */
int dt_config_agree(dt_comm *world, const dt_train_config *c, char *err, size_t errlen);

enum {
    DT_AGREE_FREE = 0,  /* may differ between ranks */
    DT_AGREE_VALUE = 1, /* the value must agree */
    DT_AGREE_SET = 2    /* only whether it is set must agree */
};

/* The rule for the option spelled --flag (without the dashes), or -1 when
 * the check has none (the audit's test: every option of the table needs
 * one). */
int dt_config_agree_rule(const char *flag);
/* The flag of the i-th rule, NULL past the last (for the same audit: each
 * must be an option of the table). */
const char *dt_config_agree_flag(int i);

#endif
