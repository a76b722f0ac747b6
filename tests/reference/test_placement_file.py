#!/usr/bin/python3
"""Self-tests of the placement-file interpreter (placement_file.py; no gradflow binary needed).

Built-in placements written as files from docs/placements.md must give the hand-written reference's figures
(gradflow_reference.py) on the same synthetic export; the grammar's stated meanings ([P] =
docs/placement-files.md) are checked one by one.

Run:  /usr/bin/python3 tests/reference/test_placement_file.py     (prints 'N passed, M failed')
"""
import glob
import math
import os
import sys
import traceback

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import gradflow_reference as R  # noqa: E402
import placement_file as PF  # noqa: E402
import test_reference_selftest as T  # noqa: E402

torch.set_default_dtype(torch.float64)
TESTS = []
HEAD = 'citation = "test"\nexpected_growth = "other"\n'

# Built-ins as files, from docs/placements.md; the key is the built-in they must reproduce.
BUILT_INS = {
    "post-ln": 'output = "x"\n[[sublayer]]\nrule = "x <- N(x + F(x))"\n',
    "pre-ln": 'output = "N(x)"\n[[sublayer]]\nrule = "x <- x + F(N(x))"\n',
    "deepnorm": 'output = "x"\n[constants]\nalpha = "(2*B)^(1/4)"\n[[sublayer]]\nrule = "x <- N(alpha*x + F(x))"\n',
    "keel": ('output = "x"\n[constants]\nalpha = "S"\n'
             '[[sublayer]]\nwhen = "b == 0 and kind == attn"\nrule = "x <- x + F(N(x))"\n'
             '[[sublayer]]\nwhen = "b == 0 and kind == ffn"\nrule = "x <- N(x + F(N(x)))"\n'
             '[[sublayer]]\nrule = "x <- N(alpha*x + F(N(x)))"\n'),
    "mix-ln": ('output = "N(x)"\n[constants]\npost = "floor(0.25*B)"\n'
               '[[sublayer]]\nwhen = "b < post"\nrule = "x <- N(x + F(x))"\n'
               '[[sublayer]]\nrule = "x <- x + F(N(x))"\n'),
    "hybridnorm": ('output = "N(x)"\n[[sublayer]]\nwhen = "kind == attn"\nrule = "x <- x + F(x)"\n'
                   'qkv_norm = "per_head_qkv"\n[[sublayer]]\nrule = "h = N(x); x <- h + F(h)"\n'),
    "hybridnorm-star": ('output = "N(x)"\n'
                        '[[sublayer]]\nwhen = "b == 0"\nrule = "x <- x + F(N(x))"\nqkv_norm = "per_head_qkv"\n'
                        '[[sublayer]]\nwhen = "kind == attn"\nrule = "x <- x + F(x)"\nqkv_norm = "per_head_qkv"\n'
                        '[[sublayer]]\nrule = """\nh = N(x)\nx <- h +\n  F(h)\n"""\n'),
    "resi-dual": ('streams = ["a", "d"]\noutput = "a + N(d)"\n'  # [P] a stream may take a size's name
                  '[[sublayer]]\nrule = "o = F(a); a, d <- N(a + o), d + o"\n'),
    "siamese-norm": ('streams = ["X", "Y"]\noutput = "N(N(X) + N(Y))"\n[constants]\nc = "sqrt(2*(b + 1))"\n'
                     '[[sublayer]]\nrule = "Xn = N(X); O = F(N(Xn + N(Y))); X, Y <- Xn + O/c, Y + O"\n'),
    "peri-ln": 'output = "N(x)"\n[[sublayer]]\nrule = "x <- x + N(F(N(x)))"\n',
    "olmo2": 'output = "N(x)"\n[[sublayer]]\nrule = "x <- x + N(F(x))"\nqkv_norm = "full_qk"\n',
    "rezero": 'output = "x"\n[constants]\nalpha = 0\n[[sublayer]]\nrule = "x <- x + alpha*F(x)"\n',
    "layerscale": ('output = "N(x)"\n[constants]\nlam = "if(B <= 18, 0.1, if(B <= 24, 1e-5, 1e-6))"\n'
                   '[[sublayer]]\nrule = "x <- x + lam*F(N(x))"\n'),
    "depth-mup": 'output = "N(x)"\n[[sublayer]]\nrule = "x <- x + (1/sqrt(S))*F(N(x))"\n',
    "deepscalelm": ('output = "N(x)"\n[constants]\nbeta = "sqrt(2/S)"\nlam = "sqrt(1 - beta^2)"\n'
                    '[[sublayer]]\nrule = "x <- lam*x + beta*F(N(x))"\n'),
    "ngpt": ('output = "h"\nstreams = ["h"]\n[constants]\nalpha = 0.05\n'
             '[[sublayer]]\nrule = "h <- U(U(h) + alpha*(U(F(h)) - U(h)))"\nqkv_norm = "per_head_qk_unit"\n'
             'score_scale = "sqrt(d/heads)"\nffn_hidden_scale = "sqrt(d)"\n'),
    "lns": 'output = "N(x)"\n[[sublayer]]\nrule = "x <- x + F(N(x) / sqrt(b + 1))"\n',
    "plain": 'output = "x"\n[[sublayer]]\nrule = "x <- F(x)"\n',
}


def test(fn):
    TESTS.append(fn)
    return fn


def placement(body, pid="t"):
    return PF.PlacementFile(f'id = "{pid}"\n' + HEAD + body, f"<{pid}>")


def figures_equal(a, b, tol=1e-12):
    """Largest relative difference over every figure of two reference results (streams by position)."""
    worst = 0.0
    pairs = [(a["states"][k], b["states"][k]) for k in ("rms", "log10_grad", "log10_grad_rel")]
    pairs += [(a["sublayers"][k], b["sublayers"][k])
              for k in ("gain", "skip_gain", "branch_gain", "branch_rms", "stream_share")]
    for sa, sb in zip(a["states"]["streams"].values(), b["states"]["streams"].values()):
        pairs += [(sa["rms"], sb["rms"]), (sa["log10_grad"], sb["log10_grad"])]
    for xs, ys in pairs:
        assert len(xs) == len(ys)
        for x, y in zip(xs, ys):
            if x is None or y is None:
                assert x is None and y is None
                continue
            worst = max(worst, abs(x - y) / max(abs(x), abs(y), 1e-300) if max(abs(x), abs(y)) > 1e-14 else 0.0)
    assert a["sublayers"]["kind"] == b["sublayers"]["kind"]
    assert worst <= tol, worst
    return worst


@test
def built_ins_as_files_match_the_hand_written_reference():
    worst = 0.0
    for arch, body in BUILT_INS.items():
        for block, norm in (("attn-ffn", "rms"), ("ffn", "layer"), ("attn", "dyt")):
            path = T.make_export(arch, B=4, block=block, norm=norm, name=f"pf_{arch}_{block}_{norm}.st")
            # [P] qkv_norm: RMSNorm whatever --norm is, as the hand-written reference's default
            hand = R.run_reference(path)
            mine = PF.run_reference(placement(body, arch), path)
            try:
                worst = max(worst, figures_equal(hand, mine))
            except AssertionError as e:
                raise AssertionError(f"{arch} {block} {norm}: {e}")
    print(f"     built-ins as files vs hand-written reference: worst relative difference {worst:.1e}")


def ops_export(arch, block, norm, ffn, kv_heads, name, B=3, d=16, T_=5, heads=4):
    """A synthetic export with issue 19's ops: K/V projections of kv_heads heads, W_3 for a gated FFN, a bias
    on every projection, rotary embeddings on half of each head, norm epsilon 1e-5."""
    import json
    import numpy as np
    rng = np.random.default_rng(7)
    t = T.make_tensors(B, d, T_, block)
    kv = d // heads * kv_heads
    for key in list(t):
        if key.endswith(("W_K", "W_V")):
            t[key] = t[key][:, :kv].copy()
        if key.endswith("W_1") and ffn != "gelu":
            t[key[:-1] + "3"] = rng.normal(0.0, 0.2, size=t[key].shape)
    for key in [k for k in t if ".W_" in k]:
        t[key.replace(".W_", ".b_")] = rng.normal(0.0, 0.1, size=t[key].shape[1])
    cfg = {"arch": arch, "blocks": B, "width": d, "heads": heads, "seq": T_, "block": block, "norm": norm,
           "norm_eps": 1e-5, "precision": "f64", "probes": 1, "constants": {}, "ffn": ffn, "kv_heads": kv_heads,
           "rope_theta": 500.0, "rope_fraction": 0.5, "bias": True}
    path = os.path.join(T.TMP, name)
    R.write_safetensors(path, t, {"arch": arch, "seed": 0, "config": json.dumps(cfg)})
    return path


@test
def built_ins_as_files_take_the_new_block_ops():
    """Issue 19's ops (gated FFNs, shared key/value heads, rotary embeddings, biases, norm epsilon) read from
    the export's config reach F and N of a file as they reach the hand-written formulas; and they matter."""
    worst, moved = 0.0, 0.0
    for arch in ("pre-ln", "hybridnorm", "olmo2", "ngpt", "resi-dual"):
        for block, norm, ffn, kv in (("attn-ffn", "rms", "swiglu", 2), ("attn-ffn", "layer", "geglu", 1)):
            path = ops_export(arch, block, norm, ffn, kv, f"pf_ops_{arch}_{norm}_{ffn}.st")
            hand = R.run_reference(path)
            mine = PF.run_reference(placement(BUILT_INS[arch], arch), path)
            try:
                worst = max(worst, figures_equal(hand, mine))
            except AssertionError as e:
                raise AssertionError(f"{arch} {block} {norm} {ffn} kv_heads {kv}: {e}")
            plain = PF.run_reference(placement(BUILT_INS[arch], arch), T.make_export(
                arch, B=3, heads=4, block=block, norm=norm, name=f"pf_plain_{arch}_{norm}.st"))
            moved = max(moved, abs(plain["states"]["rms"][-1] - mine["states"]["rms"][-1]))
    assert moved > 1e-3, moved
    print(f"     built-ins as files with issue 19's ops vs hand-written reference: worst {worst:.1e}")


# option flags given to shipped files that declare them, with the hand-written reference's own overrides
GIVEN_OPTIONS = {"alpha": 1.7, "keel_variant": "v1", "mix_ratio": 0.5}


@test
def shipped_files_read_and_restate_their_built_ins():
    """Every data/placements/**/*.toml is read by the interpreter and runs; one whose id is a built-in's (the id
    itself, e.g. "keel", or the older `<built-in>-file`, e.g. "keel-file") reproduces the hand-written formulas,
    q/k/v norms as [P] states them, at the options' defaults and with the flags of GIVEN_OPTIONS it declares.
    Every file in data/placements/builtins/ must restate a built-in."""
    import compare as C
    repo = os.path.dirname(os.path.dirname(HERE))
    paths = sorted(glob.glob(os.path.join(repo, "data", "placements", "**", "*.toml"), recursive=True))
    worst, restated, with_flags = 0.0, [], 0
    for path in paths:
        p = PF.load(path)
        built_in = C.hand_written(p.id)
        if os.path.basename(os.path.dirname(path)) == "builtins":
            plain_id = p.id[:-len("-file")] if p.id.endswith("-file") else p.id
            assert built_in is not None and built_in == R.ALIASES.get(plain_id, plain_id), (path, p.id, built_in)
        given = {k: v for k, v in GIVEN_OPTIONS.items() if k in p.options}
        for flags in ([{}, given] if given and built_in else [{}]):
            for block, norm in (("attn-ffn", "rms"), ("ffn", "layer"), ("attn", "dyt")):
                export = T.make_export(built_in or "post-ln", B=4, block=block, norm=norm,
                                       name=f"shipped_{p.id}_{block}.st")
                mine = PF.run_reference(p, export, flags)
                if built_in:
                    stack, x0, probes, *_ = R.build_from_export(export, overrides=dict(flags, arch=built_in))
                    try:
                        worst = max(worst, figures_equal(R.analyze(stack, x0, probes), mine))
                    except AssertionError as e:
                        raise AssertionError(f"{path} ({block}, {norm}, flags {flags}) is not {built_in}: {e}")
            with_flags += bool(flags)
        if built_in:
            restated.append(p.id)
    print(f"     {len(paths)} shipped files; {len(restated)} restate a built-in ({with_flags} also with option "
          f"flags given), worst difference {worst:.1e}")


@test
def a_wrong_file_is_told_apart():
    """keel with a on the branch (N(x + a F(N2 x))) is not keel: the comparison can fail."""
    path = T.make_export("keel", B=4, name="pf_keel_wrong.st")
    body = BUILT_INS["keel"].replace("N(alpha*x + F(N(x)))", "N(x + alpha*F(N(x)))")
    try:
        figures_equal(R.run_reference(path), PF.run_reference(placement(body, "keel"), path))
    except AssertionError:
        return
    raise AssertionError("a wrong keel file matched the reference")


@test
def constant_expressions():
    """[P] precedence, associativity, functions, if, and the sizes; NaN / infinity is an error."""
    p = placement('output = "x"\n[constants]\nk = 3\n[[sublayer]]\nrule = "x <- x + F(x)"\n')
    w = PF.Where(p, {"S": 8, "B": 4, "d": 16, "T": 5, "heads": 2}, 5, 2, "ffn", "attn-ffn")
    cases = {"-2^2": -4.0, "2^3^2": 512.0, "2^-1": 0.5, "1 - 2 - 3": -4.0, "8 / 4 / 2": 1.0, "(2*B)^(1/4)":
             math.pow(8.0, 0.25), "min(l, b) + max(S, d)": 18.0, "mod(7, 3)": 1.0, "mod(-7, 3)": -1.0,
             "floor(2.7)": 2.0, "if(kind == ffn and not l < 5, k, 0)": 3.0, "if((l + 1) == 6 or b > 9, 1, 2)": 1.0,
             "if(block_kind == attn_ffn, T, heads)": 5.0, "1.5E+3 * 1e-3": 1.5, "sqrt(d/heads)": math.sqrt(8.0),
             "exp(log(2))": math.exp(math.log(2.0)), "if(l == 5, 1, log(0))": 1.0}
    for text, want in cases.items():
        assert w.value(PF.parse_expr(text)) == want, (text, w.value(PF.parse_expr(text)), want)
    assert w.holds(PF.parse_cond("(kind == ffn) and (b + 1) * 2 == 6"))
    for bad in ("log(0)", "1/0", "sqrt(-1)", "unknown + 1"):
        try:
            w.value(PF.parse_expr(bad))
        except PF.FileError:
            continue
        raise AssertionError(f"{bad} was accepted")


@test
def update_and_sum_inference():
    """[P] "The update and the sum": the outermost + or - on the path to F; '-' with F on the right gives the
    scale(., -1) node; no + or -: both are the assigned expression; `update`/`sum` name bindings."""
    path = T.make_export("post-ln", B=2, name="pf_update.st")
    _, _, _, x0, _, weights = R.load_export(path)
    d, T_ = x0.shape[1], x0.shape[0]

    def one(rule, extra=""):
        p = placement(f'output = "x"\n[[sublayer]]\nrule = "{rule}"\n{extra}')
        st = PF.FileStack(p, weights, 2, "attn-ffn", "rms", d, T_)
        return st.sublayer(1, (x0,)), R.ffn(x0, weights[1]), R.ffn(R.rms_norm(x0), weights[1])

    ((y,), u, s), f, fn = one("x <- x - 2*F(x)")
    assert torch.equal(u, (f * 2.0) * -1.0) and torch.equal(s, x0 + u) and torch.equal(y, s)
    ((y,), u, s), f, fn = one("x <- N(3*x + F(N(x)))")
    assert torch.equal(u, fn) and torch.equal(s, x0 * 3.0 + fn)
    ((y,), u, s), f, fn = one("x <- F(x)")
    assert torch.equal(u, f) and torch.equal(s, f)
    ((y,), u, s), f, fn = one("g = F(x); t = x + 0.5*g; x <- N(t)", 'update = "g"\nsum = "t"')
    assert torch.equal(u, f) and torch.equal(s, x0 + f * 0.5)
    ((y,), u, s), f, fn = one("x <- (x + F(x)) + x")  # the outermost + on the path is the root
    assert torch.equal(u, x0 + f) and torch.equal(s, (x0 + f) + x0)


@test
def streams_assign_simultaneously():
    """[P] a stream name is the sublayer's input value even after an assignment: `x, y <- y, x` swaps."""
    path = T.make_export("post-ln", B=1, name="pf_swap.st")
    _, _, _, x0, _, weights = R.load_export(path)
    p = placement('streams = ["x", "y"]\noutput = "x + y"\n[[sublayer]]\nrule = "x <- y + F(x); y <- x"\n')
    st = PF.FileStack(p, weights, 2, "attn-ffn", "rms", x0.shape[1], x0.shape[0])
    a, b = torch.randn(x0.shape), torch.randn(x0.shape)
    (x2, y2), u, s = st.sublayer(0, (a, b))
    assert torch.equal(y2, a) and torch.equal(x2, b + R.attention(a, weights[0], 2))


@test
def malformed_files_are_refused():
    bad = {
        "F twice": 'output = "x"\n[[sublayer]]\nrule = "x <- x + F(x) + F(x)"\n',
        "F never": 'output = "x"\n[[sublayer]]\nrule = "x <- N(x)"\n',
        "unknown key": 'output = "x"\ncolour = "red"\n[[sublayer]]\nrule = "x <- x + F(x)"\n',
        "unknown stream": 'output = "x"\n[[sublayer]]\nrule = "z <- x + F(x)"\n',
        "assigned twice": 'output = "x"\n[[sublayer]]\nrule = "x <- x + F(x); x <- x"\n',
        "reserved name": 'output = "x"\n[constants]\nS = 2\n[[sublayer]]\nrule = "x <- x + F(x)"\n',
        "unbalanced": 'output = "x"\n[[sublayer]]\nrule = "x <- x + F(N(x)"\n',
        "bad qkv_norm": 'output = "x"\n[[sublayer]]\nrule = "x <- x + F(x)"\nqkv_norm = "yes"\n',
    }
    for why, body in bad.items():
        try:
            placement(body)
        except PF.FileError:
            continue
        raise AssertionError(f"{why}: accepted")
    p = placement('output = "x"\n[[sublayer]]\nwhen = "l < 2"\nrule = "x <- x + F(x)"\n')
    try:  # sublayer 2 is selected by no entry
        PF.FileStack(p, [{}] * 4, 2, "attn-ffn", "rms", 16, 5, branch="rotation", sublayers=4)
    except PF.FileError:
        return
    raise AssertionError("a sublayer without a rule was accepted")


@test
def constants_at_the_last_sublayer_and_hash():
    p = placement('output = "x"\n[constants]\nc = "sqrt(2*(b + 1))"\nk = "c * 2"\n'
                  '[[sublayer]]\nrule = "x <- x + F(x) / c"\nskip_gain = "1/k"\n')
    st = PF.FileStack(p, [{}] * 6, 2, "attn-ffn", "rms", 16, 5, branch="rotation", sublayers=6)
    assert st.constants_at_last_sublayer() == {"c": math.sqrt(6.0), "k": math.sqrt(6.0) * 2}
    assert st.skip_gain_theory() == [1 / (math.sqrt(2.0 * (l // 2 + 1)) * 2) for l in range(6)]
    assert PF.fnv1a64(b"") == "fnv1a64:cbf29ce484222325" and PF.fnv1a64(b"a") == "fnv1a64:af63dc4c8601ec8c"


def fractions_by_hand(x, W):
    """[P] "Slicing the width", by hand: fraction f of the result (d/m columns) = sum over g of W[f, g] times
    fraction g of x, for an m x m matrix W."""
    T_, d = x.shape
    m = W.shape[0]
    return torch.einsum("fg,tgc->tfc", W, x.reshape(T_, m, d // m)).reshape(T_, d)


def mix_stack(rule, extra="", output="x", d=16, S=2, weights=None):
    """A stack of one file rule: on the rotation branch, or with `weights` (an export's) on the model branch."""
    p = placement(f'output = "{output}"\n{extra}[[sublayer]]\nrule = "{rule}"\n')
    if weights is None:
        return PF.FileStack(p, [{}] * S, 2, "attn-ffn", "rms", d, 5, branch="rotation", sublayers=S)
    return PF.FileStack(p, weights, 2, "attn-ffn", "rms", d, 5)


@test
def mix_fractions_identity_builds_no_node():
    """[P] "Slicing the width": the identity weight if(fraction_in == fraction_out, 1, 0) gives e itself (no node,
    as a scale by exactly 1), at any m dividing d, in a rule and in the output head; mix_fractions(e, 1, 1) is
    e; an all-ones weight at m = 1 too."""
    a = torch.randn(5, 16)
    ev_of = lambda st: PF.Evaluation(st, {"x": a}, st.where[0], 0, False, {})
    for m in (1, 2, 4, 8, 16):
        st = mix_stack("x <- x + F(x)", output=f"mix_fractions(x, {m}, if(fraction_in == fraction_out, 1, 0))")
        assert ev_of(st).tensor(st.p.output) is a, m
        assert st.output((a,)) is a, m
    for head in ("mix_fractions(x, 1, 1)", "mix_fractions(x, 1, fraction_out + fraction_in + 1)"):
        st = mix_stack("x <- x + F(x)", output=head)
        assert st.output((a,)) is a, head
    st = mix_stack("x <- mix_fractions(x, 4, if(fraction_in == fraction_out, 1, 0)) + F(x)")
    (y,), u, s = st.sublayer(0, (a,))
    assert torch.equal(y, a + R.rotate_pairs(a)) and torch.equal(u, R.rotate_pairs(a)) and torch.equal(s, y)
    st = mix_stack("x <- x + F(N(mix_fractions(x, 2, if(fraction_in == fraction_out, 1, 0))))")
    (y,), _, _ = st.sublayer(0, (a,))
    assert torch.equal(y, a + R.rotate_pairs(R.rms_norm(a)))


@test
def mix_fractions_is_the_stated_linear_map():
    """[P] "Slicing the width": mix_fractions in a rule is the map result_f = sum_g w(f, g) e_g (a swap and a
    gather at m = 2, the page's Frac-Connections rule at m = 4, general weights using l and a constant), on the
    rotation branch and on the model's attention and FFN; F inside it is looked through for the update and the
    sum; autograd's backward is the stated one (input fraction g: sum over f of w(f, g) times output f's)."""
    a = torch.randn(5, 16)
    swap, first = torch.tensor([[0.0, 1.0], [1.0, 0.0]]), torch.tensor([[1.0, 0.0], [1.0, 0.0]])
    # m = 2: the residual swaps the two fractions, the branch input gathers fraction 0 into both
    st = mix_stack("x <- mix_fractions(x, 2, if(fraction_in == 1 - fraction_out, 1, 0)) + "
                   "F(mix_fractions(x, 2, if(fraction_in == 0, 1, 0)))")
    (y,), u, s = st.sublayer(0, (a,))
    branch = R.rotate_pairs(fractions_by_hand(a, first))
    assert torch.equal(fractions_by_hand(a, first), torch.cat([a[:, :8], a[:, :8]], dim=1))
    assert torch.equal(u, branch) and torch.equal(s, fractions_by_hand(a, swap) + branch) and torch.equal(y, s)
    # the page's Frac-Connections rule (lucidrains' layout) at m = 4, on the model's own branch
    path = T.make_export("pre-ln", B=2, name="pf_mix_fractions.st")
    _, _, _, x0, _, weights = R.load_export(path)
    gather = lambda idx: torch.tensor([[1.0 if g == idx(f) else 0.0 for g in range(4)] for f in range(4)])
    Y = gather(lambda f: 0 if 2 * f < 4 else 2 * f - 4)
    A = gather(lambda f: 0 if 2 * f + 1 < 4 else 2 * f + 1 - 4)
    rule = ("o = F(N(mix_fractions(x, m, if(fraction_in == if(2*fraction_out < m, 0, 2*fraction_out - m), 1, 0))))"
            "; x <- mix_fractions(x, m, if(fraction_in == if(2*fraction_out + 1 < m, 0, 2*fraction_out + 1 - m), "
            "1, 0)) + mix_fractions(o, m, 1)")
    st = mix_stack(rule, '[constants]\nm = 4\n', d=x0.shape[1], weights=weights)
    for l, f_of in ((0, lambda h: R.attention(h, weights[0], 2)), (1, lambda h: R.ffn(h, weights[1]))):
        (y,), u, s = st.sublayer(l, (x0,))
        o = f_of(R.rms_norm(fractions_by_hand(x0, Y)))
        assert torch.equal(fractions_by_hand(x0, Y), x0[:, [*range(4), *range(4), *range(4), *range(8, 12)]])
        assert torch.allclose(u, fractions_by_hand(o, torch.ones(4, 4)), rtol=0, atol=1e-13), l
        assert torch.equal(s, fractions_by_hand(x0, A) + u) and torch.equal(y, s), l
    # general weights (l, a named constant, both indices), summed in increasing g with zero weights skipped
    weight = "if(fraction_in == 2, 0, c*(1 + fraction_out) - fraction_in/(l + 2))"
    st = mix_stack(f"x <- x + mix_fractions(F(x), 4, {weight})", '[constants]\nc = 0.75\n', S=4)
    for l in range(4):
        W = torch.tensor([[0.0 if g == 2 else 0.75 * (1 + f) - g / (l + 2) for g in range(4)] for f in range(4)])
        (y,), u, s = st.sublayer(l, (a,))
        assert torch.allclose(u, fractions_by_hand(R.rotate_pairs(a), W), rtol=0, atol=1e-14), l
        assert torch.equal(s, a + u) and torch.equal(y, s), l
        x = a.clone().requires_grad_(True)
        probe = torch.randn(5, 16)
        (y,), _, _ = st.sublayer(l, (x,))
        (grad,) = torch.autograd.grad((probe * y).sum(), x)
        want = probe + R.rotate_pairs(fractions_by_hand(probe, W.T)) * -1.0  # rotate_pairs^T = -rotate_pairs
        assert torch.allclose(grad, want, rtol=0, atol=1e-13), l
    # zero weights are skipped, not multiplied: an infinite fraction of e with weight 0 leaves the result finite,
    # and an output fraction whose weights are all 0 is 0
    big = a.clone()
    big[:, 8:12] = math.inf
    st = mix_stack("x <- x + F(x)", output="mix_fractions(x, 4, if(fraction_in == 2 or fraction_out == 3, 0, 1))")
    got = st.output((big,))
    keep = torch.tensor([[1.0, 1.0, 0.0, 1.0]] * 3 + [[0.0] * 4])
    assert torch.allclose(got, fractions_by_hand(a, keep), rtol=0, atol=1e-14), got
    assert torch.equal(got[:, 12:], torch.zeros(5, 4))
    # F held through mix_fractions: the outermost + on the path is inside it (update F, sum the add)
    st = mix_stack("x <- mix_fractions(x + F(x), 2, if(fraction_in == 1 - fraction_out, 1, 0))")
    (y,), u, s = st.sublayer(0, (a,))
    assert torch.equal(u, R.rotate_pairs(a)) and torch.equal(s, a + u) and torch.equal(y, fractions_by_hand(s, swap))
    st = mix_stack("x <- mix_fractions(F(x), 2, 2)")  # no + or - on the path: both the assigned expression
    (y,), u, s = st.sublayer(0, (a,))
    assert torch.equal(y, fractions_by_hand(R.rotate_pairs(a), torch.full((2, 2), 2.0))) and u is y and s is y
    # in the output head, with the constants of the last sublayer (l = S - 1)
    st = mix_stack("x <- x + F(x)", output="N(mix_fractions(x, 2, if(fraction_in == fraction_out, l, 0)))", S=4)
    assert torch.equal(st.output((a,)), R.rms_norm(fractions_by_hand(a, torch.eye(2) * 3.0)))


@test
def mix_fractions_malformed_uses_are_refused():
    """[P] "Slicing the width" and Names: the names are reserved; mix_fractions takes three arguments;
    fraction_out and fraction_in mean nothing outside its weight (rules, [constants], conditions, gains, the
    output head, even where never evaluated): refused when the file is read. m not a whole number >= 1
    dividing d: refused when the stack is built at the sizes (every sublayer and the output head, before any
    work), naming m and d. A tensor weight or m, or a constant first argument: refused when evaluated, as the
    interpreter's other typing errors."""
    rule = lambda r, extra="", output="x": f'output = "{output}"\n{extra}[[sublayer]]\nrule = "{r}"\n'
    at_reading = {
        "two arguments": rule("x <- x + F(mix_fractions(x, 2))"),
        "four arguments": rule("x <- x + F(mix_fractions(x, 2, 1, 1))"),
        "one argument in the output head": rule("x <- x + F(x)", output="mix_fractions(x)"),
        "fraction_out outside the weight": rule("x <- x + fraction_out*F(x)"),
        "fraction_in in a branch never taken": rule("x <- x + if(l < 0, fraction_in, 1)*F(x)"),
        "fraction_in as m": rule("x <- x + F(mix_fractions(x, fraction_in, 1))"),
        "fraction_out in the tensor argument": rule("x <- x + F(mix_fractions(fraction_out*x, 2, 1))"),
        "fraction_out in [constants]": rule("x <- x + c*F(x)", '[constants]\nc = "fraction_out"\n'),
        "fraction_out in [constants] used as a weight": rule("x <- x + F(mix_fractions(x, 2, c))",
                                                            '[constants]\nc = "if(fraction_out == 0, 1, 0)"\n'),
        "fraction_in in the output head": rule("x <- x + F(x)", output="fraction_in*x"),
        "fraction_in in when": rule("x <- x + F(x)").replace("[[sublayer]]\n", '[[sublayer]]\nwhen = "fraction_in == 0"\n'),
        "fraction_out in skip_gain": rule("x <- x + F(x)") + 'skip_gain = "fraction_out"\n',
        "fraction_out in [init_gain]": rule("x <- x + F(x)", '[init_gain]\nv = "fraction_out"\n'),
        "a constant named fraction_in": rule("x <- x + F(x)", "[constants]\nfraction_in = 1\n"),
        "a constant named mix_fractions": rule("x <- x + F(x)", "[constants]\nmix_fractions = 1\n"),
        "a stream named fraction_out": 'streams = ["fraction_out"]\n' + rule("fraction_out <- fraction_out + F(fraction_out)"),
        "a binding named fraction_out": rule("fraction_out = F(x); x <- x + fraction_out"),
        "a binding named mix_fractions": rule("mix_fractions = F(x); x <- x + mix_fractions"),
        "an option named fraction_in": rule("x <- x + F(x)", '[options.fraction_in]\nhelp = "h"\ndefault = 1\n'),
    }
    for why, body in at_reading.items():
        try:
            placement(body)
        except PF.FileError:
            continue
        raise AssertionError(f"{why}: accepted when the file was read")
    at_building = {  # the file reads; the stack at d = 16, S = 4 is refused before any sublayer runs
        "m not dividing d": rule("x <- x + F(mix_fractions(x, 3, 1))"),
        "m larger than d": rule("x <- x + F(mix_fractions(x, 32, 1))"),
        "m not whole": rule("x <- x + F(mix_fractions(x, 1.5, 1))"),
        "m zero": rule("x <- x + F(mix_fractions(x, 0, 1))"),
        "m negative": rule("x <- x + F(mix_fractions(x, -2, 1))"),
        "m = l + 1 at sublayer 2 only": rule("x <- x + F(mix_fractions(x, l + 1, 1))"),
        "m in a binding": rule("o = F(x); x <- x + mix_fractions(o, 5, 1)"),
        "m in the output head": rule("x <- x + F(x)", output="mix_fractions(x, 6, 1)"),
        "a weight that is not finite": rule("x <- x + F(mix_fractions(x, 2, 1/fraction_in))"),
    }
    for why, body in at_building.items():
        p = placement(body)
        try:
            PF.FileStack(p, [{}] * 4, 2, "attn-ffn", "rms", 16, 5, branch="rotation", sublayers=4)
        except PF.FileError as e:
            assert why == "a weight that is not finite" or ("m = " in str(e) and "d = 16" in str(e)), (why, str(e))
            continue
        raise AssertionError(f"{why}: accepted when the stack was built")
    PF.FileStack(placement(rule("x <- x + F(mix_fractions(x, l + 1, 1))")), [{}] * 2, 2, "attn-ffn", "rms", 16, 5,
                 branch="rotation", sublayers=2)  # m = 1, 2 divide 16: accepted
    at_evaluation = {
        "a tensor weight": rule("x <- x + F(mix_fractions(x, 2, x))"),
        "a tensor m": rule("x <- x + F(mix_fractions(x, x, 1))"),
        "a constant first argument": rule("x <- x + F(x) + mix_fractions(2, 2, 1)"),
    }
    a = torch.randn(5, 16)
    for why, body in at_evaluation.items():
        try:
            mix_stack(body.split('rule = "')[1].rstrip('"\n')).sublayer(0, (a,))
        except PF.FileError:
            continue
        raise AssertionError(f"{why}: accepted")


OPTS = ('[options.ratio]\nhelp = "r"\ndefault = 0.25\nrange = "[0, 1]"\n'
        '[options.alpha]\nhelp = "a"\ndefault_text = "paper\'s constant"\nrange = "(0, inf)"\n'
        '[options.variant]\nhelp = "v"\ndefault = "v2"\nchoices = ["v1", "v2"]\nin_run_config = true\n')


def rotation_stack(p, options=None, B=3):
    return PF.FileStack(p, [{}] * (2 * B), 2, "attn-ffn", "rms", 16, 5, branch="rotation", sublayers=2 * B,
                        options=options)


@test
def option_bound_constants_given_and_default():
    """[P] `[constants]` inline table with `option`: the given value when the flag is given, else `value`, else
    the option's default; the formula is the flag when given, else `formula`, else the expression text; a
    number option with a default is usable by its key; final_norm is read (display only)."""
    p = placement('output = "x"\nfinal_norm = "none"\n' + OPTS + '[constants]\n'
                  'alpha = { value = "(2*B)^(1/4)", option = "alpha", formula = "(2B)^(1/4)" }\n'
                  'r = { option = "ratio", unit = "fraction of blocks" }\n'
                  'post = "floor(ratio*B)"\n'
                  '[[sublayer]]\nrule = "x <- N(alpha*x + F(x))"\n')
    assert p.final_norm == "none" and placement(BUILT_INS["pre-ln"]).final_norm == "N(x)"
    recs = rotation_stack(p).constant_records_at_last_sublayer()
    assert recs == {"alpha": {"value": math.pow(6.0, 0.25), "formula": "(2B)^(1/4)", "unit": "blocks"},
                    "r": {"value": 0.25, "formula": "0.25", "unit": "fraction of blocks"},
                    "post": {"value": 0.0, "formula": "floor(ratio*B)", "unit": "blocks"}}, recs
    st = rotation_stack(p, {"alpha": 2.5, "ratio": 0.5})
    recs = st.constant_records_at_last_sublayer()
    assert recs["alpha"] == {"value": 2.5, "formula": "--alpha", "unit": "-"}, recs
    assert recs["r"] == {"value": 0.5, "formula": "--ratio", "unit": "fraction of blocks"}, recs
    assert recs["post"]["value"] == 1.0 and st.constants_at_last_sublayer()["alpha"] == 2.5
    for bad in ({"alpha": 0.0}, {"ratio": 1.5}, {"ratio": math.nan}, {"variant": "v3"}):
        try:
            rotation_stack(p, bad)
        except PF.FileError:
            continue
        raise AssertionError(f"{bad} was accepted")
    # through an export: the flag from the caller, or from the run's config.constants record "--alpha"
    path = T.make_export("deepnorm", B=3, name="pf_opt_deepnorm.st",
                         constants={"alpha": {"value": 3.0, "formula": "--alpha", "unit": "-"}})
    assert PF.run_reference(p, path)["constants"]["alpha"] == 3.0
    assert PF.run_reference(p, path, {"alpha": 1.5})["constant_records"]["alpha"]["formula"] == "--alpha"
    path = T.make_export("deepnorm", B=3, name="pf_opt_deepnorm2.st", constants={
        "alpha": {"value": math.pow(6.0, 0.25), "formula": "(2B)^(1/4)", "unit": "blocks"}})
    assert PF.run_reference(p, path)["constants"]["alpha"] == math.pow(6.0, 0.25)


@test
def word_option_conditions_select_entries():
    """[P] `KEY == WORD` (and !=): the given value, else the default; the run's config.KEY (in_run_config)."""
    body = ('output = "x"\n' + OPTS +
            '[[sublayer]]\nwhen = "variant == v1 and l == 0"\nrule = "x <- x + F(x)"\nskip_gain = "1"\n'
            '[[sublayer]]\nwhen = "v2 != variant"\nrule = "x <- x + F(x)"\nskip_gain = "2"\n'
            '[[sublayer]]\nrule = "x <- x + F(x)"\nskip_gain = "if(variant == v2, 4, 3)"\n')
    p = placement(body)
    assert rotation_stack(p).skip_gain_theory() == [4.0] * 6
    assert rotation_stack(p, {"variant": "v1"}).skip_gain_theory() == [1.0] + [2.0] * 5
    path = T.make_export("post-ln", B=2, name="pf_opt_variant.st", extra={"variant": "v1"})
    assert PF.run_reference(p, path)["sublayers"]["skip_gain_theory"] == [1.0, 2.0, 2.0, 2.0]
    assert PF.run_reference(p, path, {"variant": "v2"})["sublayers"]["skip_gain_theory"] == [4.0] * 4


@test
def unit_inference():
    """[P]: unit "blocks" (B or b), "sublayers" (S or l), "blocks and sublayers", "-", directly or through other
    constants; `unit` when stated."""
    p = placement('output = "x"\n[constants]\nk = "(2*B)^(1/4)"\nm = "sqrt(l + 1)"\nn = "k * S"\nz = "d/heads"\n'
                  'q = 0.5\nr = "m + 1"\ns = "if(b < 1, 1, 2)"\nu = { value = "S", unit = "blocks" }\n'
                  '[[sublayer]]\nrule = "x <- x + F(x)"\n')
    got = {n: r["unit"] for n, r in rotation_stack(p).constant_records_at_last_sublayer().items()}
    assert got == {"k": "blocks", "m": "sublayers", "n": "blocks and sublayers", "z": "-", "q": "-",
                   "r": "sublayers", "s": "blocks", "u": "blocks"}, got
    formulas = {n: r["formula"] for n, r in rotation_stack(p).constant_records_at_last_sublayer().items()}
    assert formulas["q"] == "0.5" and formulas["k"] == "(2*B)^(1/4)", formulas


@test
def malformed_option_tables_are_refused():
    rule = '[[sublayer]]\nrule = "x <- x + F(x)"\n'
    bad = {
        "word default not in choices": '[options.v]\nhelp = "v"\ndefault = "v3"\nchoices = ["v1", "v2"]\n',
        "word option without choices": '[options.v]\nhelp = "v"\ndefault = "v1"\n',
        "range not parseable": '[options.r]\nhelp = "r"\ndefault = 0.5\nrange = "0 to 1"\n',
        "range with nan": '[options.r]\nhelp = "r"\ndefault = 0.5\nrange = "[nan, 1]"\n',
        "empty range": '[options.r]\nhelp = "r"\ndefault = 0.5\nrange = "(1, 0)"\n',
        "default outside range": '[options.r]\nhelp = "r"\ndefault = 2\nrange = "[0, 1]"\n',
        "default on an open bound": '[options.r]\nhelp = "r"\ndefault = 0\nrange = "(0, inf)"\n',
        "unknown option key": '[options.r]\nhelp = "r"\ndefault = 0.5\ncolour = "red"\n',
        "no help": '[options.r]\ndefault = 0.5\n',
        "bad when_unused": '[options.r]\nhelp = "r"\ndefault = 0.5\nwhen_unused = "shout"\n',
        "range on a word option": '[options.v]\nhelp = "v"\ndefault = "a"\nchoices = ["a"]\nrange = "[0, 1]"\n',
        "choices on a number option": '[options.r]\nhelp = "r"\ndefault = 1\nchoices = ["a"]\n',
        "key not lower case": '[options.Mix]\nhelp = "r"\ndefault = 1\n',
        "reserved key": '[options.heads]\nhelp = "r"\ndefault = 1\n',
        "constant: unknown key": '[constants]\na = { value = "S", colour = "red" }\n',
        "constant: undeclared option": '[constants]\na = { value = "S", option = "alpha" }\n',
        "constant: word option": ('[options.v]\nhelp = "v"\ndefault = "a"\nchoices = ["a", "b"]\n'
                                  '[constants]\na = { value = "S", option = "v" }\n'),
        "constant: no value, no default": ('[options.a]\nhelp = "a"\ndefault_text = "paper"\n'
                                           '[constants]\nk = { option = "a" }\n'),
        "number option without default by key": '[options.a]\nhelp = "a"\n[constants]\nk = "a * 2"\n',
        "word option in an expression": ('[options.v]\nhelp = "v"\ndefault = "a"\nchoices = ["a", "b"]\n'
                                         '[constants]\nk = "v * 2"\n'),
        "final_norm not a string": 'final_norm = true\n',
        # [P] "Further rules", one case each
        "refuse without sets": '[options.r]\nhelp = "r"\ndefault = 0.5\nwhen_unused = "refuse"\n',
        "sets without refuse": '[options.r]\nhelp = "r"\ndefault = 0.5\nsets = "the weight"\n',
        "sets with warn": '[options.r]\nhelp = "r"\ndefault = 0.5\nwhen_unused = "warn"\nsets = "the weight"\n',
        "default and default_text": '[options.r]\nhelp = "r"\ndefault = 0.5\ndefault_text = "paper"\n',
        "word option with default_text": ('[options.v]\nhelp = "v"\ndefault = "a"\nchoices = ["a", "b"]\n'
                                          'default_text = "paper"\n'),
        "repeated choice": '[options.v]\nhelp = "v"\ndefault = "a"\nchoices = ["a", "b", "a"]\n',
        "choice not a name": '[options.v]\nhelp = "v"\ndefault = "a"\nchoices = ["a", "b-c"]\n',
        "choice starting with a digit": '[options.v]\nhelp = "v"\ndefault = "a"\nchoices = ["a", "2b"]\n',
        "empty choice": '[options.v]\nhelp = "v"\ndefault = "a"\nchoices = ["a", ""]\n',
        "constant named as an option, unbound": '[options.a]\nhelp = "a"\ndefault = 1\n[constants]\na = "S"\n',
        "constant named as an option, bound to another": ('[options.a]\nhelp = "a"\ndefault = 1\n'
                                                          '[options.c]\nhelp = "c"\ndefault = 2\n'
                                                          '[constants]\na = { value = "S", option = "c" }\n'),
    }
    conds = {
        "condition comparing an undeclared option": "variant == v1",
        "word not in choices": "v == c",
        "word option with <": "v < a",
    }
    word = '[options.v]\nhelp = "v"\ndefault = "a"\nchoices = ["a", "b"]\n'
    cases = {k: 'output = "x"\n' + v + rule for k, v in bad.items()}
    cases.update({k: 'output = "x"\n' + word + f'[[sublayer]]\nwhen = "{c}"\nrule = "x <- x + F(x)"\n'
                  f'[[sublayer]]\nrule = "x <- x + F(x)"\n' for k, c in conds.items()})
    for why, body in cases.items():
        try:
            placement(body)
        except PF.FileError as e:
            assert "missing" not in str(e), (why, e)  # refused for its own reason
            continue
        raise AssertionError(f"{why}: accepted")
    placement('output = "x"\n' + word + '[options.r]\nhelp = "r"\ndefault = 1\nrange = "[0, inf)"\n' + rule)  # a good one reads
    placement('output = "x"\n[options.r]\nhelp = "r"\ndefault = 0.5\nwhen_unused = "refuse"\nsets = "the weight"\n'
              '[options.v]\nhelp = "v"\ndefault = "A_1"\nchoices = ["A_1", "_b2"]\n'
              '[constants]\nr = { option = "r" }\n' + rule)  # refuse with sets, name-like choices, a bound namesake


REQ = ('output = "N(x)"\n[constants]\nbeta = "sqrt(2/S)"\nlam = "sqrt(1 - beta^2)"\n'
       '[[requires]]\ncondition = "S >= 2 and B >= 1"\nmessage = "needs at least 2 sublayers; try --depth 2"\n'
       '[[sublayer]]\nwhen = "lam >= 0"\nrule = "x <- lam*x + beta*F(N(x))"\n')


def ffn_stack(p, S):
    return PF.FileStack(p, [{}] * S, 2, "ffn", "rms", 16, 5, branch="rotation", sublayers=S)


@test
def requires_hold_or_stop_the_run():
    """[P] `[[requires]]`: a condition at the last sublayer with the run's sizes; when it does not hold the run
    stops with `--arch ID at S = ..., B = ...: MESSAGE`, checked before the constants (here lam would be NaN);
    a missing or unknown key, or a condition that is not a condition, is refused when the file is read."""
    p = placement(REQ, "req")
    assert len(p.requires) == 1
    st = ffn_stack(p, 2)  # S = 2: holds
    assert st.constants_at_last_sublayer() == {"beta": 1.0, "lam": 0.0}
    try:
        ffn_stack(p, 1)
    except PF.FileError as e:
        assert str(e) == "--arch req at S = 1, B = 1: needs at least 2 sublayers; try --depth 2", str(e)
    else:
        raise AssertionError("S = 1 passed the requirement S >= 2")
    shipped = PF.load(os.path.join(HERE, "..", "..", "data", "placements", "builtins", "deepscalelm.toml"))
    assert len(shipped.requires) == 1
    try:
        ffn_stack(shipped, 1)
    except PF.FileError as e:
        assert "--arch deepscalelm at S = 1, B = 1: deepscalelm needs at least 2 sublayers" in str(e), str(e)
    else:
        raise AssertionError("deepscalelm.toml took S = 1")
    req = '[[requires]]\ncondition = "S >= 2"\nmessage = "m"\n'
    for bad, why in ((req.replace('message = "m"\n', ''), "missing 'message'"),
                     (req.replace('condition = "S >= 2"\n', ''), "missing 'condition'"),
                     (req + 'hint = "h"\n', "unknown key"),
                     (req.replace('"S >= 2"', '"S + 2"'), "is not a condition"),
                     (req.replace('"S >= 2"', '"S >>= 2"'), "is not a condition"),
                     (req.replace('"S >= 2"', '2'), "must be a string"),
                     (req.replace('"S >= 2"', '"Q >= 2"'), "unknown name")):
        try:
            placement(BUILT_INS["pre-ln"] + bad, "bad")
        except PF.FileError as e:
            assert why in str(e), (why, str(e))
            continue
        raise AssertionError(f"accepted: {bad!r}")


def write_file(name, pid, body):
    path = os.path.join(T.TMP, name)
    with open(path, "w") as f:
        f.write(f'id = "{pid}"\n' + HEAD + body)
    return path


@test
def compare_uses_the_interpreter_for_files():
    """compare.py with the stand-in binary: a file placement from the registry is checked through the
    interpreter (rows 'F:'), and, when its id has hand-written formulas, against those too; a file the
    interpreter cannot read fails as NO_REFERENCE, naming it; a wrong figure fails as MISMATCH."""
    mine = write_file("mine.toml", "pre-ln-mine", BUILT_INS["pre-ln"])
    wrong_keel = write_file("keel.toml", "keel", BUILT_INS["keel"].replace("alpha*x + F", "x + alpha*F"))
    unreadable = write_file("odd.toml", "odd", BUILT_INS["pre-ln"].replace("F(N(x))", "G(N(x))"))
    env = {"FAKE_GRADFLOW_ARCHS": "pre-ln", "FAKE_GRADFLOW_FILES": mine}
    r = T._compare("--all", "--strict", env=env)
    assert r.returncode == 0 and "pre-ln-mine=OK" in r.stdout and "F:state" in r.stdout, r.stdout + r.stderr
    r = T._compare("--arch", mine, env={"FAKE_GRADFLOW_PERTURB": "stream_share"})
    assert r.returncode == 1 and "MISMATCH" in r.stdout, r.stdout + r.stderr
    env = {"FAKE_GRADFLOW_ARCHS": "pre-ln", "FAKE_GRADFLOW_FILES": ",".join((wrong_keel, unreadable))}
    r = T._compare("--all", env=env)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "keel=MISMATCH" in r.stdout and "odd=NO_REFERENCE" in r.stdout, r.stdout
    assert "FAILED, not covered: odd: no reference support" in r.stdout, r.stdout


def main():
    passed = failed = 0
    for t in TESTS:
        try:
            t()
            passed += 1
            print(f"ok   {t.__name__}")
        except Exception:
            failed += 1
            print(f"FAIL {t.__name__}")
            traceback.print_exc()
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
