#!/usr/bin/python3
"""What one optimizer step costs (--update): `gradflow analyze` with and without `--update adam
--lr 1e-3`, same placement, depth and threads, side by side in one run. Prints wall time, CPU time
(user + system) and peak RSS of each, and the ratios with/without, as medians over interleaved
rounds (each round runs every command once, so a slow phase of a noisy machine falls on one round
of each rather than on all runs of one). With --baseline, a second build runs the same commands in
the same rounds, for a before/after comparison.

Usage: bench/update_cost.py [--gradflow build/gradflow] [--baseline OTHER/gradflow]
                            [--arch keel] [--depth 1024] [--rounds 5] [-o FILE]
"""
import argparse
import json
import statistics
import subprocess
import sys


def run_measured(command):
    """Runs a command under /usr/bin/time; returns (wall s, CPU s, peak RSS MB)."""
    proc = subprocess.run(["/usr/bin/time", "-f", "%e %U %S %M", *command], stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"update_cost: {' '.join(command)} failed: {proc.stderr[-500:]}")
    wall, user, system, rss_kb = proc.stderr.strip().splitlines()[-1].split()
    return float(wall), float(user) + float(system), float(rss_kb) / 1024


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gradflow", default="build/gradflow")
    parser.add_argument("--baseline", help="another gradflow binary, measured in the same rounds")
    parser.add_argument("--arch", default="keel")
    parser.add_argument("--depth", type=int, default=1024)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("-o", "--output", help="also write the samples and medians as JSON")
    args = parser.parse_args()

    binaries = {"gradflow": args.gradflow}
    if args.baseline:
        binaries["baseline"] = args.baseline
    common = ["analyze", "--arch", args.arch, "--depth", str(args.depth), "-q"]
    variants = {"without": [], "with": ["--update", "adam", "--lr", "1e-3"]}
    samples = {(name, variant): [] for name in binaries for variant in variants}
    for round_index in range(args.rounds):
        for name, binary in binaries.items():
            for variant, extra in variants.items():
                samples[(name, variant)].append(run_measured([binary, *common, *extra]))
        print(f"round {round_index + 1} of {args.rounds} done", file=sys.stderr)

    report = {"arch": args.arch, "depth": args.depth, "rounds": args.rounds, "builds": {}}
    print(f"{args.arch} depth {args.depth}, medians of {args.rounds} interleaved rounds "
          "(with = --update adam --lr 1e-3)")
    print("| build | run | wall s | CPU s | peak RSS MB |")
    print("|---|---|---|---|---|")
    for name, binary in binaries.items():
        medians = {}
        for variant in variants:
            runs = samples[(name, variant)]
            medians[variant] = [statistics.median(run[i] for run in runs) for i in range(3)]
            wall, cpu, rss = medians[variant]
            print(f"| {name} | {variant} | {wall:.2f} | {cpu:.2f} | {rss:.0f} |")
        ratios = [medians["with"][i] / medians["without"][i] for i in range(3)]
        report["builds"][name] = {"binary": binary, "samples": {v: samples[(name, v)] for v in variants},
                                  "medians": medians, "ratio_wall": ratios[0], "ratio_cpu": ratios[1],
                                  "ratio_rss": ratios[2]}
    for name, build in report["builds"].items():
        print(f"{name}: with/without --update: wall {build['ratio_wall']:.2f}x, CPU {build['ratio_cpu']:.2f}x, "
              f"peak RSS {build['ratio_rss']:.2f}x")
    if args.output:
        with open(args.output, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
