#!/usr/bin/python3
"""Tests for scripts/gradflow-plot: renders every figure from synthetic contract-shaped input and
checks the images are real, correctly sized and not blank; checks the error paths.

Run:  /usr/bin/python3 tests/plot/test_gradflow_plot.py [--from-binary build/gradflow] [--keep DIR]
Prints 'N passed, M failed' and exits non-zero when anything failed.
"""

import argparse
import csv
import importlib.machinery
import importlib.util
import json
import math
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import traceback
from pathlib import Path

try:
    import matplotlib
except ImportError:  # e.g. run by a python3 without it: the plotting interpreter is Debian's
    if sys.executable != "/usr/bin/python3" and os.path.exists("/usr/bin/python3"):
        os.execv("/usr/bin/python3", ["/usr/bin/python3", __file__, *sys.argv[1:]])
    sys.exit("test_gradflow_plot: matplotlib is missing; apt-get install python3-matplotlib")

matplotlib.use("Agg")
import matplotlib.image  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "gradflow-plot"
ARCHS = ["pre-ln", "post-ln"]
SEEDS = [0, 1]
BLOCKS = 8
S = 2 * BLOCKS
DEFAULT_PX = (960, 600)  # 8 x 5 in at 120 dpi
CSV_COLUMNS = ["arch", "blocks", "sublayers", "seed", "index", "kind", "block", "rms", "log10_grad",
               "log10_grad_rel", "gain", "skip_gain", "branch_gain", "skip_gain_theory", "branch_rms",
               "stream_share"]
SUBLAYER_COLUMNS = ["kind", "block", "gain", "skip_gain", "branch_gain", "skip_gain_theory", "branch_rms",
                    "stream_share"]

# ---------------------------------------------------------------------------------------------
# Synthetic inputs shaped like the contract (CONTRACT.md), with the qualitative behaviour of
# pre-ln (sqrt growth, mild gradient change) and post-ln (bounded rms, vanishing gradient).


def synthetic_seed(arch, seed, blocks=BLOCKS, angles=False, output_share=False):
    rng = np.random.default_rng(1000 * seed + len(arch) + blocks)
    S_ = 2 * blocks
    l = np.arange(S_ + 1)
    noise = 1 + 0.03 * rng.standard_normal(S_ + 1)
    if arch == "pre-ln":
        rms = np.sqrt(1 + l / 2) * noise
        log10_grad = 0.25 * np.log10((S_ + 1) / (l + 1)) + 0.02 * rng.standard_normal(S_ + 1)
        share = 1 / np.sqrt(l[:-1] + 1) * noise[:-1]
    else:
        rms = noise
        log10_grad = -(S_ - l) * 0.1505 + 0.02 * rng.standard_normal(S_ + 1)
        share = 0.7 * noise[:-1]
    log10_grad = log10_grad - 3.0
    rel = log10_grad - log10_grad[-1]
    gain = 10 ** (log10_grad[:-1] - log10_grad[1:])
    seed_json = {
        "seed": seed,
        "states": {"index": l.tolist(), "rms": rms.tolist(), "log10_grad": log10_grad.tolist(),
                   "log10_grad_rel": rel.tolist(), "streams": {"x": {"rms": rms.tolist(),
                                                                     "log10_grad": log10_grad.tolist()}}},
        "sublayers": {"index": list(range(S_)), "kind": ["attn", "ffn"] * blocks,
                      "block": [i // 2 for i in range(S_)], "gain": gain.tolist(),
                      "skip_gain": (0.9 * gain).tolist(), "branch_gain": (0.3 * gain).tolist(),
                      "skip_gain_theory": [None] * S_ if arch == "pre-ln" else [2 ** -0.5] * S_,
                      "branch_rms": (0.5 * rms[:-1]).tolist(), "stream_share": share.tolist()},
        "summary": {"log10_grad_ratio": float(rel[0]), "gain_min": {"value": float(gain.min()), "sublayer": 0},
                    "gain_max": {"value": float(gain.max()), "sublayer": 1},
                    "growth_exponent": 0.5 if arch == "pre-ln" else 0.0, "growth_exponent_se": 0.01,
                    "growth_class": "sqrt" if arch == "pre-ln" else "bounded", "diverged": None},
        "timing": {"seconds": 0.01},
    }
    if output_share:
        c = rng.uniform(0.5, 1.5, S_)
        seed_json["sublayers"]["output_share"] = (c / c.sum()).tolist()
    if angles:
        i, j = np.meshgrid(l, l, indexing="ij")
        scale = 0.15 if arch == "pre-ln" else 0.3
        seed_json["angles_matrix"] = np.minimum(1.0, scale * np.sqrt(np.abs(i - j))).tolist()
    return seed_json


def synthetic_json(blocks=BLOCKS, angles=False, output_share=False):
    runs = []
    for arch in ARCHS:
        config = {"arch": arch, "blocks": blocks, "sublayers": 2 * blocks, "width": 64, "heads": 4, "seq": 16,
                  "block": "attn-ffn", "norm": "rms", "norm_eps": 1e-6, "init": "xavier", "precision": "f32",
                  "probes": 1, "input_corr": 0.0, "seeds": SEEDS, "constants": {}}
        runs.append({"arch": arch, "config": config,
                     "seeds": [synthetic_seed(arch, s, blocks, angles, output_share) for s in SEEDS],
                     "aggregate": {}})
    return {"schema_version": 1, "tool": {"name": "gradflow", "version": "0.1.0"}, "command": "analyze",
            "runs": runs, "timing": {"total_seconds": 0.1}}


def synthetic_csv_rows(depths=(BLOCKS,)):
    """Tidy rows, one per (arch, blocks, seed, index); sublayer columns empty on index S."""
    rows = []
    for blocks in depths:
        for run in synthetic_json(blocks)["runs"]:
            for sj in run["seeds"]:
                st, sub = sj["states"], sj["sublayers"]
                for l in st["index"]:
                    row = {"arch": run["arch"], "blocks": blocks, "sublayers": 2 * blocks, "seed": sj["seed"],
                           "index": l, "rms": repr(st["rms"][l]), "log10_grad": repr(st["log10_grad"][l]),
                           "log10_grad_rel": repr(st["log10_grad_rel"][l])}
                    for col in SUBLAYER_COLUMNS:
                        value = sub[col][l] if l < 2 * blocks else None
                        row[col] = "" if value is None else value
                    rows.append(row)
    return rows


def write_csv(path, rows, columns=CSV_COLUMNS):
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=columns)
        w.writeheader()
        w.writerows(rows)


def synthetic_sweep(update=False):
    """A summary.json shaped like gradflow sweep's (docs/output.md): cells, model, summary.fits;
    with `update`, --update's learning rates, per-cell output_update_rel and its fitted exponents."""
    cells, fits = [], []
    depths = [4, 8, 16, 32]
    rates = [1e-4, 1e-3]
    for arch in ARCHS:
        for b in depths:
            for s in SEEDS:
                jitter = 1 + 0.02 * (s - 0.5)
                rms_final = math.sqrt(1 + b) * jitter if arch == "pre-ln" else 1.0 * jitter
                ratio = 0.25 * math.log10(2 * b) * jitter if arch == "pre-ln" else -0.301 * b * jitter
                cell = {"arch": arch, "blocks": b, "sublayers": 2 * b, "width": 16, "seed": s,
                        "rms_final": rms_final, "log10_grad_ratio": ratio}
                if update:
                    cell["output_update_rel"] = [lr * 100 * b ** (0.5 if arch == "pre-ln" else 0) * jitter
                                                 for lr in rates]
                cells.append(cell)
        p = 0.5 if arch == "pre-ln" else 0.0
        fit = {"arch": arch, "width": 16, "blocks": depths,
               "growth_exponent": {"value": p, "ci95_low": p - 0.03, "ci95_high": p + 0.03},
               "log10_grad_ratio_slope": {"value": 0.01 if arch == "pre-ln" else -0.301}}
        if update:
            fit["output_update_rel_exponent"] = [{"value": p, "ci95_low": p - 0.02, "ci95_high": p + 0.02,
                                                  "learning_rate": lr} for lr in rates]
        fits.append(fit)
    model = {"block": "attn_ffn", "heads": 2}
    if update:
        model.update({"update_step": "adam", "learning_rates": rates})
    return {"schema_version": 1, "command": "sweep", "model": model, "cells": cells, "summary": {"fits": fits}}


# ---------------------------------------------------------------------------------------------
# Image checks


def png_size(path):
    """(width, height) from the IHDR chunk; fails unless the file starts with the PNG signature."""
    with open(path, "rb") as f:
        head = f.read(24)
    assert head[:8] == b"\x89PNG\r\n\x1a\n", f"{path}: not a PNG (signature {head[:8]!r})"
    assert head[12:16] == b"IHDR", f"{path}: first chunk is {head[12:16]!r}, not IHDR"
    return struct.unpack(">II", head[16:24])


def content_stats(path):
    """Pixel variance, fraction of non-background pixels, fraction of coloured (non-grey) pixels."""
    rgb = matplotlib.image.imread(path)[..., :3].astype(float)
    quantised = np.round(rgb * 255).astype(np.int64)
    packed = (quantised[..., 0] << 16) | (quantised[..., 1] << 8) | quantised[..., 2]
    values, counts = np.unique(packed, return_counts=True)
    background = values[np.argmax(counts)]
    non_background = float(np.mean(packed != background))
    coloured = float(np.mean(rgb.max(axis=2) - rgb.min(axis=2) > 0.15))
    return float(rgb.var()), non_background, coloured


def looks_plotted(path):
    """Not blank and with data drawn: the data lines and images are the only coloured pixels."""
    variance, non_background, coloured = content_stats(path)
    return variance > 1e-3 and non_background > 0.02 and coloured > 0.002, (variance, non_background, coloured)


def check_png(path, size=DEFAULT_PX):
    assert os.path.exists(path), f"{path} was not written"
    got = png_size(path)
    assert got == size, f"{path}: {got[0]}x{got[1]} pixels, expected {size[0]}x{size[1]}"
    ok, stats = looks_plotted(path)
    assert ok, f"{path}: looks blank (variance {stats[0]:.4g}, non-background {stats[1]:.3f}, coloured {stats[2]:.4f})"
    return stats


# ---------------------------------------------------------------------------------------------
# Layout checks: gradflow-plot's own code renders the figure here, kept open for matplotlib's renderer


def load_plot_module():
    loader = importlib.machinery.SourceFileLoader("gradflow_plot", str(SCRIPT))
    spec = importlib.util.spec_from_loader("gradflow_plot", loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def rendered_figure(*args):
    """Runs gradflow-plot's main(args) in this process and returns the figure it saved (one figure)."""
    plot = load_plot_module()
    figures = []

    def keep_figure(fig, *rest, **kw):
        figures.append(fig)
        return original(fig, *rest, **kw)

    original = plot.finish_figure
    plot.finish_figure = keep_figure
    code = plot.main([str(a) for a in args])
    assert code == 0, f"gradflow-plot {' '.join(map(str, args))} exited {code}"
    assert len(figures) == 1, f"gradflow-plot {' '.join(map(str, args))} saved {len(figures)} figures"
    return figures[0]


def legend_overlaps(fig):
    """What the figure's legends cover, as drawn by its renderer: every panel (axes) whose window
    extent a legend's window extent meets, any panel title or figure text (title, caption) it meets, and any
    legend that runs off the figure. Empty when every legend stands clear."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    legends = list(fig.legends) + [ax.get_legend() for ax in fig.axes if ax.get_legend() is not None]
    assert legends, "the figure has no legend"
    def where(bbox):
        return "(" + ", ".join(f"{v:.0f}" for v in bbox.extents) + ")"  # x0, y0, x1, y1 in pixels

    problems = []
    texts = [ax.title for ax in fig.axes if ax.get_title()] + [t for t in fig.texts if t.get_text()]
    for box in (legend.get_window_extent(renderer) for legend in legends):
        for i, ax in enumerate(fig.axes):
            panel = ax.get_window_extent(renderer)
            if ax.get_visible() and box.overlaps(panel):
                problems.append(f"legend {where(box)} covers panel {i} {where(panel)}")
        for text in texts:
            if box.overlaps(text.get_window_extent(renderer)):
                problems.append(f"legend {where(box)} covers the text {text.get_text()[:40]!r}")
        if not (fig.bbox.x0 <= box.x0 and box.x1 <= fig.bbox.x1 and fig.bbox.y0 <= box.y0 and box.y1 <= fig.bbox.y1):
            problems.append(f"legend {where(box)} runs off the figure {where(fig.bbox)}")
    return problems


def legend_problems(*args):
    """legend_overlaps of gradflow-plot's figure for `args`, each prefixed with the command."""
    fig = rendered_figure(*args)
    try:
        return [f"gradflow-plot {' '.join(map(str, args))}: {p}" for p in legend_overlaps(fig)]
    finally:
        plt.close(fig)


# ---------------------------------------------------------------------------------------------
# Running the script


def run_plot(*args, stdin=None):
    return subprocess.run([str(SCRIPT), *map(str, args)], input=stdin, capture_output=True, text=True,
                          timeout=120)


def plot_ok(*args, stdin=None):
    r = run_plot(*args, stdin=stdin)
    assert r.returncode == 0, f"gradflow-plot {' '.join(map(str, args))} exited {r.returncode}: {r.stderr.strip()}"
    return r


def expect_error(args, must_mention, stdin=None):
    """Exit 2 with one line on stderr that names the input and the problem."""
    r = run_plot(*args, stdin=stdin)
    assert r.returncode == 2, f"gradflow-plot {' '.join(map(str, args))}: exit {r.returncode}, expected 2"
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, f"expected a one-line message, got: {r.stderr!r}"
    for word in must_mention:
        assert word in lines[0], f"message {lines[0]!r} does not mention {word!r}"
    return lines[0]


# ---------------------------------------------------------------------------------------------
# Tests on synthetic input


class Inputs:
    def __init__(self, tmp):
        self.tmp = Path(tmp)
        self.json = self.tmp / "run.json"
        self.json.write_text(json.dumps(synthetic_json(angles=True, output_share=True), indent=1))
        self.json_plain = self.tmp / "plain.json"  # no optional fields
        self.json_plain.write_text(json.dumps(synthetic_json()))
        self.csv = self.tmp / "run.csv"
        write_csv(self.csv, synthetic_csv_rows())
        self.csv_depths = self.tmp / "depths.csv"
        write_csv(self.csv_depths, synthetic_csv_rows(depths=(2, 4, 8)))
        self.sweep = self.tmp / "sweep.json"
        self.sweep.write_text(json.dumps(synthetic_sweep()))
        self.sweep_update = self.tmp / "sweep_update.json"
        self.sweep_update.write_text(json.dumps(synthetic_sweep(update=True)))


def make_tests(inp, out):
    tests = []

    def test(fn):
        tests.append(fn)
        return fn

    @test
    def checker_rejects_blank_images():
        blank = out / "blank.png"
        fig = plt.figure(figsize=(8, 5), dpi=120)
        fig.savefig(blank, dpi=120)
        plt.close(fig)
        assert png_size(blank) == DEFAULT_PX
        assert not looks_plotted(blank)[0], "an empty figure passed the content check"
        axes_only = out / "axes_only.png"
        fig, ax = plt.subplots(figsize=(8, 5), dpi=120)
        ax.set_title("title only")
        ax.set_xlabel("x")
        fig.savefig(axes_only, dpi=120)
        plt.close(fig)
        assert not looks_plotted(axes_only)[0], "axes without data passed the content check"

    for kind in ["grad", "growth", "shares", "angles"]:
        def from_json(kind=kind):
            plot_ok(kind, inp.json, "-o", out / f"json_{kind}.png")
            check_png(out / f"json_{kind}.png")
        from_json.__name__ = f"{kind}_from_json"
        test(from_json)

    for kind in ["grad", "growth", "shares"]:
        def from_csv(kind=kind):
            plot_ok(kind, inp.csv, "-o", out / f"csv_{kind}.png")
            check_png(out / f"csv_{kind}.png")
        from_csv.__name__ = f"{kind}_from_csv"
        test(from_csv)

    @test
    def shares_without_output_share():
        plot_ok("shares", inp.json_plain, "-o", out / "plain_shares.png")
        check_png(out / "plain_shares.png")

    @test
    def shares_legend_covers_no_panel():
        """The shares panels are filled edge to edge by their curves: the legend stands outside them,
        for one and two panels, many entries and small or wide figures."""
        many = inp.tmp / "many_runs.json"
        doc = synthetic_json(output_share=True)
        doc["runs"] = [dict(run, arch=f"{run['arch']}-variant-{i}") for i in range(5) for run in doc["runs"]]
        many.write_text(json.dumps(doc))
        problems = []
        for src, options in [(inp.json, []), (inp.json_plain, []), (inp.csv, []), (many, []),
                             (inp.json, ["--size", "4x3"]), (many, ["--size", "5x4", "--dpi", "80"]),
                             (many, ["--size", "14x4"])]:
            problems += legend_problems("shares", src, "-o", out / "legend_shares.png", *options)
        assert not problems, "\n  ".join(problems)

    @test
    def sweep_from_sweep_json():
        plot_ok("sweep", inp.sweep, "-o", out / "sweep.png")
        check_png(out / "sweep.png")

    @test
    def update_depth_from_sweep_json():
        plot_ok("update-depth", inp.sweep_update, "-o", out / "update_depth.png")
        check_png(out / "update_depth.png")
        expect_error(["update-depth", inp.sweep, "-o", out / "x.png"], ["update-depth", "sweep --update"])

    @test
    def sweep_from_csv_with_several_depths():
        plot_ok("--kind", "sweep", inp.csv_depths, "-o", out / "csv_sweep.png")
        check_png(out / "csv_sweep.png")

    @test
    def kind_option_and_stdin():
        plot_ok("--kind", "grad", "-", "-o", out / "stdin_grad.png", stdin=inp.csv.read_text())
        check_png(out / "stdin_grad.png")
        plot_ok("growth", "-", "-o", out / "stdin_growth.png", stdin=inp.json.read_text())
        check_png(out / "stdin_growth.png")

    @test
    def std_band():
        plot_ok("grad", inp.json, "--band", "std", "-o", out / "std_grad.png")
        check_png(out / "std_grad.png")

    @test
    def dpi_and_size_set_pixels():
        plot_ok("grad", inp.json, "--dpi", "60", "--size", "6x4", "-o", out / "small.png")
        check_png(out / "small.png", size=(360, 240))

    @test
    def svg_output():
        plot_ok("shares", inp.json, "-o", out / "shares.svg")
        text = (out / "shares.svg").read_text()
        assert "<svg" in text and "</svg>" in text, "shares.svg is not an SVG document"
        assert 'width="576pt"' in text and 'height="360pt"' in text, "shares.svg is not 8x5 in"

    @test
    def pdf_output():
        plot_ok("growth", inp.json, "-o", out / "growth.pdf")
        data = (out / "growth.pdf").read_bytes()
        assert data.startswith(b"%PDF-") and data.rstrip().endswith(b"%%EOF"), "growth.pdf is not a PDF document"
        assert len(data) > 5000, f"growth.pdf has only {len(data)} bytes"

    @test
    def a_python_without_matplotlib_is_told_to_use_usr_bin_python3():
        venv = out / "venv-without-matplotlib"
        made = subprocess.run(["/usr/bin/python3", "-m", "venv", "--without-pip", str(venv)], capture_output=True)
        assert made.returncode == 0, f"cannot make a venv to test with: {made.stderr[-300:]!r}"
        r = subprocess.run([str(venv / "bin" / "python3"), str(SCRIPT), "grad", str(inp.json), "-o", str(out / "x.png")],
                           capture_output=True, text=True)
        assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
        assert "is missing for" in r.stderr and "run it with /usr/bin/python3" in r.stderr, r.stderr

    @test
    def all_from_json():
        d = out / "all_json"
        plot_ok("all", inp.json, "--outdir", d)
        names = sorted(p.name for p in d.iterdir())
        assert names == ["angles.png", "grad.png", "growth.png", "shares.png"], f"all wrote {names}"
        for name in names:
            check_png(d / name)

    @test
    def all_from_csv_skips_angles():
        d = out / "all_csv"
        r = plot_ok("all", inp.csv_depths, "-o", d)
        names = sorted(p.name for p in d.iterdir())
        assert names == ["grad.png", "growth.png", "shares.png", "sweep.png"], f"all wrote {names}"
        assert "skipped angles" in r.stderr, f"no note on the skipped figure: {r.stderr!r}"
        for name in names:
            check_png(d / name)

    @test
    def all_from_sweep_json():
        d = out / "all_sweep"
        plot_ok("all", inp.sweep, "--outdir", d, "--format", "svg")
        names = sorted(p.name for p in d.iterdir())
        assert names == ["sweep.svg"], f"all wrote {names}"
        d = out / "all_sweep_update"
        plot_ok("all", inp.sweep_update, "--outdir", d, "--format", "svg")
        names = sorted(p.name for p in d.iterdir())
        assert names == ["sweep.svg", "update-depth.svg"], f"all wrote {names}"

    @test
    def multi_stream_csv():
        rows = synthetic_csv_rows()
        for row in rows:  # stream columns are empty for single-stream archs
            two_streams = row["arch"] == "pre-ln"
            row["arch"] = "resi-dual" if two_streams else row["arch"]
            row["rms_a"] = 1.0 if two_streams else ""
            row["rms_d"] = float(row["rms"]) * 1.4 if two_streams else ""
        path = inp.tmp / "streams.csv"
        write_csv(path, rows, CSV_COLUMNS + ["rms_a", "rms_d"])
        plot_ok("growth", path, "-o", out / "streams_growth.png")
        check_png(out / "streams_growth.png")

    @test
    def nulls_after_divergence_are_gaps():
        doc = synthetic_json()
        st = doc["runs"][1]["seeds"][0]["states"]
        for key in ("rms", "log10_grad_rel"):
            st[key][10:] = [None] * (len(st[key]) - 10)
        doc["runs"][1]["seeds"][0]["summary"]["diverged"] = {"sublayer": 9, "reason": "overflow"}
        path = inp.tmp / "diverged.json"
        path.write_text(json.dumps(doc))
        for kind in ("grad", "growth"):
            plot_ok(kind, path, "-o", out / f"diverged_{kind}.png")
            check_png(out / f"diverged_{kind}.png")

    # --- errors: exit 2, one line naming the input and the problem
    @test
    def error_missing_file():
        expect_error(["grad", inp.tmp / "nope.json", "-o", out / "x.png"], ["nope.json", "cannot read"])

    @test
    def error_malformed_json():
        bad = inp.tmp / "bad.json"
        bad.write_text(inp.json.read_text()[:500])
        expect_error(["grad", bad, "-o", out / "x.png"], ["bad.json", "malformed JSON"])

    @test
    def error_json_missing_field():
        doc = synthetic_json()
        del doc["runs"][0]["seeds"][1]["states"]["log10_grad_rel"]
        path = inp.tmp / "missing.json"
        path.write_text(json.dumps(doc))
        expect_error(["grad", path, "-o", out / "x.png"], ["missing.json", "runs[0].seeds[1].states", "log10_grad_rel"])

    @test
    def error_bad_csv_value():
        rows = synthetic_csv_rows()
        rows[3]["rms"] = "abc"
        path = inp.tmp / "badvalue.csv"
        write_csv(path, rows)
        expect_error(["growth", path, "-o", out / "x.png"], ["badvalue.csv", "line 5", "rms"])

    @test
    def error_csv_missing_column():
        path = inp.tmp / "nocol.csv"
        write_csv(path, [{k: v for k, v in r.items() if k != "stream_share"} for r in synthetic_csv_rows()],
                  [c for c in CSV_COLUMNS if c != "stream_share"])
        expect_error(["grad", path, "-o", out / "x.png"], ["nocol.csv", "stream_share"])

    @test
    def error_not_gradflow_output():
        expect_error(["grad", "-", "-o", out / "x.png"], ["stdin", "neither"], stdin="hello world\n")
        expect_error(["grad", "-", "-o", out / "x.png"], ["stdin", "empty"], stdin="")

    @test
    def error_angles_absent():
        expect_error(["angles", inp.csv, "-o", out / "x.png"], ["run.csv", "angles_matrix"])
        expect_error(["angles", inp.json_plain, "-o", out / "x.png"], ["plain.json", "angles_matrix"])

    @test
    def error_figure_not_supported_by_input():
        expect_error(["grad", inp.sweep, "-o", out / "x.png"], ["sweep.json", "sweep"])
        expect_error(["sweep", inp.json, "-o", out / "x.png"], ["run.json", "several depths"])

    @test
    def error_usage():
        r = run_plot("grad", inp.json, "-o", out / "x.jpg")
        assert r.returncode == 2 and ".png, .svg or .pdf" in r.stderr, r.stderr
        r = run_plot("grad", inp.json)
        assert r.returncode == 2 and "-o" in r.stderr, r.stderr
        r = run_plot("bogus", inp.json, "-o", out / "x.png")
        assert r.returncode == 2, r.stderr

    return tests


# ---------------------------------------------------------------------------------------------
# Real gradflow output


def check_contract_json(doc):
    """The parts of CONTRACT.md the plots rely on, for pre-ln,post-ln --depth 8 --seeds 2."""
    assert doc.get("schema_version") == 1, f"schema_version is {doc.get('schema_version')!r}"
    assert doc.get("command") == "analyze", f"command is {doc.get('command')!r}"
    assert doc.get("tool", {}).get("name") == "gradflow", f"tool is {doc.get('tool')!r}"
    archs = [r.get("arch") for r in doc["runs"]]
    assert archs == ARCHS, f"runs[].arch is {archs}"
    for i, run in enumerate(doc["runs"]):
        cfg = run["config"]
        for key in ("blocks", "sublayers", "width", "heads", "seq", "norm", "init", "precision", "seeds"):
            assert key in cfg, f"runs[{i}].config lacks {key}"
        assert cfg["blocks"] == BLOCKS and cfg["sublayers"] == S, f"runs[{i}].config blocks/sublayers {cfg['blocks']}/{cfg['sublayers']}"
        assert [s["seed"] for s in run["seeds"]] == SEEDS, f"runs[{i}] seeds {[s['seed'] for s in run['seeds']]}"
        for j, sj in enumerate(run["seeds"]):
            where = f"runs[{i}].seeds[{j}]"
            st, sub = sj["states"], sj["sublayers"]
            assert st["index"] == list(range(S + 1)), f"{where}.states.index is {st['index']}"
            for key in ("rms", "log10_grad", "log10_grad_rel"):
                assert len(st[key]) == S + 1, f"{where}.states.{key} has {len(st[key])} entries"
            assert st["log10_grad_rel"][S] == 0, f"{where}.states.log10_grad_rel[S] = {st['log10_grad_rel'][S]}"
            assert sub["index"] == list(range(S)), f"{where}.sublayers.index is {sub['index']}"
            assert sub["kind"] == ["attn", "ffn"] * BLOCKS, f"{where}.sublayers.kind is {sub['kind']}"
            for key in ("block", "gain", "skip_gain", "branch_gain", "skip_gain_theory", "branch_rms", "stream_share"):
                assert len(sub[key]) == S, f"{where}.sublayers.{key} has {len(sub[key])} entries"
            for key in ("log10_grad_ratio", "growth_exponent", "growth_class", "diverged"):
                assert key in sj["summary"], f"{where}.summary lacks {key}"
        assert "aggregate" in run, f"runs[{i}] lacks aggregate"


def check_contract_csv(path):
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
        f.seek(0)
        header = next(csv.reader(f))
    missing = [c for c in CSV_COLUMNS if c not in header]
    assert not missing, f"CSV header lacks {missing}: {header}"
    order = [c for c in header if c in CSV_COLUMNS]  # later issues may add columns in between
    assert order == CSV_COLUMNS, f"CSV contract columns out of order: {order}"
    expected_rows = len(ARCHS) * len(SEEDS) * (S + 1)
    assert len(rows) == expected_rows, f"CSV has {len(rows)} rows, expected {expected_rows}"
    for row in rows:
        if int(row["index"]) == S:
            filled = [c for c in SUBLAYER_COLUMNS if row[c] != ""]
            assert not filled, f"CSV row index S has sublayer columns filled: {filled}"


def make_binary_tests(binary, out):
    json_path, csv_path = out / "real.json", out / "real.csv"
    base = [binary, "analyze", "--arch", ",".join(ARCHS), "--depth", str(BLOCKS), "--seeds", str(len(SEEDS))]

    def run_binary(extra, path):
        r = subprocess.run([*base, *extra, "-o", str(path)], capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, f"{' '.join(base + extra)} exited {r.returncode}: {r.stderr.strip()[-500:]}"

    def binary_json():
        run_binary([], json_path)
        check_contract_json(json.loads(json_path.read_text()))

    def binary_csv():
        run_binary(["--format", "csv"], csv_path)
        check_contract_csv(csv_path)

    def expected_figures(src):
        """The figure types gradflow's real output supports: angles only when it carries the matrix."""
        kinds = {"grad", "growth", "shares"}
        if src.suffix == ".json":
            doc = json.loads(src.read_text())
            if any("angles_matrix" in sj for run in doc["runs"] for sj in run["seeds"]):
                kinds.add("angles")
        return kinds

    def binary_figures():
        for src in (json_path, csv_path):
            assert src.exists(), f"{src} missing (its binary run failed)"
            d = out / f"real_{src.suffix[1:]}"
            r = plot_ok("all", src, "--outdir", d)
            names = sorted(p.name for p in d.iterdir())
            expected = sorted(f"{kind}.png" for kind in expected_figures(src))
            assert names == expected, f"all from {src.name} wrote {names}, expected {expected}: {r.stderr.strip()}"
            for name in names:
                stats = check_png(d / name)
                print(f"  {d.name}/{name}: {png_size(d / name)[0]}x{png_size(d / name)[1]}, "
                      f"non-background {stats[1]:.3f}, coloured {stats[2]:.3f}")

    def binary_shares_legend():
        assert json_path.exists(), f"{json_path} missing (its binary run failed)"
        problems = legend_problems("shares", json_path, "-o", out / "real_legend_shares.png")
        assert not problems, "\n  ".join(problems)

    def binary_sweep():
        """Two depths of real CSV output concatenated (the CSV is self-describing) give the sweep figure."""
        assert csv_path.exists(), f"{csv_path} missing (its binary run failed)"
        shallow = out / "real_depth4.csv"
        r = subprocess.run([binary, "analyze", "--arch", ",".join(ARCHS), "--depth", "4", "--seeds", str(len(SEEDS)),
                            "--format", "csv", "-o", str(shallow)], capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, f"depth 4 run exited {r.returncode}: {r.stderr.strip()[-500:]}"
        combined = out / "real_depths.csv"
        combined.write_text(csv_path.read_text() + "".join(shallow.read_text().splitlines(keepends=True)[1:]))
        plot_ok("sweep", combined, "-o", out / "real_sweep.png")
        stats = check_png(out / "real_sweep.png")
        print(f"  real_sweep.png: non-background {stats[1]:.3f}, coloured {stats[2]:.3f}")

    def binary_sweep_summary():
        """A real `gradflow sweep --update` directory's summary.json gives the sweep and update-depth figures."""
        directory = out / "real_sweep_dir"
        r = subprocess.run([binary, "sweep", "--arch", ",".join(ARCHS), "--depth", "2,4,8", "--seeds", "2",
                            "--width", "16", "--heads", "2", "--seq", "4", "--update", "adam", "--lr", "1e-4,1e-3",
                            "-o", str(directory), "-q"], capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, f"sweep exited {r.returncode}: {r.stderr.strip()[-500:]}"
        for kind in ("sweep", "update-depth"):
            plot_ok(kind, directory / "summary.json", "-o", out / f"real_{kind}.png")
            stats = check_png(out / f"real_{kind}.png")
            print(f"  real_{kind}.png: non-background {stats[1]:.3f}, coloured {stats[2]:.3f}")

    binary_json.__name__ = "binary_json_matches_contract"
    binary_csv.__name__ = "binary_csv_matches_contract"
    binary_figures.__name__ = "binary_figures"
    binary_shares_legend.__name__ = "binary_shares_legend_covers_no_panel"
    binary_sweep.__name__ = "binary_sweep_from_two_depths"
    binary_sweep_summary.__name__ = "binary_sweep_summary_with_update"
    return [binary_json, binary_csv, binary_figures, binary_shares_legend, binary_sweep, binary_sweep_summary]


# ---------------------------------------------------------------------------------------------


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--from-binary", metavar="BIN", help="also plot real `BIN analyze` output")
    p.add_argument("--keep", metavar="DIR", help="keep inputs and figures in DIR")
    args = p.parse_args()

    tmp = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="gradflow-plot-test."))
    tmp.mkdir(parents=True, exist_ok=True)
    out = tmp / "out"
    out.mkdir(exist_ok=True)
    tests = make_tests(Inputs(tmp), out)
    if args.from_binary:
        if os.path.isfile(args.from_binary) and os.access(args.from_binary, os.X_OK):
            tests += make_binary_tests(os.path.abspath(args.from_binary), out)
        else:
            print(f"skip: --from-binary {args.from_binary} is not an executable file")

    passed = failed = 0
    for test in tests:
        try:
            test()
        except Exception as e:  # an assertion, or an unexpected crash of the test itself
            failed += 1
            detail = str(e) if isinstance(e, AssertionError) else traceback.format_exc()
            print(f"FAIL {test.__name__}: {detail}")
        else:
            passed += 1
            print(f"ok   {test.__name__}")
    if args.keep:
        print(f"figures kept in {out}")
    else:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
