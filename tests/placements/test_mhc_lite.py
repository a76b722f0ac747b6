#!/usr/bin/python3
"""mHC-lite (data/placements/mhc-lite.toml) against an independent float64 torch implementation.

Usage:
  /usr/bin/python3 tests/placements/test_mhc_lite.py GRADFLOW_BINARY REPOSITORY_ROOT [--placement FILE.toml]

Exit 0 when every check passes, 1 when one fails, 2 on a usage error or when gradflow cannot run.
Without --placement the shipped file is run by its id (`--arch mhc-lite`); with it, FILE.toml is run by
path (give a copy another id, as docs/placement-files.md asks), which is how a broken copy shows that
the test fails.

What mHC-lite is at init (Yang & Gao 2026, arXiv 2601.05732; the authors' code FFTYYY/mhc-lite at
commit ea197752957e520063ae0e26a88c8061834c67fa, hyper_conn/mhc_lite.py and model.py), n = 4 streams:
  a = softmax(z) over the 24 permutations of itertools.permutations(range(4)) (mhc_lite.py l. 362),
  z_0 = 0 for the identity, z_k = -8 for the others (l. 263-264);
  H_res = sum_k a_k P_k, P_k = eye(4)[perm_k] so P_k[i, j] = 1 iff j = perm_k(i) (l. 57-61, 363);
  H_pre[i] = sigmoid(+1 if i == r else -1), H_post[i] = 2 sigmoid(+1 if i == r else -1) (l. 261-262,
  288-290, 369, 387), with r = l mod 4 (the code's layer_index rule, l. 236; the file's choice);
  u = F(N(sum_i H_pre[i] x_i)); x_j <- sum_i H_res[i, j] x_i + H_post[j] u (l. 389-392, 428-441);
  output = sum_j N(x_j) (model.py l. 227-229: ln_f per stream, then the streams summed).

Checks:
 (i)  the mixing matrix gradflow uses (the run's config.constants h11..h44, and the same constants
      evaluated from the file by tests/reference/placement_file.py) is doubly stochastic to 1e-12,
      non-negative, and equals this test's sum_k softmax(z)_k P_k to 1e-14; at the paper's init
      logits and at random logits this test writes into a copy of the file (so a wrong permutation
      in any h_ij shows: at the init logits every non-identity permutation weighs the same);
 (ii) the per-state rms and log10_grad (whole state and per stream; docs/metrics.md) of gradflow's
      run equal this file's torch model built on gradflow's exported weights (--export-weights):
      to 1e-10 in --precision f64 and 2e-5 in f32 (gradflow then computes in float32), for
      --block attn-ffn / ffn / attn, --norm rms / layer, at the init logits and at random logits
      (random logits make H_res non-symmetric, so the orientation H_res^T of the update is tested).
The model's F (attention, FFN) and norms are tests/reference/gradflow_reference.py's ops; the
mHC-lite mixing, the streams, the output head and the gradients are written here.
"""
import argparse
import itertools
import json
import math
import os
import re
import subprocess
import sys
import tempfile

import numpy as np
import torch

torch.set_default_dtype(torch.float64)

N_STREAMS = 4
PERMS = list(itertools.permutations(range(N_STREAMS)))  # mhc_lite.py l. 57: itertools.permutations(range(n))
INIT_LOGITS = [0.0] + [-8.0] * (len(PERMS) - 1)  # mhc_lite.py l. 263-264
PRE_POST_ON, PRE_POST_OFF = 1.0, -1.0  # mhc_lite.py l. 261-262, 288-290
SMALL = ["--width", "16", "--heads", "2", "--seq", "5", "--seed", "3"]
DEPTH = {"attn-ffn": "3", "ffn": "5", "attn": "5"}  # S = 6, 5, 5: every r = l mod 4 occurs
TOL = {"f64": 1e-10, "f32": 2e-5}
DS_TOL = 1e-12


class Failures:
    def __init__(self):
        self.items, self.passed = [], 0

    def check(self, ok, what):
        if ok:
            self.passed += 1
        else:
            self.items.append(what)
            print("FAIL:", what)


def permutation_matrices():
    """P_k = eye(n)[perm_k] (mhc_lite.py l. 57-61): row i of P_k is e_{perm_k(i)}."""
    return torch.eye(N_STREAMS)[torch.tensor(PERMS, dtype=torch.long)]  # (24, 4, 4)


def h_res(logits):
    """H_res = sum_k softmax(z)_k P_k (mhc_lite.py l. 361-363), float64."""
    a = torch.softmax(torch.tensor(logits, dtype=torch.float64), dim=0)
    return torch.einsum("k,kij->ij", a, permutation_matrices())


def run_gradflow(binary, arch, block, norm, precision, out_dir, tag):
    out = os.path.join(out_dir, f"{tag}.json")
    export = os.path.join(out_dir, f"{tag}.safetensors")
    cmd = [binary, "analyze", "--arch", arch, "--depth", DEPTH[block], "--block", block, "--norm", norm,
           "--precision", precision, "--no-timing", "-q", "--export-weights", export, "-o", out] + SMALL
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    if res.returncode != 0:
        print(f"gradflow failed ({res.returncode}): {' '.join(cmd)}\n{res.stderr}", file=sys.stderr)
        sys.exit(2)
    with open(out) as f:
        doc = json.load(f)
    run = doc["runs"][0]
    # --export-weights writes one file per arch and seed; find the one this run wrote
    exports = [os.path.join(out_dir, n) for n in os.listdir(out_dir) if n.startswith(tag) and n.endswith(".safetensors")]
    if len(exports) != 1:
        print(f"expected one export for {tag}, found {exports}", file=sys.stderr)
        sys.exit(2)
    return run, exports[0]


# ------------------------------------------------------------------------------------------------
# (i) the mixing matrix
# ------------------------------------------------------------------------------------------------
def matrix_from_constants(consts):
    return np.array([[consts[f"h{i + 1}{j + 1}"] for j in range(N_STREAMS)] for i in range(N_STREAMS)])


def check_doubly_stochastic(fails, H, label, logits):
    rows, cols = H.sum(axis=1), H.sum(axis=0)
    fails.check(np.all(np.abs(rows - 1.0) <= DS_TOL), f"{label}: row sums {rows.tolist()} not 1 to {DS_TOL}")
    fails.check(np.all(np.abs(cols - 1.0) <= DS_TOL), f"{label}: column sums {cols.tolist()} not 1 to {DS_TOL}")
    fails.check(np.all(H >= 0.0), f"{label}: negative entry in {H.tolist()}")
    want = h_res(logits).numpy()
    err = float(np.max(np.abs(H - want)))
    fails.check(err <= 1e-14, f"{label}: H_res differs from sum_k softmax(z)_k P_k by {err:.3g}")
    return err


def check_matrix(fails, root, run, path, logits, label):
    consts = {k: v["value"] for k, v in run["config"]["constants"].items()}
    missing = [f"h{i + 1}{j + 1}" for i in range(N_STREAMS) for j in range(N_STREAMS) if f"h{i + 1}{j + 1}" not in consts]
    if missing:
        fails.check(False, f"{label}: config.constants lacks {missing}")
        return
    err = check_doubly_stochastic(fails, matrix_from_constants(consts), f"{label} (gradflow's config.constants)", logits)
    print(f"  {label}: gradflow's H_res row/col sums within {DS_TOL}, max |H - sum a_k P_k| = {err:.2e}")
    # the same constants evaluated from the file by the reference's interpreter (docs/placement-files.md)
    sys.path.insert(0, os.path.join(root, "tests", "reference"))
    import placement_file as PF
    p = PF.load(path)
    sizes = {"S": 4, "B": 2, "d": 16, "T": 5, "heads": 2}
    where = PF.Where(p, sizes, 0, 0, "attn", "attn-ffn", p.option_values(None))
    Hi = np.array([[where.constant(f"h{i + 1}{j + 1}") for j in range(N_STREAMS)] for i in range(N_STREAMS)])
    check_doubly_stochastic(fails, Hi, f"{label} (placement_file.py)", logits)


# ------------------------------------------------------------------------------------------------
# (ii) the independent model
# ------------------------------------------------------------------------------------------------
class MhcLite:
    """mHC-lite at init on gradflow's exported weights, float64, the streams as four tensors."""

    def __init__(self, R, weights, cfg, logits, norm, heads):
        self.R, self.W, self.heads = R, weights, heads
        eps = float(cfg.get("norm_eps", R.EPS))
        base = {"rms": R.rms_norm, "layer": R.layer_norm}[norm]
        self.N = lambda x: base(x, eps)
        self.H = h_res(logits)  # (i, j): source stream i, target stream j

    def gates(self, l):
        r = l % N_STREAMS  # the stream this sublayer favours (the file's r = l mod 4)
        z = torch.tensor([PRE_POST_ON if i == r else PRE_POST_OFF for i in range(N_STREAMS)])
        return torch.sigmoid(z), 2.0 * torch.sigmoid(z)  # H_pre, H_post

    def branch(self, l, x):
        W = self.W[l]
        if "W_Q" in W:
            return self.R.attention(x, W, self.heads)
        return self.R.ffn(x, W)

    def sublayer(self, l, xs):
        pre, post = self.gates(l)
        u = self.branch(l, self.N(sum(pre[i] * xs[i] for i in range(N_STREAMS))))
        return [sum(self.H[i, j] * xs[i] for i in range(N_STREAMS)) + post[j] * u for j in range(N_STREAMS)]

    def output(self, xs):
        return sum(self.N(x) for x in xs)


def reference_figures(R, export, logits, norm):
    arch, cfg, meta, x0, probes, weights = R.load_export(export)
    heads = int(cfg.get("heads", 1))
    model = MhcLite(R, weights, cfg, logits, norm, heads)
    states = [[x0.clone().requires_grad_(True) for _ in range(N_STREAMS)]]  # every stream a copy of x_0
    for l in range(len(weights)):
        states.append(model.sublayer(l, states[-1]))
    loss = (probes[0] * model.output(states[-1])).sum()  # L = sum(U * y), probe 0
    flat = [t for st in states for t in st]
    grads = torch.autograd.grad(loss, flat)
    T, d = x0.shape
    out = {"rms": [], "log10_grad": [], "streams": {f"x{i + 1}": {"rms": [], "log10_grad": []} for i in range(N_STREAMS)}}
    for l, st in enumerate(states):
        g = grads[l * N_STREAMS:(l + 1) * N_STREAMS]
        out["rms"].append(math.sqrt(sum(float((x * x).sum()) for x in st) / (N_STREAMS * T * d)))
        out["log10_grad"].append(0.5 * math.log10(sum(float((t * t).sum()) for t in g)))
        for i in range(N_STREAMS):
            s = out["streams"][f"x{i + 1}"]
            s["rms"].append(math.sqrt(float((st[i] * st[i]).sum()) / (T * d)))
            s["log10_grad"].append(0.5 * math.log10(float((g[i] * g[i]).sum())))
    return out


def compare(fails, label, gf, ref, tol):
    worst = 0.0

    def series(name, a, b, kind):
        nonlocal worst
        if a is None or len(a) != len(b):
            fails.check(False, f"{label}: {name} has {None if a is None else len(a)} entries, reference {len(b)}")
            return
        for idx, (x, y) in enumerate(zip(a, b)):
            if x is None:
                fails.check(False, f"{label}: {name}[{idx}] is null")
                return
            err = abs(x - y) / max(abs(x), abs(y)) if kind == "rms" else abs(10.0 ** (x - y) - 1.0)
            worst = max(worst, err)
            if err > tol:
                fails.check(False, f"{label}: {name}[{idx}] gradflow {x!r} reference {y!r} (error {err:.3g} > {tol})")
                return
        fails.check(True, "")

    st = gf["states"]
    series("rms", st["rms"], ref["rms"], "rms")
    series("log10_grad", st["log10_grad"], ref["log10_grad"], "log")
    for name, s in ref["streams"].items():
        g = (st.get("streams") or {}).get(name)
        if g is None:
            fails.check(False, f"{label}: gradflow reports no stream {name}")
            continue
        series(f"streams.{name}.rms", g["rms"], s["rms"], "rms")
        series(f"streams.{name}.log10_grad", g["log10_grad"], s["log10_grad"], "log")
    return worst


def random_logit_copy(path, logits, out_dir):
    """A copy of the file with the 24 residual logits replaced and another id (docs/placement-files.md)."""
    with open(path) as f:
        text = f.read()
    found = set()

    def sub(m):
        k = int(m.group(2))
        found.add(k)
        return f"{m.group(1)} = {logits[k]!r}"

    text = re.sub(r"^(res_logit_(\d\d))[ \t]*=[ \t]*[^#\n]*?(?=[ \t]*(#|$))", sub, text, flags=re.M)
    if found != set(range(len(PERMS))):
        return None, f"the file does not define res_logit_00..res_logit_23 as plain constants (found {sorted(found)})"
    text, n = re.subn(r'^id[ \t]*=[ \t]*"([^"]*)"', lambda m: f'id = "{m.group(1)}-random-logits"', text, count=1, flags=re.M)
    if n != 1:
        return None, "no id line"
    out = os.path.join(out_dir, "mhc-lite-random-logits.toml")
    with open(out, "w") as f:
        f.write(text)
    return out, None


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("gradflow")
    ap.add_argument("root")
    ap.add_argument("--placement", help="a placement file to test instead of the shipped mhc-lite (run by path)")
    a = ap.parse_args(argv)
    binary = os.path.abspath(a.gradflow)
    root = os.path.abspath(a.root)
    if not os.access(binary, os.X_OK):
        print(f"{binary}: not an executable", file=sys.stderr)
        return 2
    sys.path.insert(0, os.path.join(root, "tests", "reference"))
    import gradflow_reference as R

    path = os.path.abspath(a.placement) if a.placement else os.path.join(root, "data", "placements", "mhc-lite.toml")
    arch = path if a.placement else "mhc-lite"
    fails = Failures()
    rng = np.random.default_rng(20260109)
    rand_logits = [float(v) for v in np.round(rng.uniform(-3.0, 3.0, len(PERMS)), 6)]
    with tempfile.TemporaryDirectory(prefix="mhc-lite-test-") as tmp:
        rand_path, why = random_logit_copy(path, rand_logits, tmp)
        fails.check(rand_path is not None, f"random-logit copy: {why}")
        cases = [("init", arch, path, INIT_LOGITS)]
        if rand_path:
            cases.append(("random logits", rand_path, rand_path, rand_logits))
        for case, arch_arg, file_path, logits in cases:
            print(f"{case}: {arch_arg}")
            n = 0
            for block in ("attn-ffn", "ffn", "attn"):
                for norm in ("rms", "layer"):
                    for precision in ("f64", "f32"):
                        tag = f"{case.replace(' ', '_')}-{block}-{norm}-{precision}"
                        run, export = run_gradflow(binary, arch_arg, block, norm, precision, tmp, tag)
                        if n == 0:
                            check_matrix(fails, root, run, file_path, logits, f"(i) {case}")
                        n += 1
                        ref = reference_figures(R, export, logits, norm)
                        worst = compare(fails, f"(ii) {case} {block} {norm} {precision}", run["seeds"][0], ref,
                                        TOL[precision])
                        print(f"  (ii) {block:8s} {norm:5s} {precision}: max error {worst:.2e} (tolerance {TOL[precision]:g})")
    print(f"{fails.passed} passed, {len(fails.items)} failed")
    return 0 if not fails.items else 1


if __name__ == "__main__":
    sys.exit(main())
