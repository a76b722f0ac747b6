#!/usr/bin/python3
"""Independent PyTorch (float64) reference for gradflow's per-state / per-sublayer figures.

Written from /work/shared/spec/architectures.md, /work/shared/spec/metrics.md and
/work/contract/CONTRACT.md only (never from the C++ sources).  Citations in comments:
  [A]  architectures.md      [M]  metrics.md      [C]  CONTRACT.md
The mixture-of-experts FFN (--ffn moe) follows HF transformers' MixtralSparseMoeBlock, OlmoeSparseMoeBlock and
Qwen2MoeSparseMoeBlock (see moe_ffn).

Usage:
  /usr/bin/python3 gradflow_reference.py FILE.safetensors [-o OUT.json]
      [--wrong-variant keel-alpha-on-branch] [--qk-norm rms|follow] [--lns-index block|sublayer]
      [--constants config|spec]

Input: a safetensors file as written by `gradflow analyze --export-weights` ([C] "Export").
Output: JSON {"arch", "config", "constants", "constant_notes", "states": {...}, "sublayers": {...}}.
"""
import argparse
import json
import math
import struct
import sys

import numpy as np
import torch

torch.set_default_dtype(torch.float64)

EPS = 1e-6  # [C] "eps = 1e-6 for all norms"

# ----------------------------------------------------------------------------------------------
# safetensors I/O (format: u64 little-endian header length, JSON header, raw little-endian bytes)
# ----------------------------------------------------------------------------------------------
_DTYPES = {"F64": np.dtype("<f8"), "F32": np.dtype("<f4"), "F16": np.dtype("<f2"),
           "I64": np.dtype("<i8"), "I32": np.dtype("<i4")}


def read_safetensors(path):
    """Return (tensors: dict name -> np.ndarray, metadata: dict str -> str)."""
    with open(path, "rb") as f:
        raw = f.read()
    if len(raw) < 8:
        raise ValueError(f"{path}: too short for a safetensors file")
    (hlen,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + hlen].decode("utf-8"))
    data = raw[8 + hlen:]
    meta = header.pop("__metadata__", {}) or {}
    tensors = {}
    for name, info in header.items():
        dt = _DTYPES[info["dtype"]]
        start, end = info["data_offsets"]
        shape = tuple(info["shape"])
        arr = np.frombuffer(data[start:end], dtype=dt)
        if arr.size != int(np.prod(shape, dtype=np.int64)):
            raise ValueError(f"{path}: tensor {name} has {arr.size} elements, shape {shape}")
        tensors[name] = arr.reshape(shape).astype(np.float64)
    return tensors, meta


def write_safetensors(path, tensors, metadata=None, dtype="F64"):
    """Minimal writer (used by the self-tests to make synthetic exports)."""
    dt = _DTYPES[dtype]
    header, blobs, off = {}, [], 0
    for name in sorted(tensors):
        arr = np.ascontiguousarray(np.asarray(tensors[name], dtype=dt))
        b = arr.tobytes()
        header[name] = {"dtype": dtype, "shape": list(arr.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    if metadata is not None:
        header["__metadata__"] = {k: str(v) for k, v in metadata.items()}
    h = json.dumps(header).encode("utf-8")
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


# ----------------------------------------------------------------------------------------------
# Elementary ops (all per token = per row, [C] "Norms act per token (per row)")
# ----------------------------------------------------------------------------------------------
def rms_norm(x, eps=EPS):
    # [C] RMSNorm y = x / sqrt(mean_j x_j^2 + eps), gamma = 1, no bias; eps: --norm-eps (issue 19)
    return x / torch.sqrt((x * x).mean(dim=-1, keepdim=True) + eps)


def layer_norm(x, eps=EPS):
    # [C] LayerNorm y = (x - mean) / sqrt(var + eps) (biased var), gamma = 1, no bias
    mu = x.mean(dim=-1, keepdim=True)
    xc = x - mu
    var = (xc * xc).mean(dim=-1, keepdim=True)
    return xc / torch.sqrt(var + eps)


def dyt(x, eps=None):  # DyT has no epsilon
    # [C] DyT y = tanh(0.5 * x); [A] "gamma tanh(a x), a = 0.5" (Zhu et al. 2025)
    return torch.tanh(0.5 * x)


NORMS = {"rms": rms_norm, "layer": layer_norm, "dyt": dyt}


def unit(v):
    # [A] nGPT: U(v) = v / norm(v) per token (no eps is specified for U)
    return v / torch.sqrt((v * v).sum(dim=-1, keepdim=True))


def gelu(x):
    # [C] GELU erf form: 0.5 x (1 + erf(x / sqrt 2))
    return 0.5 * x * (1.0 + torch.erf(x / math.sqrt(2.0)))


def linear(x, W, name, bias):
    # x @ W plus the bias b_<name> when the export has one (issue 19's --bias)
    out = x @ W["W_" + name]
    return out + W["b_" + name] if bias and ("b_" + name) in W else out


def ffn(x, W, hidden_scale=1.0, kind="gelu"):
    # [C] FFN(x) = gelu(x @ W_1) @ W_2, hidden 4d, no biases; [A] ngpt: "the FFN's hidden
    # pre-activation is scaled by s_uv = sqrt(d) at init" -> gelu(s_uv * (x @ W_1)) @ W_2
    # Issue 19: Shazeer 2020 (arXiv 2002.05202) Eq. 6: FFN_SwiGLU = (Swish_1(x W) * x V) W_2,
    # FFN_GEGLU = (GELU(x W) * x V) W_2 with W = W_1, V = W_3, torch's own SiLU and GELU; optional biases.
    # --ffn moe (kind "moe", or weights with a router): moe_ffn below, the kind's own router settings.
    if kind == "moe" or "W_router" in W:
        return moe_ffn(x, W, kind if isinstance(kind, MoeKind) else MoeKind(), hidden_scale)
    # gelu_tanh, geglu_tanh: GELU's tanh approximation, torch's own (F.gelu(approximate="tanh")).
    up = hidden_scale * linear(x, W, "1", True)
    if kind == "gelu":
        hidden = gelu(up)
    elif kind == "gelu_tanh":
        hidden = torch.nn.functional.gelu(up, approximate="tanh")
    else:
        act = {"swiglu": torch.nn.functional.silu, "geglu": torch.nn.functional.gelu,
               "geglu_tanh": lambda v: torch.nn.functional.gelu(v, approximate="tanh")}[kind]
        hidden = act(up) * (hidden_scale * linear(x, W, "3", True))
    return linear(hidden, W, "2", True)


# ----------------------------------------------------------------------------------------------
# Mixture-of-experts FFN (--ffn moe): Mixtral / OLMoE / Qwen-MoE, as HF transformers' MixtralSparseMoeBlock,
# OlmoeSparseMoeBlock and Qwen2MoeSparseMoeBlock compute it (modeling_mixtral.py, modeling_olmoe.py,
# modeling_qwen2_moe.py): router_logits = gate(x); routing_weights = softmax(router_logits); top-k of
# routing_weights; if norm_topk_prob (Mixtral always): routing_weights /= their sum over the top k; every
# selected expert's MLP output times its weight, summed; Qwen2-MoE adds
# sigmoid(shared_expert_gate(x)) * shared_expert(x).  Experts are SwiGLU (Shazeer 2020 Eq. 6, SiLU gates).
# ----------------------------------------------------------------------------------------------
MOE_DEFAULTS = {"experts": 8, "experts_active": 2, "shared_expert_hidden": 0, "router_gates": "renormalized",
                "shared_expert_gate": "sigmoid"}  # gradflow's --experts, --experts-active, ... defaults


class MoeKind(str):
    """The FFN kind word "moe" (it compares equal to "moe") carrying the run's router settings, so every caller
    that hands ops["ffn"] to ffn() -- Stack here, placement_file.py's FileStack -- builds the same MoE."""

    def __new__(cls, experts=8, experts_active=2, shared_expert_hidden=0, router_gates="renormalized",
                shared_expert_gate="sigmoid"):
        if router_gates not in ("renormalized", "softmax"):
            raise ValueError(f"router_gates must be renormalized or softmax, not {router_gates!r}")
        if shared_expert_gate not in ("sigmoid", "none"):
            raise ValueError(f"shared_expert_gate must be sigmoid or none, not {shared_expert_gate!r}")
        if not 1 <= int(experts_active) <= int(experts):
            raise ValueError(f"experts_active = {experts_active} must be in 1..experts = {experts}")
        k = super().__new__(cls, "moe")
        k.experts, k.experts_active = int(experts), int(experts_active)
        k.shared_expert_hidden = int(shared_expert_hidden)
        k.router_gates, k.shared_expert_gate = router_gates, shared_expert_gate
        return k


def moe_kind(cfg):
    """MoeKind from the exported config's keys (absent or null keys: gradflow's defaults)."""
    return MoeKind(**{k: (cfg[k] if cfg.get(k) is not None else v) for k, v in MOE_DEFAULTS.items()})


def moe_weight_names(moe):
    """The matrices of one MoE FFN sublayer (biases aside): the router, W_1/W_2/W_3 of each expert e as
    "W_i.e<e>", and with a shared expert its W_i.shared and (sigmoid gate) W_gate.shared."""
    names = {"W_router"} | {f"W_{i}.e{e}" for i in (1, 2, 3) for e in range(moe.experts)}
    if moe.shared_expert_hidden > 0:
        names |= {"W_1.shared", "W_2.shared", "W_3.shared"}
        if moe.shared_expert_gate == "sigmoid":
            names.add("W_gate.shared")
    return names


def moe_top_k(p, k):
    """Indices (T, k) of each row's k largest probabilities, largest first; equal ones: the lower expert index
    first (a stable sort of -p). torch.topk's order among ties is unspecified, hence the sort."""
    return torch.sort(-p, dim=-1, stable=True).indices[..., :k]


def moe_gates(x, W, moe):
    """(p, G) per token: p = softmax(x @ W_router + b_router) over the E experts (HF's router
    `gate = nn.Linear(hidden, num_experts, bias=False)` has none; gradflow's --bias gives every projection
    one, zero at init, the router included), G (T, E) the gates, zero outside the token's top-K:
    renormalized g_e = p_e / sum_{e' in top-K} p_e' (Mixtral; OLMoE / Qwen-MoE with norm_topk_prob true),
    softmax g_e = p_e (norm_topk_prob false).  The selection is piecewise constant: gradients reach the router
    through the selected p_e only (the softmax couples them to every logit), as autograd of HF's blocks."""
    p = torch.softmax(linear(x, W, "router", True), dim=-1)
    mask = torch.zeros_like(p).scatter_(-1, moe_top_k(p.detach(), moe.experts_active), 1.0)
    G = p * mask
    if moe.router_gates == "renormalized":
        G = G / G.sum(dim=-1, keepdim=True)
    return p, G


def swiglu(x, W, suffix, hidden_scale=1.0):
    # Shazeer 2020 Eq. 6: (Swish_1(x W) * x V) W_2 with W = W_1<suffix>, V = W_3<suffix>, W_2 = W_2<suffix>,
    # each with its bias b_i<suffix> when exported (HF's MixtralBlockSparseTop2MLP w2(act(w1 x) * w3 x),
    # Qwen2MoeMLP down(act(gate x) * up x))
    up = hidden_scale * linear(x, W, "1" + suffix, True)
    gate = hidden_scale * linear(x, W, "3" + suffix, True)
    return linear(torch.nn.functional.silu(up) * gate, W, "2" + suffix, True)


def moe_ffn(x, W, moe, hidden_scale=1.0):
    """y = sum_{e in top-K} g_e FFN_e(x) [+ s(x) FFN_shared(x)], per token; s(x) = sigmoid(x @ W_gate.shared)
    (Qwen2MoeSparseMoeBlock: `F.sigmoid(self.shared_expert_gate(hidden_states)) * shared_expert_output`), or 1
    with --shared-expert-gate none.  E is W_router's column count; every expert is evaluated on every token
    and weighted by its gate (exactly 0 off the top-K), so an expert no token picked gets a zero gradient.
    hidden_scale (ngpt's s_uv) scales every SwiGLU's two hidden pre-activations, as ffn() does; not the router."""
    _, G = moe_gates(x, W, moe)
    y = None
    for e in range(W["W_router"].shape[1]):
        term = G[:, e:e + 1] * swiglu(x, W, f".e{e}", hidden_scale)
        y = term if y is None else y + term
    if "W_1.shared" in W:
        shared = swiglu(x, W, ".shared", hidden_scale)
        if moe.shared_expert_gate == "sigmoid":
            shared = torch.sigmoid(linear(x, W, "gate.shared", True)) * shared  # W_gate.shared (d, 1)
        y = y + shared
    return y


def rope_matrices(T, dh, rot, theta):
    """RoFormer (Su et al. 2021, arXiv 2104.09864) Eq. 15: the block-diagonal rotation R_{Theta,m} with
    theta_i = theta^(-2(i-1)/rot), here pairing dim i with i + rot/2 (GPT-NeoX / HF rotate_half layout)
    over the first `rot` dims of a head; the rest pass unchanged. Returns (T, dh, dh) with
    y_m = x_m @ R[m]."""
    R = torch.zeros(T, dh, dh, dtype=torch.float64)
    for m in range(T):
        R[m] = torch.eye(dh, dtype=torch.float64)
        for i in range(rot // 2):
            angle = m * theta ** (-2.0 * i / rot)
            c, s = math.cos(angle), math.sin(angle)
            j = i + rot // 2
            # y_i = x_i cos - x_j sin ; y_j = x_i sin + x_j cos   (row-vector form: y = x @ R)
            R[m, i, i], R[m, j, i] = c, -s
            R[m, i, j], R[m, j, j] = s, c
    return R


def split_heads(M, heads):
    # [C] "split into `heads` contiguous column blocks of d_h = d/heads" -> (heads, T, d_h)
    T, d = M.shape
    return M.reshape(T, heads, d // heads).transpose(0, 1)


def merge_heads(M):
    # [C] "heads concatenated in order"
    h, T, dh = M.shape
    return M.transpose(0, 1).reshape(T, h * dh)


def causal_softmax(scores):
    # [C] softmax(causal_mask(...)): token t attends to s <= t
    T = scores.shape[-1]
    mask = torch.ones(T, T, dtype=torch.bool).triu(diagonal=1)
    return torch.softmax(scores.masked_fill(mask, float("-inf")), dim=-1)


def attention(x, W, heads, qk="none", qk_norm=rms_norm, kv_heads=None, rope=None, score_scale=None):
    """[C] Attn(X): Q = X W_Q, K = X W_K, V = X W_V; per head softmax(causal(Q_h K_h^T / sqrt(d_h))) V_h;
    concat heads; @ W_O.  Variants (all part of F, [C] "including any q/k/v norms inside attention"):
      qk="qkv-per-head": [A] hybridnorm "per-head RMSNorm on Q, K and V"
      qk="qk-full":      [A] olmo2 "QK-norm over full q and k" (norm over all d columns, before the split)
      qk="ngpt":         [A] ngpt "q, k unit-normalised per head, softmax scale sqrt(d_h)"
    Issue 19: kv_heads key/value heads (Ainslie et al. 2023, arXiv 2305.13245), each repeated for its
    heads/kv_heads query heads with repeat_interleave (HF repeat_kv); rope = (theta, rotary dims) rotates
    q and k after any q/k norm (HF Llama, Qwen3, OLMo 2); biases b_Q, b_K, b_V, b_O when exported.
    score_scale: a placement file's softmax scale, replacing the one above (docs/placement-files.md).
    """
    kv_heads = kv_heads or heads
    Q, K, V = linear(x, W, "Q", True), linear(x, W, "K", True), linear(x, W, "V", True)
    if qk == "qk-full":
        Q, K = qk_norm(Q), qk_norm(K)
    Qh, Kh, Vh = split_heads(Q, heads), split_heads(K, kv_heads), split_heads(V, kv_heads)
    dh = Qh.shape[-1]
    if qk == "qkv-per-head":
        Qh, Kh, Vh = qk_norm(Qh), qk_norm(Kh), qk_norm(Vh)
    if qk == "ngpt":
        Qh, Kh = unit(Qh), unit(Kh)
        scale = math.sqrt(dh)           # [A] ngpt: softmax scale sqrt(d_h) (multiplies)
    else:
        scale = 1.0 / math.sqrt(dh)     # [C] Q_h K_h^T / sqrt(d_h)
    if score_scale is not None:
        scale = score_scale
    if rope is not None:
        R = rope_matrices(Qh.shape[1], dh, rope[1], rope[0])
        Qh = torch.einsum("htd,tde->hte", Qh, R)
        Kh = torch.einsum("htd,tde->hte", Kh, R)
    Kh = Kh.repeat_interleave(heads // kv_heads, dim=0)
    Vh = Vh.repeat_interleave(heads // kv_heads, dim=0)
    P = causal_softmax((Qh @ Kh.transpose(-1, -2)) * scale)
    return linear(merge_heads(P @ Vh), W, "O", True)


def rotate_pairs(x):
    """Idealised branch (gradflow --ideal-branch, [A] closed forms: 'branch as large as the stream and
    orthogonal to it'): (x_{2i}, x_{2i+1}) -> (-x_{2i+1}, x_{2i}) per token."""
    y = torch.empty_like(x)
    y[..., 0::2] = -x[..., 1::2]
    y[..., 1::2] = x[..., 0::2]
    return y


# ----------------------------------------------------------------------------------------------
# Configuration and constants
# ----------------------------------------------------------------------------------------------
ALIASES = {"sandwich-ln": "peri-ln"}  # [A] "`peri-ln` (alias `sandwich-ln`)"

ARCHS = ["post-ln", "pre-ln", "deepnorm", "deepnorm-glm", "keel", "mix-ln", "hybridnorm",
         "hybridnorm-star", "resi-dual", "siamese-norm", "span-norm", "peri-ln", "olmo2", "admin",
         "rezero", "layerscale", "depth-mup", "deepscalelm", "ngpt", "lns", "plain", "b2t", "hc", "mhc"]
HYPER_STREAMS = 4  # hc, mhc: expansion rate n = 4 (issue 17)

FINAL_NORM = {"pre-ln", "mix-ln", "hybridnorm", "hybridnorm-star", "peri-ln", "olmo2",
              "layerscale", "depth-mup", "deepscalelm", "lns"}  # [A] "final norm" column = yes


def spec_constants(arch, B, S, mix_ratio=0.25, alpha=None, lns_index="block", width=None):
    """Constants recomputed from architectures.md (with their unit) and the project decisions.
    `alpha`: an explicit --alpha override (keel, deepnorm, rezero, depth-mup, ngpt); constants that
    derive from it are recomputed.  Per-block constants (siamese-norm c, lns input scale) are given
    at the last block b = B-1, the value gradflow's config reports.  `width` (d), when known, adds
    the width-dependent constants (ngpt s_uv)."""
    c = _spec_constants(arch, B, S, mix_ratio, lns_index)
    if arch == "ngpt" and width is not None:
        c["s_uv"] = math.sqrt(width)  # [A] ngpt: s_uv = sqrt(d) at init
    if alpha is not None and "alpha" in c:
        c["alpha"] = float(alpha)
        if arch == "depth-mup":
            c["branch_scale"] = c["alpha"] / math.sqrt(S)
    return c


def mhc_matrices(constants, iterations=20):
    """mHC at init (arXiv 2512.24880 Eq. 8): H_res = Sinkhorn-Knopp(exp(H~_res)) with `iterations` row-then-column
    normalisations, H_pre = sigmoid(H~_pre), H_post = 2 sigmoid(H~_post); the dynamic terms are zero at init, so
    H~ is its static bias: `b_res_diag` on the diagonal, `b_res_off` off it, `b_pre`, `b_post` (0 unless the
    resolved constants give them)."""
    n = HYPER_STREAMS
    bias = {k: float(constants.get(k, 0.0)) for k in ("b_res_diag", "b_res_off", "b_pre", "b_post")}
    m = torch.full((n, n), bias["b_res_off"])
    m.fill_diagonal_(bias["b_res_diag"])
    m = torch.exp(m)
    for _ in range(iterations):
        m = m / m.sum(dim=1, keepdim=True)
        m = m / m.sum(dim=0, keepdim=True)
    sigmoid = lambda v: 1.0 / (1.0 + math.exp(-v))
    return m.tolist(), [sigmoid(bias["b_pre"])] * n, [2.0 * sigmoid(bias["b_post"])] * n


def _spec_constants(arch, B, S, mix_ratio, lns_index):
    if arch == "deepnorm":
        # [A] decoder-only: a = (2B)^(1/4), b = (8B)^(-1/4) (blocks)
        return {"alpha": (2.0 * B) ** 0.25, "beta": (8.0 * B) ** -0.25}
    if arch == "deepnorm-glm":
        # [A] GLM-130B's a = (2B)^(1/2), b = (2B)^(-1/2)
        return {"alpha": (2.0 * B) ** 0.5, "beta": (2.0 * B) ** -0.5}
    if arch == "keel":
        return {"alpha": float(S)}  # [A] keel: a = S (sublayers)
    if arch == "mix-ln":
        # [A] blocks b < floor(r B): post-ln; r = 0.25
        return {"mix_ratio": mix_ratio, "post_ln_blocks": int(math.floor(mix_ratio * B))}
    if arch == "rezero":
        return {"alpha": 0.0}  # [A] rezero: a = 0 at init
    if arch == "layerscale":
        # [A] lambda = 0.1 if B <= 18, 1e-5 if B <= 24, else 1e-6
        return {"lambda": 0.1 if B <= 18 else (1e-5 if B <= 24 else 1e-6)}
    if arch == "depth-mup":
        # [A] (a / sqrt(S)), a = 1; Adam's learning rate eta / sqrt(S) (Depth-muP), recorded as a constant
        return {"alpha": 1.0, "branch_scale": 1.0 / math.sqrt(S), "adam_lr_scale": 1.0 / math.sqrt(S)}
    if arch == "deepscalelm":
        b2 = 2.0 / S  # [A] l^2 + b^2 = 1, b^2 = 2 / S
        return {"beta": math.sqrt(b2), "lambda": math.sqrt(1.0 - b2) if b2 <= 1 else float("nan")}
    if arch == "ngpt":
        return {"alpha": 0.05}  # [A] ngpt: a = 0.05
    if arch == "siamese-norm":
        return {"c": math.sqrt(2.0 * B)}  # [A] c = sqrt(2(b+1)), b 0-based block; value at b = B-1
    if arch == "lns":
        # decision 1: 1/sqrt(b+1), b the 0-based block (LNS authors' code); value at the last block
        return {"input_scale": 1.0 / math.sqrt(B if lns_index == "block" else S)}
    if arch == "admin":
        return {"w_0": 1.0}  # [A] admin: w_0 = 1 (the rest is profiled)
    if arch == "mhc":
        # static biases of H~ at init: all 0, the choice data/placements/mhc.toml states (the published
        # implementations disagree); H_res = 1/4 everywhere, H_pre = 1/2, H_post = 1
        return {"b_res_diag": 0.0, "b_res_off": 0.0, "b_pre": 0.0, "b_post": 0.0}
    return {}


# names under which the config may carry a constant (we accept several spellings)
_CONST_KEYS = {
    "alpha": ["alpha", "a"], "beta": ["beta", "b"], "lambda": ["lambda", "l", "lam"],
    "mix_ratio": ["mix_ratio", "r"], "post_ln_blocks": ["post_ln_blocks"],
    "branch_scale": ["branch_scale", "scale"], "c": ["c"], "input_scale": ["input_scale"], "w_0": ["w_0"],
    "s_uv": ["s_uv"],
}


def _num(val):
    """A config number, also in gradflow's {"value": v, "formula": ..., "unit": ...} form (else None)."""
    if isinstance(val, dict):
        val = val.get("value")
    if isinstance(val, bool):
        return None
    if isinstance(val, (int, float)):
        return float(val)
    if isinstance(val, str):
        try:
            return float(val)
        except ValueError:
            return None
    return None


def resolve_constants(arch, cfg, B, S, mix_ratio, source="config", alpha=None, lns_index="block", width=None):
    """Spec constants, overridden by the config's `constants` when present (source='config').
    Returns (constants, notes) where notes list every config/spec disagreement."""
    spec = spec_constants(arch, B, S, mix_ratio, alpha, lns_index, width)
    cc = dict(cfg.get("constants") or {})
    out, notes = dict(spec), []
    for name, sval in spec.items():
        for key in _CONST_KEYS.get(name, [name]):
            if key not in cc:
                continue
            cval = _num(cc[key])  # gradflow writes {"value": v, "formula": ..., "unit": ...}
            if cval is not None:
                if not _close(cval, sval):
                    notes.append(f"{arch}: config constants.{key} = {cval!r} but spec gives {name} = {sval!r}")
                if source == "config":
                    out[name] = cval
                break
    known = {k for n in spec for k in _CONST_KEYS.get(n, [n])}
    for key in cc:
        if key not in known:
            notes.append(f"{arch}: config constant '{key}' = {cc[key]!r} not used by the reference")
    return out, notes


def _close(a, b, rtol=1e-12):
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return abs(a - b) <= rtol * max(abs(a), abs(b), 1e-300)


# ----------------------------------------------------------------------------------------------
# The stack: one object per (arch, config, weights)
# ----------------------------------------------------------------------------------------------
class Stack:
    """State = tuple of streams (T x d tensors).  sublayer(l, state, detach_F) returns
    (new_state, update, presum): update = what is added to the stream after scalings,
    presum = the (pre-norm) sum the update is added into ([C] branch_rms / stream_share)."""

    def __init__(self, arch, weights, heads, block="attn-ffn", norm="rms", constants=None,
                 keel_variant="v2", mix_ratio=0.25, qk_norm="rms", lns_index="block",
                 wrong_variant=None, branch="model", sublayers=None, ops=None):
        arch = ALIASES.get(arch, arch)
        # issue 19's block ops: ffn kind, key/value heads, rotary (theta, dims) or None, norm epsilon
        self.ops = dict({"ffn": "gelu", "kv_heads": None, "rope": None, "eps": EPS}, **(ops or {}))
        if arch not in ARCHS:
            raise ValueError(f"unknown arch {arch!r}")
        self.arch, self.W, self.heads, self.block = arch, weights, heads, block
        eps = self.ops["eps"]
        self.N = lambda x, _n=NORMS[norm]: _n(x, eps)
        # q/k/v norms inside attention: [A] hybridnorm says "per-head RMSNorm"; 'follow' uses --norm
        self.QN = (lambda x: rms_norm(x, eps)) if qk_norm == "rms" else self.N
        # branch "rotation" (gradflow --ideal-branch): F(x) = x rotated by +90 degrees in each coordinate
        # pair (2i, 2i+1) -> (-x_{2i+1}, x_{2i}); no weights are exported then.
        self.branch = branch
        self.S = len(weights) if sublayers is None else int(sublayers)
        per_block = 2 if block == "attn-ffn" else 1
        if self.S % per_block:
            raise ValueError("odd sublayer count for attn-ffn")
        self.B = self.S // per_block
        self.kinds = [self.kind(l) for l in range(self.S)]
        self.c = dict(constants if constants is not None
                      else spec_constants(arch, self.B, self.S, mix_ratio, lns_index=lns_index))
        self.keel_variant, self.mix_ratio, self.lns_index = keel_variant, mix_ratio, lns_index
        self.wrong_variant = wrong_variant
        self.admin_w = None  # filled by forward() for admin
        # stream names; span-norm's h exists only on the states after an attention sublayer
        self.streams = {"resi-dual": ["a", "d"], "siamese-norm": ["X", "Y"],
                        "span-norm": ["x", "h"] if block == "attn-ffn" else ["x"], "b2t": ["x", "h"],
                        "hc": ["x1", "x2", "x3", "x4"], "mhc": ["x1", "x2", "x3", "x4"]}.get(arch, ["x"])
        if arch == "mhc":
            self.mhc = mhc_matrices(self.c)

    # --- bookkeeping -------------------------------------------------------------------------
    def kind(self, l):
        # [C] "S = 2B for attn-ffn (sublayer 2b is attn, 2b+1 is ffn of block b)"
        if self.block == "attn-ffn":
            return "attn" if l % 2 == 0 else "ffn"
        return self.block

    def block_of(self, l):
        return l // 2 if self.block == "attn-ffn" else l

    def F(self, l, x, detach, qk="none"):
        """The branch function itself, [C] skip_gain: F = Attn/FFN incl. q/k/v norms, not the input norm."""
        if self.branch == "rotation":
            out = rotate_pairs(x)
            return out.detach() if detach else out
        W = self.W[l]
        if self.kinds[l] == "attn":
            out = attention(x, W, self.heads, qk, self.QN, self.ops["kv_heads"], self.ops["rope"])
        elif self.arch == "ngpt":
            # [A] ngpt: s_uv = sqrt(d) (the resolved constant when the export's config gave one)
            out = ffn(x, W, self.c.get("s_uv", math.sqrt(x.shape[-1])), self.ops["ffn"])
        else:
            out = ffn(x, W, kind=self.ops["ffn"])
        return out.detach() if detach else out

    def first_of_kind(self, l):
        return self.kinds.index(self.kinds[l]) == l

    # --- input / output ---------------------------------------------------------------------
    def init_state(self, x0):
        if self.arch in ("resi-dual", "siamese-norm", "b2t"):
            return (x0, x0)  # [A] resi-dual "start a = d = x_0"; siamese "both start at x_0"; b2t: h starts as x_0
        if self.arch in ("hc", "mhc"):
            return (x0,) * HYPER_STREAMS  # HC Sec. 2: the input is copied into the n streams
        return (x0,)

    def output(self, state):
        N = self.N
        if self.arch == "resi-dual":
            a, d = state
            return a + N(d)  # [A] resi-dual "output a_S + N(d_S)"
        if self.arch == "siamese-norm":
            X, Y = state
            return N(N(X) + N(Y))  # [A] siamese "output N_f(N_a(X) + N_b(Y))"
        if self.arch == "b2t":
            return state[0]  # B2T: each block ends in N2; no final norm
        if self.arch in ("hc", "mhc"):
            return N(sum(state[1:], state[0]))  # HC / mHC: the streams are summed, then the final norm
        if self.arch == "span-norm" and len(state) != 1:
            raise ValueError("span-norm stack ended mid-block")
        (x,) = state
        return N(x) if self.arch in FINAL_NORM else x  # [A] "final norm" column

    # --- one sublayer -----------------------------------------------------------------------
    def learning_rate_scale(self, l, rule):
        """--update's multiplier on the learning rate of sublayer l's parameters: depth-muP's Adam rate
        eta / sqrt(L) with L = S, the depth its branch scale a / sqrt(S) reads (Yang et al. 2023, arXiv
        2310.02244: SGD keeps eta); 1 for every other built-in."""
        return 1.0 / math.sqrt(self.S) if self.arch == "depth-mup" and rule == "adam" else 1.0

    def sublayer(self, l, state, detach=False):
        a, N, c = self.arch, self.N, self.c
        k = self.kinds[l]
        b = self.block_of(l)

        if a == "resi-dual":
            xa, xd = state
            f = self.F(l, xa, detach)
            s = xa + f
            # [A] resi-dual: a <- N(a + F(a)); d <- d + F(a).  share: the a-stream sum (see README)
            return (N(s), xd + f), f, s

        if a == "siamese-norm":
            X, Y = state
            cb = math.sqrt(2.0 * (b + 1))  # [A] c = sqrt(2(b+1)), b = block index (0-based)
            # decision 2 (official code form): X' = N_X(X); O = F(N_in(X' + N_Y(Y)));
            # X <- X' + O/c; Y <- Y + O.  update = O/c, sum = X' + O/c.
            Xn = N(X)
            O = self.F(l, N(Xn + N(Y)), detach)
            s = Xn + O / cb
            return (s, Y + O), O / cb, s

        if a == "span-norm":
            # [A] PROVISIONAL: h = N1(x + Attn(x)); x <- N2(x + FFN(h)) (the skip spans the block).
            if self.block == "attn-ffn":
                if k == "attn":
                    (x,) = state
                    f = self.F(l, x, detach)
                    s = x + f
                    return (x.clone(), N(s)), f, s  # state after attn is (x, h); clone = own node
                x, h = state
                f = self.F(l, h, detach)
                s = x + f
                return (N(s),), f, s
            # single-sublayer blocks: decision 4, reduces to x <- N(x + F(x))
            (x,) = state
            f = self.F(l, x, detach)
            s = x + f
            return (N(s),), f, s

        if a in ("b2t", "hc", "mhc"):
            return self.hyper_or_b2t(l, state, detach)

        (x,) = state

        if a == "post-ln":
            f = self.F(l, x, detach)
            s = x + f
            return (N(s),), f, s  # [A] x <- N(x + F(x))

        if a == "pre-ln":
            f = self.F(l, N(x), detach)
            s = x + f
            return (s,), f, s  # [A] x <- x + F(N(x))

        if a in ("deepnorm", "deepnorm-glm"):
            f = self.F(l, x, detach)
            s = c["alpha"] * x + f
            return (N(s),), f, s  # [A] x <- N(a x + F(x))

        if a == "keel":
            alpha = c["alpha"]
            if self.first_of_kind(l) and (self.keel_variant == "v1" or k == "attn"):
                # [A] v2: first attention sublayer plain pre-ln; v1: both first sublayers plain pre-ln
                f = self.F(l, N(x), detach)
                s = x + f
                return (s,), f, s
            if self.first_of_kind(l) and k == "ffn":
                alpha = 1.0  # [A] v2: "the first FFN keeps the outer norm but uses a = 1"
            f = self.F(l, N(x), detach)  # N2
            if self.wrong_variant == "keel-alpha-on-branch":
                # DELIBERATELY WRONG (test fixture): N1(x + a F(N2(x)))
                u = alpha * f
                s = x + u
                return (N(s),), u, s
            s = alpha * x + f
            return (N(s),), f, s  # [A] keel: x <- N1(a x + F(N2(x)))

        if a == "mix-ln":
            if b < int(math.floor(self.mix_ratio * self.B)):  # [A] blocks b < floor(r B): post-ln
                f = self.F(l, x, detach)
                s = x + f
                return (N(s),), f, s
            f = self.F(l, N(x), detach)  # later blocks: pre-ln
            s = x + f
            return (s,), f, s

        if a in ("hybridnorm", "hybridnorm-star"):
            if a == "hybridnorm-star" and b == 0:
                # [A] hybridnorm-star: "block 0 is pre-ln (keeping QKV-norm)"
                f = self.F(l, N(x), detach, qk="qkv-per-head" if k == "attn" else "none")
                s = x + f
                return (s,), f, s
            if k == "attn":
                # [A] "attn: x <- x + Attn with per-head RMSNorm on Q, K and V and no input norm"
                f = self.F(l, x, detach, qk="qkv-per-head")
                s = x + f
                return (s,), f, s
            h = N(x)  # [A] "FFN: h = N(x); x <- h + FFN(h)"
            f = self.F(l, h, detach)
            s = h + f
            return (s,), f, s

        if a == "peri-ln":
            u = N(self.F(l, N(x), detach))  # [A] x <- x + N_out(F(N_in(x)))
            s = x + u
            return (s,), u, s

        if a == "olmo2":
            u = N(self.F(l, x, detach, qk="qk-full"))  # [A] x <- x + N(F(x)), QK-norm over full q and k
            s = x + u
            return (s,), u, s

        if a == "admin":
            f = self.F(l, x, detach)
            s = self.admin_w[l] * x + f
            return (N(s),), f, s  # [A] admin: x <- N(w x + F(x))

        if a == "rezero":
            u = c["alpha"] * self.F(l, x, detach)  # [A] x <- x + a F(x), no norm
            s = x + u
            return (s,), u, s

        if a == "layerscale":
            u = c["lambda"] * self.F(l, N(x), detach)  # [A] x <- x + diag(lambda) F(N(x))
            s = x + u
            return (s,), u, s

        if a == "depth-mup":
            u = (c["alpha"] / math.sqrt(self.S)) * self.F(l, N(x), detach)  # [A] x + (a/sqrt(S)) F(N(x))
            s = x + u
            return (s,), u, s

        if a == "deepscalelm":
            u = c["beta"] * self.F(l, N(x), detach)  # [A] x <- l x + b F(N(x))
            s = c["lambda"] * x + u
            return (s,), u, s

        if a == "ngpt":
            # [A] h <- U(U(h) + a (U(F(h)) - U(h)))
            hu = unit(x)
            u = c["alpha"] * (unit(self.F(l, x, detach, qk="ngpt")) - hu)
            s = hu + u
            return (unit(s),), u, s

        if a == "lns":
            # decision 1: 1/sqrt(b+1), b = 0-based block (LNS code `1/math.sqrt(self.layer_index + 1)` for
            # both norms of a block); --lns-index sublayer: the notation section's sublayer index l
            idx = l if self.lns_index == "sublayer" else b
            f = self.F(l, N(x) / math.sqrt(idx + 1), detach)  # [A] x <- x + F(N(x) / sqrt(idx+1))
            s = x + f
            return (s,), f, s

        if a == "plain":
            f = self.F(l, x, detach)  # [A] x <- F(x): no residual, no norm
            return (f,), f, f

        raise ValueError(a)

    def hyper_or_b2t(self, l, state, detach):
        """Issue 17's placements, from the papers (the representation: a fixed set of streams)."""
        N = self.N
        if self.arch == "b2t":
            # Takase et al. 2022 (arXiv 2206.00330) Eq. 5-6: h = N1(x + Attn(x)); x <- N2(h + FFN(h) + x); x is
            # carried through the attention sublayer, h through the FFN. One-sublayer blocks: post-ln.
            x, h = state  # a carried stream is cloned: its own node, as in span-norm
            if self.block == "attn-ffn" and self.kinds[l] == "attn":
                f = self.F(l, x, detach)
                s = x + f
                return (x.clone(), N(s)), f, s
            if self.block == "attn-ffn":
                f = self.F(l, h, detach)
                s = h + f + x
                return (N(s), h.clone()), f, s
            f = self.F(l, x, detach)
            s = x + f
            return (N(s), h.clone()), f, s
        if self.arch == "hc":
            # Zhu et al. 2024 (arXiv 2409.19606) at init: width connection [e_{k mod n} | I_n] (sublayer k reads
            # stream k mod n), depth connection beta = 1 (T's output added to every stream); T = F(N(.)).
            o = self.F(l, N(state[l % HYPER_STREAMS]), detach)
            new = tuple(x + o for x in state)
            return new, o, new[0]
        # mHC (arXiv 2512.24880) Eq. 3, 7-8 at init: x_{l+1} = H_res x_l + H_post^T F(N(H_pre x_l))
        res, pre, post = self.mhc
        o = self.F(l, N(sum(pre[j] * state[j] for j in range(HYPER_STREAMS))), detach)
        new = tuple(sum(res[i][j] * state[j] for j in range(HYPER_STREAMS)) + post[i] * o
                    for i in range(HYPER_STREAMS))
        return new, post[0] * o, new[0]

    # --- forward ---------------------------------------------------------------------------
    def forward(self, x0):
        """Returns states (list of tuples), updates, presums; profiles admin's w on the way."""
        with torch.no_grad():
            state = self.init_state(x0)
            states, updates, presums = [state], [], []
            if self.arch == "admin":
                self.admin_w = []
                w2 = 1.0  # [A] admin: w_0 = 1
            for l in range(self.S):
                if self.arch == "admin":
                    self.admin_w.append(math.sqrt(w2))
                state, u, s = self.sublayer(l, state)
                if self.arch == "admin":
                    # [A] w_{l+1}^2 = w_l^2 Var[x_l] + Var[F_l] ("sqrt(var(residual * ratio) + var(F))", Var[x_l]
                    # the measured variance of the state); decision 5: population variance over all entries,
                    # profiled in this pass on the seed's own input x0
                    x_l = states[-1][0]
                    w2 = float((math.sqrt(w2) * x_l).var(unbiased=False)) + float(u.var(unbiased=False))
                states.append(state)
                updates.append(u)
                presums.append(s)
        return states, updates, presums


# ----------------------------------------------------------------------------------------------
# VJPs and figures
# ----------------------------------------------------------------------------------------------
def vjp(fn, state, cot):
    """Vector-Jacobian product of fn at state with cotangent tuple cot; returns a tuple (zeros if unused)."""
    inp = tuple(t.detach().clone().requires_grad_(True) for t in state)
    with torch.enable_grad():
        out = fn(inp)
        out = out if isinstance(out, tuple) else (out,)
        pairs = [(o, g) for o, g in zip(out, cot) if o.requires_grad]
        if not pairs:
            return tuple(torch.zeros_like(t) for t in state)
        grads = torch.autograd.grad([o for o, _ in pairs], inp, [g for _, g in pairs], allow_unused=True)
    return tuple(torch.zeros_like(t) if g is None else g.detach() for t, g in zip(state, grads))


def tnorm(tup):
    return math.sqrt(sum(float((t * t).sum()) for t in tup))


def trms(tup):
    # [C] rms[l] = sqrt(mean of x_l^2 over every entry of every stream of the state)
    return math.sqrt(sum(float((t * t).sum()) for t in tup) / sum(t.numel() for t in tup))


def analyze(stack, x0, probes):
    """probes: tensor (K, T, d).  Returns dict of figures (per-probe RMS for K > 1, [M] 'The probe')."""
    S = stack.S
    states, updates, presums = stack.forward(x0)
    K = probes.shape[0]
    # per probe: log ||g_l|| (natural log), per-stream log norms, gains
    logn = np.zeros((K, S + 1))
    logn_stream = np.full((K, S + 1, len(stack.streams)), -np.inf)
    g2 = np.zeros((K, S))        # ||g_l||^2 / ||g_{l+1}||^2
    skip2 = np.zeros((K, S))
    branch2 = np.zeros((K, S))
    for k in range(K):
        # g_S = dL/dx_S, L = sum(U * y)  ([C] Loss)
        g = vjp(stack.output, states[S], (probes[k],))
        # Gradients are propagated renormalised at every state, logs accumulated ([M] The probe)
        n = tnorm(g)
        logn[k, S] = math.log(n)
        _stream_logs(logn_stream, k, S, g, stack, states[S])
        g = tuple(t / n for t in g)
        for l in range(S - 1, -1, -1):
            full = vjp(lambda st: stack.sublayer(l, st)[0], states[l], g)
            skip = vjp(lambda st: stack.sublayer(l, st, detach=True)[0], states[l], g)
            nf = tnorm(full)
            g2[k, l] = nf ** 2
            skip2[k, l] = tnorm(skip) ** 2                                    # [C] skip_gain
            branch2[k, l] = tnorm(tuple(a - s for a, s in zip(full, skip))) ** 2  # [C] branch_gain
            logn[k, l] = logn[k, l + 1] + math.log(nf) if nf > 0 else -math.inf
            _stream_logs(logn_stream, k, l, full, stack, states[l], base=logn[k, l + 1])
            g = tuple(t / nf for t in full) if nf > 0 else full
    ln10 = math.log(10.0)
    # probe-RMS of ||g_l||: log10 sqrt(mean_k ||g||^2)
    log10_grad = [_log_rms(logn[:, l]) / ln10 for l in range(S + 1)]
    gain, skip_gain, branch_gain = [], [], []
    for l in range(S):
        # K = 1: gain = ||g_l|| / ||g_{l+1}|| exactly ([C] Figure definitions); K > 1: ratio of probe-RMS norms
        wts = np.exp(2 * (logn[:, l + 1] - logn[:, l + 1].max()))
        den = float(wts.sum())
        gain.append(math.sqrt(float((wts * g2[:, l]).sum()) / den))
        skip_gain.append(math.sqrt(float((wts * skip2[:, l]).sum()) / den))
        branch_gain.append(math.sqrt(float((wts * branch2[:, l]).sum()) / den))
    streams = {}
    for i, name in enumerate(stack.streams):
        streams[name] = {
            "rms": [_stream_rms(states[l], i) for l in range(S + 1)],
            "log10_grad": [_log_rms(logn_stream[:, l, i]) / ln10 for l in range(S + 1)],
        }
    for v in streams.values():  # absent stream (span-norm h on block boundaries) -> None
        for key in ("rms", "log10_grad"):
            v[key] = [x if math.isfinite(x) else None for x in v[key]]
    return {
        "states": {
            "index": list(range(S + 1)),
            "rms": [trms(st) for st in states],
            "log10_grad": log10_grad,
            "log10_grad_rel": [v - log10_grad[S] for v in log10_grad],
            "streams": streams,
        },
        "sublayers": {
            "index": list(range(S)),
            "kind": stack.kinds,
            "block": [stack.block_of(l) for l in range(S)],
            "gain": gain, "skip_gain": skip_gain, "branch_gain": branch_gain,
            "branch_rms": [trms((u,)) for u in updates],                      # [C] branch_rms
            "stream_share": [tnorm((u,)) / tnorm((s,)) for u, s in zip(updates, presums)],  # [C] stream_share
            "admin_w": stack.admin_w,
        },
    }


# gradflow's matrix names (step_rel keys) for the exported tensor names; MoE: the router and the shared
# expert's gate count as "up" matrices (w_1)
MATRIX_KINDS = {"W_Q": "w_q", "W_K": "w_k", "W_V": "w_v", "W_O": "w_o", "W_1": "w_1", "W_2": "w_2", "W_3": "w_3",
                "W_router": "w_1", "W_gate": "w_1"}


def matrix_kind(name):
    """step_rel key of an exported tensor: MATRIX_KINDS of the name before its first '.' (MoE's "W_1.e3" -> w_1,
    "W_2.shared" -> w_2, "W_gate.shared" -> w_1), None for a bias ("b_1.e3")."""
    return MATRIX_KINDS.get(name.split(".", 1)[0])


class GainedNorm:
    """--update-params all: every call of the stack's norm N is a norm instance with its own gain gamma
    (length d, 1 at init): y = gamma * N(x). Gains are keyed by (sublayer or "head", call index within it),
    created on first use as torch leaves (requires_grad) or taken from `fixed` (the stepped gains)."""

    def __init__(self, norm, fixed=None):
        self.norm, self.gains, self.fixed, self.key, self.index = norm, {}, fixed, None, 0

    def start(self, key):
        self.key, self.index = key, 0

    def __call__(self, x):
        k = (self.key, self.index)
        self.index += 1
        if self.fixed is not None:
            g = self.fixed[k]
        else:
            g = self.gains.get(k)
            if g is None:
                g = torch.ones(x.shape[-1], dtype=x.dtype, requires_grad=True)
                self.gains[k] = g
        return g * self.norm(x)


class PseudoQueries:
    """--update-params all on a stack that reads a history ([P] attend): every read's pseudo-query w (length d,
    q in every entry at init; Kimi Team 2026, arXiv 2603.15031, Sec. 3.1) is a parameter. Keyed by (sublayer,
    read index within it), created on first use as torch leaves or taken from `fixed` (the stepped ones)."""

    def __init__(self, fixed=None):
        self.queries, self.fixed, self.key, self.index = {}, fixed, None, 0

    def start(self, key):
        self.key, self.index = key, 0

    def __call__(self, l, q, V):
        k = (self.key, self.index)
        self.index += 1
        if self.fixed is not None:
            return self.fixed[k]
        w = self.queries.get(k)
        if w is None:
            w = torch.full((V.shape[-1],), float(q), dtype=V.dtype, requires_grad=True)
            self.queries[k] = w
        return w


def _optimizer_step(rule, lr, g):
    return -lr * g if rule == "sgd" else -lr * g / (g.abs() + 1e-8)


def model_update(stack, x0, probe, rule, lr, params_mode="matrices"):
    """--update (issue 18), computed independently: torch autograd's dL/dW of L = sum(U * y) for probe 0, one
    optimizer step, and the forward pass again with the stepped weights (admin's w as profiled on x0).
      SGD:  Delta W = -lr g
      Adam: Delta W = -lr g / (|g| + 1e-8)  (Kingma & Ba 2014, arXiv 1412.6980, Alg. 1: the first step's
            bias-corrected m^ = g, v^ = g^2)
    params_mode "all" (--update-params all): every norm call's gain gamma takes the same step (GainedNorm);
    the q/k/v norms inside attention (stack.QN) keep gamma = 1, as in gradflow. A stack that reads a history
    ([P] attend, placement_file.py) reads the (stepped) states before each sublayer, and with "all" every read's
    pseudo-query w takes the step too (PseudoQueries); w starts at zero, so, like a bias, it has no step_rel."""
    states, _, _ = stack.forward(x0)
    base, base_norm = stack.W, stack.N
    history = bool(getattr(stack, "history_streams", None))

    def run(weights, norm, queries=None):
        stack.W = weights
        if norm is not None:
            stack.N = norm
        if history:
            stack.Q = queries
        state, out = stack.init_state(x0), []
        out.append(state)
        for l in range(stack.S):
            if norm is not None:
                norm.start(l)
            if queries is not None:
                queries.start(l)
            kw = {"history": stack.history_at(l, out)} if history else {}
            state = stack.sublayer(l, state, **kw)[0]
            out.append(state)
        if norm is not None:
            norm.start("head")
        return out, stack.output(state)

    try:
        params = [{n: t.clone().requires_grad_(True) for n, t in Wl.items()} for Wl in base]
        gained = GainedNorm(base_norm) if params_mode == "all" else None
        queried = PseudoQueries() if params_mode == "all" and history else None
        with torch.enable_grad():
            _, y = run(params, gained, queried)
            loss = (probe * y).sum()
            flat = [t for Wl in params for t in Wl.values()]
            gain_keys = list(gained.gains) if gained else []
            query_keys = list(queried.queries) if queried else []
            all_grads = torch.autograd.grad(loss, flat + [gained.gains[k] for k in gain_keys] +
                                            [queried.queries[k] for k in query_keys])
        grads = iter(g.detach() for g in all_grads[:len(flat)])
        grads = [{n: next(grads) for n in Wl} for Wl in params]
        gain_grads = {k: g.detach() for k, g in zip(gain_keys, all_grads[len(flat):len(flat) + len(gain_keys)])}
        query_grads = {k: g.detach() for k, g in zip(query_keys, all_grads[len(flat) + len(gain_keys):])}
        # a placement's depth-scaled learning rate (its file's learning_rate_scale) for sublayer l's
        # parameters; the output head ("head") keeps lr
        scale = lambda l: stack.learning_rate_scale(l, rule)
        steps = [{n: _optimizer_step(rule, lr * scale(l), g) for n, g in Gl.items()} for l, Gl in enumerate(grads)]
        gain_steps = {k: _optimizer_step(rule, lr * (1.0 if k[0] == "head" else scale(k[0])), g)
                      for k, g in gain_grads.items()}
        query_steps = {k: _optimizer_step(rule, lr * scale(k[0]), g) for k, g in query_grads.items()}
        with torch.no_grad():
            y = y.detach()
            stepped_norm = (GainedNorm(base_norm, {k: 1.0 + st for k, st in gain_steps.items()})
                            if gained else None)
            stepped_queries = (PseudoQueries({k: queried.queries[k].detach() + st for k, st in query_steps.items()})
                               if queried else None)
            moved_states, moved_y = run([{n: base[l][n] + st[n] for n in st} for l, st in enumerate(steps)],
                                        stepped_norm, stepped_queries)
    finally:
        stack.W, stack.N = base, base_norm
        if history:
            stack.Q = None
    diffs = [tuple(a - b for a, b in zip(m, o)) for m, o in zip(moved_states, states)]
    update_loss = [sum(float((grads[l][n] * steps[l][n]).sum()) for n in steps[l]) for l in range(stack.S)]
    gain_loss = {k: float((gain_grads[k] * gain_steps[k]).sum()) for k in gain_keys}
    for (key, _), value in gain_loss.items():
        if key != "head":
            update_loss[key] += value
    for (key, _), g in query_grads.items():  # a read's <g, Delta w> is its sublayer's
        update_loss[key] += float((g * query_steps[(key, _)]).sum())
    first_order = sum(update_loss) + sum(v for (key, _), v in gain_loss.items() if key == "head")
    step_sq, weight_sq = {}, {}
    for l in range(stack.S):
        for n, st in steps[l].items():
            k = matrix_kind(n)
            if k is None:
                continue  # a bias (--bias): stepped, but zero at init, so no relative step
            # every matrix of a kind (all sublayers, all experts, used or not) in one ratio of sums
            step_sq[k] = step_sq.get(k, 0.0) + float((st * st).sum())
            weight_sq[k] = weight_sq.get(k, 0.0) + float((base[l][n] ** 2).sum())
    if gain_keys:  # gamma = 1: norm(gamma)^2 is the number of gain entries
        step_sq["norm_gain"] = sum(float((st * st).sum()) for st in gain_steps.values())
        weight_sq["norm_gain"] = float(sum(st.numel() for st in gain_steps.values()))
    return {
        "update_rms": [trms(dx) for dx in diffs],
        # a state that does not move (l = 0; every state of rezero, whose alpha = 0 cuts the weights'
        # gradients) has no log: null, as gradflow writes it
        "log10_update_rel": [math.log10(tnorm(dx) / tnorm(states[l])) if tnorm(dx) > 0 else None
                             for l, dx in enumerate(diffs)],
        "update_loss": update_loss,
        "update_loss_share": [u / first_order if first_order != 0 else None for u in update_loss],
        "output_update_rel": tnorm((moved_y - y,)) / tnorm((y,)),
        "delta_loss": float((probe * (moved_y - y)).sum()),
        "delta_loss_first_order": first_order,
        "step_rel": {k: math.sqrt(step_sq[k] / weight_sq[k]) for k in step_sq},
    }


def _stream_logs(out, k, l, g, stack, state, base=0.0):
    """Per-stream log||g|| (natural log) for state l; g is the (renormalised) gradient tuple."""
    for i in range(len(stack.streams)):
        if i < len(g):
            n = tnorm((g[i],))
            out[k, l, i] = base + math.log(n) if n > 0 else -math.inf


def _stream_rms(state, i):
    return trms((state[i],)) if i < len(state) else float("nan")  # nan -> None in the output


def _log_rms(logs):
    """log sqrt(mean exp(2 logs)) computed stably."""
    logs = np.asarray(logs, dtype=np.float64)
    m = logs.max()
    if not np.isfinite(m):
        return float(m)
    return float(m + 0.5 * math.log(np.mean(np.exp(2 * (logs - m)))))


# ----------------------------------------------------------------------------------------------
# Loading an export
# ----------------------------------------------------------------------------------------------
def load_export(path):
    tensors, meta = read_safetensors(path)
    cfg = meta.get("config", "{}")
    cfg = json.loads(cfg) if isinstance(cfg, str) else dict(cfg)
    arch = meta.get("arch") or cfg.get("arch")
    if arch is None:
        raise ValueError(f"{path}: no arch in __metadata__")
    x0 = torch.from_numpy(tensors["input"].copy())
    probes = torch.from_numpy(tensors["probe"].copy())
    if probes.dim() == 2:
        probes = probes.unsqueeze(0)
    ids = sorted({int(n.split(".")[1]) for n in tensors if n.startswith("sublayer.")})
    if ids != list(range(len(ids))):
        raise ValueError(f"{path}: sublayer indices not contiguous: {ids}")
    weights = []
    for l in ids:
        pre = f"sublayer.{l:04d}."
        weights.append({n[len(pre):]: torch.from_numpy(t.copy()) for n, t in tensors.items() if n.startswith(pre)})
    return arch, cfg, meta, x0, probes, weights


def _cfg_get(cfg, keys, default):
    for k in keys:
        if k in cfg and cfg[k] is not None:
            return cfg[k]
    return default


def build_from_export(path, qk_norm="rms", lns_index="block", wrong_variant=None, constants_source="config",
                      overrides=None):
    """Build the reference stack for an export.  `overrides` (keys: block, norm, heads, keel_variant,
    mix_ratio, alpha) are what the caller asked gradflow for; they take precedence over the exported
    config (and any disagreement is noted), so the reference does not have to trust the config.
    overrides["arch"]: build these formulas whatever the export's arch (a placement file restating a built-in)."""
    arch, cfg, meta, x0, probes, weights = load_export(path)
    arch = ALIASES.get((overrides or {}).get("arch") or arch, (overrides or {}).get("arch") or arch)
    ov = {k: v for k, v in (overrides or {}).items() if v is not None}
    notes = []

    def setting(name, keys, default):
        val = _cfg_get(cfg, keys, None)
        if name in ov:
            if val is not None and str(val) != str(ov[name]) and not _num_eq(val, ov[name]):
                notes.append(f"config {keys[0]} = {val!r} but {ov[name]!r} was requested")
            return ov[name]
        return default if val is None else val

    T, d = x0.shape
    branch = _cfg_get(cfg, ["branch"], "model")
    S = len(weights) if branch != "rotation" else int(cfg["sublayers"])
    if branch == "rotation":
        weights = [{} for _ in range(S)]
    block = setting("block", ["block"], "attn-ffn")
    B = S // 2 if block == "attn-ffn" else S
    heads = int(setting("heads", ["heads"], 1))
    norm = setting("norm", ["norm"], "rms")
    keel_variant = setting("keel_variant", ["keel_variant", "keel-variant"], "v2")
    mix_ratio = _num(setting("mix_ratio", ["mix_ratio", "mix-ratio"],
                             (cfg.get("constants") or {}).get("mix_ratio", 0.25)))
    if mix_ratio is None:
        raise ValueError(f"{path}: unreadable mix_ratio in config")
    # consistency checks of the config against the tensors themselves
    for key, val in (("width", d), ("seq", T), ("sublayers", S), ("blocks", B)):
        if key in cfg and int(cfg[key]) != val:
            notes.append(f"config {key} = {cfg[key]} but tensors give {val}")
    if cfg.get("rezero_alpha") is not None and arch == "rezero":
        cfg.setdefault("constants", {}).setdefault("alpha", cfg["rezero_alpha"])
    consts, cnotes = resolve_constants(arch, cfg, B, S, mix_ratio, constants_source, ov.get("alpha"), lns_index,
                                       width=d)
    notes += cnotes
    if "alpha" in ov and "alpha" in consts:
        consts["alpha"] = float(ov["alpha"])  # explicit --alpha override (keel, deepnorm, rezero, depth-mup, ngpt)
    if branch == "rotation":
        stack = Stack(arch, weights, heads, block, norm, consts, keel_variant, mix_ratio, qk_norm, lns_index,
                      wrong_variant, branch="rotation", sublayers=S)
        return stack, x0, probes, cfg, consts, notes
    # issue 19's ops: what the caller asked for wins over the exported config, as for the settings above
    ops = block_ops({**cfg, **{k: setting(k, [k], None) for k in OPS_KEYS if k in ov}}, heads, d)
    if ops["ffn"] != "moe" and any("W_router" in Wl for Wl in weights):
        notes.append(f"the export has MoE weights (W_router) but ffn = {ops['ffn']!r}: read as ffn = moe")
        ops["ffn"] = moe_kind(cfg)
    moe = ops["ffn"] if ops["ffn"] == "moe" else None
    gated = ops["ffn"] != "gelu"
    for l, Wl in enumerate(weights):
        if "W_Q" in Wl:
            want = {"W_Q", "W_K", "W_V", "W_O"}
        elif moe is not None:
            want = moe_weight_names(moe)
            if "W_router" in Wl and Wl["W_router"].shape[1] != moe.experts:
                notes.append(f"sublayer {l}: W_router has {Wl['W_router'].shape[1]} experts, config {moe.experts}")
            if "W_1.shared" in Wl and Wl["W_1.shared"].shape[1] != moe.shared_expert_hidden:
                notes.append(f"sublayer {l}: W_1.shared is {tuple(Wl['W_1.shared'].shape)} but "
                             f"shared_expert_hidden = {moe.shared_expert_hidden}")
        else:
            want = {"W_1", "W_2"} | ({"W_3"} if gated else set())
        if cfg.get("bias"):  # --bias: every projection, the MoE router and shared gate included
            want |= {"b_" + n[2:] for n in want}
        if set(Wl) != want:
            notes.append(f"sublayer {l}: unexpected tensors {sorted(Wl)}")
    stack = Stack(arch, weights, heads, block, norm, consts, keel_variant, mix_ratio, qk_norm, lns_index,
                  wrong_variant, ops=ops)
    for l in range(S):
        has_attn = "W_Q" in weights[l]
        if has_attn != (stack.kinds[l] == "attn"):
            raise ValueError(f"sublayer {l}: weights do not match block kind {block}")
    return stack, x0, probes, cfg, consts, notes


OPS_KEYS = ["ffn", "kv_heads", "rope_theta", "rope_fraction", "norm_eps", "bias"] + list(MOE_DEFAULTS)


def block_ops(cfg, heads, d):
    """Issue 19's ops from the exported config (absent keys: the GPT-2-like defaults); ffn "moe" comes back as a
    MoeKind with the config's experts, experts_active, shared_expert_hidden, router_gates, shared_expert_gate."""
    dh = d // heads
    theta = float(cfg.get("rope_theta", 0) or 0)
    rot = int(dh * float(cfg.get("rope_fraction", 1.0)))
    rot -= rot % 2
    kind = cfg.get("ffn", "gelu")
    return {"ffn": moe_kind(cfg) if kind == "moe" else kind, "kv_heads": int(cfg.get("kv_heads", heads) or heads),
            "rope": (theta, rot) if theta > 0 else None, "eps": float(cfg.get("norm_eps", EPS))}


def _num_eq(a, b):
    try:
        return float(a) == float(b)
    except (TypeError, ValueError):
        return False


def run_reference(path, **kw):
    stack, x0, probes, cfg, consts, notes = build_from_export(path, **kw)
    res = analyze(stack, x0, probes)
    res.update({"arch": stack.arch, "config": cfg, "constants": consts, "constant_notes": notes})
    return res


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("export")
    p.add_argument("-o", "--output")
    p.add_argument("--wrong-variant", choices=["keel-alpha-on-branch"])
    p.add_argument("--qk-norm", choices=["rms", "follow"], default="rms")
    p.add_argument("--lns-index", choices=["sublayer", "block"], default="block")
    p.add_argument("--constants", choices=["config", "spec"], default="config")
    a = p.parse_args(argv)
    try:
        res = run_reference(a.export, qk_norm=a.qk_norm, lns_index=a.lns_index,
                            wrong_variant=a.wrong_variant, constants_source=a.constants)
    except (OSError, ValueError, KeyError) as e:
        print(f"gradflow_reference: {e}", file=sys.stderr)
        return 2
    for n in res["constant_notes"]:
        print("note:", n, file=sys.stderr)
    text = json.dumps(res, indent=1, allow_nan=True)
    if a.output:
        with open(a.output, "w") as f:
            f.write(text)
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
