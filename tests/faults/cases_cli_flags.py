#!/usr/bin/python3
"""Bad invocations across every subcommand (issue 20): each exits 2 with one stderr line that names
the value and the fix, prints nothing on stdout and leaves no file behind.

Usage: cases_cli_flags.py GRADFLOW_BINARY
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fault_table import Case, run_table  # noqa: E402

SMALL = ["--depth", "2", "--width", "16", "--heads", "2", "--seq", "4", "-q"]
HELP = {sub: rf"see 'gradflow {sub} --help'" for sub in ["analyze", "archs", "sweep", "merge", "check", "explain"]}
RESULT = '{"schema_version": 1, "runs": []}'

CASES = [
    # ---- subcommands: typos get a suggestion, not "A subcommand is required"
    Case("subcommand analyse", ["analyse", "--arch", "keel"], r"unknown subcommand \"analyse\"; did you mean 'gradflow analyze'"),
    Case("subcommand anlyze", ["anlyze"], r"unknown subcommand \"anlyze\"; did you mean 'gradflow analyze'"),
    Case("subcommand chek", ["chek", "r.json"], r"did you mean 'gradflow check'"),
    Case("subcommand arch", ["arch"], r"did you mean 'gradflow archs'"),
    Case("subcommand unknown word", ["frobnicate"], r"unknown subcommand \"frobnicate\"; use one of analyze, archs"),
    Case("no subcommand", [], r"a subcommand is required: one of analyze, archs, sweep, merge, check, explain"),
    Case("option before subcommand", ["--depth", "4"], r"--depth must follow a subcommand, e.g. 'gradflow analyze --depth"),

    # ---- analyze: options and their values
    Case("analyze option typo --dept", ["analyze", "--dept", "4"], r"unknown option --dept; did you mean --depth\?; " + HELP["analyze"]),
    Case("analyze option typo --widht", ["analyze", "--widht", "16"], r"unknown option --widht; did you mean --width\?"),
    Case("analyze option typo --seed=", ["analyze", "--sedd=3"], r"unknown option --sedd; did you mean --seed\?"),
    Case("analyze unknown option far from any", ["analyze", "--zzzzzzzz"], r"unknown option --zzzzzzzz; " + HELP["analyze"]),
    Case("analyze stray positional", ["analyze", "keel"], r"unexpected argument \"keel\"; options take a name \(e.g. --arch keel\)"),
    Case("analyze depth 1e3", ["analyze", "--depth", "1e3"], r"--depth 1e3 must be written in digits; try --depth 1000; " + HELP["analyze"]),
    Case("analyze depth 64.0", ["analyze", "--depth", "64.0"], r"--depth 64.0 must be written in digits; try --depth 64"),
    Case("analyze depth abc", ["analyze", "--depth", "abc"], r"--depth \"abc\" must be a whole number"),
    Case("analyze depth 0", ["analyze", "--depth", "0"], r"--depth 0 must be at least 1 block; try --depth 64"),
    Case("analyze depth negative", ["analyze", "--depth", "-5"], r"--depth -5 must be at least 1 block"),
    Case("analyze depth twice", ["analyze", "--depth", "2", "--depth", "3"], r"--depth is given more than once; give it once; " + HELP["analyze"]),
    Case("analyze depth without value", ["analyze", "--depth"], r"--depth needs a value; " + HELP["analyze"]),
    Case("analyze width 0", ["analyze", "--width", "0"], r"--width 0 must be positive; try --width 256"),
    Case("analyze seq 0", ["analyze", "--seq", "0"], r"--seq 0 must be at least 1 token; try --seq 64"),
    Case("analyze probes 0", ["analyze", "--probes", "0"], r"--probes 0 must be at least 1; try --probes 1"),
    Case("analyze heads 3 suggests heads", ["analyze", "--heads", "3"], r"--width 256 is not divisible by --heads 3; try --heads 4 or --width 255"),
    Case("analyze heads 5 width 96", ["analyze", "--heads", "5", "--width", "96"], r"try --heads 6 or --width 95"),
    Case("analyze heads 0", ["analyze", "--heads", "0"], r"--heads 0 must be positive; try --heads 4"),
    Case("analyze seeds 0", ["analyze", "--seeds", "0"], r"--seeds 0 must be at least 1 \(seeds 0..N-1\); try --seeds 1"),
    Case("analyze seeds -3", ["analyze", "--seeds", "-3"], r"--seeds -3 must be at least 1"),
    Case("analyze seeds abc", ["analyze", "--seeds", "abc"], r"--seeds \"abc\" must be a whole number"),
    Case("analyze seed -1", ["analyze", "--seed", "-1"], r"--seed -1 must be >= 0; try --seed 0; " + HELP["analyze"]),
    Case("analyze seed 1.5", ["analyze", "--seed", "1.5"], r"--seed \"1.5\" must be a whole number >= 0; try --seed 0"),
    Case("analyze seed with seeds", ["analyze", "--seed", "1", "--seeds", "2"], r"--seed and --seeds exclude each other|--seeds and --seed exclude each other"),
    Case("analyze format CSV", ["analyze", "--format", "CSV"], r"--format \"CSV\" is not one of json, csv, table, markdown; did you mean --format csv\?; " + HELP["analyze"]),
    Case("analyze format xml", ["analyze", "--format", "xml"], r"--format \"xml\" is not one of json, csv, table, markdown"),
    Case("analyze norm batch", ["analyze", "--norm", "batch"], r"--norm \"batch\" is not one of rms, layer, dyt"),
    Case("analyze init he", ["analyze", "--init", "he"], r"--init \"he\" is not one of xavier, gpt2, small, normal"),
    # ---- the block's ops (issue 19)
    Case("analyze init normal:abc", ["analyze", "--init", "normal:abc", *SMALL], r"--init \"normal:abc\": the standard deviation \"abc\" is not a number; try --init normal:0.02"),
    Case("analyze init normal:0", ["analyze", "--init", "normal:0", *SMALL], r"--init normal:0 needs a positive standard deviation; try --init normal:0.02"),
    Case("analyze init normal:-1", ["analyze", "--init", "normal:-1", *SMALL], r"--init normal:-1 needs a positive standard deviation"),
    Case("analyze init xavier:0.1", ["analyze", "--init", "xavier:0.1", *SMALL], r"--init xavier:0.1 takes no standard deviation; only normal:STD does"),
    Case("analyze ffn relu", ["analyze", "--ffn", "relu", *SMALL], r"--ffn \"relu\" is not one of gelu, swiglu, geglu"),
    # issue 33: the mixture-of-experts FFN's options, declared by its op row
    Case("analyze experts without moe", ["analyze", "--experts", "4", *SMALL], r"--experts 4 applies to --ffn moe only, and --ffn is gelu; add --ffn moe or omit --experts"),
    Case("analyze experts-active above experts", ["analyze", "--ffn", "moe", "--experts", "4", "--experts-active", "6", *SMALL], r"--experts-active 6 exceeds --experts 4: each token picks that many of the experts; try --experts-active 2"),
    Case("analyze experts zero", ["analyze", "--ffn", "moe", "--experts", "0", *SMALL], r"--experts 0 must lie in \[1, 4096\]; try --experts 8"),
    Case("analyze experts fractional", ["analyze", "--ffn", "moe", "--experts", "2.5", *SMALL], r"--experts 2.5 must be a whole number; try --experts 2"),
    Case("analyze shared gate without shared expert", ["analyze", "--ffn", "moe", "--shared-expert-gate", "none", *SMALL], r"--shared-expert-gate none gates the shared expert, and there is none; add --shared-expert-hidden N"),
    Case("analyze router gates word", ["analyze", "--ffn", "moe", "--router-gates", "top", *SMALL], r"--router-gates \"top\" is not renormalized or softmax; try --router-gates renormalized"),
    Case("analyze experts not a number", ["analyze", "--ffn", "moe", "--experts", "many", *SMALL], r"--experts \"many\" must be a number; try --experts 8"),
    Case("analyze ffn-hidden negative", ["analyze", "--ffn-hidden", "-3", *SMALL], r"--ffn-hidden -3 must lie in \[1, 1048576\] \(or 0 for 4 x --width\); try --ffn-hidden 64"),
    Case("analyze kv-heads not dividing", ["analyze", "--kv-heads", "3", "--heads", "4", "--width", "16", "--depth", "2", "--seq", "4", "-q"], r"--kv-heads 3 must divide --heads 4 \(0 means --heads\); try --kv-heads 2"),
    Case("analyze kv-heads above heads", ["analyze", "--kv-heads", "4", *SMALL], r"--kv-heads 4 must divide --heads 2"),
    Case("analyze rope-theta negative", ["analyze", "--rope-theta", "-1", *SMALL], r"--rope-theta -1 must be above 1 \(or 0 for no rotary embedding\); try --rope-theta 10000"),
    Case("analyze rope-theta 0.5", ["analyze", "--rope-theta", "0.5", *SMALL], r"--rope-theta 0.5 must be above 1"),
    Case("analyze rope-fraction 0", ["analyze", "--rope-fraction", "0", *SMALL], r"--rope-fraction 0 must lie in \(0, 1\]; try --rope-fraction 1"),
    Case("analyze rope-fraction 1.5", ["analyze", "--rope-fraction", "1.5", *SMALL], r"--rope-fraction 1.5 must lie in \(0, 1\]"),
    Case("analyze rope-fraction too few dims", ["analyze", "--rope-theta", "10000", "--rope-fraction", "0.1", *SMALL], r"--rope-fraction 0.1 rotates 0 of the 8 dims per head; rotary embeddings need at least 2"),
    Case("analyze norm-eps 0", ["analyze", "--norm-eps", "0", *SMALL], r"--norm-eps 0 must lie in \(0, 1\); try --norm-eps 1e-06"),
    Case("analyze precision f16", ["analyze", "--precision", "f16"], r"--precision \"f16\" is not one of f32, f64; did you mean"),
    Case("analyze block attn-mlp", ["analyze", "--block", "attn-mlp"], r"--block \"attn-mlp\" is not one of attn-ffn, ffn, attn; see"),
    Case("analyze angles every", ["analyze", "--angles", "every"], r"--angles \"every\" is not one of consecutive, all"),
    Case("analyze spectrum -1", ["analyze", "--spectrum", "-1", *SMALL], r"--spectrum -1 must lie in \[0, \d+\]; try --spectrum 4"),
    Case("analyze keel-variant v3", ["analyze", "--keel-variant", "v3", *SMALL], r"--keel-variant \"v3\" is not v1 or v2; try --keel-variant v2"),
    Case("analyze alpha on pre-ln", ["analyze", "--arch", "pre-ln", "--alpha", "2", *SMALL], r"--alpha 2 does not apply to pre-ln; it sets the skip weight of"),
    Case("analyze input-corr 2", ["analyze", "--input-corr", "2", *SMALL], r"--input-corr 2 must lie in \[0, 1\]; try --input-corr 0.5"),
    Case("analyze exact-jacobian too large", ["analyze", "--exact-jacobian", "--seq", "128"], r"--exact-jacobian .* limited to seq \* width <= 4096"),
    # ---- --update and --lr (issue 18)
    Case("analyze lr 0", ["analyze", "--update", "sgd", "--lr", "0", *SMALL], r"--lr 0 must be a positive finite learning rate; try --lr 1e-3"),
    Case("analyze lr negative", ["analyze", "--update", "adam", "--lr", "1e-3,-1e-4", *SMALL], r"--lr -0.0001 must be a positive finite learning rate; try --lr 1e-3"),
    Case("analyze lr inf", ["analyze", "--update", "adam", "--lr", "inf", *SMALL], r"--lr (inf|\"inf\") must be a (positive finite learning rate|number)"),
    Case("analyze lr nan", ["analyze", "--update", "adam", "--lr", "nan", *SMALL], r"--lr (nan|\"nan\") must be a (positive finite learning rate|number)"),
    Case("analyze lr without update", ["analyze", "--lr", "1e-3", *SMALL], r"--lr is the learning rate of --update, which is not given; add --update adam"),
    Case("analyze update with ideal branch", ["analyze", "--update", "sgd", "--ideal-branch", *SMALL], r"--update sgd steps the branch weights, and --ideal-branch has none; drop --ideal-branch or --update"),
    Case("analyze update momentum", ["analyze", "--update", "momentum", *SMALL], r"--update \"momentum\" is not one of none, sgd, adam"),
    Case("analyze update-params without update", ["analyze", "--update-params", "all", *SMALL], r"--update-params all says what --update steps, and --update is not given; add --update adam"),
    Case("analyze update-params gains", ["analyze", "--update", "adam", "--update-params", "gains", *SMALL], r"--update-params \"gains\" is not matrices or all; try --update-params all"),
    Case("sweep lr 0", ["sweep", "--arch", "keel", "--depth", "2", "--update", "sgd", "--lr", "0", "-o", "out"], r"--lr 0 must be a positive finite learning rate"),

    # ---- placements: did-you-mean that means it
    Case("arch prenorm suggests pre-ln", ["analyze", "--arch", "prenorm", *SMALL], r"--arch \"prenorm\" is not a known placement; did you mean \"pre-ln\"\?"),
    Case("arch PostNorm suggests post-ln", ["analyze", "--arch", "PostNorm", *SMALL], r"did you mean \"post-ln\"\?"),
    Case("arch keell suggests keel", ["analyze", "--arch", "keell", *SMALL], r"did you mean \"keel\"\?"),
    Case("arch sandwich suggests peri-ln", ["analyze", "--arch", "sandwich", *SMALL], r"did you mean \"peri-ln\"\?"),
    Case("arch nonsense has no suggestion", ["analyze", "--arch", "xyzzy", *SMALL], r"--arch \"xyzzy\" is not a known placement; 'gradflow archs' lists all of them$"),
    Case("arch all,keel", ["analyze", "--arch", "all,keel", *SMALL], r"--arch \"all,keel\": 'all' already names every placement; give --arch all alone"),
    Case("arch empty name", ["analyze", "--arch", "keel,,pre-ln", *SMALL], r"has an empty name; separate names by single commas"),
    # ---- output: -o, its extension and --format
    Case("analyze -o empty", ["analyze", "-o", "", *SMALL], r"-o '' is an empty file name; give a file name \(e.g. -o result.json\) or omit -o"),
    Case("analyze -o csv with format json", ["analyze", "-o", "result.csv", "--format", "json", *SMALL], r"-o result.csv names csv output but --format is json; drop --format"),
    Case("analyze -o md with format csv", ["analyze", "-o", "r.md", "--format", "csv", *SMALL], r"-o r.md names markdown output but --format is csv"),
    Case("analyze -o json with format table", ["analyze", "-o", "r.json", "--format", "table", *SMALL], r"-o r.json names json output but --format is table"),
    Case("analyze -o a directory", ["analyze", "-o", "outdir", *SMALL], r"-o outdir is a directory; give a file name such as outdir/result.json", files={"outdir/keep": ""}),
    Case("export-weights npz", ["analyze", "--export-weights", "w.npz", *SMALL], r"--export-weights w.npz must name a .safetensors file \(the only format it writes\); try --export-weights w.safetensors"),
    Case("export-weights no extension", ["analyze", "--export-weights", "weights", *SMALL], r"--export-weights weights must name a .safetensors file.*try --export-weights weights.safetensors"),
    Case("export-weights pt", ["analyze", "--export-weights", "w.pt", *SMALL], r"try --export-weights w.safetensors"),

    # ---- archs
    Case("archs prenorm", ["archs", "--arch", "prenorm"], r"did you mean \"pre-ln\"\?"),
    Case("archs format yaml", ["archs", "--format", "yaml"], r"--format \"yaml\" is not one of json, table; " + HELP["archs"]),
    Case("archs depth 0", ["archs", "--depth", "0"], r"--depth 0 must be at least 1 block"),
    Case("archs option typo", ["archs", "--dpth", "4"], r"unknown option --dpth; did you mean --depth\?; " + HELP["archs"]),
    Case("archs depth 1e2", ["archs", "--depth", "1e2"], r"--depth 1e2 must be written in digits; try --depth 100"),

    # ---- sweep
    Case("sweep without arch", ["sweep", "--depth", "2", "-o", "out"], r"--arch is required \(or --config FILE, whose model_type names the placement\); " + HELP["sweep"]),
    Case("sweep without output", ["sweep", "--arch", "keel", "--depth", "2"], r"(-o|--output).* is required; " + HELP["sweep"]),
    Case("sweep -o empty", ["sweep", "--arch", "keel", "--depth", "2", "-o", ""], r"-o '' is an empty directory name; give the sweep's directory"),
    Case("sweep seeds 0", ["sweep", "--arch", "keel", "--depth", "2", "-o", "out", "--seeds", "0"], r"--seeds 0 must be at least 1; try --seeds 1"),
    Case("sweep jobs 0", ["sweep", "--arch", "keel", "--depth", "2", "-o", "out", "--jobs", "0"], r"--jobs 0 must be at least 1; try --jobs 1"),
    Case("sweep arch typo", ["sweep", "--arch", "prenorm", "--depth", "2", "-o", "out"], r"did you mean \"pre-ln\"\?"),
    Case("sweep option typo", ["sweep", "--arch", "keel", "--depths", "2", "-o", "out"], r"unknown option --depths; did you mean --depth\?"),
    Case("sweep depth list with a word", ["sweep", "--arch", "keel", "--depth", "2,x", "-o", "out"], r"--depth"),

    # ---- merge
    Case("merge without DIR", ["merge"], r"DIR is required; " + HELP["merge"]),
    Case("merge not a sweep directory", ["merge", "nothing-here"], r"nothing-here/sweep.json: missing; nothing-here is not a gradflow sweep directory"),
    Case("merge -o md", ["merge", "d", "-o", "r.md"], r"-o r.md: this subcommand writes json, csv, not markdown"),
    Case("merge -o empty", ["merge", "d", "-o", ""], r"-o '' is an empty file name"),
    Case("merge format markdown", ["merge", "d", "--format", "markdown"], r"--format \"markdown\" is not one of json, csv; " + HELP["merge"]),
    Case("merge -o csv with format json", ["merge", "d", "-o", "s.csv", "--format", "json"], r"-o s.csv names csv output but --format is json"),

    # ---- check
    Case("check without arguments", ["check"], r"(RESULT|--baseline) is required; " + HELP["check"]),
    Case("check without baseline", ["check", "r.json"], r"--baseline is required; " + HELP["check"], files={"r.json": RESULT}),
    Case("check max-rows -1", ["check", "r.json", "--baseline", "r.json", "--max-rows", "-1"], r"--max-rows -1 must be >= 0; try --max-rows 0", files={"r.json": RESULT}),
    Case("check missing result", ["check", "missing.json", "--baseline", "missing.json"], r"missing.json: cannot read the file"),
    Case("check malformed result", ["check", "r.json", "--baseline", "r.json"], r"r.json: malformed JSON", files={"r.json": "{"}),
    Case("check bad expect", ["check", "r.json", "--baseline", "r.json", "--expect", "keel.x ~ 1"], r"--expect \"keel.x ~ 1\": no comparison operator", files={"r.json": RESULT}),
    Case("check option typo", ["check", "r.json", "--baseline", "r.json", "--jsn"], r"unknown option --jsn; did you mean --json\?", files={"r.json": RESULT}),
    Case("check max-rows words", ["check", "r.json", "--baseline", "r.json", "--max-rows", "ten"], r"--max-rows \"ten\" must be a whole number", files={"r.json": RESULT}),

    # ---- the environment
    Case("GRADFLOW_KERNELS unknown piece", ["analyze", "--depth", "2", "-o", "{dir}/r.json"],
         r"GRADFLOW_KERNELS: unknown piece 'tiles'; use library, or a comma-separated list of products, gram, normals, pool and subnormals, or unset it",
         env={"GRADFLOW_KERNELS": "products,tiles"}),
    Case("GRADFLOW_KERNELS wrong case", ["sweep", "--arch", "keel", "--depth", "2", "-o", "{dir}/sweep"],
         r"GRADFLOW_KERNELS: unknown piece 'Library'", env={"GRADFLOW_KERNELS": "Library"}),

    # ---- explain
    Case("explain without figure", ["explain"], r"explain needs a FIGURE, e.g. 'gradflow explain log10_grad_rel'"),
    Case("explain typo", ["explain", "log10_grd"], r"explain \"log10_grd\": no such figure or field; did you mean \"log10_grad\"\?"),
    Case("explain unknown", ["explain", "frobenius"], r"explain \"frobenius\": no such figure or field; 'gradflow explain --list' lists them"),
]

if __name__ == "__main__":
    run_table(CASES)
