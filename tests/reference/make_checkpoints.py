#!/usr/bin/python3
"""Tiny random Hugging Face checkpoints (config.json + safetensors) for testing `gradflow analyze --checkpoint`.

Tensor names are those of HF's `*ForCausalLM.state_dict()` (GPT-2: the hub `gpt2` repo's `GPT2Model` names, optionally
prefixed `transformer.`); config keys are those the HF configuration classes serialise. Every weight is random, every
norm gain is 1 + 0.2 N(0,1) (Gemma-2 stores w and computes with 1 + w) and every bias 0.1 N(0,1), so no term of the
forward is the identity or zero by accident.

    make_checkpoints.py OUTDIR [--tokens FILE]     # the standard set, one subdirectory per entry of STANDARD_SET
    make_checkpoints.py --tokens FILE              # only a tokens file (12 ids in [0, 61))
"""
import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import safetensors_io  # noqa: E402

FAMILIES = ("llama", "mistral", "qwen2", "olmo2", "gpt2", "gemma2")
TINY = {"hidden": 32, "layers": 4, "heads": 4, "kv_heads": 2, "intermediate": 48, "vocab": 61, "positions": 64}
TORCH_DTYPE_NAMES = {"F32": "float32", "BF16": "bfloat16", "F16": "float16", "F64": "float64"}
STORAGE_DTYPES = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16, "F64": torch.float64}
# Tied embeddings when the caller does not say: the HF config classes' defaults for these hub families
# (LlamaConfig / MistralConfig / Qwen2Config / Olmo2Config: False; Gemma2Config and GPT2Config: True).
TIED_BY_DEFAULT = {"llama": False, "mistral": False, "qwen2": False, "olmo2": False, "gpt2": True, "gemma2": True}
ARCHITECTURES = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM",
                 "olmo2": "Olmo2ForCausalLM", "gpt2": "GPT2LMHeadModel", "gemma2": "Gemma2ForCausalLM"}
LLAMA3_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 16}
# With head_dim 16 and theta 1e4 the wavelengths 2 pi / inv_freq are 6.3, 19.9, 62.8, ...: against
# original_max_position_embeddings 32 (high_freq_wavelen 8, low_freq_wavelen 32) this hits all three branches
# of _compute_llama3_parameters (kept, smoothed, divided by factor).
LLAMA3_ROPE_ALL_BRANCHES = dict(LLAMA3_ROPE, original_max_position_embeddings=32)


def make_config(family, *, dtype="F32", tied=None, layers=TINY["layers"], **overrides):
    """config.json contents of a tiny model of `family`; overrides replace or add keys."""
    if family not in FAMILIES:
        raise ValueError(f"unknown family {family!r}; choose one of {', '.join(FAMILIES)}")
    tied = TIED_BY_DEFAULT[family] if tied is None else bool(tied)
    common = {"architectures": [ARCHITECTURES[family]], "model_type": family, "torch_dtype": TORCH_DTYPE_NAMES[dtype],
              "transformers_version": "4.46.0", "vocab_size": TINY["vocab"], "initializer_range": 0.02,
              "use_cache": True, "bos_token_id": 1, "eos_token_id": 2}
    if family == "gpt2":  # configuration_gpt2.py GPT2Config field names
        config = dict(common, activation_function="gelu_new", n_embd=TINY["hidden"], n_layer=layers,
                      n_head=TINY["heads"], n_positions=TINY["positions"], n_ctx=TINY["positions"], n_inner=None,
                      layer_norm_epsilon=1e-5, resid_pdrop=0.1, embd_pdrop=0.1, attn_pdrop=0.1,
                      scale_attn_weights=True, scale_attn_by_inverse_layer_idx=False, reorder_and_upcast_attn=False)
        if not tied:  # the hub gpt2 config omits the key (PretrainedConfig default True); write it only when untied
            config["tie_word_embeddings"] = False
    else:
        config = dict(common, hidden_size=TINY["hidden"], num_hidden_layers=layers,
                      num_attention_heads=TINY["heads"], num_key_value_heads=TINY["kv_heads"],
                      head_dim=TINY["hidden"] // TINY["heads"], intermediate_size=TINY["intermediate"],
                      hidden_act="silu", max_position_embeddings=TINY["positions"], rms_norm_eps=1e-6,
                      rope_theta=10000.0, rope_scaling=None, attention_dropout=0.0, tie_word_embeddings=tied)
        if family == "llama":
            config.update(attention_bias=False, mlp_bias=False, pretraining_tp=1, rms_norm_eps=1e-5,
                          rope_theta=500000.0)
        elif family == "mistral":
            config.update(sliding_window=None, rms_norm_eps=1e-5)
        elif family == "qwen2":  # hub Qwen2 configs: sliding window present but disabled
            config.update(use_sliding_window=False, sliding_window=TINY["positions"], max_window_layers=layers)
        elif family == "olmo2":
            config.update(attention_bias=False, rope_theta=500000.0, pad_token_id=0)
        elif family == "gemma2":
            config.update(hidden_act="gelu_pytorch_tanh", hidden_activation="gelu_pytorch_tanh",
                          attention_bias=False, query_pre_attn_scalar=24, sliding_window=3,
                          attn_logit_softcapping=2.0, final_logit_softcapping=3.0, cache_implementation="hybrid",
                          pad_token_id=0)
    config.update(overrides)
    return config


def make_tensors(config, *, seed=0, prefix=None, hub_buffers=False):
    """dict name -> float64 tensor of a random model for `config`, in HF state_dict order.

    The random draws depend only on (config, seed): the prefix, the buffers and the storage dtype do not change them,
    so variants made with one seed are comparable.
    """
    gen = torch.Generator().manual_seed(seed)

    def normal(*shape, std):
        return torch.randn(*shape, generator=gen, dtype=torch.float64) * std

    def weight(fan_out, fan_in):  # std 1.2/sqrt(fan_in) ~ 0.1-0.2: signals stay O(1)
        return normal(fan_out, fan_in, std=1.2 / fan_in ** 0.5)

    def gain(n, stored_offset=0.0):  # gain 1 + 0.2 N(0,1); stored as gain - stored_offset
        return 1.0 + normal(n, std=0.2) - stored_offset

    def bias(n):
        return normal(n, std=0.1)

    family = config["model_type"]
    out = {}
    if family == "gpt2":
        return _gpt2_tensors(config, out, normal, weight, gain, bias, prefix or "", hub_buffers)
    hidden, heads, kv_heads = config["hidden_size"], config["num_attention_heads"], config["num_key_value_heads"]
    head_dim = config.get("head_dim") or hidden // heads
    inter, vocab = config["intermediate_size"], config["vocab_size"]
    gain_offset = 1.0 if family == "gemma2" else 0.0  # Gemma2RMSNorm computes x_hat * (1 + weight)
    attn_bias = config.get("attention_bias", False)
    qkv_bias = attn_bias or family == "qwen2"  # Qwen2Attention: q/k/v bias=True, o_proj bias=False
    o_bias = attn_bias and family != "qwen2"
    mlp_bias = family == "llama" and config.get("mlp_bias", False)
    tied = config.get("tie_word_embeddings", TIED_BY_DEFAULT[family])
    # x_0 ~ O(1); a tied embedding is also the output head, so it is drawn smaller to keep the logits O(1)
    embed_std = 0.2 if family == "gemma2" else (0.4 if tied else 1.0)  # Gemma-2 multiplies x_0 by sqrt(hidden)
    out["model.embed_tokens.weight"] = normal(vocab, hidden, std=embed_std)
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        for name, rows in (("q_proj", heads * head_dim), ("k_proj", kv_heads * head_dim),
                           ("v_proj", kv_heads * head_dim)):
            out[p + f"self_attn.{name}.weight"] = weight(rows, hidden)
            if qkv_bias:
                out[p + f"self_attn.{name}.bias"] = bias(rows)
        out[p + "self_attn.o_proj.weight"] = weight(hidden, heads * head_dim)
        if o_bias:
            out[p + "self_attn.o_proj.bias"] = bias(hidden)
        if family == "olmo2":  # Olmo2Attention: RMSNorm over the whole q / k projection
            out[p + "self_attn.q_norm.weight"] = gain(heads * head_dim)
            out[p + "self_attn.k_norm.weight"] = gain(kv_heads * head_dim)
        for name, shape in (("gate_proj", (inter, hidden)), ("up_proj", (inter, hidden)),
                            ("down_proj", (hidden, inter))):
            out[p + f"mlp.{name}.weight"] = weight(*shape)
            if mlp_bias:
                out[p + f"mlp.{name}.bias"] = bias(shape[0])
        norms = {"olmo2": ("post_attention_layernorm", "post_feedforward_layernorm"),
                 "gemma2": ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                            "post_feedforward_layernorm")}.get(family, ("input_layernorm", "post_attention_layernorm"))
        for name in norms:
            out[p + f"{name}.weight"] = gain(hidden, gain_offset)
    out["model.norm.weight"] = gain(hidden, gain_offset)
    if not tied:
        out["lm_head.weight"] = weight(vocab, hidden)
    return out


def _gpt2_tensors(config, out, normal, weight, gain, bias, prefix, hub_buffers):
    """GPT-2 names of the hub `gpt2` repo (GPT2Model); Conv1D weights are stored (in, out)."""
    n, vocab, positions = config["n_embd"], config["vocab_size"], config["n_positions"]
    inner = config.get("n_inner") or 4 * n  # GPT2MLP: inner_dim = n_inner if not None else 4 * hidden_size
    p = prefix
    tied = config.get("tie_word_embeddings", True)
    out[p + "wte.weight"] = normal(vocab, n, std=0.4 if tied else 0.7)
    out[p + "wpe.weight"] = normal(positions, n, std=0.3)
    for i in range(config["n_layer"]):
        h = f"{p}h.{i}."
        out[h + "ln_1.weight"], out[h + "ln_1.bias"] = gain(n), bias(n)
        if hub_buffers:  # the hub gpt2 checkpoint stores the causal-mask buffer, shape (1, 1, n_positions, n_positions)
            out[h + "attn.bias"] = torch.tril(torch.ones(positions, positions, dtype=torch.float64)).view(
                1, 1, positions, positions)
        out[h + "attn.c_attn.weight"], out[h + "attn.c_attn.bias"] = weight(3 * n, n).T.contiguous(), bias(3 * n)
        out[h + "attn.c_proj.weight"], out[h + "attn.c_proj.bias"] = weight(n, n).T.contiguous(), bias(n)
        out[h + "ln_2.weight"], out[h + "ln_2.bias"] = gain(n), bias(n)
        out[h + "mlp.c_fc.weight"], out[h + "mlp.c_fc.bias"] = weight(inner, n).T.contiguous(), bias(inner)
        out[h + "mlp.c_proj.weight"], out[h + "mlp.c_proj.bias"] = weight(n, inner).T.contiguous(), bias(n)
    out[p + "ln_f.weight"], out[p + "ln_f.bias"] = gain(n), bias(n)
    if not tied:
        out["lm_head.weight"] = weight(vocab, n)
    return out


def write_tensors(directory, tensors, sharded=False, num_shards=3):
    """model.safetensors, or model-0000k-of-0000N.safetensors + model.safetensors.index.json (HF layout).

    Names are written sorted, as the official writer orders them; shards are contiguous runs of about equal bytes.
    """
    names = sorted(tensors)
    if not sharded:
        safetensors_io.save_file({k: tensors[k] for k in names}, os.path.join(directory, "model.safetensors"),
                                 metadata={"format": "pt"})
        return
    sizes = [tensors[k].numel() * tensors[k].element_size() for k in names]
    total, shards, filled = sum(sizes), [[]], 0
    for name, size in zip(names, sizes):
        if filled >= (len(shards)) * total / num_shards and len(shards) < num_shards:
            shards.append([])
        shards[-1].append(name)
        filled += size
    weight_map = {}
    for k, shard in enumerate(shards):
        file = f"model-{k + 1:05d}-of-{len(shards):05d}.safetensors"
        safetensors_io.save_file({n: tensors[n] for n in shard}, os.path.join(directory, file),
                                 metadata={"format": "pt"})
        weight_map.update({n: file for n in shard})
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    with open(os.path.join(directory, "model.safetensors.index.json"), "w") as handle:
        json.dump(index, handle, indent=2)
        handle.write("\n")


def make_checkpoint(directory, family, *, dtype="F32", tied=None, sharded=False, seed=0, layers=4, prefix=None,
                    hub_buffers=False, num_shards=3, **overrides):
    """Write config.json and the weights of a tiny random `family` model into `directory` (created if needed).

    dtype: storage dtype F32 / BF16 / F16 / F64 (weights drawn in float64, then rounded). tied: None = the family's
    HF default. overrides: config keys (e.g. attention_bias=True, mlp_bias=True, head_dim=16, rope_scaling={...},
    sliding_window=4, n_inner=48). prefix / hub_buffers: GPT-2 only ("transformer." names; `h.{i}.attn.bias` mask
    buffers as in the hub gpt2 checkpoint). Returns the config dict.
    """
    if dtype not in STORAGE_DTYPES:
        raise ValueError(f"dtype {dtype!r}: choose one of {', '.join(STORAGE_DTYPES)}")
    if (prefix or hub_buffers) and family != "gpt2":
        raise ValueError("prefix= and hub_buffers= apply to gpt2 only")
    os.makedirs(directory, exist_ok=True)
    config = make_config(family, dtype=dtype, tied=tied, layers=layers, **overrides)
    tensors = make_tensors(config, seed=seed, prefix=prefix, hub_buffers=hub_buffers)
    stored = {k: (v.to(torch.float32) if k.endswith("attn.bias") and v.dim() == 4 else v.to(STORAGE_DTYPES[dtype]))
              for k, v in tensors.items()}  # the hub's mask buffer is F32 whatever the weights are
    with open(os.path.join(directory, "config.json"), "w") as handle:
        json.dump(config, handle, indent=2)
        handle.write("\n")
    write_tensors(directory, stored, sharded=sharded, num_shards=num_shards)
    return config


# The standard set: (subdirectory, family, make_checkpoint keyword arguments). Each entry has its own seed.
STANDARD_SET = [
    ("llama-f32", "llama", {}),
    ("llama-bf16", "llama", {"dtype": "BF16"}),
    ("llama-f64", "llama", {"dtype": "F64"}),
    ("llama-tied-f32", "llama", {"tied": True}),
    ("llama-sharded-f32", "llama", {"sharded": True}),
    ("llama-bias-f32", "llama", {"attention_bias": True, "mlp_bias": True}),
    ("llama-head-dim16-f32", "llama", {"head_dim": 16}),
    ("llama-rope-llama3-f32", "llama", {"rope_scaling": LLAMA3_ROPE}),
    ("llama-rope-llama3-hd16-f32", "llama", {"rope_scaling": LLAMA3_ROPE_ALL_BRANCHES, "head_dim": 16,
                                             "rope_theta": 10000.0}),
    ("llama-rope-linear-f32", "llama", {"rope_scaling": {"rope_type": "linear", "factor": 2.0}}),
    ("mistral-f32", "mistral", {}),
    ("mistral-bf16", "mistral", {"dtype": "BF16"}),
    ("mistral-swa-f32", "mistral", {"sliding_window": 4}),
    ("qwen2-f32", "qwen2", {}),
    ("qwen2-bf16", "qwen2", {"dtype": "BF16"}),
    ("qwen2-f16", "qwen2", {"dtype": "F16"}),
    ("qwen2-tied-f32", "qwen2", {"tied": True}),
    ("qwen2-swa-f32", "qwen2", {"use_sliding_window": True, "sliding_window": 4, "max_window_layers": 2}),
    ("olmo2-f32", "olmo2", {}),
    ("olmo2-bf16", "olmo2", {"dtype": "BF16"}),
    ("gemma2-f32", "gemma2", {}),
    ("gemma2-bf16", "gemma2", {"dtype": "BF16"}),
    ("gpt2-f32", "gpt2", {}),
    ("gpt2-bf16", "gpt2", {"dtype": "BF16"}),
    ("gpt2-prefix-inner48-f32", "gpt2", {"prefix": "transformer.", "n_inner": 48}),
    ("gpt2-hub-buffers-f32", "gpt2", {"hub_buffers": True}),
    ("gpt2-untied-f32", "gpt2", {"tied": False, "prefix": "transformer."}),
]


def make_standard_set(outdir):
    """Write every STANDARD_SET entry under outdir; returns [(name, path)]."""
    made = []
    for seed, (name, family, kwargs) in enumerate(STANDARD_SET):
        path = os.path.join(outdir, name)
        make_checkpoint(path, family, seed=100 + seed, **kwargs)
        made.append((name, path))
    return made


def write_tokens(path, count=12, vocab=TINY["vocab"], seed=7):
    """A tokens file: `count` whitespace-separated ids in [0, vocab)."""
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (count,), generator=gen).tolist()
    with open(path, "w") as handle:
        handle.write(" ".join(str(i) for i in ids) + "\n")
    return ids


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("outdir", nargs="?", help="write the standard set of checkpoints here")
    parser.add_argument("--tokens", metavar="FILE", help="write a tokens file")
    parser.add_argument("--num-tokens", type=int, default=12)
    parser.add_argument("--list", action="store_true", help="list the standard set and exit")
    args = parser.parse_args(argv)
    if args.list:
        for name, family, kwargs in STANDARD_SET:
            print(f"{name:28s} {family:8s} {json.dumps(kwargs)}")
        return 0
    if not args.outdir and not args.tokens:
        parser.error("give OUTDIR and/or --tokens FILE")
    if args.outdir:
        for name, path in make_standard_set(args.outdir):
            print(path)
    if args.tokens:
        write_tokens(args.tokens, count=args.num_tokens)
        print(args.tokens)
    return 0


if __name__ == "__main__":
    sys.exit(main())
