"""DenseFormer and Frac-Connections at initialisation (data/placements/denseformer.toml,
data/placements/frac-connections.toml):

 (i)   denseformer equals its base, pre-ln, bit for bit (every figure of `seeds` and `aggregate`,
       timing aside) for every block kind, RMS and LayerNorm, float32 and float64; its DWA weight on
       the current block reaches the rule (a copy with alpha_{i,i} = 0.5 differs from pre-ln) and a
       nonzero weight on the history is refused (exit 2);
 (ii)  frac-connections with one fraction (--num-fracs 1, the default) equals hc with one stream bit for
       bit on the same grid. The one-stream hc file is generated from hc's definition (sublayer l reads
       stream l mod n, its output is added to every stream, output N(sum of the streams)); the generator
       is checked first: with n = 4 it must give the shipped hc.toml's figures bit for bit. Also: every
       figure but the additive-stream ones equals pre-ln's; --num-fracs 1.5 and 3 (width 16) are refused,
       and --frac-init identity is pre-ln at m = 2 and 4;
 (iii) an independent float64 torch implementation of both, on the weights gradflow exports
       (--export-weights), compared with gradflow's per-state rms and log10_grad (docs/metrics.md):
       DenseFormer with a real history of block outputs (the code's dilated accumulators) and a real
       DWA weight tensor per block (identity init, `torch.tensordot` as epfml/DenseFormer's
       `DWAModules`), for dilation/period 1x1, 2x2 and 4x3, and with a current-block weight of 0.5 against a
       copy of the file that states it; Frac-Connections as lucidrains/hyper-connections' static
       initialisation (static_alpha = cat(init_alpha0, I), static_beta = 1, its index layout) applied to
       real width slices of the state, with n = 1 and m = 1, 2, 4, 8 against frac-connections (each m > 1
       also shown to be a different model from m = 1) and n = 4, m = 1 against hc.
The op functions F (attention, FFN, norms) are those of tests/reference/gradflow_reference.py.

Usage: test_denseformer_frac.py GRADFLOW_BINARY REPOSITORY_ROOT [--denseformer PATH]
                                [--frac-connections PATH] [--hc PATH]
Each file (default: the shipped one) is copied into a temporary directory under a fresh id and found
there through GRADFLOW_PLACEMENTS, so a broken copy can be tested without touching the shipped files.
Exit 0 when everything holds, 1 otherwise. Needs /usr/bin/python3 (torch).
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

from json_compare import without_timing

torch.set_default_dtype(torch.float64)

SMALL = ["--depth", "3", "--width", "16", "--heads", "2", "--seq", "8", "--seeds", "2"]
GRID = [(block, norm, precision) for block in ["attn-ffn", "ffn", "attn"] for norm in ["rms", "layer"]
        for precision in ["f32", "f64"]]
TOL = 1e-9  # relative for rms, decades for log10_grad (float64 against float64)


def renamed(value, old, new):
    """The JSON with stream name `old` written `new` (as a dict key), to compare two placements whose one
    stream has different names."""
    if isinstance(value, dict):
        return {(new if k == old else k): renamed(v, old, new) for k, v in value.items()}
    if isinstance(value, list):
        return [renamed(v, old, new) for v in value]
    return value


def dropped(value, names):
    if isinstance(value, dict):
        return {k: dropped(v, names) for k, v in value.items() if k not in names}
    if isinstance(value, list):
        return [dropped(v, names) for v in value]
    return value


class Gradflow:
    def __init__(self, binary, registry):
        self.binary, self.env = binary, dict(os.environ, GRADFLOW_PLACEMENTS=registry)

    def run(self, archs, extra):
        return subprocess.run([self.binary, "analyze", "--arch", ",".join(archs), "--format", "json", "--no-timing",
                               *extra], capture_output=True, text=True, env=self.env)

    def analyze(self, archs, extra):
        proc = self.run(archs, extra)
        if proc.returncode != 0:
            raise RuntimeError(f"gradflow analyze --arch {','.join(archs)} {' '.join(extra)} exited "
                               f"{proc.returncode}: {proc.stderr.strip()}")
        return json.loads(proc.stdout)["runs"]

    def export(self, arch, extra, directory):
        """One float64 run of `arch` with its weights exported: (seed 0's JSON, export path)."""
        path = os.path.join(directory, f"{arch}.{len(os.listdir(directory))}.safetensors")
        runs = self.analyze([arch], ["--precision", "f64", "--seed", "0", "--export-weights", path, *extra])
        if not os.path.exists(path):
            raise RuntimeError(f"gradflow did not write {path}")
        return runs[0]["seeds"][0], path


def copy_as(path, new_id, directory, edits=()):
    """The file under the id new_id (aliases dropped), with text substitutions `edits` (regex, replacement)."""
    text = open(path).read()
    text, count = re.subn(r'^id = "[^"]*"$', f'id = "{new_id}"', text, count=1, flags=re.M)
    if count != 1:
        raise SystemExit(f"{path}: no line id = \"...\"")
    text = re.sub(r"^aliases = .*$", "", text, flags=re.M)
    for pattern, replacement in edits:
        text, n = re.subn(pattern, replacement, text, flags=re.M)
        if n == 0:
            raise SystemExit(f"{path}: the test's edit {pattern!r} matched nothing")
    target = os.path.join(directory, f"{new_id}.toml")
    with open(target, "w") as handle:
        handle.write(text)
    return target


def hc_text(n):
    """Hyper-Connections at init with n streams, as data/placements/hc.toml defines them for n = 4:
    sublayer l reads stream (l mod n) + 1 through F(N(.)), the output o is added to every stream, output
    N(x1 + ... + xn)."""
    names = [f"x{i}" for i in range(1, n + 1)]
    lines = [f'id = "hc{n}-generated"', 'citation = "Zhu et al. 2024, arXiv 2409.19606 (test: n streams)"',
             'expected_growth = "sqrt"', f"streams = {json.dumps(names)}", f'output = "N({" + ".join(names)})"']
    targets, values = ", ".join(names), ", ".join(f"{x} + o" for x in names)
    for k in range(n):
        lines.append("\n[[sublayer]]")
        if k < n - 1:
            lines.append(f'when = "mod(l, {n}) == {k}"')
        lines.append(f'rule = "o = F(N({names[k]})); {targets} <- {values}"')
        lines.append('skip_gain = "1"')
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------------------------
# The independent torch models (float64), on a gradflow export
# ------------------------------------------------------------------------------------------------
def load_reference(root):
    spec = importlib.util.spec_from_file_location("gradflow_reference",
                                                  os.path.join(root, "tests", "reference", "gradflow_reference.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class Export:
    """x_0, the probe U, the weights and the run's settings of one export; F(l, x) is sublayer l's branch."""

    def __init__(self, ref, path):
        self.ref = ref
        _, cfg, _, self.x0, probes, self.W = ref.load_export(path)
        self.probe = probes[0]
        self.block, self.heads = cfg["block"], int(cfg["heads"])
        eps = float(cfg.get("norm_eps", ref.EPS))
        norm = ref.NORMS[cfg["norm"]]
        self.N = lambda x: norm(x, eps)
        self.S = len(self.W)
        self.per_block = 2 if self.block == "attn-ffn" else 1
        self.B = self.S // self.per_block

    def F(self, l, x):
        W = self.W[l]
        return self.ref.attention(x, W, self.heads) if "W_Q" in W else self.ref.ffn(x, W)


def figures(states, y, probe):
    """Per state: rms over every entry of every stream, log10 of the norm of dL/dx_l (all streams) with
    L = sum(U * y), by autograd through the whole model (docs/metrics.md rms, log10_grad)."""
    loss = (probe * y).sum()
    flat = [t for state in states for t in state]
    grads = torch.autograd.grad(loss, flat, allow_unused=True)
    out_rms, out_grad, i = [], [], 0
    for state in states:
        g = [torch.zeros_like(t) if grads[i + j] is None else grads[i + j] for j, t in enumerate(state)]
        i += len(state)
        out_rms.append(math.sqrt(sum(float((t * t).sum()) for t in state) / sum(t.numel() for t in state)))
        out_grad.append(0.5 * math.log10(sum(float((t * t).sum()) for t in g)))
    return out_rms, out_grad


def denseformer_model(ex, dilation=1, period=1, current_weight=1.0):
    """DenseFormer (epfml/DenseFormer `DWAModules` with the experiments' pre-LN `Block`): the history of
    block outputs in `dilation` accumulators, the DWA after block i when (i + 1) % period == 0 as
    tensordot(alpha_i, accumulator), alpha_i a real weight tensor of (i + 1 + dilation) // dilation entries,
    zero but its last, `current_weight` (1 at init). Returns the states at the sublayer boundaries (the DWA
    output at a block end) and the output N(x)."""
    x0 = ex.x0.clone().requires_grad_(True)
    accumulators = [[] for _ in range(dilation)]
    accumulators[0].append(x0)                      # init_accumulators: Y_0 = the embedding
    alphas = []
    for i in range(ex.B):
        alpha = torch.zeros((i + 1 + dilation) // dilation)
        alpha[-1] = current_weight                  # _init_weights: zero_(), weight[0, -1] = 1
        alphas.append(alpha.requires_grad_(True))
    states, x = [(x0,)], x0
    for i in range(ex.B):
        for j in range(ex.per_block):               # Block.forward: x = x + attn(ln_1(x)); x = x + mlp(ln_2(x))
            l = i * ex.per_block + j
            x = x + ex.F(l, ex.N(x))
            if j < ex.per_block - 1:
                states.append((x,))
        group = accumulators[(i + 1) % dilation]
        group.append(x)                             # Y_{i+1} at position (i + 1) // dilation
        if len(group) != (i + 1) // dilation + 1:
            raise AssertionError("accumulator layout differs from DWAModules'")
        if (i + 1) % period == 0:
            x = torch.tensordot(alphas[i], torch.stack(group), dims=1)
        states.append((x,))
    return states, ex.N(x)


def library_static_connections(n, m, layer_index):
    """lucidrains/hyper-connections `HyperConnections.__init__` (num_residual_streams n, num_fracs m) at
    init, with its index layout: alpha[f1, s, f2, t] (rows '(f s)', columns split '(f2 t)' by
    `split_fracs`), t = 0 the branch input, t = 1 + s' the residual stream s'; beta[s, f2] from '(s f)'."""
    init_alpha0 = torch.zeros(n * m, m)
    init_alpha0[layer_index % n, :] = 1.0
    static_alpha = torch.cat((init_alpha0, torch.eye(n * m)), dim=1)
    alpha = static_alpha.reshape(m, n, m, n + 1)
    beta = torch.ones(n * m).reshape(n, m)
    return alpha, beta


def frac_connections_model(ex, n=1, m=1):
    """Frac-/Hyper-Connections with the library's static init on real width slices: stream s's fraction f
    is the column block [f d/m, (f+1) d/m) of the T x d state. Per sublayer l (layer_index l):
      mix[f2][t] = sum_{f1, s} alpha[f1, s, f2, t] * h_s[:, fraction f1]
      branch input = cat_f2 mix[f2][0], y = F(N(branch input)),
      h_s <- cat_f2 (sum_f1 beta[s, f2] y[:, fraction f1]) + cat_f2 mix[f2][1 + s].
    Output: N(sum of the streams) (reduce_stream, then the final norm). Returns states, output and the
    first sublayer's branch input."""
    d = ex.x0.shape[1]
    w = d // m
    x0 = ex.x0.clone().requires_grad_(True)
    state = tuple(x0.clone() for _ in range(n))     # expand_stream: the input repeated into n streams (own copies)
    states, first_input = [state], None
    for l in range(ex.S):
        alpha, beta = library_static_connections(n, m, l)
        frac = [[h[:, f * w:(f + 1) * w] for f in range(m)] for h in state]
        mix = [[sum(alpha[f1, s, f2, t] * frac[s][f1] for f1 in range(m) for s in range(n)) for t in range(n + 1)]
               for f2 in range(m)]
        branch_input = torch.cat([mix[f2][0] for f2 in range(m)], dim=1)
        if first_input is None:
            first_input = branch_input.detach()
        y = ex.F(l, ex.N(branch_input))
        yf = [y[:, f * w:(f + 1) * w] for f in range(m)]
        state = tuple(torch.cat([sum(beta[s, f2] * yf[f1] for f1 in range(m)) for f2 in range(m)], dim=1)
                      + torch.cat([mix[f2][1 + s] for f2 in range(m)], dim=1) for s in range(n))
        states.append(state)
    return states, ex.N(sum(state[1:], state[0])), first_input


def compare(label, gf, rms, grad, check):
    """gradflow's seed JSON against the torch figures (one check); returns the largest error."""
    e_rms = max(abs(a - b) / max(abs(a), abs(b)) for a, b in zip(gf["states"]["rms"], rms))
    e_grad = max(abs(a - b) for a, b in zip(gf["states"]["log10_grad"], grad))
    if len(gf["states"]["rms"]) != len(rms):
        check(False, f"{label}: {len(gf['states']['rms'])} states in gradflow, {len(rms)} in torch")
    else:
        check(e_rms <= TOL and e_grad <= TOL,
              f"{label}: torch and gradflow differ (rms rel {e_rms:.2e}, log10_grad {e_grad:.2e} decades)")
    return max(e_rms, e_grad)


# ------------------------------------------------------------------------------------------------
def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("binary")
    parser.add_argument("root")
    parser.add_argument("--denseformer")
    parser.add_argument("--frac-connections")
    parser.add_argument("--hc")
    args = parser.parse_args()
    placements = os.path.join(args.root, "data", "placements")
    dense_path = args.denseformer or os.path.join(placements, "denseformer.toml")
    frac_path = args.frac_connections or os.path.join(placements, "frac-connections.toml")
    hc_path = args.hc or os.path.join(placements, "hc.toml")
    passed, failures = [], []

    def check(ok, message):
        (passed if ok else failures).append(message)
    ref = load_reference(args.root)

    with tempfile.TemporaryDirectory() as registry, tempfile.TemporaryDirectory() as exports:
        copy_as(dense_path, "denseformer-t", registry)
        copy_as(frac_path, "frac-connections-t", registry)
        copy_as(hc_path, "hc-t", registry)
        # variants: the DWA's current-block weight 0.5 (period 1 and 2), and a weight on the history
        half = (r'^dwa_current = \{ value = 1,', "dwa_current = { value = 0.5,")
        copy_as(dense_path, "denseformer-half", registry, [half])
        copy_as(dense_path, "denseformer-half-p2", registry,
                [half, (r'^dwa_period = \{ value = 1,', "dwa_period = { value = 2,")])
        copy_as(dense_path, "denseformer-earlier", registry,
                [(r'^dwa_earlier = \{ value = 0,', "dwa_earlier = { value = 0.1,")])
        for n in (1, 4):
            with open(os.path.join(registry, f"hc{n}-generated.toml"), "w") as handle:
                handle.write(hc_text(n))
        gradflow = Gradflow(args.binary, registry)

        # (i) denseformer = pre-ln bit for bit
        for block, norm, precision in GRID:
            extra = SMALL + ["--block", block, "--norm", norm, "--precision", precision]
            base, dense = gradflow.analyze(["pre-ln", "denseformer-t"], extra)
            differ = [part for part in ("seeds", "aggregate") if without_timing(base[part]) != without_timing(dense[part])]
            check(not differ, f"(i) denseformer {block} {norm} {precision}: {' and '.join(differ)} differ from pre-ln's")
        base, half_run = gradflow.analyze(["pre-ln", "denseformer-half"], SMALL)
        check(without_timing(base["seeds"]) != without_timing(half_run["seeds"]),
              "(i) denseformer with alpha_{i,i} = 0.5 gives pre-ln's figures: the DWA weight is not in the rule")
        refused = gradflow.run(["denseformer-earlier"], SMALL)
        check(refused.returncode == 2 and "history" in refused.stderr,
              f"(i) a nonzero weight on the history is not refused (exit {refused.returncode})")

        # (ii) frac-connections, one fraction = hc with one stream
        for block, norm, precision in GRID:
            extra = SMALL + ["--block", block, "--norm", norm, "--precision", precision]
            hc4, hc_gen = gradflow.analyze(["hc-t", "hc4-generated"], extra)
            check(without_timing(hc4["seeds"]) == without_timing(hc_gen["seeds"]),
                  f"(ii) the hc generator with n = 4 differs from hc.toml ({block} {norm} {precision})")
            frac, hc1, frac_given, pre_ln = gradflow.analyze(["frac-connections-t", "hc1-generated"], extra) + \
                gradflow.analyze(["frac-connections-t", "pre-ln"], extra + ["--num-fracs", "1"])
            differ = [part for part in ("seeds", "aggregate") if without_timing(frac[part]) != without_timing(hc1[part])]
            check(not differ, f"(ii) frac-connections (m = 1) {block} {norm} {precision}: {' and '.join(differ)} "
                              "differ from hc with one stream")
            check(without_timing(frac_given["seeds"]) == without_timing(frac["seeds"]),
                  f"(ii) frac-connections --num-fracs 1 {block} {norm} {precision}: differs from the default")
            # pre-ln: the same figures but those of an additive stream (stream_decomposition needs the rule
            # x <- x + update without a binding; output_share is then computed on another path)
            additive = {"stream_decomposition", "stream_decomposition_input", "output_share", "effective_depth"}
            a = dropped(renamed(without_timing(pre_ln["seeds"]), "x", "x1"), additive)
            b = dropped(without_timing(frac_given["seeds"]), additive)
            check(a == b, f"(ii) frac-connections (m = 1) {block} {norm} {precision}: differs from pre-ln")
        for value, says in (("1.5", "whole number"), ("3", "must divide --width")):  # width 16
            refused = gradflow.run(["frac-connections-t"], SMALL + ["--num-fracs", value])
            check(refused.returncode == 2 and says in refused.stderr,
                  f"(ii) frac-connections --num-fracs {value} is not refused with '{says}' "
                  f"(exit {refused.returncode}: {refused.stderr.strip()})")
        # --frac-init identity: each fraction its own residual, pre-ln bit for bit at any m
        for block, norm, precision in GRID[:4]:
            extra = SMALL + ["--block", block, "--norm", norm, "--precision", precision]
            for m in ("2", "4"):
                frac, pre_ln = gradflow.analyze(["frac-connections-t", "pre-ln"],
                                                extra + ["--num-fracs", m, "--frac-init", "identity"])
                a = dropped(renamed(without_timing(pre_ln["seeds"]), "x", "x1"), additive)
                b = dropped(without_timing(frac["seeds"]), additive)
                check(a == b, f"(ii) frac-connections --frac-init identity m = {m} {block} {norm} {precision}: "
                              "differs from pre-ln")

        # (iii) independent torch models on gradflow's exported weights, float64
        worst = 0.0
        small = ["--depth", "4", "--width", "16", "--heads", "2", "--seq", "6"]
        for block, norm in [("attn-ffn", "rms"), ("attn-ffn", "layer"), ("ffn", "rms"), ("attn", "layer")]:
            extra = small + ["--block", block, "--norm", norm]
            gf, path = gradflow.export("denseformer-t", extra, exports)
            ex = Export(ref, path)
            for dilation, period in [(1, 1), (2, 2), (4, 3)]:
                states, y = denseformer_model(ex, dilation, period)
                rms, grad = figures(states, y, ex.probe)
                worst = max(worst, compare(f"(iii) denseformer {block} {norm} {dilation}x{period}", gf, rms, grad,
                                           check))
            for arch, period in [("denseformer-half", 1), ("denseformer-half-p2", 2)]:
                gf_half, path_half = gradflow.export(arch, extra, exports)
                ex_half = Export(ref, path_half)
                states, y = denseformer_model(ex_half, 1, period, current_weight=0.5)
                rms, grad = figures(states, y, ex_half.probe)
                worst = max(worst, compare(f"(iii) {arch} {block} {norm}", gf_half, rms, grad, check))

            gf, path = gradflow.export("frac-connections-t", extra, exports)
            ex = Export(ref, path)
            states, y, first = frac_connections_model(ex, n=1, m=1)
            check(torch.equal(first, ex.x0), "(iii) frac-connections m = 1: the branch input is not the state")
            rms1, grad1 = figures(states, y, ex.probe)
            worst = max(worst, compare(f"(iii) frac-connections m=1 {block} {norm}", gf, rms1, grad1, check))
            # m = 2, 4 (and 8): the library's layout on real width slices against gradflow's mix_fractions
            for m in (2, 4, 8):
                gf_m, path_m = gradflow.export("frac-connections-t", extra + ["--num-fracs", str(m)], exports)
                ex_m = Export(ref, path_m)
                states, y, first = frac_connections_model(ex_m, n=1, m=m)
                w = ex_m.x0.shape[1] // m
                if m == 2:  # the branch reads [h_1, h_1]: another model than m = 1 on the same weights
                    check(torch.equal(first, torch.cat([ex_m.x0[:, :w], ex_m.x0[:, :w]], dim=1)),
                          "(iii) the library's m = 2 branch input is not [h_1, h_1]")
                rms_m, grad_m = figures(states, y, ex_m.probe)
                check(max(abs(a - b) for a, b in zip(grad1 + rms1, grad_m + rms_m)) > 1e-6,
                      f"(iii) the library's m = {m} init gives m = 1's figures: the test cannot tell them apart")
                worst = max(worst, compare(f"(iii) frac-connections m={m} {block} {norm}", gf_m, rms_m, grad_m,
                                           check))

            gf, path = gradflow.export("hc-t", extra, exports)
            ex = Export(ref, path)
            states, y, _ = frac_connections_model(ex, n=4, m=1)
            rms, grad = figures(states, y, ex.probe)
            worst = max(worst, compare(f"(iii) hc (library, n = 4) {block} {norm}", gf, rms, grad, check))

    for failure in failures:
        print("FAIL", failure)
    print(f"torch against gradflow: largest error {worst:.1e} (tolerance {TOL:g})")
    print(f"{len(passed)} passed, {len(failures)} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except RuntimeError as error:
        print("FAIL", error)
        print("0 passed, 1 failed")
        sys.exit(1)
