/* The model a run trains: its sizes from a checkpoint being resumed, else
 * from a weights file (--init), else from the configuration, checked
 * against the data and the sequence length. */
#ifndef DT_TRAIN_WEIGHTS_MODEL_SOURCE_H
#define DT_TRAIN_WEIGHTS_MODEL_SOURCE_H

#include <stddef.h>

#include "model/gpt.h"
#include "train/config/config.h"
#include "train/data/dataset.h"

/* Fills mc. resume_dir is the checkpoint being resumed, or NULL. *seq_len
 * becomes the file's block size when a file gives the sizes and no length
 * was asked for. Sizes given explicitly must match a file's. 0, or -1 with
 * a message naming the file and the size. */
int dt_model_source_config(const dt_train_config *c, const char *resume_dir,
                           const dt_dataset *train, const dt_dataset *val, int *seq_len,
                           dt_gpt_config *mc, char *err, size_t errlen);

#endif
