/* Moved to comm/bootstrap/bootstrap.h; this forwarding header stays until
 * src/train/trainer.c includes the new path. */
#include "comm/bootstrap/bootstrap.h"
