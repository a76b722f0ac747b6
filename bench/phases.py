#!/usr/bin/python3
"""Per-phase time breakdown of one `gradflow analyze` run and an Amdahl scaling model, for one or
several binaries side by side in one run (e.g. before and after a change to the ops' threading).

Phases. `perf record -F 2000` samples the run (by default `analyze --arch keel --depth 1024
--no-timing -o TMP`); each symbol's self samples (`perf report --no-children --sort symbol`) go to
the first phase whose regular expression matches the whole demangled symbol, prefixed by perf's
"[.] " (user) or "[k] " (kernel) so that rules can tell kernel symbols apart (PHASE_RULES below:
GEMM, normal draws, softmax/attention core, norms & activations, eigen/representation figures,
graph executor glue, start-up & output, memory, synchronisation/waiting, and "other"; the top "other" symbols are
printed so the rules can be refined). A phase's share of samples times the run's task-clock
(core-seconds, `perf stat -e task-clock` of a run without sampling) estimates its core-seconds.

Timing. Wall seconds and peak RSS (/usr/bin/time -f %M) of plain runs, without perf, at the
default thread count; median, min and max, and each binary's median relative to the first's.

Scaling. Plain runs with --threads 1, 2 and 4 (--threads-list). From the medians T1 and Tn, n the
smallest measured count above 1 and at most the machine's cores, Amdahl's law T(n) = T1 (s + (1 -
s) / n) gives the serial fraction s = (n Tn / T1 - 1) / (n - 1), for n = 2: s = 2 T2 / T1 - 1,
clamped to [0, 1]. The 16-core time T1 (s + (1 - s) / 16) and speed-up are a PREDICTION from
Amdahl's law, not a measurement. Counts above `nproc` oversubscribe the cores: they measure
synchronisation overhead (Tn against the time at nproc threads), not speed-up.

The machines are noisy, so every measurement runs in rounds (--repeats): each round runs each
binary once per kind of run, the binaries' order reversed on every other round, so that a slow
phase of the machine hits all binaries alike. Prints Markdown tables; -o FILE.json keeps every raw
number. --args must not contain -o, --no-timing or --threads (the script adds them; --no-timing only
to binaries whose `analyze --help` lists it, so that builds of older commits can be compared).

Usage: bench/phases.py --binary before=/tmp/old/gradflow --binary after=build/gradflow
                       [--args "analyze --arch keel --depth 1024"] [--repeats 5]
                       [--threads-list 1,2,4] [--predict-cores 16] [--frequency 2000]
                       [--no-perf] [--no-scaling] [-o FILE.json]
"""
import argparse
import json
import os
import platform
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
import time

PERF = "/usr/bin/perf"

# (phase, regular expression), first match wins; matched against "[.] symbol" or "[k] symbol".
PHASE_RULES = [
    # OpenBLAS's level-2 routines of the symmetric eigensolver (dsymv_L_COOPERLAKE) before GEMM's "_COOPERLAKE".
    ("eigen/representation figures", r"dsymv|dsytrd|dlarf|dsteqr|dsterf"),
    ("GEMM", r"multiply_f32|multiply_f64|tile_transposed|tile_|gemm|sgemm|dgemm|transpose_block|"
             r"dispatch_rows|gebp|gemm_pack|general_matrix|lower_gram|gram_lower|symmetric_inner|dsyrk|"
             r"ssyrk|_COOPERLAKE|_SKYLAKEX|_HASWELL|kernel|gradflow::detail::multiply|"
             r"gradflow::\(anonymous namespace\)::transpose\b"),
    ("normal draws", r"standard_normal_chunk|box_muller|fill_normal|WeightDraw|mix64|StackRun<\w+>::start_draw"),
    ("softmax/attention core", r"softmax|attention_forward|attention_backward|head_backward|__expf|__exp\b"),
    ("norms & activations", r"norm_forward|norm_backward|unit_rows|gelu|silu|rotary|lane_sum|squared_norm|"
                            r"lane_dot|row_major_dot|ffn_forward|ffn_backward|renormalise|__tanhf|__erff"),
    ("eigen/representation figures", r"dsterf|tridiagonal|dsymv|compute_representation|erank|effective_rank|"
                                     r"angular|symmetric_eigen|dsytrd|dlarf|dsteqr|makeHouseholder|dlae|dlas|"
                                     r"dlamch|dlapy|dlaisnan|lsame_|mean_token_cosine|record_angle|"
                                     r"record_contribution|record_state_gradient|output_norm_stats"),
    ("graph executor & residual arithmetic", r"GraphExecutor|StackRun|back_through_sublayers|"
                                             r"gradflow::run_forward|gradflow::run_backward"),
    ("start-up & output (loader, CLI, JSON)", r"_dl_|do_lookup|nlohmann|CLI::|dtoa|grisu|placement::"),
    # Kernel memory management (page faults and what they call) before the kernel catch-all below.
    ("memory/allocation", r"^\[k\] .*(page|pte|pmd|mm_fault|memcg|folio|lruvec|alloc|vma|mas_|mmap|"
                          r"munmap|brk|rmqueue|zone|gup_|free)"),
    ("synchronisation/waiting", r"WorkPool|ShardPair|worker_loop|wait|futex|pause|spin|sched|gomp|omp_|GOMP|"
                                r"pthread_mutex|syscall|^\[k\] "),
    ("memory/allocation", r"memset|memmove|memcpy|malloc|free|page_fault|clear_page|_int_malloc|mmap|"
                          r"blas_memory_alloc|PlainObjectBase<.*>::resize"),
]
PHASES = ["GEMM", "normal draws", "softmax/attention core", "norms & activations", "eigen/representation figures",
          "graph executor & residual arithmetic", "start-up & output (loader, CLI, JSON)", "memory/allocation",
          "synchronisation/waiting", "other"]
assert set(PHASES) == {phase for phase, _ in PHASE_RULES} | {"other"}
COMPILED_RULES = [(phase, re.compile(pattern)) for phase, pattern in PHASE_RULES]


def run_measured(command, env=None):
    """Runs a command in a child; returns (seconds, peak RSS in MB of that child, stdout)."""
    start = time.perf_counter()
    proc = subprocess.run(["/usr/bin/time", "-f", "%M", *command], capture_output=True, text=True, env=env)
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"phases: {' '.join(command)} failed: {proc.stderr[-500:]}")
    peak_kb = int(proc.stderr.strip().splitlines()[-1])
    return seconds, peak_kb / 1024, proc.stdout


def run_checked(command):
    proc = subprocess.run(command, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"phases: {' '.join(command)} failed: {proc.stderr[-500:]}")
    return proc.stdout


def task_clock_seconds(command, workdir):
    """Core-seconds (task-clock summed over threads) of one run under `perf stat`, without sampling."""
    stat_file = os.path.join(workdir, "stat.csv")
    run_checked([PERF, "stat", "-e", "task-clock", "-x,", "-o", stat_file, "--", *command])
    with open(stat_file) as f:
        for line in f:
            fields = line.strip().split(",")
            if len(fields) > 2 and fields[2].startswith("task-clock"):
                return float(fields[0]) / 1e3
    raise SystemExit(f"phases: no task-clock in {stat_file}")


def symbol_samples(command, workdir, frequency):
    """Self samples by symbol ("[.] name" or "[k] name") of one run under `perf record`."""
    data = os.path.join(workdir, "perf.data")
    run_checked([PERF, "record", "-q", "-F", str(frequency), "-o", data, "--", *command])
    report = run_checked([PERF, "report", "-i", data, "--no-children", "--sort", "symbol", "-g", "none",
                          "--stdio", "-n", "--percent-limit", "0", "--field-separator", "\t"])
    samples = {}
    for line in report.splitlines():
        fields = line.split("\t")
        if line.startswith("#") or len(fields) < 3:
            continue
        symbol = fields[2].strip()
        samples[symbol] = samples.get(symbol, 0) + int(fields[1])
    return samples


def phase_of(symbol):
    for phase, pattern in COMPILED_RULES:
        if pattern.search(symbol):
            return phase
    return "other"


def phase_breakdown(samples):
    """Samples by phase, and the "other" symbols, largest first."""
    phases = dict.fromkeys(PHASES, 0)
    others = {}
    for symbol, count in samples.items():
        phase = phase_of(symbol)
        phases[phase] += count
        if phase == "other":
            others[symbol] = count
    return phases, sorted(others.items(), key=lambda item: -item[1])


def merge_samples(total, samples):
    for symbol, count in samples.items():
        total[symbol] = total.get(symbol, 0) + count


def amdahl(times, cores, predict_cores):
    """Serial fraction from T1 and Tn (n: the smallest measured count in 2..cores) and the predicted
    time and speed-up on predict_cores cores; None without T1 or such an n."""
    fit_counts = [n for n in sorted(times) if 1 < n <= cores]
    if 1 not in times or not fit_counts:
        return None
    n, t1 = fit_counts[0], times[1]
    serial = min(1.0, max(0.0, (n * times[n] / t1 - 1) / (n - 1)))
    predicted = t1 * (serial + (1 - serial) / predict_cores)
    return {"fit_threads": n, "serial_fraction": serial, "predict_cores": predict_cores,
            "predicted_seconds": predicted, "predicted_speedup": t1 / predicted}


def spread(values):
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "all": values}


def parse_binaries(specs):
    binaries = {}
    for spec in specs:
        name, sep, path = spec.partition("=")
        if not sep or not name or not path:
            raise SystemExit(f"phases: --binary wants NAME=PATH, got {spec!r}")
        if not os.access(path, os.X_OK):
            raise SystemExit(f"phases: {path} is not an executable file")
        binaries[name] = os.path.abspath(path)
    return binaries


def timing_flags(path):
    """["--no-timing"] when the binary has the option; a binary from before it (e.g. to compare with
    an old commit) runs without it, as its timing fields are not read here."""
    result = subprocess.run([path, "analyze", "--help"], capture_output=True, text=True)
    return ["--no-timing"] if "--no-timing" in result.stdout else []


def run_rounds(args, binaries, analyze_args, workdir):
    """Every measurement, in rounds alternating the binaries; returns the raw numbers by binary."""
    raw = {name: {"wall": [], "rss_mb": [], "task_clock": [], "samples": {}, "threads": {}} for name in binaries}
    raw["load_average"] = []
    threads = [int(n) for n in args.threads_list.split(",")] if not args.no_scaling else []
    no_timing = {name: timing_flags(path) for name, path in binaries.items()}
    for round_index in range(args.repeats):
        order = list(binaries) if round_index % 2 == 0 else list(reversed(binaries))
        raw["load_average"].append(os.getloadavg()[0])

        def command(name, *extra):
            output = os.path.join(workdir, f"{name}.json")
            return [binaries[name], *analyze_args, *no_timing[name], "-o", output, *extra]

        for name in order:
            seconds, rss, _ = run_measured(command(name))
            raw[name]["wall"].append(seconds)
            raw[name]["rss_mb"].append(rss)
        for name in order:
            raw[name]["task_clock"].append(task_clock_seconds(command(name), workdir))
        if not args.no_perf:
            for name in order:
                merge_samples(raw[name]["samples"], symbol_samples(command(name), workdir, args.frequency))
        for n in threads:
            for name in order:
                seconds, _, _ = run_measured(command(name, "--threads", str(n)))
                raw[name]["threads"].setdefault(n, []).append(seconds)
        print(f"round {round_index + 1} of {args.repeats} done", file=sys.stderr)
    return raw


def summarize(raw, args, cores):
    """Per binary: timing spreads, phase shares and core-seconds, the scaling model."""
    results = {}
    first = None
    for name, r in raw.items():
        if name == "load_average":
            continue
        row = {"wall_seconds": spread(r["wall"]), "peak_rss_mb": max(r["rss_mb"]), "rss_mb_all": r["rss_mb"],
               "task_clock_core_seconds": spread(r["task_clock"])}
        first = first or row
        row["wall_ratio_to_first"] = row["wall_seconds"]["median"] / first["wall_seconds"]["median"]
        if r["samples"]:
            phases, others = phase_breakdown(r["samples"])
            total = sum(phases.values())
            core_seconds = row["task_clock_core_seconds"]["median"]
            row["samples_total"] = total
            row["phases"] = {phase: {"samples": count, "share": count / total, "core_seconds": count / total * core_seconds}
                             for phase, count in phases.items()}
            row["other_symbols"] = [{"symbol": s, "samples": c, "share": c / total} for s, c in others[:args.top_other]]
            row["symbol_samples"] = r["samples"]
        if r["threads"]:
            medians = {n: statistics.median(times) for n, times in r["threads"].items()}
            row["threads"] = {n: spread(times) for n, times in r["threads"].items()}
            row["amdahl"] = amdahl(medians, cores, args.predict_cores)
            row["oversubscribed"] = {n: medians[n] / medians[max(m for m in medians if m <= cores)]
                                     for n in medians if n > cores and any(m <= cores for m in medians)}
        results[name] = row
    return results


def print_timing(results, names):
    print("| binary | wall s (median) | min | max | peak RSS MB | task-clock core-s (median) | core-s / wall | "
          f"median / {names[0]}'s |")
    print("|---|---|---|---|---|---|---|---|")
    for name in names:
        r = results[name]
        wall, clock = r["wall_seconds"], r["task_clock_core_seconds"]["median"]
        print(f"| {name} | {wall['median']:.2f} | {wall['min']:.2f} | {wall['max']:.2f} | {r['peak_rss_mb']:.0f} | "
              f"{clock:.2f} | {clock / wall['median']:.2f} | {r['wall_ratio_to_first']:.3f} |")


def print_phases(results, names):
    print("| phase | " + " | ".join(f"{n} share %" for n in names) + " | " +
          " | ".join(f"{n} core-s" for n in names) + " |")
    print("|---|" + "---|" * (2 * len(names)))
    for phase in PHASES:
        shares = [f"{100 * results[n]['phases'][phase]['share']:.1f}" for n in names]
        seconds = [f"{results[n]['phases'][phase]['core_seconds']:.2f}" for n in names]
        print(f"| {phase} | " + " | ".join(shares) + " | " + " | ".join(seconds) + " |")
    print("| samples (all rounds) | " + " | ".join(str(results[n]["samples_total"]) for n in names) + " | " +
          " | ".join(f"{results[n]['task_clock_core_seconds']['median']:.2f}" for n in names) + " |")
    print("\nCore-seconds: a phase's share of perf samples times the median task-clock of runs without sampling. "
          "The rules cover " + ", ".join(f"{100 * (1 - results[n]['phases']['other']['share']):.1f}% of {n}'s samples"
                                         for n in names) + ".")
    for name in names:
        print(f"\nTop 'other' symbols, {name}:")
        for entry in results[name]["other_symbols"]:
            print(f"  {100 * entry['share']:5.2f}%  {entry['symbol'][:150]}")


def print_scaling(results, names, cores, predict_cores):
    counts = sorted({n for name in names for n in results[name]["threads"]})
    print("| binary | " + " | ".join(f"T{n} s (median)" for n in counts) + " | serial fraction s (fit) | "
          f"predicted T{predict_cores} s | predicted speed-up on {predict_cores} | " +
          " | ".join(f"T{n} / T{cores}" for n in counts if n > cores) + " |")
    print("|---|" + "---|" * (len(counts) + 3 + len([n for n in counts if n > cores])))
    for name in names:
        r = results[name]
        times = [f"{r['threads'][n]['median']:.2f}" if n in r["threads"] else "-" for n in counts]
        fit = r["amdahl"]
        model = (f"{fit['serial_fraction']:.3f} (T1, T{fit['fit_threads']}) | {fit['predicted_seconds']:.2f} | "
                 f"{fit['predicted_speedup']:.2f}x" if fit else "- | - | -")
        over = [f"{r['oversubscribed'][n]:.3f}" for n in counts if n > cores and n in r["oversubscribed"]]
        print(f"| {name} | " + " | ".join(times) + f" | {model} | " + " | ".join(over) + " |")
    print(f"\nThe {predict_cores}-core time and speed-up are predictions from Amdahl's law fitted to T1 and T2 "
          f"(T(n) = T1 (s + (1 - s) / n)), not measurements. This machine has {cores} cores: thread counts above "
          f"{cores} oversubscribe them and measure synchronisation overhead (Tn / T{cores}; 1.000 means none), "
          "not speed-up.")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--binary", action="append", required=True, metavar="NAME=PATH",
                        help="a gradflow binary to measure (repeat; ratios are against the first)")
    parser.add_argument("--args", default="analyze --arch keel --depth 1024",
                        help="gradflow's arguments (the script adds --no-timing, -o and --threads)")
    parser.add_argument("--repeats", type=int, default=5, help="rounds: runs per binary and kind (median reported)")
    parser.add_argument("--threads-list", default="1,2,4", help="thread counts of the scaling runs")
    parser.add_argument("--predict-cores", type=int, default=16, help="cores of Amdahl's prediction")
    parser.add_argument("--frequency", type=int, default=2000, help="perf record's sampling frequency (Hz)")
    parser.add_argument("--top-other", type=int, default=5, help="'other' symbols to list")
    parser.add_argument("--no-perf", action="store_true", help="skip perf record (no phase table)")
    parser.add_argument("--no-scaling", action="store_true", help="skip the --threads runs (no Amdahl model)")
    parser.add_argument("-o", "--output", help="write every raw number to this JSON file")
    args = parser.parse_args()
    binaries = parse_binaries(args.binary)
    analyze_args = shlex.split(args.args)
    cores = os.cpu_count()

    with tempfile.TemporaryDirectory(prefix="gradflow-phases-") as workdir:
        raw = run_rounds(args, binaries, analyze_args, workdir)
    results = summarize(raw, args, cores)
    load = raw["load_average"]
    names = list(binaries)

    if args.output:
        os.makedirs(os.path.dirname(args.output) or ".", exist_ok=True)
        with open(args.output, "w") as f:
            json.dump({"machine": {"cpus": cores, "platform": platform.platform()}, "binaries": binaries,
                       "args": analyze_args, "repeats": args.repeats, "phase_rules": PHASE_RULES,
                       "load_average_at_round_starts": load,
                       "results": results}, f, indent=1)
    print(f"gradflow {' '.join(analyze_args)}, {args.repeats} rounds, {cores} cores; 1-minute load average at "
          f"the rounds' starts: {', '.join(f'{x:.1f}' for x in load)}")
    if max(load) > 0.5 * cores:
        print("The machine was busy: wall times and the scaling model are unreliable (phase shares, from this "
              "process's own samples, and task-clock core-seconds much less so).")
    print()
    print_timing(results, names)
    if not args.no_perf:
        print()
        print_phases(results, names)
    if not args.no_scaling:
        print()
        print_scaling(results, names, cores, args.predict_cores)


if __name__ == "__main__":
    main()
