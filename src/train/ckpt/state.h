/* A checkpoint's state.json: the numbers that, with the tensors, resume a
 * run exactly (format 1):
 *
 *   {"format": 1, "step": 20, "seq_counter": "160", "seed": "1337",
 *    "shuffle": 1, "seq_len": 64, "global_batch": 8, "last_loss": 2.31,
 *    "data_tokens": "1000000", "optimizer": "adamw", "optimizer_step": 20,
 *    "model": {"n_layer": 2, "n_head": 2, "n_embd": 64, "vocab_size": 256,
 *              "block_size": 64},
 *    "moe_expert_bias": ["00000000 3a83126f bf800000", ...],
 *    "tokenizer": {"spec": "gpt2", "split": "gpt2", "eot": 50256, "vocab": 50257,
 *                  "fingerprint": "dae4cbe1e441ad33"}}
 *
 * 64-bit counters are decimal strings (JSON numbers are doubles). Reading
 * checks every field's type and range and the relations between them, so a
 * hand-edited or damaged file fails with a message naming the file, the
 * field and what it may hold, rather than resuming a run that is wrong.
 * "model" and "data_tokens" are optional: checkpoints written before they
 * were recorded lack them. So is "tokenizer", the one the training data
 * was prepared with as its shards record it (tokenizer/tokenizer.h), by
 * which `dtrain sample` reads prompts and writes text; absent when the
 * data records none.
 *
 * "moe_expert_bias", with --moe-router-enable-expert-bias: the experts'
 * bias of aux-loss-free balancing (model/moe.h), one string per layer of
 * E words, each the 8 hexadecimal digits of a float's IEEE bits. The bits
 * rather than decimal numbers: the bias moves the routing, so a resumed
 * run must start from the very same floats, and JSON numbers are doubles
 * that cJSON prints in its own way (an integral -0 loses its sign). */
#ifndef DT_TRAIN_CKPT_STATE_H
#define DT_TRAIN_CKPT_STATE_H

#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "model/gpt.h"
#include "model/optimizer.h"
#include "tokenizer/tokenizer.h"

#define DT_CKPT_FORMAT 1
/* The largest step: the largest integer a JSON number (a double) holds
 * exactly. */
#define DT_CKPT_STEP_MAX 9007199254740992L
/* The largest state.json read: room for the experts' bias of thousands of
 * layers of 256 experts (9 bytes a value). */
#define DT_CKPT_STATE_BYTES (16 << 20)

typedef struct {
    long step;             /* optimizer steps completed */
    uint64_t seq_counter;  /* training sequences consumed (the loader's position) */
    uint64_t seed;
    int shuffle;
    int seq_len;
    long global_batch;     /* sequences per optimizer step */
    double last_loss;
    uint64_t data_tokens;  /* tokens of the training data: resuming on other data is refused */
    /* The experts' bias to save, [n_layer][E] of the model, or NULL; a
     * read leaves it NULL (dt_ckpt_read_moe_bias fetches the values). */
    const float *moe_bias;
    dt_tok_ref tokenizer;  /* the data's; spec "": none recorded */
} dt_ckpt_state;

/* Everything state.json holds. */
typedef struct {
    dt_ckpt_state run;
    dt_opt_kind optimizer;
    long optimizer_step;   /* the optimizer's t */
    dt_gpt_config model;   /* all zero when the file does not record it */
    size_t moe_bias_n;     /* values of the experts' bias recorded; 0: none */
} dt_ckpt_record;

/* The JSON text of r (malloc'd), or NULL when memory runs out. */
char *dt_ckpt_state_format(const dt_ckpt_record *r);

/* The same as a JSON object (a sharded checkpoint's manifest holds it). */
cJSON *dt_ckpt_state_json(const dt_ckpt_record *r);

/* Parses and checks text, the contents of path. */
int dt_ckpt_state_parse(const char *path, const char *text, dt_ckpt_record *r, char *err,
                        size_t errlen);

/* Checks an object parsed already (from path, named in messages). */
int dt_ckpt_state_from_json(const char *path, const cJSON *j, dt_ckpt_record *r, char *err,
                            size_t errlen);

/* The experts' bias that j, a state object read from path, records, into
 * out[n_layer][E] of its model (r, what parsing j gave). */
int dt_ckpt_state_moe_bias(const char *path, const cJSON *j, const dt_ckpt_record *r,
                           float *out, char *err, size_t errlen);

/* Reads and checks DIR/state.json. */
int dt_ckpt_state_read(const char *dir, dt_ckpt_record *r, char *err, size_t errlen);

#endif
