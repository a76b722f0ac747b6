#!/usr/bin/python3
"""Attention Residuals with zero pseudo-queries equal the uniform average of earlier outputs, made real.

data/placements/attnres.toml and attnres-block.toml state Full and Block AttnRes (Kimi Team 2026,
arXiv 2603.15031; MoonshotAI/Attention-Residuals @ 85e22310fe5ee860b4a023de312d791de8a5a5e6, README
pseudocode = the paper's Fig. 2) with one stream carrying a running uniform mean, which holds only
because every pseudo-query w_l is 0 at init. This test builds the model the paper describes, with a
TRUE history and real pseudo-queries, independently of the files:

  - every source is stored: the embedding v_0 = x_0 and every sublayer output v_{i+1} = F(N(h_i))
    (Full), or the completed block sums and the current block's partial sum (Block, the pseudocode's
    `blocks` and `partial_block`, the embedding committed as b_0 at layer 0, a boundary every
    k = ceil(B / N) layers, 0-based `layer % k == 0`, read before the commit);
  - each read is h = sum_i softmax_i(w^T RMSNorm(v_i)) v_i with its own w, a torch tensor of zeros
    with requires_grad (one per sublayer, one for the final read);
  - F is gradflow's exported branch (its weights from --export-weights), computed with the op
    functions of tests/reference/gradflow_reference.py (attention, FFN, norms), imported by path;
  - the output is N(final read) and the loss L = sum(U * y) with gradflow's exported probe U.

It then compares with gradflow's JSON (f64, seed 0, small sizes), per state l = 0..S:
  - rms: the rms of the hidden state the paper's layer l reads (state S: the final read);
  - log10_grad: log10 norm(dL/dx_l). In the history model the state is the history; the gradient
    with respect to the hidden state is taken as the gradient with respect to a shift delta_l added
    to EVERY source at state l (a zero tensor with requires_grad), which moves the mean by delta_l.
Both to 1e-10 relative (log10 figures: |10^(gf - ref) - 1|). It also prints the autograd
gradient dL/dw_l of the pseudo-queries (gradflow cannot report it) and requires it nonzero for
every read over two or more sources and exactly 0 for a read over one source.

Block AttnRes is checked with block counts that divide the depth and that do not (last block
shorter), and with N > B. A negative control runs copies of the shipped files with a wrong source
count and requires the comparison to fail, so the test can fail.

Usage: test_attnres_history.py GRADFLOW_BINARY REPOSITORY_ROOT [--attnres FILE] [--attnres-block FILE]
  --attnres / --attnres-block: compare these placement files instead of the shipped ones (a copy
  needs an id other than the shipped file's). Exit 0 when everything agrees, 1 otherwise.
"""
import argparse
import importlib.util
import json
import math
import os
import re
import subprocess
import sys
import tempfile

import torch

torch.set_default_dtype(torch.float64)

TOL = 1e-10
SMALL = ["--width", "16", "--heads", "2", "--seq", "5", "--precision", "f64", "--seed", "0", "--no-timing",
         "--format", "json", "-q"]


def load_reference_ops(root):
    path = os.path.join(root, "tests", "reference", "gradflow_reference.py")
    spec = importlib.util.spec_from_file_location("gradflow_reference", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    torch.set_default_dtype(torch.float64)
    return module


# ------------------------------------------------------------------------------------------------
# The paper's model with a true history (arXiv 2603.15031, Eq. 1-6, Fig. 2)
# ------------------------------------------------------------------------------------------------
class History:
    def __init__(self, ref, path):
        arch, cfg, meta, x0, probes, weights = ref.load_export(path)
        self.ref, self.cfg, self.x0, self.U, self.W = ref, cfg, x0, probes[0], weights
        self.S = len(weights)
        self.block = cfg["block"]
        self.per = 2 if self.block == "attn-ffn" else 1
        self.B = self.S // self.per
        self.heads = int(cfg["heads"])
        self.ops = ref.block_ops(cfg, self.heads, x0.shape[1])
        eps = self.ops["eps"]
        norm = ref.NORMS[cfg["norm"]]
        self.N = lambda x: norm(x, eps)                  # the sublayers' pre-norm and the final norm
        self.key_norm = lambda v: ref.rms_norm(v, eps)   # AttnRes's own RMSNorm on the keys (gain 1)
        d = x0.shape[1]
        # one zero-init pseudo-query per sublayer and one for the final read (paper Sec. 5)
        self.w = [torch.zeros(d, requires_grad=True) for _ in range(self.S + 1)]
        # delta_l: a shift of every source at state l (zero; its gradient is dL/d(hidden state l))
        self.delta = [torch.zeros_like(x0, requires_grad=True) for _ in range(self.S + 1)]
        self.reads = []       # the hidden state read at each state l = 0..S
        self.sources = []     # number of sources of each read

    def kind(self, l):
        if self.block == "attn-ffn":
            return "attn" if l % 2 == 0 else "ffn"
        return self.block

    def F(self, l, x):
        ref, Wl = self.ref, self.W[l]
        if self.kind(l) == "attn":
            return ref.attention(x, Wl, self.heads, "none", None, self.ops["kv_heads"], self.ops["rope"])
        return ref.ffn(x, Wl, kind=self.ops["ffn"])

    def read(self, sources, w):
        """AttnRes read (Fig. 2 block_attn_res): V = stack(sources); K = RMSNorm(V);
        alpha = softmax over sources of w . K; h = sum alpha V (values not normalised)."""
        V = torch.stack(sources)
        logits = torch.einsum("d,ntd->nt", w, self.key_norm(V))
        alpha = logits.softmax(dim=0)
        self.sources.append(len(sources))
        h = torch.einsum("nt,ntd->td", alpha, V)
        self.reads.append(h)
        return h

    def full(self):
        """Full AttnRes: h_l = sum_{i<=l} alpha_{i->l} v_i, v_0 = x_0, v_{i+1} = F(N(h_i))."""
        history = [self.x0]
        for l in range(self.S):
            history = [v + self.delta[l] for v in history]
            h = self.read(history, self.w[l])
            history.append(self.F(l, self.N(h)))
        history = [v + self.delta[self.S] for v in history]
        return self.N(self.read(history, self.w[self.S]))

    def block_attnres(self, n_blocks):
        """Block AttnRes as the README pseudocode: blocks start empty, partial_block = embedding; per
        layer (gradflow block b, 0-based) the first sublayer reads blocks + [partial], then commits the
        partial when b % k == 0 (k = block_size // 2 = ceil(B / N) layers); every sublayer adds its
        output to the partial sum; the final read is over blocks + [partial]."""
        k = -(-self.B // n_blocks)
        blocks, partial = [], self.x0
        for l in range(self.S):
            b, first = l // self.per, l % self.per == 0
            blocks = [v + self.delta[l] for v in blocks]
            partial = partial + self.delta[l]
            h = self.read(blocks + [partial], self.w[l])
            if first and b % k == 0:
                blocks, partial = blocks + [partial], None
            out = self.F(l, self.N(h))
            partial = out if partial is None else partial + out
        blocks = [v + self.delta[self.S] for v in blocks]
        partial = partial + self.delta[self.S]
        return self.N(self.read(blocks + [partial], self.w[self.S]))

    def figures(self, variant, n_blocks=None):
        y = self.full() if variant == "full" else self.block_attnres(n_blocks)
        loss = (self.U * y).sum()
        grads = torch.autograd.grad(loss, self.delta + self.w)
        g_state, g_w = grads[:self.S + 1], grads[self.S + 1:]
        rms = [math.sqrt(float((h * h).mean())) for h in self.reads]
        log10_grad = [math.log10(float(g.norm())) for g in g_state]
        return rms, log10_grad, [float(g.norm()) for g in g_w]


# ------------------------------------------------------------------------------------------------
def run_gradflow(binary, arch_file, args, export):
    cmd = [binary, "analyze", "--arch", arch_file, *SMALL, "--export-weights", export, *args]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}): {proc.stderr.strip()}")
    run = json.loads(proc.stdout)["runs"][0]
    return run, run["seeds"][0]["states"]


def rel(a, b):
    return abs(a - b) / max(abs(a), abs(b), 1e-300)


def compare_case(binary, ref, arch_file, variant, args, n_blocks, tmp, verbose=True):
    """Returns (max rms error, max log10_grad error, message)."""
    export = os.path.join(tmp, "export.safetensors")
    run, states = run_gradflow(binary, arch_file, args, export)
    model = History(ref, export)
    rms, log10_grad, gw = model.figures(variant, n_blocks)
    S = model.S
    if len(states["rms"]) != S + 1:
        raise RuntimeError(f"gradflow reports {len(states['rms'])} states, the export has {S} sublayers")
    e_rms = max(rel(a, b) for a, b in zip(states["rms"], rms))
    e_stream = max(rel(a, b) for a, b in zip(states["streams"]["h"]["rms"], rms))
    e_grad = max(abs(10 ** (a - b) - 1) for a, b in zip(states["log10_grad"], log10_grad))
    # the pseudo-queries' gradient: zero exactly for a read over one source, nonzero otherwise
    bad_w = [l for l, (g, n) in enumerate(zip(gw, model.sources)) if (n == 1) != (g == 0.0)]
    shown = ", ".join(f"w_{l}: {gw[l]:.3g} ({model.sources[l]} src)" for l in list(range(min(S, 4))) + [S])
    message = (f"{run['arch']} {' '.join(args)}: S = {S}, rms err {max(e_rms, e_stream):.1e}, "
               f"log10_grad err {e_grad:.1e}; |dL/dw_l| {shown}")
    if bad_w:
        message += f"; dL/dw wrong (zero vs one source) at reads {bad_w}"
    return max(e_rms, e_stream), e_grad, bad_w, message


def broken_copy(path, tmp, new_id, old, new):
    text = open(path).read()
    original_id = re.search(r'^id = "([^"]+)"$', text, flags=re.M).group(1)
    text = text.replace(f'id = "{original_id}"', f'id = "{new_id}"', 1)
    if old not in text:
        raise RuntimeError(f"{path}: cannot break it, '{old}' not found")
    text = text.replace(old, new, 1)
    target = os.path.join(tmp, f"{new_id}.toml")
    with open(target, "w") as handle:
        handle.write(text)
    return target


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("binary")
    parser.add_argument("root")
    parser.add_argument("--attnres", help="placement file for Full AttnRes (default: the shipped one)")
    parser.add_argument("--attnres-block", help="placement file for Block AttnRes (default: the shipped one)")
    a = parser.parse_args()
    ref = load_reference_ops(a.root)
    shipped_full = os.path.join(a.root, "data", "placements", "attnres.toml")
    shipped_block = os.path.join(a.root, "data", "placements", "attnres-block.toml")
    full_file = a.attnres or shipped_full
    block_file = a.attnres_block or shipped_block

    # (variant, file, extra gradflow args, N)
    cases = [
        ("full", full_file, ["--depth", "4"], None),
        ("full", full_file, ["--depth", "6", "--block", "ffn", "--norm", "layer"], None),
        ("full", full_file, ["--depth", "5", "--block", "attn"], None),
        ("full", full_file, ["--depth", "3", "--norm", "dyt", "--ffn", "swiglu", "--kv-heads", "1",
                             "--rope-theta", "10000"], None),
        # N divides B: k = 2, three blocks of two layers
        ("block", block_file, ["--depth", "6", "--attnres-blocks", "3"], 3),
        # N does not divide B: k = ceil(7/3) = 3, blocks of 3, 3 and 1 layers
        ("block", block_file, ["--depth", "7", "--attnres-blocks", "3"], 3),
        # N does not divide B, one-sublayer blocks: k = ceil(10/4) = 3, blocks 3, 3, 3, 1
        ("block", block_file, ["--depth", "10", "--block", "ffn", "--norm", "layer", "--attnres-blocks", "4"], 4),
        ("block", block_file, ["--depth", "9", "--block", "attn", "--attnres-blocks", "2"], 2),
        # the default N = 8 with B = 16 (k = 2), and N = 8 > B = 3 (k = 1: every layer its own block)
        ("block", block_file, ["--depth", "16"], 8),
        ("block", block_file, ["--depth", "3"], 8),
        # N = 1: one block after the embedding
        ("block", block_file, ["--depth", "4", "--attnres-blocks", "1"], 1),
    ]
    failures = 0
    with tempfile.TemporaryDirectory() as tmp:
        for variant, path, args, n in cases:
            try:
                e_rms, e_grad, bad_w, message = compare_case(a.binary, ref, path, variant, args, n, tmp)
            except Exception as error:  # a gradflow failure or an unreadable export fails the test
                print(f"FAIL {variant} {' '.join(args)}: {error}")
                failures += 1
                continue
            ok = e_rms <= TOL and e_grad <= TOL and not bad_w
            failures += not ok
            print(("ok   " if ok else "FAIL ") + message)

        # Negative control: the shipped files with a wrong source count must not pass.
        controls = [
            ("full", broken_copy(shipped_full, tmp, "attnres-broken-control",
                                 'keep = { value = "(l + 1)/(l + 2)"', 'keep = { value = "(l + 1)/(l + 3)"'),
             ["--depth", "4"], None),
            ("block", broken_copy(shipped_block, tmp, "attnres-block-broken-control",
                                  'value = "floor(b / per_block) + 1"', 'value = "floor(b / per_block) + 2"'),
             ["--depth", "7", "--attnres-blocks", "3"], 3),
        ]
        for variant, path, args, n in controls:
            try:
                e_rms, e_grad, bad_w, message = compare_case(a.binary, ref, path, variant, args, n, tmp)
            except Exception as error:
                print(f"FAIL negative control {variant}: {error}")
                failures += 1
                continue
            caught = e_rms > 1e-6 or e_grad > 1e-6
            failures += not caught
            print(("ok   negative control caught: " if caught else "FAIL negative control NOT caught: ") + message)
    total = len(cases) + 2
    print(f"{total - failures} passed, {failures} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
