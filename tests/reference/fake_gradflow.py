#!/usr/bin/python3
"""A stand-in for `gradflow analyze` (test fixture for compare.py only, NOT a gradflow implementation):
writes random weights to --export-weights in the CONTRACT.md layout and a CONTRACT.md-shaped JSON whose
figures come from the reference itself.  `--perturb FIG` scales one figure by (1 + 1e-6) so the
comparison must fail.  FAKE_GRADFLOW_REJECT=ARCH[,ARCH...] makes it reject those archs with exit 2
("does not apply"), as gradflow does for an option that does not fit a placement.  Constants are written
in gradflow's form {"value": v, "formula": ..., "unit": ...}.
`archs --format json` lists the reference's placements, or FAKE_GRADFLOW_ARCHS=ID[,ID...] (ids the
reference does not know included: a stand-in for a newly registered placement), then the placement files
FAKE_GRADFLOW_FILES=PATH[,PATH...] with their `source`; `analyze --arch` takes their ids or a PATH.toml, and
their figures come from the placement-file interpreter (placement_file.py)."""
import argparse
import json
import os
import sys
import tomllib

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import gradflow_reference as R  # noqa: E402
import placement_file as PF  # noqa: E402
import test_reference_selftest as T  # noqa: E402


def archs():
    if sys.argv[2:] != ["--format", "json"]:
        print("fake_gradflow: usage: archs --format json", file=sys.stderr)
        return 2
    listed = os.environ.get("FAKE_GRADFLOW_ARCHS")
    ids = listed.split(",") if listed else R.ARCHS
    entries = [{"id": i, "aliases": [], "source": "built-in"} for i in ids]
    entries += [{"id": i, "aliases": [], "source": path} for i, path in files().items()]
    print(json.dumps({"schema_version": 1, "architectures": entries}))
    return 0


def files():
    """id -> path of FAKE_GRADFLOW_FILES (the id read with tomllib alone; the file's stem when unreadable)."""
    out = {}
    for path in filter(None, (os.environ.get("FAKE_GRADFLOW_FILES") or "").split(",")):
        try:
            with open(path, "rb") as f:
                out[tomllib.load(f)["id"]] = path
        except (OSError, ValueError, KeyError):
            out[os.path.splitext(os.path.basename(path))[0]] = path
    return out


def analyze_file(a, path):
    """A placement file: figures from placement_file.py, config with constants and placement_file."""
    with open(path, "rb") as f:
        data = f.read()
    placement = PF.PlacementFile(data.decode("utf-8"), path)
    B = a.depth
    S = 2 * B if a.block == "attn-ffn" else B
    t = T.make_tensors(B, a.width, a.seq, a.block, 1, a.seed)
    cfg = {"arch": placement.id, "blocks": B, "sublayers": S, "width": a.width, "heads": a.heads, "seq": a.seq,
           "block": a.block, "norm": a.norm, "norm_eps": 1e-6, "init": a.init, "precision": a.precision,
           "probes": 1, "seeds": [a.seed], "placement_file": {"text": placement.text, "hash": PF.fnv1a64(data)}}
    R.write_safetensors(a.export_weights, t, {"arch": placement.id, "seed": a.seed, "config": json.dumps(cfg)})
    res = PF.run_reference(placement, a.export_weights)
    cfg["constants"] = {k: {"value": v, "formula": "(fake)", "unit": "file"} for k, v in res["constants"].items()}
    return placement.id, cfg, res


def main():
    if len(sys.argv) >= 2 and sys.argv[1] == "archs":
        return archs()
    if len(sys.argv) < 2 or sys.argv[1] != "analyze":
        print("fake_gradflow: usage: analyze ... | archs --format json", file=sys.stderr)
        return 2
    p = argparse.ArgumentParser()
    for f in ("--arch", "--block", "--norm", "--init", "--precision", "--export-weights", "-o",
              "--keel-variant", "--perturb"):
        p.add_argument(f)
    for f in ("--depth", "--width", "--heads", "--seq", "--seed"):
        p.add_argument(f, type=int)
    for f in ("--alpha", "--mix-ratio", "--input-corr"):
        p.add_argument(f, type=float)
    a = p.parse_args(sys.argv[2:])
    perturb = a.perturb or os.environ.get("FAKE_GRADFLOW_PERTURB")
    path = a.arch if a.arch.endswith(".toml") else files().get(a.arch)
    if path is not None:
        arch, cfg, res = analyze_file(a, path)
        return write_result(a, arch, cfg, res, perturb)
    arch = R.ALIASES.get(a.arch, a.arch)
    if arch not in R.ARCHS:
        print(f"gradflow: unknown arch '{a.arch}'", file=sys.stderr)
        return 2
    if arch in (os.environ.get("FAKE_GRADFLOW_REJECT") or "").split(","):
        print(f"gradflow: error: this option does not apply to {arch}", file=sys.stderr)
        return 2
    B = a.depth
    S = 2 * B if a.block == "attn-ffn" else B
    t = T.make_tensors(B, a.width, a.seq, a.block, 1, a.seed)
    consts = R.spec_constants(arch, B, S, a.mix_ratio if a.mix_ratio is not None else 0.25, a.alpha)
    consts = {k: {"value": v, "formula": "(fake)", "unit": "-"} for k, v in consts.items()}
    cfg = {"arch": arch, "blocks": B, "sublayers": S, "width": a.width, "heads": a.heads, "seq": a.seq,
           "block": a.block, "norm": a.norm, "norm_eps": 1e-6, "init": a.init, "precision": a.precision,
           "probes": 1, "seeds": [a.seed], "constants": consts, "keel_variant": a.keel_variant or "v2"}
    R.write_safetensors(a.export_weights, t, {"arch": arch, "seed": a.seed, "config": json.dumps(cfg)})
    res = R.run_reference(a.export_weights)
    return write_result(a, arch, cfg, res, perturb)


def write_result(a, arch, cfg, res, perturb):
    if perturb:
        for part in ("states", "sublayers"):
            if perturb in res[part]:
                res[part][perturb] = [v * (1 + 1e-6) if v is not None else v for v in res[part][perturb]]
    doc = {"schema_version": 1, "tool": {"name": "gradflow", "version": "fake"}, "command": "analyze",
           "runs": [{"arch": arch, "config": cfg,
                     "seeds": [{"seed": a.seed, "states": res["states"], "sublayers": res["sublayers"]}]}]}
    with open(a.o, "w") as f:
        json.dump(doc, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
