/* The learning rate of an optimizer step: linear warmup, then constant,
 * cosine or linear decay (formula in config/config.h). */
#include <math.h>
#include <string.h>

#include "train/config/config.h"

double dt_config_lr_at(const dt_train_config *c, long step)
{
    long w = c->warmup_steps > 0 ? c->warmup_steps : 0;
    if (step < 0) step = 0;
    if (step < w) return c->lr * (double)(step + 1) / (double)w;
    double p = c->steps > w ? (double)(step - w) / (double)(c->steps - w) : 1.0;
    p = p < 0 ? 0 : p > 1 ? 1 : p;
    if (!strcmp(c->lr_schedule, "cosine"))
        return c->min_lr + 0.5 * (c->lr - c->min_lr) * (1.0 + cos(M_PI * p));
    if (!strcmp(c->lr_schedule, "linear")) return c->min_lr + (c->lr - c->min_lr) * (1.0 - p);
    return c->lr;
}
