/* The model families: what differs between them outside a layer's blocks
 * (the tensors' names, the embeddings, the head) and their default blocks.
 * A family is a row of the table in arch.c; a layer's kinds stay data
 * (model/block.h).
 *
 *   gpt2   GPT-2: learned positions (wpe), LayerNorm, GELU MLP, biases,
 *          the head tied to the embedding; Conv1D weights [in, out]
 *   llama  the Llama family: rotary positions (in attention), RMSNorm,
 *          SwiGLU MLP, grouped-query attention, no biases, an untied
 *          head unless asked; Linear weights [out, in]; Hugging Face's
 *          LlamaForCausalLM names */
#ifndef DT_MODEL_ARCH_H
#define DT_MODEL_ARCH_H

typedef struct dt_gpt_config dt_gpt_config;

typedef enum { DT_ARCH_GPT2 = 0, DT_ARCH_LLAMA = 1, DT_ARCH_COUNT } dt_arch_kind;

typedef struct {
    dt_arch_kind kind;
    const char *name;       /* as --arch and checkpoints spell it */
    const char *layer;      /* a layer's prefix, with its index for %d */
    const char *tokens;     /* the embedding's weight */
    const char *positions;  /* learned positions' weight; NULL: rotary, in attention */
    const char *final_norm; /* the final norm (its tensors' prefix) */
    const char *head;       /* the head's weight when untied */
    const char *blocks;     /* a layer's default blocks */
    const char *moe_blocks; /* with experts (NULL: none yet) */
} dt_arch;

/* The configuration's family (GPT-2 for an unknown kind: checked by
 * dt_gpt_config_check), and one by name (NULL if none). */
const dt_arch *dt_arch_of(const dt_gpt_config *cfg);
const dt_arch *dt_arch_find(const char *name);
/* "gpt2|llama", for messages. */
const char *dt_arch_names(void);

/* A layer's blocks: the configuration's, or its family's default. */
const char *dt_gpt_blocks(const dt_gpt_config *cfg);
/* The values a 0 in the configuration stands for. */
int dt_gpt_kv_heads(const dt_gpt_config *cfg);  /* n_head */
int dt_gpt_ffn(const dt_gpt_config *cfg);       /* GPT-2: 4 C; Llama: 8 C / 3 up to 256 */
double dt_gpt_rope_theta(const dt_gpt_config *cfg); /* 10000 */
double dt_gpt_norm_eps(const dt_gpt_config *cfg);   /* 1e-5 */
/* The head is the embedding's transpose (GPT-2's always; Llama's on request). */
int dt_gpt_tied(const dt_gpt_config *cfg);

#endif
