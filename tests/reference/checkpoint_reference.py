#!/usr/bin/python3
"""Independent float64 PyTorch reference for `gradflow analyze --checkpoint DIR --tokens FILE`.

Reads config.json + safetensors itself, rebuilds the Hugging Face forward of llama / mistral / qwen2 / olmo2 /
gemma2 / gpt2 with every weight upcast to float64 and every op in float64, takes the LM loss and its backward, and
prints {"loss", "rms", "log10_grad", "angular_distance", "logits_shape"} (contract: /work/shared/spec/metrics.md,
"Trained checkpoints"). Conventions are cited to the HF source (transformers/src/transformers/...) next to the code.

    checkpoint_reference.py DIR --tokens FILE [--loss lm]
    checkpoint_reference.py --check-self        # self-test (see self_test()); exit 1 on failure
"""
import argparse
import json
import math
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import safetensors_io  # noqa: E402

DT = torch.float64
FAMILIES = ("llama", "mistral", "qwen2", "olmo2", "gemma2", "gpt2")
# Defaults of the HF config classes for keys a config.json may omit.
TIED_DEFAULT = {"llama": False, "mistral": False, "qwen2": False, "olmo2": False, "gemma2": True, "gpt2": True}


class UsageError(Exception):
    """Bad checkpoint / tokens / unsupported option: exit 2."""


# ---------------------------------------------------------------------------------------------------------------
# Checkpoint reading

def load_checkpoint(directory):
    """(config dict, {name: float64 tensor}) from an HF checkpoint directory (single file or sharded)."""
    config_path = os.path.join(directory, "config.json")
    if not os.path.isfile(config_path):
        raise UsageError(f"{directory}: no config.json")
    with open(config_path) as handle:
        config = json.load(handle)
    index_path = os.path.join(directory, "model.safetensors.index.json")
    tensors = {}
    if os.path.isfile(index_path):  # sharded: modeling_utils reads weight_map {tensor: shard file}
        with open(index_path) as handle:
            weight_map = json.load(handle)["weight_map"]
        for shard in sorted(set(weight_map.values())):
            for name, tensor in safetensors_io.load_file(os.path.join(directory, shard)).items():
                if weight_map.get(name) != shard:
                    raise UsageError(f"{shard}: tensor {name!r} is not mapped to this shard by the index")
                tensors[name] = tensor
        missing = set(weight_map) - set(tensors)
        if missing:
            raise UsageError(f"{directory}: index names tensors no shard holds: {sorted(missing)[:5]}")
    elif os.path.isfile(os.path.join(directory, "model.safetensors")):
        tensors = safetensors_io.load_file(os.path.join(directory, "model.safetensors"))
    else:
        raise UsageError(f"{directory}: neither model.safetensors nor model.safetensors.index.json")
    return config, {name: t.to(DT) for name, t in tensors.items()}


def read_tokens(path):
    with open(path) as handle:
        return [int(tok) for tok in handle.read().split()]


# ---------------------------------------------------------------------------------------------------------------
# Primitives. `Ops` follows the HF modeling code's own formulas; `AltOps` is a second, independently written
# formulation of each (used by the self-test to cross-check the whole forward).

def rotate_half(x):
    """modeling_llama.rotate_half: (x1, x2) -> (-x2, x1) on the first / second half of the last dim."""
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class Ops:
    name = "hf"

    def linear(self, x, w, b=None):  # nn.Linear: y = x W^T + b, W stored (out, in)
        y = x @ w.T
        return y if b is None else y + b

    def conv1d(self, x, w, b):  # pytorch_utils.Conv1D (GPT-2): y = x W + b, W stored (in, out)
        return x @ w + b

    def rms_norm(self, x, w, eps, offset=0.0):  # LlamaRMSNorm; Gemma2RMSNorm multiplies by (1 + w): offset 1
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * (offset + w)

    def layer_norm(self, x, w, b, eps):  # nn.LayerNorm: biased variance
        mu = x.mean(-1, keepdim=True)
        var = (x - mu).pow(2).mean(-1, keepdim=True)
        return (x - mu) / torch.sqrt(var + eps) * w + b

    def rope(self, x, inv_freq, positions):  # LlamaRotaryEmbedding + apply_rotary_pos_emb; x (heads, T, rot_dim)
        freqs = positions[:, None] * inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        return x * emb.cos() + rotate_half(x) * emb.sin()

    def causal_mask(self, T, window):  # masking_utils: causal kv <= q, sliding_window_overlay kv > q - window
        i, j = torch.arange(T)[:, None], torch.arange(T)[None, :]
        keep = j <= i
        return keep if window is None else keep & (i - j < window)

    def attention(self, q, k, v, keep, scale, softcap=None):
        """eager_attention_forward: q (H,T,d), k/v (KV,T,d); repeat_kv; scores*scale; Gemma-2 soft-cap before mask."""
        n_rep = q.shape[0] // k.shape[0]
        k = k[:, None].expand(k.shape[0], n_rep, *k.shape[1:]).reshape(q.shape[0], *k.shape[1:])  # repeat_kv
        v = v[:, None].expand(v.shape[0], n_rep, *v.shape[1:]).reshape(q.shape[0], *v.shape[1:])
        scores = (q @ k.transpose(-1, -2)) * scale
        if softcap is not None:
            scores = softcap * torch.tanh(scores / softcap)
        scores = scores.masked_fill(~keep, float("-inf"))
        return torch.softmax(scores, dim=-1) @ v

    def act(self, name, x):  # activations.ACT2FN
        if name in ("silu", "swish"):
            return F.silu(x)
        if name in ("gelu_new", "gelu_pytorch_tanh", "gelu_fast"):  # NewGELUActivation / tanh approximation
            return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x.pow(3))))
        if name == "gelu":
            return 0.5 * x * (1.0 + torch.erf(x / math.sqrt(2.0)))
        if name == "relu":
            return torch.relu(x)
        raise UsageError(f"activation {name!r} is not supported by the reference")

    def cross_entropy(self, logits, targets):  # loss_utils.ForCausalLMLoss: mean token cross-entropy
        return (torch.logsumexp(logits, dim=-1) - logits.gather(-1, targets[:, None])[:, 0]).mean()


class AltOps(Ops):
    name = "alt"

    def linear(self, x, w, b=None):
        return F.linear(x, w, b)

    def conv1d(self, x, w, b):
        return F.linear(x, w.T, b)

    def rms_norm(self, x, w, eps, offset=0.0):  # x sqrt(d) / sqrt(|x|^2 + d eps)
        d = x.shape[-1]
        return x * math.sqrt(d) / torch.sqrt(torch.linalg.vector_norm(x, dim=-1, keepdim=True) ** 2 + d * eps) * (
            w + offset)

    def layer_norm(self, x, w, b, eps):
        return F.layer_norm(x, (x.shape[-1],), w, b, eps)

    def rope(self, x, inv_freq, positions):  # complex rotation of the pairs (x_k, x_{k + d/2})
        half = x.shape[-1] // 2
        z = torch.complex(x[..., :half], x[..., half:])
        angle = positions[:, None] * inv_freq[None, :]
        z = z * torch.polar(torch.ones_like(angle), angle)
        return torch.cat((z.real, z.imag), dim=-1)

    def causal_mask(self, T, window):  # the older HF form: triu for the future, tril(diagonal=-window) for the far past
        ones = torch.ones(T, T, dtype=torch.bool)
        masked = torch.triu(ones, diagonal=1)
        if window is not None:
            masked = masked | torch.tril(ones, diagonal=-window)
        return ~masked

    def attention(self, q, k, v, keep, scale, softcap=None):  # per head, per query: only the allowed keys
        n_rep = q.shape[0] // k.shape[0]
        heads = []
        for h in range(q.shape[0]):
            rows = []
            for i in range(q.shape[1]):
                js = torch.nonzero(keep[i])[:, 0]
                s = (k[h // n_rep, js] @ q[h, i]) * scale
                if softcap is not None:
                    s = torch.tanh(s / softcap) * softcap
                p = torch.exp(s - s.max())
                rows.append((p / p.sum()) @ v[h // n_rep, js])
            heads.append(torch.stack(rows))
        return torch.stack(heads)

    def act(self, name, x):
        if name in ("silu", "swish"):
            return x / (1.0 + torch.exp(-x))
        if name in ("gelu_new", "gelu_pytorch_tanh", "gelu_fast"):
            return F.gelu(x, approximate="tanh")
        if name == "gelu":
            return F.gelu(x)
        return super().act(name, x)

    def cross_entropy(self, logits, targets):
        return F.cross_entropy(logits, targets)


OPS, ALT_OPS = Ops(), AltOps()


# ---------------------------------------------------------------------------------------------------------------
# RoPE frequencies (modeling_rope_utils.py)

def rope_parameters(config):
    """(theta, rope scaling dict or {}) from the v4 keys (rope_theta, rope_scaling) or v5's rope_parameters."""
    params = config.get("rope_parameters") or {}
    scaling = dict(config.get("rope_scaling") or params)
    theta = config.get("rope_theta", params.get("rope_theta", 10000.0))
    return float(theta), scaling


def inv_freq_for(config, rot_dim, seq_len):
    """_compute_default_rope_parameters: 1 / theta^(arange(0, dim, 2) / dim), then the rope_type's adjustment."""
    theta, scaling = rope_parameters(config)
    inv_freq = 1.0 / theta ** (torch.arange(0, rot_dim, 2, dtype=DT) / rot_dim)
    rope_type = scaling.get("rope_type", scaling.get("type", "default"))
    if rope_type == "default":
        return inv_freq
    if rope_type == "linear":  # _compute_linear_scaling_rope_parameters: inv_freq / factor == positions / factor
        return inv_freq / scaling["factor"]
    if rope_type == "dynamic" and seq_len <= config["max_position_embeddings"]:
        return inv_freq  # _compute_dynamic_ntk_parameters changes nothing up to max_position_embeddings
    if rope_type == "llama3":  # _compute_llama3_parameters
        factor, low, high = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
        old_context = scaling["original_max_position_embeddings"]
        low_freq_wavelen, high_freq_wavelen = old_context / low, old_context / high
        wavelen = 2 * math.pi / inv_freq
        scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
        smooth = (old_context / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = ~(wavelen < high_freq_wavelen) & ~(wavelen > low_freq_wavelen)
        return torch.where(medium, smoothed, scaled)
    raise UsageError(f"rope_type {rope_type!r} is not supported by the reference")


# ---------------------------------------------------------------------------------------------------------------
# The model: embed(ids) -> x_0, sublayer(k, x_k) -> x_{k+1} (k = 2i attention, 2i+1 MLP of layer i), logits(x_S)

class Model:
    def __init__(self, config, tensors, ops=OPS, seq_len=None):
        self.family = config.get("model_type")
        if self.family not in FAMILIES:
            raise UsageError(f"model_type {self.family!r} is not supported; one of {', '.join(FAMILIES)}")
        self.config, self.w, self.ops = config, tensors, ops
        self.tied = config.get("tie_word_embeddings", TIED_DEFAULT[self.family])
        (self._init_gpt2 if self.family == "gpt2" else self._init_decoder)(seq_len)

    def get(self, name, required=True):
        if name not in self.w:
            if required:
                raise UsageError(f"checkpoint lacks tensor {name!r}")
            return None
        return self.w[name]

    # -- Llama-like decoders ------------------------------------------------------------------------------------
    def _init_decoder(self, seq_len):
        c, fam = self.config, self.family
        self.num_layers = c["num_hidden_layers"]
        self.hidden, self.heads = c["hidden_size"], c["num_attention_heads"]
        self.kv_heads = c.get("num_key_value_heads") or self.heads
        # head_dim from the config when present (LlamaAttention: getattr(config, "head_dim", None) or hidden // heads;
        # Gemma2Config's default is 256)
        self.head_dim = c.get("head_dim") or (256 if fam == "gemma2" else self.hidden // self.heads)
        self.eps = c["rms_norm_eps"]
        self.norm_offset = 1.0 if fam == "gemma2" else 0.0  # Gemma2RMSNorm: output * (1.0 + weight)
        self.rot_dim = int(self.head_dim * c.get("partial_rotary_factor", 1.0))
        self.inv_freq = inv_freq_for(c, self.rot_dim, seq_len or c["max_position_embeddings"])
        # Gemma2Attention: scaling = query_pre_attn_scalar ** -0.5; others head_dim ** -0.5
        self.scale = (c.get("query_pre_attn_scalar", 256) if fam == "gemma2" else self.head_dim) ** -0.5
        self.softcap = c.get("attn_logit_softcapping") if fam == "gemma2" else None
        self.final_softcap = c.get("final_logit_softcapping") if fam == "gemma2" else None
        self.act_name = c.get("hidden_act", "silu")
        if fam == "gemma2":  # Gemma2MLP: ACT2FN[config.hidden_activation]
            self.act_name = c.get("hidden_activation") or self.act_name
        self.windows = self._layer_windows()
        attn_bias = bool(c.get("attention_bias", False)) and fam in ("llama", "olmo2", "gemma2")
        self.qkv_bias = attn_bias or fam == "qwen2"  # Qwen2Attention: q/k/v bias=True, o_proj bias=False
        self.o_bias = attn_bias
        self.mlp_bias = fam == "llama" and bool(c.get("mlp_bias", False))  # LlamaMLP: bias=config.mlp_bias

    def _layer_windows(self):
        """Sliding window (None = full causal) of each layer, as the HF config's layer_types resolve it."""
        c, n = self.config, self.num_layers
        types = c.get("layer_types")
        if self.family == "gemma2":  # configuration_gemma2: sliding if bool((i + 1) % 2), i.e. even layer indices
            window = c.get("sliding_window", 4096)
            types = types or ["sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(n)]
        elif self.family == "mistral":  # MistralModel: sliding-window mask on every layer when sliding_window is set
            window = c.get("sliding_window")
            types = types or ["sliding_attention"] * n
        elif self.family == "qwen2":  # configuration_qwen2: if use_sliding_window, on layers >= max_window_layers
            window = c.get("sliding_window") if c.get("use_sliding_window", False) else None
            types = types or ["sliding_attention" if i >= c.get("max_window_layers", 28) else "full_attention"
                              for i in range(n)]
        else:
            return [None] * n
        return [window if window is not None and t == "sliding_attention" else None for t in types]

    def _rms(self, x, name):
        return self.ops.rms_norm(x, self.get(name), self.eps, self.norm_offset)

    def _attention(self, i, h):
        """LlamaAttention.forward (+ Qwen2 biases, Olmo2 q/k norms, Gemma2 scaling / soft-cap / window)."""
        o, p, T = self.ops, f"model.layers.{i}.self_attn.", h.shape[0]
        q, k, v = (o.linear(h, self.get(p + f"{n}_proj.weight"),
                            self.get(p + f"{n}_proj.bias") if self.qkv_bias else None) for n in "qkv")
        if self.family == "olmo2":  # Olmo2Attention: q_norm / k_norm over the whole projection, before the head split
            q = o.rms_norm(q, self.get(p + "q_norm.weight"), self.eps)
            k = o.rms_norm(k, self.get(p + "k_norm.weight"), self.eps)
        q = q.view(T, self.heads, self.head_dim).transpose(0, 1)  # (H, T, d)
        k = k.view(T, self.kv_heads, self.head_dim).transpose(0, 1)  # (KV, T, d)
        v = v.view(T, self.kv_heads, self.head_dim).transpose(0, 1)
        positions, r = torch.arange(T, dtype=DT), self.rot_dim
        q = torch.cat((o.rope(q[..., :r], self.inv_freq, positions), q[..., r:]), dim=-1)
        k = torch.cat((o.rope(k[..., :r], self.inv_freq, positions), k[..., r:]), dim=-1)
        out = o.attention(q, k, v, o.causal_mask(T, self.windows[i]), self.scale, self.softcap)
        out = out.transpose(0, 1).reshape(T, self.heads * self.head_dim)
        return o.linear(out, self.get(p + "o_proj.weight"), self.get(p + "o_proj.bias") if self.o_bias else None)

    def _mlp(self, i, h):  # LlamaMLP / Gemma2MLP: down(act(gate(x)) * up(x))
        o, p = self.ops, f"model.layers.{i}.mlp."
        b = (lambda n: self.get(p + n + ".bias")) if self.mlp_bias else (lambda n: None)
        gate = o.linear(h, self.get(p + "gate_proj.weight"), b("gate_proj"))
        up = o.linear(h, self.get(p + "up_proj.weight"), b("up_proj"))
        return o.linear(o.act(self.act_name, gate) * up, self.get(p + "down_proj.weight"), b("down_proj"))

    def _decoder_sublayer(self, k, x):
        """LlamaDecoderLayer / Olmo2DecoderLayer / Gemma2DecoderLayer residual structure."""
        i, p = k // 2, f"model.layers.{k // 2}."
        branch = self._attention if k % 2 == 0 else self._mlp
        if self.family == "olmo2":  # no input norms; post_attention / post_feedforward norm on the branch output
            return x + self._rms(branch(i, x), p + ("post_attention_layernorm" if k % 2 == 0
                                                    else "post_feedforward_layernorm") + ".weight")
        if self.family == "gemma2":  # pre norm and post norm around each branch
            pre, post = (("input_layernorm", "post_attention_layernorm") if k % 2 == 0
                         else ("pre_feedforward_layernorm", "post_feedforward_layernorm"))
            return x + self._rms(branch(i, self._rms(x, p + pre + ".weight")), p + post + ".weight")
        pre = "input_layernorm" if k % 2 == 0 else "post_attention_layernorm"
        return x + branch(i, self._rms(x, p + pre + ".weight"))

    # -- GPT-2 (modeling_gpt2.py) ---------------------------------------------------------------------------------
    def _init_gpt2(self, seq_len):
        c = self.config
        self.prefix = "transformer." if "transformer.wte.weight" in self.w else ""
        self.num_layers, self.hidden, self.heads = c["n_layer"], c["n_embd"], c["n_head"]
        self.head_dim = self.hidden // self.heads
        self.eps = c.get("layer_norm_epsilon", 1e-5)
        self.act_name = c.get("activation_function", "gelu_new")

    def _gpt2_sublayer(self, k, x):
        o, i, T, n = self.ops, k // 2, x.shape[0], self.hidden
        p = f"{self.prefix}h.{i}."
        ln = (lambda name: o.layer_norm(x, self.get(p + name + ".weight"), self.get(p + name + ".bias"), self.eps))
        conv = (lambda h, name: o.conv1d(h, self.get(p + name + ".weight"), self.get(p + name + ".bias")))
        if k % 2 == 1:  # GPT2MLP: c_proj(act(c_fc(x)))
            return x + conv(o.act(self.act_name, conv(ln("ln_2"), "mlp.c_fc")), "mlp.c_proj")
        qkv = conv(ln("ln_1"), "attn.c_attn")  # GPT2Attention: c_attn(x).split(embed_dim, dim=2) -> q, k, v
        q, kk, v = (t.view(T, self.heads, self.head_dim).transpose(0, 1) for t in qkv.split(n, dim=-1))
        scale = 1.0 / math.sqrt(self.head_dim) if self.config.get("scale_attn_weights", True) else 1.0
        if self.config.get("scale_attn_by_inverse_layer_idx", False):
            scale /= i + 1
        out = o.attention(q, kk, v, o.causal_mask(T, None), scale)
        return x + conv(out.transpose(0, 1).reshape(T, n), "attn.c_proj")

    # -- common ---------------------------------------------------------------------------------------------------
    @property
    def num_sublayers(self):
        return 2 * self.num_layers

    def embed(self, ids):
        if self.family == "gpt2":  # GPT2Model: inputs_embeds + wpe(position_ids)
            return self.get(self.prefix + "wte.weight")[ids] + self.get(self.prefix + "wpe.weight")[:len(ids)]
        x = self.get("model.embed_tokens.weight")[ids]
        if self.family == "gemma2":  # Gemma2Model: hidden_states * hidden_size**0.5 (exact here, float64)
            x = x * math.sqrt(self.hidden)
        return x

    def sublayer(self, k, x):
        return (self._gpt2_sublayer if self.family == "gpt2" else self._decoder_sublayer)(k, x)

    def logits(self, x):
        o = self.ops
        if self.family == "gpt2":
            h = o.layer_norm(x, self.get(self.prefix + "ln_f.weight"), self.get(self.prefix + "ln_f.bias"), self.eps)
            embedding = self.get(self.prefix + "wte.weight")
        else:
            h = self._rms(x, "model.norm.weight")
            embedding = self.get("model.embed_tokens.weight")
        head = embedding if self.tied else self.get("lm_head.weight")  # tie_word_embeddings: lm_head is the embedding
        logits = o.linear(h, head)
        if self.family == "gemma2" and self.final_softcap is not None:  # Gemma2ForCausalLM.forward
            logits = self.final_softcap * torch.tanh(logits / self.final_softcap)
        return logits

    def loss_from(self, start, x, ids):
        """L as a function of the state x_start (used by finite differences)."""
        for k in range(start, self.num_sublayers):
            x = self.sublayer(k, x)
        return self.ops.cross_entropy(self.logits(x)[:-1], ids[1:])


def analyze(config, tensors, ids, ops=OPS, keep_states=False):
    """The contract's figures for token ids `ids` (list of ints); states and grads kept on request."""
    vocab = config["vocab_size"]
    if len(ids) < 2:
        raise UsageError("the LM loss needs at least 2 tokens")
    if not all(0 <= t < vocab for t in ids):
        raise UsageError(f"token ids must be in [0, {vocab})")
    ids = torch.tensor(ids, dtype=torch.long)
    model = Model(config, tensors, ops, seq_len=len(ids))
    x = model.embed(ids).detach().requires_grad_(True)  # x_0: the leaf the first layer consumes
    states = [x]
    for k in range(model.num_sublayers):
        x = model.sublayer(k, x)
        x.retain_grad()  # x_{k+1} is consumed whole by the next sublayer (residual and branch)
        states.append(x)
    logits = model.logits(x)
    loss = ops.cross_entropy(logits[:-1], ids[1:])  # mean over t = 0..T-2 of CE(logits_t, id_{t+1})
    loss.backward()
    grad_norms = [s.grad.norm().item() for s in states]
    result = {
        "loss": loss.item(),
        "rms": [s.detach().pow(2).mean().sqrt().item() for s in states],
        "log10_grad": [math.log10(g) if g > 0 else float("-inf") for g in grad_norms],
        "angular_distance": [],
        "logits_shape": list(logits.shape),
    }
    for i in range(model.num_layers):  # Gromov et al. 2024: arccos(cos(x_2i[T-1], x_2i+2[T-1])) / pi
        a, b = states[2 * i][-1].detach(), states[2 * i + 2][-1].detach()
        cos = (a @ b / (a.norm() * b.norm())).clamp(-1.0, 1.0)
        result["angular_distance"].append(math.acos(cos.item()) / math.pi)
    if keep_states:
        result["_states"] = [s.detach() for s in states]
        result["_grads"] = [s.grad.detach() for s in states]
        result["_model"], result["_ids"], result["_logits"] = model, ids, logits.detach()
    return result


# ---------------------------------------------------------------------------------------------------------------
# Self-test (--check-self): tiny checkpoints of every family, a second formulation of every primitive, finite
# differences of L with respect to the states, and checks that each family feature changes the result.

def figure_errors(a, b):
    """Worst relative error per figure (log10_grad compared as norms, angular distance absolute)."""
    rel = lambda x, y: abs(x - y) / max(abs(x), abs(y), 1e-300)  # noqa: E731
    return {"loss": rel(a["loss"], b["loss"]),
            "rms": max(rel(x, y) for x, y in zip(a["rms"], b["rms"])),
            "log10_grad": max(abs(10 ** (x - y) - 1) for x, y in zip(a["log10_grad"], b["log10_grad"])),
            "angular_distance": max(abs(x - y) for x, y in zip(a["angular_distance"], b["angular_distance"]))}


def meta_llama3_inv_freq(inv_freq, scaling):
    """meta-llama/llama-models apply_scaling, element by element (the formula HF's _compute_llama3_parameters ports)."""
    factor, low, high = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
    old = scaling["original_max_position_embeddings"]
    out, branches = [], set()
    for freq in inv_freq.tolist():
        wavelen = 2 * math.pi / freq
        if wavelen < old / high:
            out.append(freq), branches.add("kept")
        elif wavelen > old / low:
            out.append(freq / factor), branches.add("divided")
        else:
            smooth = (old / wavelen - low) / (high - low)
            out.append((1 - smooth) * freq / factor + smooth * freq), branches.add("smoothed")
    return torch.tensor(out, dtype=DT), branches


def self_test():
    import tempfile
    import make_checkpoints as mc
    passed, failed = [], []

    def check(name, ok, detail=""):
        (passed if ok else failed).append(name)
        print(f"{'ok  ' if ok else 'FAIL'} {name}" + (f"  ({detail})" if detail else ""))

    with tempfile.TemporaryDirectory() as tmp:
        ids = mc.write_tokens(os.path.join(tmp, "tokens.txt"))
        made = dict(mc.make_standard_set(tmp))

        # safetensors: round trip of every dtype, the padded header, contiguous offsets in the given order
        gen = torch.Generator().manual_seed(3)
        sample = {"b": torch.randn(3, 5, generator=gen).to(torch.bfloat16), "a": torch.randn(7, generator=gen),
                  "h": torch.randn(2, 2, generator=gen).half(), "d": torch.randn(1, 3, generator=gen, dtype=DT),
                  "s": torch.tensor(2.5)}
        path = os.path.join(tmp, "t.safetensors")
        safetensors_io.save_file(sample, path, metadata={"format": "pt"})
        back, meta = safetensors_io.load_file(path, with_metadata=True)
        header, data_start = safetensors_io.read_header(path)
        offsets = [header[k]["data_offsets"] for k in sample]
        check("safetensors round trip (BF16/F32/F16/F64/scalar, metadata, header order)",
              list(back) == list(sample) and meta == {"format": "pt"} and data_start % 8 == 0
              and all(back[k].dtype == v.dtype and torch.equal(back[k], v) for k, v in sample.items())
              and offsets[0][0] == 0 and all(offsets[i][1] == offsets[i + 1][0] for i in range(len(offsets) - 1)))

        # primitives against a second formulation
        x = torch.randn(5, 12, generator=gen, dtype=DT)
        w = 1 + 0.2 * torch.randn(12, generator=gen, dtype=DT)
        b = 0.1 * torch.randn(12, generator=gen, dtype=DT)
        direct = x / torch.sqrt((x * x).sum(-1, keepdim=True) / 12 + 1e-5) * w
        check("rms_norm vs direct formula and AltOps", torch.allclose(OPS.rms_norm(x, w, 1e-5), direct, 0, 1e-14)
              and torch.allclose(ALT_OPS.rms_norm(x, w, 1e-5, 1.0), OPS.rms_norm(x, w, 1e-5, 1.0), 0, 1e-14))
        check("layer_norm vs F.layer_norm", torch.allclose(OPS.layer_norm(x, w, b, 1e-5),
                                                           ALT_OPS.layer_norm(x, w, b, 1e-5), 0, 1e-14))
        check("gelu tanh vs F.gelu(approximate='tanh'); silu vs x*sigmoid(x)",
              torch.allclose(OPS.act("gelu_new", x), ALT_OPS.act("gelu_new", x), 0, 1e-15)
              and torch.allclose(OPS.act("silu", x), ALT_OPS.act("silu", x), 0, 1e-15))
        masks_ok = all(torch.equal(OPS.causal_mask(9, win), ALT_OPS.causal_mask(9, win)) for win in (None, 1, 3, 5))
        check("sliding-window mask: j <= i and i - j < window (== HF tril(diagonal=-window) form)",
              masks_ok and torch.nonzero(OPS.causal_mask(9, 3)[5])[:, 0].tolist() == [3, 4, 5])
        pos = torch.arange(6, dtype=DT)
        freq = inv_freq_for({"rope_theta": 10000.0}, 8, 6)
        q, k = torch.randn(2, 6, 8, generator=gen, dtype=DT), torch.randn(2, 6, 8, generator=gen, dtype=DT)
        rq, rk = OPS.rope(q, freq, pos), OPS.rope(k, freq, pos)
        shifted = (OPS.rope(q[:, :3], freq, pos[:3] + 2) * OPS.rope(k[:, :3], freq, pos[:3] + 2)).sum(-1)
        check("rope: rotate_half == complex rotation; norm-preserving; dot products depend on p - p' only",
              torch.allclose(rq, ALT_OPS.rope(q, freq, pos), 0, 1e-14)
              and torch.allclose(rq.norm(dim=-1), q.norm(dim=-1), 0, 1e-13)
              and torch.allclose((rq[:, :3] * rk[:, :3]).sum(-1), shifted, 0, 1e-12))
        for name, scaling, want in (("llama3", mc.LLAMA3_ROPE, {"divided", "smoothed"}),
                                    ("llama3 all branches", mc.LLAMA3_ROPE_ALL_BRANCHES,
                                     {"kept", "divided", "smoothed"})):
            dim = 16 if want == {"kept", "divided", "smoothed"} else 8
            base = inv_freq_for({"rope_theta": 10000.0}, dim, 12)
            ours = inv_freq_for({"rope_theta": 10000.0, "rope_scaling": scaling}, dim, 12)
            theirs, branches = meta_llama3_inv_freq(base, scaling)
            check(f"{name} inv_freq vs Meta's apply_scaling loop (branches {sorted(branches)})",
                  torch.allclose(ours, theirs, 0, 1e-15) and branches == want)

        # every family: the whole forward in both formulations; finite differences of L w.r.t. states
        for name in ("llama-f32", "llama-bias-f32", "llama-head-dim16-f32", "llama-rope-llama3-f32",
                     "mistral-swa-f32", "qwen2-f32", "qwen2-swa-f32", "olmo2-f32", "gemma2-f32", "gpt2-f32",
                     "gpt2-prefix-inner48-f32", "llama-tied-f32"):
            config, tensors = load_checkpoint(made[name])
            ref = analyze(config, tensors, ids, OPS, keep_states=True)
            alt = analyze(config, tensors, ids, ALT_OPS, keep_states=True)
            errors = figure_errors(ref, alt)
            check(f"{name}: forward + backward == second formulation (AltOps) to 1e-12",
                  max(errors.values()) < 1e-12 and torch.allclose(ref["_logits"], alt["_logits"], 0, 1e-12)
                  and all(s.dtype == DT for s in ref["_states"]),
                  ", ".join(f"{k} {v:.1e}" for k, v in errors.items()))
            model, tids = ref["_model"], ref["_ids"]
            S = model.num_sublayers
            plain = name.count("-") == 1  # the family's plain checkpoint: x_0 and x_{S-1}; variants: the middle
            for l in (0, S - 1) if plain else (S // 2,):
                base, step = ref["_states"][l], 1e-5
                fd = torch.zeros_like(base)
                with torch.no_grad():
                    for idx in range(base.numel()):
                        e = torch.zeros(base.numel(), dtype=DT)
                        e[idx] = step
                        e = e.view_as(base)
                        fd.view(-1)[idx] = (model.loss_from(l, base + e, tids)
                                            - model.loss_from(l, base - e, tids)) / (2 * step)
                norm_err = abs(fd.norm().item() / 10 ** ref["log10_grad"][l] - 1)
                entry_err = ((fd - ref["_grads"][l]).abs().max() / ref["_grads"][l].abs().max()).item()
                check(f"{name}: ||dL/dx_{l}|| == central differences (all {base.numel()} entries)",
                      norm_err < 1e-7 and entry_err < 1e-6, f"norm {norm_err:.1e}, entries {entry_err:.1e}")
            if name == "llama-f32":
                logits = ref["_logits"]
                check("llama loss == F.cross_entropy(logits[:-1], ids[1:])",
                      abs(F.cross_entropy(logits[:-1], tids[1:]).item() - ref["loss"]) < 1e-14 * ref["loss"])

        # each family feature changes the figures (so the checkpoints exercise it)
        def changes(name, **edits):
            config, tensors = load_checkpoint(made[name])
            base = analyze(config, tensors, ids)["loss"]
            config = dict(config, **{k: v for k, v in edits.items() if k not in ("zero", "ones")})
            for key in edits.get("zero", ()):
                tensors = {n: (torch.zeros_like(t) if key in n else t) for n, t in tensors.items()}
            for key in edits.get("ones", ()):
                tensors = {n: (torch.ones_like(t) if key in n else t) for n, t in tensors.items()}
            return abs(analyze(config, tensors, ids)["loss"] - base) > 1e-6 * abs(base)
        for name, edits in (("gemma2-f32", {"sliding_window": None}), ("gemma2-f32", {"attn_logit_softcapping": None}),
                            ("gemma2-f32", {"final_logit_softcapping": None}),
                            ("gemma2-f32", {"query_pre_attn_scalar": 8}),
                            ("gemma2-f32", {"layer_types": ["full_attention", "sliding_attention"] * 2}),
                            ("llama-rope-llama3-f32", {"rope_scaling": None}),
                            ("llama-rope-llama3-hd16-f32", {"rope_scaling": None}),
                            ("llama-rope-linear-f32", {"rope_scaling": None}),
                            ("mistral-swa-f32", {"sliding_window": None}),
                            ("qwen2-swa-f32", {"use_sliding_window": False}),
                            ("qwen2-swa-f32", {"max_window_layers": 3}),
                            ("qwen2-f32", {"zero": ("k_proj.bias",)}), ("llama-bias-f32", {"zero": ("o_proj.bias",)}),
                            ("llama-bias-f32", {"zero": ("up_proj.bias",)}), ("olmo2-f32", {"ones": ("q_norm",)}),
                            ("gemma2-f32", {"zero": ("layernorm",)}), ("gpt2-f32", {"zero": ("wpe",)})):
            check(f"{name}: changing {edits} changes the loss", changes(name, **edits))

        # storage variants: same seed, same numbers
        def same(name_a, path_b, exact=True):
            (ca, ta), (cb, tb) = load_checkpoint(made[name_a]), load_checkpoint(path_b)
            ra, rb = analyze(ca, ta, ids), analyze(cb, tb, ids)
            return (ra == rb) if exact else max(figure_errors(ra, rb).values()) < 1e-13
        seed = 100 + [n for n, _, _ in mc.STANDARD_SET].index("llama-sharded-f32")
        mc.make_checkpoint(os.path.join(tmp, "single"), "llama", seed=seed)
        check("sharded checkpoint == single-file checkpoint of the same weights",
              same("llama-sharded-f32", os.path.join(tmp, "single")))
        seed = 100 + [n for n, _, _ in mc.STANDARD_SET].index("gpt2-hub-buffers-f32")
        mc.make_checkpoint(os.path.join(tmp, "nobuf"), "gpt2", seed=seed)
        mc.make_checkpoint(os.path.join(tmp, "prefixed"), "gpt2", seed=seed, prefix="transformer.")
        check("gpt2: h.{i}.attn.bias buffers are ignored; the transformer. prefix is read",
              same("gpt2-hub-buffers-f32", os.path.join(tmp, "nobuf"))
              and same("gpt2-hub-buffers-f32", os.path.join(tmp, "prefixed")))
        for dtype, torch_dtype in (("BF16", torch.bfloat16), ("F16", torch.float16)):
            mc.make_checkpoint(os.path.join(tmp, dtype), "qwen2", seed=5, dtype=dtype)
            mc.make_checkpoint(os.path.join(tmp, dtype + "-f64"), "qwen2", seed=5, dtype="F64")
            low = load_checkpoint(os.path.join(tmp, dtype))[1]
            high = load_checkpoint(os.path.join(tmp, dtype + "-f64"))[1]
            check(f"{dtype} checkpoint == the float64 weights rounded to {dtype}, upcast exactly",
                  all(torch.equal(low[n], high[n].to(torch_dtype).to(DT)) for n in high))
        tied_names = set(load_checkpoint(made["llama-tied-f32"])[1])
        check("tied llama has no lm_head.weight; gemma2 / gpt2 tied by default",
              "lm_head.weight" not in tied_names and "lm_head.weight" not in load_checkpoint(made["gemma2-f32"])[1]
              and "lm_head.weight" in load_checkpoint(made["llama-f32"])[1])

    print(f"{len(passed)} passed, {len(failed)} failed")
    return 1 if failed else 0


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkpoint", nargs="?", help="HF checkpoint directory (config.json + safetensors)")
    parser.add_argument("--tokens", help="file of whitespace-separated token ids")
    parser.add_argument("--loss", default="lm", choices=["lm"])
    parser.add_argument("--check-self", action="store_true", help="run the self-test")
    args = parser.parse_args(argv)
    if args.check_self:
        return self_test()
    if not args.checkpoint or not args.tokens:
        parser.error("give DIR and --tokens FILE (or --check-self)")
    try:
        config, tensors = load_checkpoint(args.checkpoint)
        result = analyze(config, tensors, read_tokens(args.tokens))
    except (UsageError, OSError, KeyError, ValueError) as err:
        print(f"checkpoint_reference: {err}", file=sys.stderr)
        return 2
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
