"""Model directories as Hugging Face writes them (config.json, and
model.safetensors or shards listed in model.safetensors.index.json), read
by --init and `dtrain sample --ckpt`, written by --save-final DIR/ and
`dtrain ckpt consolidate --out DIR/`.

  test_hf_dir.py DTRAIN

The directories are written here by hand (tests/pylib/dtrain_ref.py's
hf_dir_write), as save_pretrained lays them out, with the fields of
Hugging Face's LlamaConfig and GPT2Config. Checked:
  - a Llama directory in two bf16 shards loads, and written back (one
    step at lr 0, which leaves every weight as it was) holds the same
    names and the same values (bf16 -> fp32 is exact), config.json the
    fields read, in shards under DTRAIN_HF_SHARD_BYTES with an index
    that places every tensor where it is; saved again unsharded into the
    same directory, the previous shards and index are gone and other
    files stay;
  - its first loss is PyTorch's (tests/pylib/llama_ref.py, written from
    the definitions) on the same weights and batch, so rope_theta and
    rms_norm_eps came from config.json; and it trains as the same
    weights in one safetensors file do: every loss and final weight the
    same bits, the final directory holding the file's values;
  - ZeRO-3 over 2 ranks, each rank loading its pieces alone, starts
    from the directory as from the file (the same bits after 2 steps);
  - `dtrain sample` samples the directory as the file;
  - `ckpt consolidate --out DIR/` writes the checkpoint's weights, and
    with `--dtype bf16` (as `--save-final` with `--save-dtype fp16`) each
    value rounded as PyTorch rounds it, the dtype in the header and in
    torch_dtype; a value past fp16's range is refused, naming it;
  - a Mixtral directory (MixtralConfig's fields: 4 experts, top 3) loads,
    its first loss PyTorch's Mixtral (llama_ref.py with experts), written
    back in Mixtral's names and config fields; sizes the shapes
    contradict, a top K above the experts, a sliding window shorter than
    the context, and model_type "llama" over experts are refused;
  - a GPT-2 directory in fp16 ("transformer." names, no lm_head) loads,
    trains as its file does, and is written back in GPT2LMHeadModel's
    names and config fields;
  - bad input, each refused with a message naming the file, the tensor
    and the values: a config.json size the shapes contradict (each one),
    a shard the index names that is missing, a tensor the index places in
    a shard that lacks it, a tensor in no shard, a tensor named twice in
    the index or held by two shards, what dtrain does not compute
    (rope_scaling, another model_type), no config.json, both layouts at
    once, and outputs it must not write (a directory of other files, a
    checkpoint's inside, a GPT-2 model with experts).
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "pylib"))
from checks import check, finish  # noqa: E402
from dtrain_ref import (GPT, HF_CONFIG, HF_INDEX, HF_WEIGHTS,  # noqa: E402
                        hf_dir_read, hf_dir_write, hf_shard_name, shard_write, st_read, st_write)
from dtrain_run import same_bits  # noqa: E402
from llama_ref import Llama, mixtral_name  # noqa: E402

torch.set_num_threads(1)
L, NH, KV, C, FW, V, CTX, B, T = 2, 4, 2, 32, 24, 256, 64, 2, 16
THETA, EPS = 500000.0, 1e-6  # not dtrain's defaults: they must come from config.json

# What HF's LlamaConfig holds for this model, as save_pretrained writes it.
LLAMA_CONFIG = {
    "architectures": ["LlamaForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "bos_token_id": 1, "eos_token_id": 2, "hidden_act": "silu", "hidden_size": C,
    "initializer_range": 0.02, "intermediate_size": FW, "max_position_embeddings": CTX,
    "mlp_bias": False, "model_type": "llama", "num_attention_heads": NH,
    "num_hidden_layers": L, "num_key_value_heads": KV, "pretraining_tp": 1,
    "rms_norm_eps": EPS, "rope_scaling": None, "rope_theta": THETA,
    "tie_word_embeddings": False, "torch_dtype": "bfloat16", "transformers_version": "4.40.0",
    "use_cache": True, "vocab_size": V}
# The fields that say the model: what a written config.json must give back.
LLAMA_KEYS = ["model_type", "architectures", "vocab_size", "hidden_size", "intermediate_size",
              "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
              "max_position_embeddings", "rope_theta", "rms_norm_eps", "tie_word_embeddings",
              "hidden_act", "attention_bias", "mlp_bias", "rope_scaling"]
# What HF's MixtralConfig holds for a Mixtral of the same sizes, 4 experts
# of FW, top 3: save_pretrained's fields (intermediate_size is an expert's).
E, K = 4, 3
MIXTRAL_CONFIG = {
    "architectures": ["MixtralForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 1,
    "eos_token_id": 2, "hidden_act": "silu", "hidden_size": C, "initializer_range": 0.02,
    "intermediate_size": FW, "max_position_embeddings": CTX, "model_type": "mixtral",
    "num_attention_heads": NH, "num_experts_per_tok": K, "num_hidden_layers": L,
    "num_key_value_heads": KV, "num_local_experts": E, "output_router_logits": False,
    "rms_norm_eps": EPS, "rope_theta": THETA, "router_aux_loss_coef": 0.02,
    "router_jitter_noise": 0.0, "sliding_window": None, "tie_word_embeddings": False,
    "torch_dtype": "bfloat16", "transformers_version": "4.40.0", "use_cache": True,
    "vocab_size": V}
MIXTRAL_KEYS = ["model_type", "architectures", "vocab_size", "hidden_size", "intermediate_size",
                "num_local_experts", "num_experts_per_tok", "num_hidden_layers",
                "num_attention_heads", "num_key_value_heads", "max_position_embeddings",
                "rope_theta", "rms_norm_eps", "tie_word_embeddings", "hidden_act",
                "sliding_window"]
GPT2_CONFIG = {
    "activation_function": "gelu_new", "architectures": ["GPT2LMHeadModel"],
    "attn_pdrop": 0.1, "bos_token_id": 50256, "embd_pdrop": 0.1, "eos_token_id": 50256,
    "initializer_range": 0.02, "layer_norm_epsilon": 1e-05, "model_type": "gpt2",
    "n_ctx": CTX, "n_embd": C, "n_head": NH, "n_inner": None, "n_layer": L,
    "n_positions": CTX, "resid_pdrop": 0.1, "scale_attn_weights": True,
    "tie_word_embeddings": True, "torch_dtype": "float16", "vocab_size": V}
GPT2_KEYS = ["model_type", "architectures", "vocab_size", "n_positions", "n_embd", "n_layer",
             "n_head", "n_inner", "activation_function", "layer_norm_epsilon",
             "tie_word_embeddings"]


# What a one-step run on the test's data needs besides its model and outputs.
ONE_STEP = ["--steps", "1", "--seq-len", str(T), "--val-fraction", "0", "--eval-batches", "0",
            "--threads", "1"]


def run(dtrain, args, env=None):
    e = dict(os.environ)
    e.update(env or {})
    return subprocess.run([dtrain] + args, capture_output=True, text=True, errors="replace",
                          timeout=120, env=e)


def train(dtrain, tmp, init, out, steps=1, lr=0.0, extra=(), env=None, launch=()):
    """One run from init (launch: `dtrain launch`'s arguments, for ranks);
    returns (logged losses, stdout) or stops the test."""
    log = os.path.join(tmp, "log.json")
    head = ["launch"] + list(launch) + [dtrain] if launch else []
    r = run(dtrain, head + ["train", "--init", init, "--data", os.path.join(tmp, "data.bin"),
                     "--val-fraction", "0", "--eval-batches", "0", "--batch-size", str(B),
                     "--seq-len", str(T), "--steps", str(steps), "--lr", str(lr),
                     "--lr-schedule", "constant", "--shuffle", "0", "--threads", "1",
                     "--log-json", log, "--save-final", out] + list(extra), env)
    if r.returncode != 0:
        print(r.stdout[-2000:], r.stderr[-2000:])
        raise SystemExit("dtrain train --init %s failed" % init)
    return [json.loads(line)["loss"] for line in open(log) if '"loss"' in line], r.stdout


def same_values(got, want):
    return got.keys() == want.keys() and all(got[k].equal(want[k].float()) for k in want)


def llama_weights():
    """The test's Llama, its weights bf16 values (so bf16 holds them exactly)."""
    model = Llama(L, NH, KV, C, V, FW, THETA, EPS, tie=False)
    model.init_random(torch.Generator().manual_seed(7))
    state = {k: v.bfloat16().float() for k, v in model.hf_state().items()}
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(state[name if name.startswith("lm_head") else "model." + name])
    return model, state


def check_round_trip(dtrain, tmp, src, state):
    """One step at lr 0 from the bf16 shards, written back in shards."""
    out = os.path.join(tmp, "back") + "/"
    train(dtrain, tmp, src, out, extra=["--arch", "llama"],
          env={"DTRAIN_HF_SHARD_BYTES": "30000"})
    got, config, index = hf_dir_read(out)
    check(same_values(got, state), "round trip: the same names and values (%d tensors; names "
          "differing: %s)" % (len(got), sorted(set(got) ^ set(state))[:3]))
    diff = {k: (config.get(k), LLAMA_CONFIG[k]) for k in LLAMA_KEYS
            if config.get(k) != LLAMA_CONFIG[k]}
    check(not diff, "round trip: config.json gives back LlamaConfig's fields (differing: %s)"
          % diff)
    check(config.get("torch_dtype") == "float32" and config.get("head_dim") == C // NH,
          "round trip: torch_dtype float32 (what was written), head_dim %s"
          % config.get("head_dim"))
    shards = sorted(set(index["weight_map"].values())) if index else []
    files = sorted(f for f in os.listdir(out) if f.startswith("model-"))
    check(len(shards) > 2 and shards == files and not os.path.exists(out + HF_WEIGHTS),
          "round trip: shards under DTRAIN_HF_SHARD_BYTES 30000: %s, the index names them all"
          % files)
    total = sum(t.numel() * 4 for t in state.values())
    check(index and index["metadata"]["total_size"] == total
          and all(n in st_read(out + f)[0] for n, f in index["weight_map"].items()),
          "round trip: the index places each tensor where it is, total_size %d" % total)
    # Saved again, unsharded, into the same model directory: one model remains.
    open(out + "tokenizer.json", "w").write("{}")
    train(dtrain, tmp, out, out, extra=["--arch", "llama"])
    left = sorted(os.listdir(out))
    check(left == [HF_CONFIG, HF_WEIGHTS, "tokenizer.json"]
          and same_values(hf_dir_read(out)[0], state),
          "saved again unsharded: the previous shards and index removed, other files kept (%s)"
          % left)


def first_loss(model, tokens):
    x = torch.tensor(np.stack([tokens[k * T:k * T + T] for k in range(B)]), dtype=torch.long)
    y = torch.tensor(np.stack([tokens[k * T + 1:k * T + T + 1] for k in range(B)]),
                     dtype=torch.long)
    with torch.no_grad():
        return model(x, y).item()


def check_trains_as_file(dtrain, tmp, src, model, state, tokens):
    """The directory and the same weights in one file train alike."""
    single = os.path.join(tmp, "single.safetensors")
    st_write(single, state, {"n_head": str(NH), "n_kv_head": str(KV), "block_size": str(CTX),
                             "rope_theta": repr(THETA), "norm_eps": repr(EPS)})
    a, out = train(dtrain, tmp, src, os.path.join(tmp, "trained") + "/", 3, 3e-3,
                   ["--arch", "llama"])
    said = out.splitlines()[0] if out else ""
    check(said.startswith("model  from %s: n_layer %d, n_head %d, n_embd %d," % (src, L, NH, C)),
          "the run's summary names the directory as the model, with its sizes, not the default "
          "preset's name (%r)" % said)
    b, _ = train(dtrain, tmp, single, os.path.join(tmp, "trained.safetensors"), 3, 3e-3,
                 ["--arch", "llama"])
    ref = first_loss(model, tokens)
    check(abs(a[0] - ref) <= 1e-5 * ref, "the directory's first loss %.6f is PyTorch's %.6f "
          "(rope_theta %g and rms_norm_eps %g read)" % (a[0], ref, THETA, EPS))
    check(a == b and len(a) == 3, "trained 3 steps from the directory and from the file: the "
          "same losses (%s, %s)" % (a, b))
    got = hf_dir_read(os.path.join(tmp, "trained"))[0]
    check(same_bits(got, st_read(os.path.join(tmp, "trained.safetensors"))[0]),
          "trained from the directory and from the file: the same final weights, bit for bit")
    return single


def check_mixtral(dtrain, tmp, tokens):
    """A Mixtral directory: its first loss PyTorch's (num_experts_per_tok
    routes, rope_theta and rms_norm_eps read), written back in Mixtral's
    names and fields; what it would compute otherwise, refused."""
    model = Llama(L, NH, KV, C, V, FW, THETA, EPS, tie=False, E=E, K=K)
    model.init_random(torch.Generator().manual_seed(8))
    state = {k: v.bfloat16().float() for k, v in model.hf_state().items()}
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(state[mixtral_name(name if name.startswith("lm_head") else "model." + name)])
    src = os.path.join(tmp, "mixtral")
    hf_dir_write(src, state, MIXTRAL_CONFIG, dtype=torch.bfloat16)
    out = os.path.join(tmp, "mixtral_back") + "/"
    losses, _ = train(dtrain, tmp, src, out)
    ref = first_loss(model, tokens)
    check(abs(losses[0] - ref) <= 1e-5 * ref, "Mixtral: the directory's first loss %.6f is "
          "PyTorch's %.6f (%d experts, top %d)" % (losses[0], ref, E, K))
    got, config, _ = hf_dir_read(out)
    check(same_values(got, state), "Mixtral round trip: the same names and values (names "
          "differing: %s)" % sorted(set(got) ^ set(state))[:3])
    diff = {k: (config.get(k), MIXTRAL_CONFIG[k]) for k in MIXTRAL_KEYS
            if config.get(k) != MIXTRAL_CONFIG[k]}
    check(not diff, "Mixtral round trip: config.json gives back MixtralConfig's fields "
          "(differing: %s)" % diff)
    r0 = "model.layers.0.block_sparse_moe.gate.weight"
    check_bad_dirs(dtrain, tmp, src, [
        ("num_local_experts", edit_config(num_local_experts=5),
         "config.json: num_local_experts 5, but the weights have 4 (block_sparse_moe.gate"),
        ("intermediate_size of the experts", edit_config(intermediate_size=40),
         "config.json: intermediate_size 40, but the weights have 24 (block_sparse_moe.experts"),
        ("num_experts_per_tok", edit_config(num_experts_per_tok=5),
         "config.json: num_experts_per_tok 5 is more than num_local_experts 4"),
        ("sliding_window", edit_config(sliding_window=32),
         "config.json: sliding_window 32, which dtrain does not compute"),
        ("model_type llama over experts", edit_config(model_type="llama"),
         'config.json: model_type "llama", but the weights have experts (%s)' % r0),
    ], "llama")


def check_zero3(dtrain, tmp, src, single):
    """ZeRO-3 loads each rank's pieces alone (dt_weights_load_ranges): from
    the directory as from the file."""
    got = []
    for init, out in ((src, "z3-dir.safetensors"), (single, "z3-file.safetensors")):
        losses, _ = train(dtrain, tmp, init, os.path.join(tmp, out), 2, 3e-3,
                          ["--arch", "llama", "--zero-stage", "3"], launch=["-n", "2"])
        got.append((losses, st_read(os.path.join(tmp, out))[0]))
    check(got[0][0] == got[1][0] and same_bits(got[0][1], got[1][1]),
          "ZeRO-3 over 2 ranks from the directory: the file's losses and weights, bit for bit")


def check_sample(dtrain, src, single):
    args = ["sample", "--tokens", "24", "--seed", "5", "--prompt", "hi"]
    a, b = run(dtrain, args + ["--ckpt", src]), run(dtrain, args + ["--ckpt", single])
    check(a.returncode == 0 and a.stdout == b.stdout and len(a.stdout) > 2,
          "dtrain sample --ckpt DIR samples as the file does (exit %d %s)"
          % (a.returncode, a.stderr.strip()[-200:]))


def check_consolidate(dtrain, tmp, single):
    run_dir = os.path.join(tmp, "run")
    train(dtrain, tmp, single, os.path.join(tmp, "final.safetensors"), 2, 3e-3,
          ["--arch", "llama", "--out", run_dir])
    out = os.path.join(tmp, "consolidated") + "/"
    r = run(dtrain, ["ckpt", "consolidate", run_dir, "--out", out])
    ok = r.returncode == 0 and os.path.exists(out + HF_CONFIG)
    check(ok and same_bits(hf_dir_read(out)[0], st_read(os.path.join(tmp, "final.safetensors"))[0]),
          "ckpt consolidate --out DIR/: the checkpoint's weights as a model directory %s"
          % r.stderr.strip()[-300:])


def header_dtypes(path):
    """The dtypes a safetensors file's header names."""
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(n))
    return {v["dtype"] for k, v in header.items() if k != "__metadata__"}


def check_save_dtype(dtrain, tmp):
    """--save-dtype and consolidate's --dtype: the trained fp32 weights (not
    bf16 values) stored as bf16 and fp16, each value PyTorch's rounding of
    the fp32 one; fp16 refuses a value past its range."""
    final = os.path.join(tmp, "final.safetensors")
    want = st_read(final)[0]
    out = os.path.join(tmp, "bf16") + "/"
    r = run(dtrain, ["ckpt", "consolidate", os.path.join(tmp, "run"), "--out", out, "--dtype",
                     "bf16"])
    got, config, _ = hf_dir_read(out) if r.returncode == 0 else ({}, {}, None)
    check(r.returncode == 0 and header_dtypes(out + HF_WEIGHTS) == {"BF16"}
          and config.get("torch_dtype") == "bfloat16"
          and same_bits(got, {k: v.bfloat16().float() for k, v in want.items()}),
          "ckpt consolidate --dtype bf16: BF16 tensors, PyTorch's rounding of each value, "
          "torch_dtype bfloat16 %s" % r.stderr.strip()[-300:])
    f16 = os.path.join(tmp, "w16.safetensors")
    train(dtrain, tmp, final, f16, extra=["--arch", "llama", "--save-dtype", "fp16"])
    check(header_dtypes(f16) == {"F16"}
          and same_bits(st_read(f16)[0], {k: v.half().float() for k, v in want.items()}),
          "--save-dtype fp16 (one step at lr 0): F16 tensors, PyTorch's rounding of each value")
    big = dict(want)
    name = "model.layers.1.mlp.up_proj.weight"
    big[name] = big[name].clone()
    big[name][3, 5] = 1e5
    st_write(os.path.join(tmp, "big.safetensors"), big, st_read(final)[1])
    bad = os.path.join(tmp, "big16.safetensors")
    r = run(dtrain, ["train", "--init", os.path.join(tmp, "big.safetensors"), "--arch", "llama",
                     "--data", os.path.join(tmp, "data.bin"), "--lr", "0"] + ONE_STEP +
            ["--save-final", bad, "--save-dtype", "fp16"])
    check(r.returncode == 1 and "%s[%d] = 100000 is past float16's range" % (name, 3 * C + 5)
          in r.stderr and not os.path.exists(bad),
          "--save-dtype fp16 of 1e5: refused naming the tensor and element, nothing written "
          "(%s)" % r.stderr.strip()[-200:])


def check_gpt2(dtrain, tmp):
    """fp16, "transformer." names and no lm_head, as GPT2LMHeadModel saves."""
    gpt = GPT(L, NH, C, V, CTX)
    gpt.init_random(torch.Generator().manual_seed(3))
    state = {"transformer." + k: v.half().float() for k, v in gpt.hf_state().items()}
    src = os.path.join(tmp, "gpt2")
    hf_dir_write(src, state, GPT2_CONFIG, shards=2, dtype=torch.float16)
    out = os.path.join(tmp, "gpt2-back") + "/"
    train(dtrain, tmp, src, out)
    got, config, _ = hf_dir_read(out)
    check(same_values(got, state), "GPT-2 round trip from fp16: the same values, in "
          "GPT2LMHeadModel's names (differing: %s)" % sorted(set(got) ^ set(state))[:3])
    diff = {k: (config.get(k), GPT2_CONFIG[k]) for k in GPT2_KEYS
            if config.get(k) != GPT2_CONFIG[k]}
    check(not diff, "GPT-2 round trip: config.json gives back GPT2Config's fields (differing: %s)"
          % diff)
    single = os.path.join(tmp, "gpt2.safetensors")
    st_write(single, {k[len("transformer."):]: v for k, v in state.items()}, {"n_head": str(NH)})
    a, _ = train(dtrain, tmp, src, os.path.join(tmp, "g1.safetensors"), 2, 3e-3)
    b, _ = train(dtrain, tmp, single, os.path.join(tmp, "g2.safetensors"), 2, 3e-3)
    check(a == b and same_bits(st_read(os.path.join(tmp, "g1.safetensors"))[0],
                               st_read(os.path.join(tmp, "g2.safetensors"))[0]),
          "GPT-2: trained from the directory as from the file (losses %s, %s)" % (a, b))
    return src


# ---- bad input ----------------------------------------------------------------

def edit_config(**kv):
    def f(d):
        path = os.path.join(d, HF_CONFIG)
        c = json.load(open(path))
        c.update(kv)
        json.dump(c, open(path, "w"))
    return f


def edit_index(change):
    def f(d):
        path = os.path.join(d, HF_INDEX)
        x = json.load(open(path))
        change(x["weight_map"])
        json.dump(x, open(path, "w"))
    return f


def rewrite_shard(i, change, state):
    """Shard i (of 2) rewritten with change(tensors) applied, in bf16."""
    def f(d):
        path = os.path.join(d, hf_shard_name(i, 2))
        tensors = {k: state[k] for k in st_read(path)[0]}
        change(tensors)
        st_write(path, {k: v.bfloat16() for k, v in tensors.items()}, {"format": "pt"})
    return f


def dup_index_key(name):
    """The index's JSON naming the tensor twice, once for each shard."""
    def f(d):
        path = os.path.join(d, HF_INDEX)
        text = open(path).read()
        entry = '"weight_map": {"%s": "%s", ' % (name, hf_shard_name(0, 2))
        open(path, "w").write(text.replace('"weight_map": {', entry, 1))
    return f


def llama_bad(state):
    """Broken copies of the Llama directory: (name, how, what the refusal says)."""
    k0 = "model.layers.0.self_attn.k_proj.weight"
    up1 = "model.layers.1.mlp.up_proj.weight"  # in the second shard
    shard2 = hf_shard_name(1, 2)
    return [
        ("hidden_size", edit_config(hidden_size=48),
         "config.json: hidden_size 48, but the weights have 32 (model.embed_tokens.weight's "
         "columns)"),
        ("vocab_size", edit_config(vocab_size=300),
         "config.json: vocab_size 300, but the weights have 256 "
         "(model.embed_tokens.weight's rows)"),
        ("num_hidden_layers", edit_config(num_hidden_layers=3),
         "config.json: num_hidden_layers 3, but the weights have 2 (the model.layers.{i}"),
        ("intermediate_size", edit_config(intermediate_size=40),
         "config.json: intermediate_size 40, but the weights have 24 "
         "(model.layers.0.mlp.gate_proj.weight's rows)"),
        ("num_key_value_heads", edit_config(num_key_value_heads=4),
         "config.json: num_key_value_heads 4 x head_dim 8 = 32 rows, but %s is [16, 32]" % k0),
        ("num_attention_heads", edit_config(num_attention_heads=5),
         "config.json: num_attention_heads 5 does not divide the width 32 into whole heads"),
        ("no num_attention_heads", edit_config(num_attention_heads=None),
         "config.json: no num_attention_heads, which the model needs"),
        ("max_position_embeddings", edit_config(max_position_embeddings=0),
         "config.json: max_position_embeddings 0 is not a positive integer"),
        ("rms_norm_eps", edit_config(rms_norm_eps=-1e-6),
         "config.json: rms_norm_eps -1e-06 is not positive"),
        ("rope_theta", edit_config(rope_theta="big"), "config.json: rope_theta is not a number"),
        ("tie_word_embeddings", edit_config(tie_word_embeddings=True),
         "config.json: tie_word_embeddings true, but the weights hold lm_head.weight"),
        ("rope_scaling", edit_config(rope_scaling={"type": "linear", "factor": 2.0}),
         "config.json: rope_scaling is set, which dtrain does not compute"),
        ("hidden_act", edit_config(hidden_act="gelu"),
         'config.json: hidden_act "gelu", which dtrain does not compute'),
        ("attention_bias", edit_config(attention_bias=True),
         "config.json: attention_bias true, which dtrain does not compute"),
        ("mlp_bias", edit_config(mlp_bias=True),
         "config.json: mlp_bias true, which dtrain does not compute"),
        ("head_dim", edit_config(head_dim=16),
         "config.json: head_dim 16, which dtrain does not compute"),
        ("model_type", edit_config(model_type="mistral"),
         'config.json: model_type "mistral"; dtrain reads "llama", "mixtral" and "gpt2"'),
        ("model_type mixtral without experts", edit_config(model_type="mixtral"),
         'config.json: model_type "mixtral", but the weights have no experts'),
        ("model_type of the other family", edit_config(model_type="gpt2"),
         'config.json: model_type "gpt2", but the weights are named as the llama family'),
        ("a missing shard", lambda d: os.remove(os.path.join(d, shard2)),
         "%s names the shard %s (for " % (HF_INDEX, shard2)),
        ("a tensor not where the index places it",
         edit_index(lambda m: m.update({up1: hf_shard_name(0, 2)})),
         "%s does not hold tensor %s, which" % (hf_shard_name(0, 2), up1)),
        ("a tensor in no shard", lambda d: (rewrite_shard(1, lambda t: t.pop(up1), state)(d),
                                            edit_index(lambda m: m.pop(up1))(d)),
         "%s: tensor %s is missing" % (HF_INDEX, up1)),
        ("a tensor named twice in the index", dup_index_key(up1),
         "%s: weight_map names tensor %s twice" % (HF_INDEX, up1)),
        ("a tensor in two shards", rewrite_shard(0, lambda t: t.update({up1: state[up1]}), state),
         "tensor %s is in both" % up1),
        ("no config.json", lambda d: os.remove(os.path.join(d, HF_CONFIG)),
         "a directory without config.json, so not a model directory"),
        ("both layouts", lambda d: shutil.copy(os.path.join(d, shard2),
                                               os.path.join(d, HF_WEIGHTS)),
         "holds both model.safetensors and model.safetensors.index.json"),
    ]


GPT2_BAD = [
    ("GPT-2 n_embd", edit_config(n_embd=48),
     "config.json: n_embd 48, but the weights have 32 (wte.weight's columns)"),
    ("GPT-2 n_positions", edit_config(n_positions=128),
     "config.json: n_positions 128, but the weights have 64 (wpe.weight's rows)"),
    ("GPT-2 no n_head", edit_config(n_head=None), "config.json: no n_head, which the model needs"),
    ("GPT-2 tie_word_embeddings", edit_config(tie_word_embeddings=False),
     "config.json: tie_word_embeddings false, but the weights hold a GPT-2 head"),
    ("GPT-2 activation_function", edit_config(activation_function="relu"),
     'config.json: activation_function "relu", which dtrain does not compute'),
    ("GPT-2 layer_norm_epsilon", edit_config(layer_norm_epsilon=1e-6),
     "config.json: layer_norm_epsilon 1e-06, which dtrain does not compute"),
    ("GPT-2 n_inner", edit_config(n_inner=64),
     "config.json: n_inner 64, which dtrain does not compute"),
    ("GPT-2 scale_attn_by_inverse_layer_idx", edit_config(scale_attn_by_inverse_layer_idx=True),
     "config.json: scale_attn_by_inverse_layer_idx true, which dtrain does not compute"),
]


def check_bad_dirs(dtrain, tmp, src, cases, arch):
    """Each case, a broken copy of src, refused by train (and two by sample)."""
    for name, breaks, want in cases:
        d = os.path.join(tmp, "bad")
        shutil.rmtree(d, ignore_errors=True)
        shutil.copytree(src, d)
        breaks(d)
        for verb, args in (("train", ["train", "--init", d, "--arch", arch, "--data",
                                      os.path.join(tmp, "data.bin")] + ONE_STEP),
                           ("sample", ["sample", "--ckpt", d])):
            if verb == "sample" and name not in ("hidden_size", "a missing shard"):
                continue  # the same inspect and load: two cases show the route
            r = run(dtrain, args)
            msg = r.stderr + r.stdout
            check(r.returncode in (1, 2) and want in msg,
                  "%s: %s refused naming %r (exit %d: %s)" % (name, verb, want, r.returncode,
                                                             msg.strip().splitlines()[-1:]))


def check_bad_outputs(dtrain, tmp, src):
    data = os.path.join(tmp, "data.bin")
    other = os.path.join(tmp, "other")
    os.makedirs(other)
    open(os.path.join(other, "notes.txt"), "w").write("keep me")
    r = run(dtrain, ["train", "--init", src, "--arch", "llama", "--data", data] + ONE_STEP +
            ["--save-final", other + "/"])
    check(r.returncode == 1 and "a directory that holds other files and no config.json" in
          r.stderr and "step 1" not in r.stdout and os.listdir(other) == ["notes.txt"],
          "--save-final DIR/ of other files: refused before training, the files untouched (%s)"
          % r.stderr.strip()[-200:])
    r = run(dtrain, ["train", "--init", src, "--arch", "llama", "--data", data] + ONE_STEP +
            ["--save-final", other])
    check(r.returncode == 1 and "is a directory; give a file name, or %s/ for a Hugging Face "
          "model directory" % other in r.stderr, "--save-final DIR without the '/': refused, "
          "naming both forms (%s)" % r.stderr.strip()[-200:])
    moe = ["train", "--data", data, "--n-layer", "1", "--n-embd", "32", "--n-head", "4",
           "--block-size", str(T), "--num-experts", "2"] + ONE_STEP
    r = run(dtrain, moe + ["--save-final", os.path.join(tmp, "moe.safetensors")])
    check(r.returncode == 0, "the model with experts trains and saves to a file (%s)"
          % r.stderr.strip()[-200:])
    r = run(dtrain, moe + ["--save-final", os.path.join(tmp, "moe") + "/"])
    check(r.returncode == 1 and "has no Hugging Face architecture" in r.stderr
          and "step 1" not in r.stdout,
          "--save-final DIR/ of a model with experts: refused before training (%s)"
          % r.stderr.strip()[-200:])
    ck = os.path.join(tmp, "run", open(os.path.join(tmp, "run", "latest")).read().strip())
    r = run(dtrain, ["ckpt", "consolidate", os.path.join(tmp, "run"), "--out",
                     os.path.join(ck, "hf") + "/"])
    check(r.returncode == 1 and "inside the checkpoint it reads" in r.stderr
          and not os.path.exists(os.path.join(ck, "hf")),
          "ckpt consolidate --out DIR/ inside the checkpoint: refused (%s)"
          % r.stderr.strip()[-200:])


def main():
    dtrain = sys.argv[1]
    with tempfile.TemporaryDirectory() as tmp:
        tokens = np.random.default_rng(11).integers(0, V, size=T * 12 + 1)
        shard_write(os.path.join(tmp, "data.bin"), tokens)
        model, state = llama_weights()
        src = os.path.join(tmp, "llama")
        hf_dir_write(src, state, LLAMA_CONFIG, shards=2, dtype=torch.bfloat16)
        check_round_trip(dtrain, tmp, src, state)
        single = check_trains_as_file(dtrain, tmp, src, model, state, tokens)
        check_zero3(dtrain, tmp, src, single)
        check_sample(dtrain, src, single)
        check_consolidate(dtrain, tmp, single)
        check_save_dtype(dtrain, tmp)
        check_mixtral(dtrain, tmp, tokens)
        gpt2 = check_gpt2(dtrain, tmp)
        check_bad_dirs(dtrain, tmp, src, llama_bad(state), "llama")
        check_bad_dirs(dtrain, tmp, gpt2, GPT2_BAD, "gpt2")
        check_bad_outputs(dtrain, tmp, src)
    finish()


if __name__ == "__main__":
    main()
