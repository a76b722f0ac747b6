#!/usr/bin/python3
"""Compare gradflow's figures with the independent PyTorch reference, on gradflow's own exported weights.

  /usr/bin/python3 tests/reference/compare.py --gradflow build/gradflow --arch keel [--depth 3 --width 16
        --heads 2 --seq 5 --block attn-ffn --norm rms --init xavier --alpha A --keel-variant v2
        --mix-ratio R --input-corr r --tol 1e-8 --keep DIR --wrong-variant keel-alpha-on-branch
        --ffn gelu|swiglu|geglu|gelu_tanh|geglu_tanh|moe --ffn-hidden N --experts E --experts-active K --shared-expert-hidden N
        --router-gates renormalized|softmax --shared-expert-gate sigmoid|none
        --placement-option attnres-query=0.3 ...]
  ... --all [--strict] [--baselines DIR]   every placement `BIN archs --format json` lists

Runs `BIN analyze --arch ARCH ... --precision f64 --seed 0 --export-weights TMP.safetensors -o TMP.json`,
rebuilds the stack from the export in float64 torch, and compares per state (rms, log10_grad,
log10_grad_rel, per-stream rms/log10_grad) and per sublayer (gain, skip_gain, branch_gain, branch_rms,
stream_share).

Error measure (max over indices, reported per figure):
  linear figures : |gf - ref| / max(|gf|, |ref|); both below 1e-14 in magnitude counts as 0.
  log10 figures  : |10**(gf - ref) - 1|, i.e. the relative error of the underlying norm.
  null vs number : infinite error.
With --all the placements come from gradflow's own registry, so a new one cannot be skipped: a listed
placement the reference cannot build fails as NO_REFERENCE, and (with --baselines DIR) one without
DIR/<id>.json fails as NO_BASELINE, whatever --strict says; the summary names each.

Exit: 0 all within --tol (default 1e-8), 1 any mismatch (figures or constants), NO_REFERENCE or NO_BASELINE
-- or, with --strict, any placement gradflow rejects (UNSUPPORTED) --, 2 usage / IO / run error.
"""
import argparse
import glob
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import gradflow_reference as R  # noqa: E402
import placement_file as PF  # noqa: E402

REPO = os.path.dirname(os.path.dirname(HERE))

STATE_FIGS = ["rms", "log10_grad", "log10_grad_rel"]
SUB_FIGS = ["gain", "skip_gain", "branch_gain", "branch_rms", "stream_share"]
ABS_FLOOR = 1e-14


class UsageError(Exception):
    pass


def err_linear(a, b):
    if a is None and b is None:
        return 0.0
    if a is None or b is None:
        return math.inf
    if not (math.isfinite(a) and math.isfinite(b)):
        return 0.0 if a == b else math.inf
    m = max(abs(a), abs(b))
    return 0.0 if m <= ABS_FLOOR else abs(a - b) / m


def err_log10(a, b):
    if a is None and b is None:
        return 0.0
    if a is None or b is None:
        return math.inf
    if not (math.isfinite(a) and math.isfinite(b)):
        return 0.0 if a == b else math.inf
    return abs(math.expm1((a - b) * math.log(10.0)))


def compare_series(name, gf, ref, log):
    """Returns (max_err, index, gf_value, ref_value, note)."""
    if gf is None:
        return (math.inf, None, None, None, "missing in gradflow output")
    if len(gf) != len(ref):
        return (math.inf, None, len(gf), len(ref), "length differs (gradflow, reference)")
    f = err_log10 if log else err_linear
    worst = (0.0, None, None, None, "")
    for i, (a, b) in enumerate(zip(gf, ref)):
        e = f(a, b)
        if e > worst[0] or (worst[1] is None and i == 0):
            worst = (e, i, a, b, "")
    return worst


def f32_representable_tensors(path):
    """Names of F64 tensors (input, probe, weights) in the export whose values are all exactly float32
    numbers: random doubles are essentially never all f32-representable, so this detects an export that
    went through float32 (the input may legitimately be drawn in f32, so it is not listed)."""
    import numpy as np
    try:
        tensors, _ = R.read_safetensors(path)
    except (OSError, ValueError):
        return []
    hits = []
    for name in ("probe", "weights"):
        arrs = [t for n, t in tensors.items() if (n == name if name == "probe" else n.startswith("sublayer."))]
        if arrs and all(np.array_equal(a.astype(np.float32).astype(np.float64), a) for a in arrs):
            hits.append(name)
    return hits


def find_export(base):
    if os.path.exists(base):
        return base
    stem, ext = os.path.splitext(base)
    hits = sorted(glob.glob(stem + ".*" + ext))
    if len(hits) == 1:
        return hits[0]
    raise UsageError(f"export file {base} not written (candidates: {hits})")


def registry(gradflow):
    """The placements gradflow lists (`archs --format json`), in its order: [(id, source)], source the file's
    path for a placement file, None for a built-in (docs/placement-files.md: `source`, "built-in")."""
    p = subprocess.run([gradflow, "archs", "--format", "json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       text=True)
    if p.returncode != 0:
        raise UsageError(f"`{gradflow} archs --format json` exited {p.returncode}: {p.stderr.strip()}")
    try:
        entries = json.loads(p.stdout)["architectures"]
        return [(a["id"], None if a.get("source", "built-in") == "built-in" else a["source"]) for a in entries]
    except (ValueError, KeyError, TypeError) as e:
        raise UsageError(f"`{gradflow} archs --format json` is not a placement list: {e}")


def registered_source(gradflow, arch):
    """The placement file gradflow loads for id `arch` (None: a built-in, a path, or not listed)."""
    if arch.endswith(".toml"):
        return arch
    try:
        return dict(registry(gradflow)).get(arch)
    except UsageError:
        return None


def hand_written(arch_id):
    """The placement whose formulas gradflow_reference.py has for this id: the id itself (or its alias), or for
    a file named `<built-in>-file` (a built-in restated as a file) that built-in; else None."""
    for name in (arch_id, arch_id[:-len("-file")] if arch_id.endswith("-file") else None):
        if name is not None and R.ALIASES.get(name, name) in R.ARCHS:
            return R.ALIASES.get(name, name)
    return None


def file_path(source):
    """A placement file's path as `archs` gives it: absolute, relative to here, or to the repository."""
    for path in (source, os.path.join(REPO, source)):
        if os.path.isfile(path):
            return path
    return source


def reference_support(arch, source=None):
    """(placement file or None, None) if the reference can build this placement, else (None, why not)."""
    if source is not None:
        try:
            return PF.load(file_path(source)), None
        except (OSError, ValueError) as e:
            return None, (f"no reference support: tests/reference/placement_file.py cannot read placement "
                          f"'{arch}' ({source}): {e}")
    if R.ALIASES.get(arch, arch) in R.ARCHS:
        return None, None
    return None, (f"no reference support: gradflow lists placement '{arch}' but tests/reference/"
                  "gradflow_reference.py has no formulas for it and it is not a placement file")


def baseline_missing(arch, baselines):
    """None if DIR/<id>.json exists (or no DIR was given), else why the placement fails."""
    if baselines is None:
        return None
    path = os.path.join(baselines, f"{arch}.json")
    if os.path.isfile(path):
        return None
    return f"no baseline: {path} does not exist (scripts/make-baselines writes it; see data/baselines/README.md)"


def run_gradflow(args, arch, tmp):
    stem = os.path.basename(arch)
    exp = os.path.join(tmp, f"{stem}.safetensors")
    out = os.path.join(tmp, f"{stem}.json")
    cmd = [args.gradflow, "analyze", "--arch", arch, "--depth", str(args.depth), "--width", str(args.width),
           "--heads", str(args.heads), "--seq", str(args.seq), "--block", args.block, "--norm", args.norm,
           "--init", args.init, "--precision", "f64", "--seed", str(args.seed),
           "--export-weights", exp, "-o", out]
    if args.ideal_branch:
        cmd.append("--ideal-branch")
    if args.update:
        cmd += ["--update", args.update, "--lr", repr(args.lr), "--update-params", args.update_params]
    for flag, val in (("--alpha", args.alpha), ("--keel-variant", args.keel_variant),
                      ("--mix-ratio", args.mix_ratio), ("--input-corr", args.input_corr), ("--ffn", args.ffn),
                      ("--ffn-hidden", args.ffn_hidden), ("--kv-heads", args.kv_heads),
                      ("--rope-theta", args.rope_theta), ("--rope-fraction", args.rope_fraction),
                      ("--norm-eps", args.norm_eps), ("--experts", args.experts),
                      ("--experts-active", args.experts_active), ("--shared-expert-hidden", args.shared_expert_hidden),
                      ("--router-gates", args.router_gates), ("--shared-expert-gate", args.shared_expert_gate)):
        if val is not None:
            cmd += [flag, str(val)]
    if args.bias:
        cmd.append("--bias")
    for option in args.placement_option or []:  # a placement file's own [options.KEY] flags: NAME=VALUE
        name, _, val = option.partition("=")
        cmd += ["--" + name, val]
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return cmd, p, exp, out


def compare_arch(args, arch, tmp, source=None):
    """Returns (status, rows, notes).  status: OK, MISMATCH, UNSUPPORTED, NO_REFERENCE, ERROR.  `source`: the
    placement file of a file placement (an --arch ending in .toml is one); its figures are compared with the
    interpreter of placement_file.py and, when its id also has formulas in gradflow_reference.py, with those."""
    if source is None and arch.endswith(".toml"):
        source = arch
    cmd, p, exp, out = run_gradflow(args, arch, tmp)
    if p.returncode != 0:
        msg = (p.stderr or p.stdout).strip().splitlines()
        msg = msg[-1] if msg else f"exit {p.returncode}"
        low = msg.lower()
        # with --all, an arch gradflow does not know (or an option that does not apply to it) is skipped
        status = "UNSUPPORTED" if p.returncode == 2 and ("placement" in low or "arch" in low
                                                         or "does not apply" in low) else "ERROR"
        return status, [], [f"gradflow exit {p.returncode}: {msg}", "command: " + " ".join(cmd)]
    placement, why = reference_support(arch, source)
    if why:
        return "NO_REFERENCE", [], [why]
    arch_id = placement.id if placement is not None else arch
    try:
        exp = find_export(exp)
        with open(out) as f:
            doc = json.load(f)
    except (OSError, ValueError, UsageError) as e:
        return "ERROR", [], [str(e)]
    runs = doc.get("runs") or []
    run = next((r for r in runs if R.ALIASES.get(r.get("arch"), r.get("arch")) == R.ALIASES.get(arch_id, arch_id)),
               runs[0] if runs else None)
    if run is None or not run.get("seeds"):
        return "ERROR", [], ["gradflow JSON has no runs[].seeds[]"]
    seed = run["seeds"][0]
    f32_only = f32_representable_tensors(exp)
    if f32_only:
        notes_pre = [f"hint: the F64 export's {', '.join(f32_only)} hold only float32-representable values; "
                     "fine if they were drawn in f32, but if the run used unrounded doubles ([C]: export dtype "
                     "= run precision) figures cannot agree beyond ~1e-8"]
    else:
        notes_pre = []
    rows, notes, mismatch = [], [], False
    try:
        if placement is not None:
            ref, fnotes, fbad, file_built = file_reference(args, placement, exp, run)
            frows, knotes, kbad = figure_rows(seed, ref, "F:")
            rows += frows + [("F:sublayer", "skip_gain_theory") + compare_series(
                "skip_gain_theory", seed.get("sublayers", {}).get("skip_gain_theory"),
                ref["sublayers"]["skip_gain_theory"], False)]
            notes += fnotes + knotes
            mismatch |= fbad or kbad
        if hand_written(arch_id):
            ref, snotes, sbad, built = spec_reference(args, exp, run, hand_written(arch_id))
            srows, knotes, kbad = figure_rows(seed, ref, "")
            rows += srows
            notes += snotes + knotes
            mismatch |= sbad or kbad
            if args.update:
                rows += compare_update(args, *built, seed)
        elif args.update and placement is not None:
            # a file placement with no formulas of its own here: the same optimizer step on the file's stack
            # (placement_file.py), which applies the file's [learning_rate_scale]
            rows += [("U:" + row[0],) + tuple(row[1:]) for row in compare_update(args, *file_built, seed)]
    except (OSError, ValueError, KeyError) as e:
        return "ERROR", [], [f"reference failed: {e}"]
    notes = [n if n.startswith(("info", "CONSTANT", "CONFIG")) else "note: " + n for n in notes] + notes_pre
    mismatch |= any(not (row[2] <= args.tol) for row in rows)
    if not mismatch:
        notes = [n for n in notes if not n.startswith("hint:")]
    return ("MISMATCH" if mismatch else "OK"), rows, notes


def moe_overrides(args):
    """--ffn moe's settings as the reference's config keys (None: not given, the exported config's value)."""
    return {"experts": args.experts, "experts_active": args.experts_active,
            "shared_expert_hidden": args.shared_expert_hidden, "router_gates": args.router_gates,
            "shared_expert_gate": args.shared_expert_gate}


def spec_reference(args, exp, run, arch):
    """The hand-written formulas of gradflow_reference.py for `arch`: (figures, notes, constants mismatch,
    (stack, x0, probes) for --update's own optimizer step)."""
    overrides = {"block": args.block, "norm": args.norm, "heads": args.heads, "keel_variant": args.keel_variant,
                 "mix_ratio": args.mix_ratio, "alpha": args.alpha, "ffn": args.ffn, "kv_heads": args.kv_heads,
                 "rope_theta": args.rope_theta, "rope_fraction": args.rope_fraction, "norm_eps": args.norm_eps,
                 "bias": True if args.bias else None, "arch": arch, **moe_overrides(args)}
    stack, x0, probes, cfg, consts, notes = R.build_from_export(
        exp, qk_norm=args.qk_norm, lns_index=args.lns_index, wrong_variant=args.wrong_variant,
        constants_source="spec", overrides=overrides)
    ref = R.analyze(stack, x0, probes)
    # Constants: the reference used the spec (or the explicitly requested override); a different
    # constant in gradflow's resolved config is a mismatch unless it was explicitly requested.
    mismatch = False
    notes = list(notes)
    jc = dict((run.get("config") or {}).get("constants") or {})
    _, cnotes = R.resolve_constants(stack.arch, {"constants": jc}, stack.B, stack.S, stack.mix_ratio, "spec",
                                    alpha=args.alpha, lns_index=args.lns_index, width=x0.shape[1])
    for n in cnotes:
        if "not used by the reference" in n:
            notes.append("info: " + n)
        elif args.lns_index != "block" and "input_scale" in n:
            notes.append("info (--lns-index sublayer requested): " + n)
        else:
            notes.append("CONSTANT MISMATCH: " + n)
            mismatch = True
    return ref, notes, mismatch, (stack, x0, probes)


def file_reference(args, placement, exp, run):
    """The placement file through placement_file.py: (figures, notes, mismatch of constants or recorded file).
    docs/placement-files.md: config.constants holds each named constant at the last sublayer, and
    config.placement_file the file's text and its FNV-1a 64 hash."""
    overrides = {"block": args.block, "norm": args.norm, "heads": args.heads, "ffn": args.ffn,
                 "kv_heads": args.kv_heads, "rope_theta": args.rope_theta, "rope_fraction": args.rope_fraction,
                 "norm_eps": args.norm_eps, "bias": True if args.bias else None, **moe_overrides(args)}
    built = []
    ref = PF.run_reference(placement, exp, overrides, built)
    notes, mismatch = list(ref["notes"]), False
    cfg = run.get("config") or {}
    jc = dict(cfg.get("constants") or {})
    for name, value in ref["constants"].items():
        got = R._num(jc.pop(name, None))
        if got is None or not R._close(got, value):
            notes.append(f"CONSTANT MISMATCH: {placement.id}: config constants.{name} = {got!r} but the file "
                         f"gives {value!r}")
            mismatch = True
    notes += [f"info: config constant '{k}' is not in the file" for k in jc]
    recorded = cfg.get("placement_file") or {}
    text = recorded.get("text", cfg.get("placement_file.text"))
    digest = recorded.get("hash", cfg.get("placement_file.hash"))
    with open(file_path(placement.source), "rb") as f:
        want = PF.fnv1a64(f.read())
    if text != placement.text:
        notes.append(f"CONFIG: config.placement_file.text is not the text of {placement.source}")
        mismatch = True
    if digest != want:
        notes.append(f"CONFIG: config.placement_file.hash = {digest!r} but {placement.source} hashes to {want}")
        mismatch = True
    return ref, notes, mismatch, built


def figure_rows(seed, ref, label):
    """Rows (where, figure, err, index, gradflow, reference, note) of one reference's figures, with notes and
    whether the sublayer kinds differ."""
    rows, notes = [], []
    gs, gl = seed.get("states", {}), seed.get("sublayers", {})
    for fig in STATE_FIGS:
        rows.append((label + "state", fig) + compare_series(fig, gs.get(fig), ref["states"][fig],
                                                            fig.startswith("log10")))
    for fig in SUB_FIGS:
        rows.append((label + "sublayer", fig) + compare_series(fig, gl.get(fig), ref["sublayers"][fig], False))
    bad = gl.get("kind") is not None and list(gl["kind"]) != ref["sublayers"]["kind"]
    if bad:
        notes.append(f"kind differs: gradflow {gl['kind']} reference {ref['sublayers']['kind']}")
    gstreams = gs.get("streams") or {}
    for name, rs in ref["states"]["streams"].items():
        if name not in gstreams:
            if len(ref["states"]["streams"]) > 1:
                notes.append(f"info: stream '{name}' not in gradflow output (has {sorted(gstreams)})")
            continue
        for fig in ("rms", "log10_grad"):
            rows.append((f"{label}stream {name}", fig) + compare_series(fig, gstreams[name].get(fig), rs[fig],
                                                                        fig == "log10_grad"))
    return rows, notes, bad


def compare_update(args, stack, x0, probes, seed):
    """--update: the update figures of gradflow's column 1 against the reference's own optimizer step."""
    ref = R.model_update(stack, x0, probes[0], args.update, args.lr, args.update_params)
    gs, gl = seed.get("states", {}), seed.get("sublayers", {})
    steps = (seed.get("summary") or {}).get("update") or [{}]
    rows = []
    for fig in ("update_rms", "log10_update_rel"):
        rows.append(("state", fig) + compare_series(fig, gs.get(fig + "_1"), ref[fig], fig.startswith("log10")))
    for fig in ("update_loss", "update_loss_share"):
        rows.append(("sublayer", fig) + compare_series(fig, gl.get(fig + "_1"), ref[fig], False))
    for fig in ("output_update_rel", "delta_loss", "delta_loss_first_order"):
        rows.append(("run", fig) + compare_series(fig, [steps[0].get(fig)], [ref[fig]], False))
    gstep = steps[0].get("step_rel") or {}
    for kind, value in ref["step_rel"].items():
        rows.append(("run", "step_rel " + kind) + compare_series(kind, [gstep.get(kind)], [value], False))
    return rows


def fmt(v):
    if v is None:
        return "null"
    if isinstance(v, float):
        return f"{v:.17g}"
    return str(v)


def print_table(arch, status, rows, notes, tol):
    print(f"== {arch}: {status}")
    if rows:
        print(f"   {'where':<10} {'figure':<16} {'max err':>10}  {'at':>3}  {'gradflow':>24}  {'reference':>24}")
    for where, fig, e, i, a, b, note in rows:
        flag = "" if e <= tol else "   <-- MISMATCH"
        es = "inf" if math.isinf(e) else f"{e:.2e}"
        print(f"   {where:<10} {fig:<16} {es:>10}  {fmt(i):>3}  {fmt(a):>24}  {fmt(b):>24}{flag}"
              + (f"  ({note})" if note else ""))
    for n in notes:
        print("   " + n)


def build_parser():
    p = argparse.ArgumentParser(description="gradflow vs PyTorch reference")
    p.add_argument("--gradflow", required=True, help="path to the gradflow binary")
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--arch")
    g.add_argument("--all", action="store_true", help="every placement `gradflow archs --format json` lists")
    p.add_argument("--depth", type=int, default=3)
    p.add_argument("--width", type=int, default=16)
    p.add_argument("--heads", type=int, default=2)
    p.add_argument("--seq", type=int, default=5)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--block", default="attn-ffn", choices=["attn-ffn", "ffn", "attn"])
    p.add_argument("--norm", default="rms", choices=["rms", "layer", "dyt"])
    p.add_argument("--init", default="xavier", help="xavier, gpt2, small or normal:STD")
    # issue 19's block ops (the reference reads them from the export and checks them against these)
    p.add_argument("--ffn", choices=["gelu", "swiglu", "geglu", "gelu_tanh", "geglu_tanh", "moe"])
    p.add_argument("--ffn-hidden", type=int)
    # --ffn moe's router (each forwarded to gradflow only when given; else gradflow's defaults)
    p.add_argument("--experts", type=int, help="--ffn moe: number of experts E (gradflow's default 8)")
    p.add_argument("--experts-active", type=int, help="--ffn moe: experts per token K (default 2)")
    p.add_argument("--shared-expert-hidden", type=int,
                   help="--ffn moe: hidden width of the always-on shared expert (default 0: none)")
    p.add_argument("--router-gates", choices=["renormalized", "softmax"],
                   help="--ffn moe: top-K gates renormalised to sum 1 (default), or the softmax probabilities")
    p.add_argument("--shared-expert-gate", choices=["sigmoid", "none"],
                   help="--ffn moe: the shared expert's output times sigmoid(x W_gate.shared) (default), or not")
    p.add_argument("--kv-heads", type=int)
    p.add_argument("--rope-theta", type=float)
    p.add_argument("--rope-fraction", type=float)
    p.add_argument("--norm-eps", type=float)
    p.add_argument("--bias", action="store_true")
    p.add_argument("--alpha", type=float)
    p.add_argument("--keel-variant", choices=["v1", "v2"])
    p.add_argument("--mix-ratio", type=float)
    p.add_argument("--input-corr", type=float)
    p.add_argument("--placement-option", action="append", metavar="NAME=VALUE",
                   help="a placement file's own option, given to gradflow as --NAME VALUE (e.g. attnres-query=0.3); "
                        "the reference reads its value from the run's config")
    p.add_argument("--ideal-branch", action="store_true",
                   help="gradflow --ideal-branch: every F is a +90 degree rotation in coordinate pairs")
    p.add_argument("--update", choices=["sgd", "adam"],
                   help="also compare the model-update figures of one optimizer step (gradflow --update)")
    p.add_argument("--lr", type=float, default=1e-3, help="the learning rate of --update")
    p.add_argument("--update-params", choices=["matrices", "all"], default="matrices",
                   help="what --update steps: the weight matrices, or all (the norm gains as well)")
    p.add_argument("--tol", type=float, default=1e-8)
    p.add_argument("--qk-norm", choices=["rms", "follow"], default="rms",
                   help="norm type of q/k/v norms inside attention (hybridnorm, olmo2): RMSNorm or --norm")
    p.add_argument("--lns-index", choices=["sublayer", "block"], default="block",
                   help="which index in lns' 1/sqrt(idx+1): 0-based block (default, LNS authors' code) "
                        "or sublayer")
    p.add_argument("--strict", action="store_true",
                   help="with --all, an UNSUPPORTED placement is a failure (exit 1)")
    p.add_argument("--wrong-variant", choices=["keel-alpha-on-branch"],
                   help="deliberately build a WRONG reference (test that mismatches are caught)")
    p.add_argument("--keep", help="keep the exports and gradflow JSON in this directory")
    p.add_argument("--baselines", metavar="DIR",
                   help="with --all: every listed placement must also have DIR/<id>.json (else NO_BASELINE)")
    return p


def main(argv=None):
    p = build_parser()
    try:
        args = p.parse_args(argv)
    except SystemExit as e:
        return 2 if e.code else 0
    if not (os.path.isfile(args.gradflow) and os.access(args.gradflow, os.X_OK)):
        print(f"compare.py: gradflow binary not found or not executable: {args.gradflow}", file=sys.stderr)
        return 2
    try:
        archs = registry(args.gradflow) if args.all else [(args.arch, registered_source(args.gradflow, args.arch))]
    except UsageError as e:
        print(f"compare.py: {e}", file=sys.stderr)
        return 2
    tmp = args.keep or tempfile.mkdtemp(prefix="gf_compare_")
    os.makedirs(tmp, exist_ok=True)
    results = []
    try:
        for arch, source in archs:
            status, rows, notes = uncovered(arch, source, args.baselines) if args.all else (None, [], [])
            if status is None:
                status, rows, notes = compare_arch(args, arch, tmp, source)
            print_table(arch, status, rows, notes, args.tol)
            results.append((arch, status, notes))
    finally:
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)
    print("\nsummary: " + ", ".join(f"{a}={s}" for a, s, _ in results))
    for arch, status, notes in results:
        if status in ("NO_REFERENCE", "NO_BASELINE"):
            print(f"FAILED, not covered: {arch}: " + "; ".join(notes))
    return exit_code([s for _, s, _ in results], args.all, args.strict)


def uncovered(arch, source, baselines):
    """(status, [], reasons) for a listed placement the suite cannot vouch for -- no reference support, or no
    baseline in `baselines` (when given) --, else (None, [], [])."""
    no_reference, no_baseline = reference_support(arch, source)[1], baseline_missing(arch, baselines)
    if not (no_reference or no_baseline):
        return None, [], []
    return ("NO_REFERENCE" if no_reference else "NO_BASELINE"), [], [w for w in (no_reference, no_baseline) if w]


def exit_code(statuses, all_archs, strict):
    """1: a MISMATCH, NO_REFERENCE or NO_BASELINE, or (with --strict) an UNSUPPORTED placement; 2: an ERROR, or
    UNSUPPORTED for a single --arch without --strict; else 0 (with --all, UNSUPPORTED alone does not fail
    unless --strict)."""
    statuses = set(statuses)
    if statuses & {"MISMATCH", "NO_REFERENCE", "NO_BASELINE"} or (strict and "UNSUPPORTED" in statuses):
        return 1
    if "ERROR" in statuses or (not all_archs and "UNSUPPORTED" in statuses):
        return 2
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except BrokenPipeError:  # e.g. piped into head
        sys.exit(1)
