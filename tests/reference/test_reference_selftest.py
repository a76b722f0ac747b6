#!/usr/bin/python3
"""Self-tests of the PyTorch reference (no gradflow binary needed).

Run:  /usr/bin/python3 tests/reference/test_reference_selftest.py
Prints 'N passed, M failed' and exits non-zero on any failure.
"""
import json
import math
import os
import subprocess
import sys
import tempfile
import traceback

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import gradflow_reference as R  # noqa: E402

torch.set_default_dtype(torch.float64)
TMP = tempfile.mkdtemp(prefix="gf_ref_selftest_")


# ----------------------------------------------------------------------------------------------
# synthetic exports
# ----------------------------------------------------------------------------------------------
def xavier(rng, fan_in, fan_out, gain=1.0):
    return rng.normal(0.0, gain * math.sqrt(2.0 / (fan_in + fan_out)), size=(fan_in, fan_out))


def make_tensors(B=3, d=16, T=5, block="attn-ffn", K=1, seed=0, scale=1.0):
    rng = np.random.default_rng(seed)
    kinds = (["attn", "ffn"] * B) if block == "attn-ffn" else [block] * B
    t = {"input": rng.normal(size=(T, d)), "probe": rng.normal(size=(K, T, d))}
    for l, k in enumerate(kinds):
        p = f"sublayer.{l:04d}."
        if k == "attn":
            for n in ("W_Q", "W_K", "W_V", "W_O"):
                t[p + n] = scale * xavier(rng, d, d)
        else:
            t[p + "W_1"] = scale * xavier(rng, d, 4 * d)
            t[p + "W_2"] = scale * xavier(rng, 4 * d, d)
    return t


def make_export(arch, B=3, d=16, T=5, heads=2, block="attn-ffn", norm="rms", K=1, seed=0,
                extra=None, constants=None, name=None):
    t = make_tensors(B, d, T, block, K, seed)
    S = 2 * B if block == "attn-ffn" else B
    cfg = {"arch": arch, "blocks": B, "sublayers": S, "width": d, "heads": heads, "seq": T,
           "block": block, "norm": norm, "norm_eps": 1e-6, "precision": "f64", "probes": K,
           "constants": constants if constants is not None else {}}
    cfg.update(extra or {})
    path = os.path.join(TMP, name or f"{arch}.{block}.{norm}.B{B}.safetensors")
    R.write_safetensors(path, t, {"arch": arch, "seed": 0, "config": json.dumps(cfg)})
    return path


def full_graph_grads(stack, x0, U):
    """Whole-stack torch autograd (no per-sublayer VJPs): returns per-state ||g_l||."""
    streams = stack.init_state(x0)
    leaves = tuple(s.detach().clone().requires_grad_(True) for s in streams)
    states, st = [leaves], leaves
    for l in range(stack.S):
        st = stack.sublayer(l, st)[0]
        for t in st:
            t.retain_grad()
        states.append(st)
    y = stack.output(st)
    L = (U * y).sum()
    L.backward()
    return [R.tnorm(tuple(t.grad if t.grad is not None else torch.zeros_like(t) for t in s)) for s in states]


def stack_for(arch, **kw):
    path = make_export(arch, **kw)
    stack, x0, probes, cfg, consts, notes = R.build_from_export(path)
    return stack, x0, probes, notes


# ----------------------------------------------------------------------------------------------
# tests
# ----------------------------------------------------------------------------------------------
TESTS = []


def test(fn):
    TESTS.append(fn)
    return fn


@test
def safetensors_roundtrip():
    t = {"a": np.arange(6.0).reshape(2, 3), "b": np.ones((1, 2, 2))}
    p = os.path.join(TMP, "rt.safetensors")
    R.write_safetensors(p, t, {"arch": "x", "config": "{}"})
    back, meta = R.read_safetensors(p)
    assert meta == {"arch": "x", "config": "{}"}
    for k in t:
        assert np.array_equal(back[k], t[k]), k
    R.write_safetensors(p, t, None, dtype="F32")
    back, meta = R.read_safetensors(p)
    assert meta == {} and back["a"].dtype == np.float64 and np.array_equal(back["a"], t["a"])


def _all_configs():
    for arch in R.ARCHS:
        for block in ("attn-ffn", "ffn", "attn"):
            yield arch, block, "rms"
    for arch in ("pre-ln", "post-ln", "keel", "siamese-norm", "hybridnorm"):
        for norm in ("layer", "dyt"):
            yield arch, "attn-ffn", norm


@test
def chain_vjp_equals_full_autograd_all_archs():
    """Per-sublayer VJP chain (with renormalisation) == one whole-stack backward, for every placement."""
    for arch, block, norm in _all_configs():
        stack, x0, probes, _ = stack_for(arch, block=block, norm=norm)
        res = R.analyze(stack, x0, probes)
        ref = full_graph_grads(stack, x0, probes[0])
        got = [10 ** v for v in res["states"]["log10_grad"]]
        for l, (a, b) in enumerate(zip(got, ref)):
            assert abs(a - b) <= 1e-10 * b, (arch, block, norm, l, a, b)
        for l in range(stack.S):
            assert abs(res["sublayers"]["gain"][l] - ref[l] / ref[l + 1]) <= 1e-10 * (ref[l] / ref[l + 1])
        for key in ("rms", "log10_grad"):
            assert all(v is None or math.isfinite(v) for v in res["states"][key]), (arch, key)
        for key in ("gain", "skip_gain", "branch_gain", "branch_rms", "stream_share"):
            assert all(math.isfinite(v) for v in res["sublayers"][key]), (arch, block, norm, key)


def _fd_check(stack, state, l, cot, frozen=None, h=1e-6, seed=1):
    """<cot, (f(x+hv) - f(x-hv)) / 2h> vs <VJP(cot), v> for a random direction v."""
    g = torch.Generator().manual_seed(seed)
    v = tuple(torch.randn(t.shape, generator=g) for t in state)
    if frozen is None:
        fn = lambda st: stack.sublayer(l, st)[0]
        J = R.vjp(fn, state, cot)
    else:
        J = R.vjp(lambda st: stack.sublayer(l, st, detach=True)[0], state, cot)
        orig = stack.F
        stack.F = lambda l_, x, detach, qk="none": frozen  # F's output held at its value at x_l
        fn = lambda st: stack.sublayer(l, st)[0]
    with torch.no_grad():
        plus = fn(tuple(a + h * b for a, b in zip(state, v)))
        minus = fn(tuple(a - h * b for a, b in zip(state, v)))
    if frozen is not None:
        stack.F = orig
    fd = sum(float((c * (p - m)).sum()) / (2 * h) for c, p, m in zip(cot, plus, minus))
    an = sum(float((a * b).sum()) for a, b in zip(J, v))
    return fd, an


@test
def finite_difference_vjps():
    """Full and skip (F frozen) VJPs of every sublayer match central finite differences."""
    for arch, block, norm in _all_configs():
        stack, x0, probes, _ = stack_for(arch, block=block, norm=norm)
        states, _, _ = stack.forward(x0)
        for l in range(stack.S):
            st = states[l]
            out = stack.sublayer(l, st)[0]
            g = torch.Generator().manual_seed(100 + l)
            cot = tuple(torch.randn(t.shape, generator=g) for t in out)
            fd, an = _fd_check(stack, st, l, cot)
            assert abs(fd - an) <= 1e-6 * max(1.0, abs(an)), (arch, block, norm, l, "full", fd, an)
            # frozen F: recover F's output at x_l by temporarily capturing it
            captured = {}
            orig = stack.F

            def cap(l_, x, detach, qk="none"):
                captured["f"] = orig(l_, x, detach, qk).detach()
                return captured["f"]
            stack.F = cap
            with torch.no_grad():
                stack.sublayer(l, st)
            stack.F = orig
            fd, an = _fd_check(stack, st, l, cot, frozen=captured["f"])
            assert abs(fd - an) <= 1e-6 * max(1.0, abs(an)), (arch, block, norm, l, "skip", fd, an)


@test
def rezero_is_identity_at_init():
    stack, x0, probes, notes = stack_for("rezero")
    res = R.analyze(stack, x0, probes)
    r0 = res["states"]["rms"][0]
    assert all(abs(r - r0) == 0 for r in res["states"]["rms"])
    assert all(abs(g - 1.0) < 1e-15 for g in res["sublayers"]["gain"])
    assert all(abs(g - 1.0) < 1e-15 for g in res["sublayers"]["skip_gain"])
    assert all(g == 0.0 for g in res["sublayers"]["branch_gain"])
    assert all(s == 0.0 for s in res["sublayers"]["stream_share"])
    assert all(s == 0.0 for s in res["sublayers"]["branch_rms"])


@test
def ngpt_keeps_unit_norm_tokens():
    stack, x0, probes, _ = stack_for("ngpt", d=16)
    states, _, _ = stack.forward(x0)
    for st in states[1:]:
        n = st[0].norm(dim=-1)
        assert torch.allclose(n, torch.ones_like(n), atol=1e-14, rtol=0)
    res = R.analyze(stack, x0, probes)
    # every state after x_0 has rms 1/sqrt(d) (unit norm tokens)
    assert all(abs(r - 1 / math.sqrt(16)) < 1e-14 for r in res["states"]["rms"][1:])


def _orthogonal_branch(d):
    """F(x) = x J with J^T = -J, J^T J = I: branch as large as the stream and orthogonal to it per token."""
    I = torch.eye(d // 2)
    Z = torch.zeros(d // 2, d // 2)
    return torch.cat([torch.cat([Z, -I], 1), torch.cat([I, Z], 1)], 0)


@test
def post_ln_idealised_branch_gives_one_over_sqrt2():
    # [A] "idealised value (branch as large as the stream and orthogonal to it) is 1/sqrt(2)"
    d = 16
    stack, x0, probes, _ = stack_for("post-ln", d=d)
    J = _orthogonal_branch(d)
    stack.F = lambda l, x, detach, qk="none": (x @ J).detach() if detach else x @ J
    x = R.rms_norm(x0)  # a state that is already normalised (rms 1 per token)
    (y,), u, s = stack.sublayer(0, (x,))
    assert abs(R.tnorm((u,)) / R.tnorm((s,)) - 1 / math.sqrt(2)) < 1e-14  # stream_share
    # cotangent orthogonal (per token) to the normalised sum -> exactly the closed form, up to eps
    g = torch.randn(x.shape, generator=torch.Generator().manual_seed(3))
    yh = y / y.norm(dim=-1, keepdim=True)
    g = g - (g * yh).sum(-1, keepdim=True) * yh
    sk = R.vjp(lambda st: stack.sublayer(0, st, detach=True)[0], (x,), (g,))
    ratio = R.tnorm(sk) / R.tnorm((g,))
    assert abs(ratio - 1 / math.sqrt(2)) < 1e-6, ratio  # eps = 1e-6 perturbs at ~1e-7
    # S-sublayer product: 2^(-S/2) in log10 ([A] Keel Eq. 15)
    res = R.analyze(stack, x, probes)
    assert all(sg <= 1 / math.sqrt(2) + 1e-6 for sg in res["sublayers"]["skip_gain"])


@test
def keel_idealised_branch_gives_a_over_sqrt_a2_plus_1():
    # [A] "Keel skip-path factor a/sqrt(a^2+1) per sublayer"
    d = 16
    stack, x0, probes, _ = stack_for("keel", d=d, B=3)
    a = stack.c["alpha"]
    assert a == 6.0  # a = S (sublayers)
    J = _orthogonal_branch(d)
    # F(N2(x)): with x normalised, N2(x) = x (up to eps) so F = x J is orthogonal with equal norm
    stack.F = lambda l, x, detach, qk="none": (x @ J).detach() if detach else x @ J
    x = R.rms_norm(x0)
    (y,), u, s = stack.sublayer(3, (x,))  # sublayer 3: not a first sublayer -> full keel form
    g = torch.randn(x.shape, generator=torch.Generator().manual_seed(4))
    yh = y / y.norm(dim=-1, keepdim=True)
    g = g - (g * yh).sum(-1, keepdim=True) * yh
    sk = R.vjp(lambda st: stack.sublayer(3, st, detach=True)[0], (x,), (g,))
    ratio = R.tnorm(sk) / R.tnorm((g,))
    assert abs(ratio - a / math.sqrt(a * a + 1)) < 1e-6, (ratio, a / math.sqrt(a * a + 1))


@test
def keel_first_sublayers_v1_v2():
    stack, x0, probes, _ = stack_for("keel")
    x = x0
    # v2: sublayer 0 is pre-ln: x + F(N(x)) (no outer norm); sublayer 1 has an outer norm with a = 1
    (y0,), u0, s0 = stack.sublayer(0, (x,))
    assert torch.equal(y0, s0) and torch.allclose(s0, x + R.attention(R.rms_norm(x), stack.W[0], 2))
    (y1,), u1, s1 = stack.sublayer(1, (x,))
    assert torch.allclose(s1, x + R.ffn(R.rms_norm(x), stack.W[1])) and torch.allclose(y1, R.rms_norm(s1))
    (y2,), u2, s2 = stack.sublayer(2, (x,))
    assert torch.allclose(s2, 6.0 * x + R.attention(R.rms_norm(x), stack.W[2], 2))
    stack.keel_variant = "v1"
    (y1,), u1, s1 = stack.sublayer(1, (x,))
    assert torch.equal(y1, s1)  # v1: first FFN also plain pre-ln


@test
def keel_wrong_variant_differs():
    path = make_export("keel")
    good = R.run_reference(path)
    bad = R.run_reference(path, wrong_variant="keel-alpha-on-branch")
    assert good["states"]["log10_grad"][0] != bad["states"]["log10_grad"][0]
    assert max(abs(a - b) for a, b in zip(good["sublayers"]["skip_gain"], bad["sublayers"]["skip_gain"])) > 1e-3


@test
def admin_profile():
    stack, x0, probes, _ = stack_for("admin")
    states, updates, _ = stack.forward(x0)
    w = stack.admin_w
    assert w[0] == 1.0
    def var(t):  # np.var of the flattened tensor: population variance, centred on the mean
        return float(((t - t.mean()) ** 2).mean())
    for l in range(1, stack.S):
        # [A] w_{l+1}^2 = w_l^2 Var[x_l] + Var[F_l] (Var[x_l] measured on the state, not 1)
        x_prev = states[l - 1][0]
        assert abs(w[l] ** 2 - w[l - 1] ** 2 * var(x_prev) - var(updates[l - 1])) < 1e-12
    # the sampled x_0 does not have variance 1, so the Var[x_0] factor changes w_1
    assert abs(var(x0) - 1) > 1e-3
    assert abs(w[1] ** 2 - (1 + var(updates[0]))) > 1e-4


@test
def ngpt_scales_the_ffn_hidden_preactivation():
    """[A] ngpt: the FFN's hidden pre-activation is scaled by s_uv = sqrt(d) at init."""
    d = 16
    stack, x0, probes, notes = stack_for("ngpt", d=d)
    assert notes == [], notes
    assert stack.c["s_uv"] == math.sqrt(d)
    l = stack.kinds.index("ffn")
    x = R.unit(x0)
    W = stack.W[l]
    got = stack.F(l, x, detach=True)
    want = R.gelu(math.sqrt(d) * (x @ W["W_1"])) @ W["W_2"]
    assert torch.allclose(got, want, atol=1e-14, rtol=0)
    assert not torch.allclose(got, R.ffn(x, W), atol=1e-3, rtol=0)


@test
def plain_has_no_skip():
    stack, x0, probes, _ = stack_for("plain")
    res = R.analyze(stack, x0, probes)
    assert all(s == 0.0 for s in res["sublayers"]["skip_gain"])
    assert all(abs(s - 1.0) < 1e-15 for s in res["sublayers"]["stream_share"])
    assert all(abs(b - g) < 1e-12 * g for b, g in zip(res["sublayers"]["branch_gain"], res["sublayers"]["gain"]))


@test
def pre_ln_skip_is_identity():
    for arch in ("pre-ln", "peri-ln", "olmo2", "lns", "depth-mup", "layerscale", "hybridnorm"):
        stack, x0, probes, _ = stack_for(arch, block="attn")  # hybridnorm attn: no input norm, identity skip
        res = R.analyze(stack, x0, probes)
        assert all(abs(s - 1.0) < 1e-14 for s in res["sublayers"]["skip_gain"]), arch


@test
def deepscalelm_and_constants():
    c = R.spec_constants("deepscalelm", 3, 6)
    assert abs(c["lambda"] ** 2 + c["beta"] ** 2 - 1) < 1e-15 and abs(c["beta"] ** 2 - 2 / 6) < 1e-15
    assert R.spec_constants("deepnorm", 4, 8)["alpha"] == 8 ** 0.25
    assert R.spec_constants("deepnorm", 4, 8)["beta"] == 32 ** -0.25
    assert R.spec_constants("deepnorm-glm", 4, 8)["alpha"] == 8 ** 0.5
    assert R.spec_constants("layerscale", 18, 36)["lambda"] == 0.1
    assert R.spec_constants("layerscale", 19, 38)["lambda"] == 1e-5
    assert R.spec_constants("layerscale", 25, 50)["lambda"] == 1e-6
    assert R.spec_constants("mix-ln", 8, 16)["post_ln_blocks"] == 2
    # a disagreeing config constant is used (override) but reported
    path = make_export("keel", constants={"alpha": 3.0}, name="keel_alpha3.safetensors")
    stack, x0, probes, cfg, consts, notes = R.build_from_export(path)
    assert consts["alpha"] == 3.0 and any("alpha" in n for n in notes)
    stack, x0, probes, cfg, consts, notes = R.build_from_export(path, constants_source="spec")
    assert consts["alpha"] == 6.0
    # gradflow's form {"value": v, "formula": ..., "unit": ...} is read too
    _, notes = R.resolve_constants("deepnorm", {"constants": {"alpha": {"value": 1.5, "unit": "blocks"}}}, 3, 6, 0.25)
    assert any("alpha" in n for n in notes)
    _, notes = R.resolve_constants("deepnorm", {"constants": {"alpha": {"value": 6 ** 0.25}}}, 3, 6, 0.25)
    assert notes == []


@test
def siamese_and_resi_dual_streams():
    for arch, names in (("resi-dual", ["a", "d"]), ("siamese-norm", ["X", "Y"])):
        stack, x0, probes, _ = stack_for(arch)
        res = R.analyze(stack, x0, probes)
        assert sorted(res["states"]["streams"]) == sorted(names)
        for l in range(stack.S + 1):
            # total rms^2 is the mean of the stream rms^2 (equal sizes); grad norms add in quadrature
            rs = [res["states"]["streams"][n]["rms"][l] for n in names]
            assert abs(res["states"]["rms"][l] ** 2 - sum(r * r for r in rs) / 2) < 1e-12
            gs = [10 ** res["states"]["streams"][n]["log10_grad"][l] for n in names]
            assert abs(10 ** res["states"]["log10_grad"][l] - math.sqrt(sum(g * g for g in gs))) < 1e-10 * max(gs)


@test
def span_norm_states():
    stack, x0, probes, _ = stack_for("span-norm")
    states, _, _ = stack.forward(x0)
    assert [len(s) for s in states] == [1, 2, 1, 2, 1, 2, 1]
    res = R.analyze(stack, x0, probes)
    h = res["states"]["streams"]["h"]["rms"]
    assert h[0] is None and h[1] is not None and h[2] is None


@test
def multi_probe_rms():
    path = make_export("pre-ln", K=3, name="k3.safetensors")
    res = R.run_reference(path)
    stack, x0, probes, *_ = R.build_from_export(path)
    norms = [full_graph_grads(stack, x0, probes[k]) for k in range(3)]
    for l in range(stack.S + 1):
        want = math.sqrt(sum(n[l] ** 2 for n in norms) / 3)
        assert abs(10 ** res["states"]["log10_grad"][l] - want) < 1e-10 * want


@test
def deep_post_ln_log_is_finite():
    # renormalised propagation: a deep post-ln stack still gives finite logs
    path = make_export("post-ln", B=40, d=8, T=3, heads=2, name="deep.safetensors")
    res = R.run_reference(path)
    assert all(math.isfinite(v) for v in res["states"]["log10_grad"])


@test
def cli_roundtrip_and_errors():
    path = make_export("olmo2")
    out = os.path.join(TMP, "o.json")
    r = subprocess.run([sys.executable, os.path.join(HERE, "gradflow_reference.py"), path, "-o", out])
    assert r.returncode == 0
    with open(out) as f:
        res = json.load(f)
    assert res["arch"] == "olmo2" and len(res["states"]["rms"]) == 7
    r = subprocess.run([sys.executable, os.path.join(HERE, "gradflow_reference.py"), "/nonexistent.safetensors"],
                       stderr=subprocess.DEVNULL)
    assert r.returncode == 2


@test
def sandwich_alias():
    stack, x0, probes, _ = stack_for("sandwich-ln")
    assert stack.arch == "peri-ln"


def _compare(*args, env=None):
    e = dict(os.environ)
    e.update(env or {})
    return subprocess.run([sys.executable, os.path.join(HERE, "compare.py"),
                           "--gradflow", os.path.join(HERE, "fake_gradflow.py")] + list(args),
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=e)


@test
def compare_against_fake_binary():
    """compare.py plumbing, with a stand-in binary whose numbers come from the reference itself."""
    r = _compare("--arch", "keel")
    assert r.returncode == 0, r.stdout + r.stderr
    r = _compare("--arch", "keel", "--wrong-variant", "keel-alpha-on-branch")
    assert r.returncode == 1 and "MISMATCH" in r.stdout
    r = _compare("--arch", "resi-dual", env={"FAKE_GRADFLOW_PERTURB": "stream_share"})
    assert r.returncode == 1 and "stream_share" in r.stdout
    r = _compare("--arch", "no-such-arch")
    assert r.returncode == 2
    r = subprocess.run([sys.executable, os.path.join(HERE, "compare.py"), "--gradflow", "/nonexistent",
                        "--arch", "keel"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert r.returncode == 2
    r = _compare("--arch", "keel", "--alpha", "2.5", "--block", "ffn", "--norm", "layer")
    assert r.returncode == 0, r.stdout + r.stderr


@test
def siamese_code_form():
    """Decision 2 (official code form): X' = N_X(X); O = F(N_in(X' + N_Y(Y))); X <- X' + O/c; Y <- Y + O;
    c = sqrt(2(b+1)), b = 0-based block; update O/c, sum X' + O/c; output N_f(N_a(X) + N_b(Y))."""
    stack, x0, probes, _ = stack_for("siamese-norm")
    N = R.rms_norm
    g = torch.Generator().manual_seed(7)
    X, Y = torch.randn(x0.shape, generator=g), torch.randn(x0.shape, generator=g)
    for l in range(stack.S):
        c = math.sqrt(2.0 * (l // 2 + 1))
        Xn = N(X)
        h = N(Xn + N(Y))
        O = R.attention(h, stack.W[l], 2) if l % 2 == 0 else R.ffn(h, stack.W[l])
        (X2, Y2), u, s = stack.sublayer(l, (X, Y))
        assert torch.allclose(X2, Xn + O / c, atol=1e-14, rtol=0) and torch.allclose(Y2, Y + O, atol=1e-14, rtol=0)
        assert torch.allclose(u, O / c, atol=1e-15, rtol=0) and torch.allclose(s, Xn + O / c, atol=1e-14, rtol=0)
    assert torch.allclose(stack.output((X, Y)), N(N(X) + N(Y)))
    assert R.spec_constants("siamese-norm", 3, 6) == {"c": math.sqrt(6.0)}  # value at b = B-1
    # siamese with one-sublayer blocks: b = sublayer index
    stack, x0, probes, _ = stack_for("siamese-norm", block="ffn")
    (X2, Y2), u, s = stack.sublayer(2, (x0, x0))
    O = R.ffn(R.rms_norm(R.rms_norm(x0) + R.rms_norm(x0)), stack.W[2])
    assert torch.allclose(u, O / math.sqrt(6.0), atol=1e-15, rtol=0)


@test
def lns_block_index_default():
    """Decision 1: N(x)/sqrt(b+1), b = 0-based BLOCK (both sublayers of a block share it); --lns-index sublayer."""
    for lns_index, idx in (("block", lambda l: l // 2), ("sublayer", lambda l: l)):
        path = make_export("lns", name=f"lns_{lns_index}.safetensors")
        kw = {} if lns_index == "block" else {"lns_index": "sublayer"}
        stack, x0, probes, cfg, consts, notes = R.build_from_export(path, **kw)
        assert stack.lns_index == lns_index
        for l in range(stack.S):
            h = R.rms_norm(x0) / math.sqrt(idx(l) + 1)
            f = R.attention(h, stack.W[l], 2) if l % 2 == 0 else R.ffn(h, stack.W[l])
            (y,), u, s = stack.sublayer(l, (x0,))
            assert torch.allclose(y, x0 + f, atol=1e-14, rtol=0), (lns_index, l)
    assert R.Stack("lns", [{}] * 4, 1, branch="rotation", sublayers=4).lns_index == "block"
    assert R.spec_constants("lns", 3, 6)["input_scale"] == 1 / math.sqrt(3)
    assert R.spec_constants("lns", 3, 6, lns_index="sublayer")["input_scale"] == 1 / math.sqrt(6)


@test
def span_norm_single_sublayer_blocks_are_post_ln():
    """Decision 4: span-norm with --block ffn|attn reduces to x <- N(x + F(x))."""
    for block in ("ffn", "attn"):
        for norm in ("rms", "layer"):
            a = R.run_reference(make_export("span-norm", block=block, norm=norm, name=f"sp_{block}_{norm}.st"))
            b = R.run_reference(make_export("post-ln", block=block, norm=norm, name=f"pl_{block}_{norm}.st"))
            for part in ("states", "sublayers"):
                for key in ("rms", "log10_grad", "gain", "skip_gain", "branch_gain", "branch_rms", "stream_share"):
                    if key in a[part]:
                        assert a[part][key] == b[part][key], (block, norm, key)
            assert list(a["states"]["streams"]) == ["x"]


@test
def gradflow_config_objects():
    """gradflow's resolved config: every constant is {"value", "formula", "unit"} (mix_ratio too)."""
    o = lambda v, unit="-": {"value": v, "formula": "f", "unit": unit}
    cases = {
        "mix-ln": {"mix_ratio": o(0.25, "fraction of blocks"), "post_ln_blocks": o(1.0, "blocks")},
        "siamese-norm": {"c": o(math.sqrt(8.0), "blocks")},
        "lns": {"input_scale": o(0.5, "blocks")},
        "admin": {"w_0": o(1.0, "sublayers")},
        "ngpt": {"alpha": o(0.05), "s_uv": o(4.0)},  # make_export's d = 16
        "depth-mup": {"branch_scale": o(1 / math.sqrt(8.0), "sublayers"), "adam_lr_scale": o(1 / math.sqrt(8.0), "sublayers")},
        "deepnorm": {"alpha": o(8 ** 0.25, "blocks"), "beta": o(32 ** -0.25, "blocks")},
    }
    for arch, cc in cases.items():
        path = make_export(arch, B=4, constants=cc, name=f"obj_{arch}.safetensors")
        stack, x0, probes, cfg, consts, notes = R.build_from_export(path, constants_source="spec")
        assert notes == [], (arch, notes)
        R.analyze(stack, x0, probes)
    assert R.build_from_export(make_export("mix-ln", B=4, constants=cases["mix-ln"], name="mx.st"))[0].mix_ratio == 0.25
    # a differing value is reported
    path = make_export("siamese-norm", B=4, constants={"c": o(2.0)}, name="obj_bad_c.safetensors")
    notes = R.build_from_export(path, constants_source="spec")[5]
    assert any("constants.c" in n for n in notes), notes
    # an --alpha override recomputes derived constants (depth-mup a / sqrt(S))
    assert R.spec_constants("depth-mup", 4, 8, alpha=2.0)["branch_scale"] == 2.0 / math.sqrt(8.0)


@test
def strict_exit_codes():
    import compare as C
    assert C.exit_code(["OK", "UNSUPPORTED"], True, False) == 0
    assert C.exit_code(["OK", "UNSUPPORTED"], True, True) == 1
    assert C.exit_code(["OK", "MISMATCH", "UNSUPPORTED"], True, False) == 1
    assert C.exit_code(["OK", "ERROR"], True, True) == 2
    assert C.exit_code(["UNSUPPORTED"], False, False) == 2
    assert C.exit_code(["UNSUPPORTED"], False, True) == 1
    assert C.exit_code(["OK"], True, True) == 0
    r = _compare("--arch", "plain", env={"FAKE_GRADFLOW_REJECT": "plain"})
    assert r.returncode == 2 and "UNSUPPORTED" in r.stdout, r.stdout + r.stderr
    r = _compare("--arch", "plain", "--strict", env={"FAKE_GRADFLOW_REJECT": "plain"})
    assert r.returncode == 1 and "UNSUPPORTED" in r.stdout, r.stdout + r.stderr


@test
def all_follows_the_registry():
    """--all compares every placement `archs --format json` lists; one the reference cannot build, or (with
    --baselines) one without DIR/<id>.json, fails the run and is named, with or without --strict."""
    import compare as C
    assert C.exit_code(["OK", "NO_REFERENCE"], True, False) == 1
    assert C.exit_code(["OK", "NO_BASELINE"], True, False) == 1
    baselines = os.path.join(TMP, "baselines")
    os.makedirs(baselines, exist_ok=True)
    for arch in ("keel", "b2t-fake"):
        open(os.path.join(baselines, f"{arch}.json"), "w").close()
    r = _compare("--all", "--strict", "--baselines", baselines, env={"FAKE_GRADFLOW_ARCHS": "keel"})
    assert r.returncode == 0 and "keel=OK" in r.stdout, r.stdout + r.stderr
    for strict in (["--strict"], []):  # a new placement without formulas in the reference
        r = _compare("--all", *strict, "--baselines", baselines, env={"FAKE_GRADFLOW_ARCHS": "keel,b2t-fake"})
        assert r.returncode == 1, r.stdout + r.stderr
        assert "keel=OK" in r.stdout and "b2t-fake=NO_REFERENCE" in r.stdout, r.stdout
        assert "FAILED, not covered: b2t-fake: no reference support" in r.stdout, r.stdout
    r = _compare("--all", "--baselines", baselines, env={"FAKE_GRADFLOW_ARCHS": "keel,pre-ln"})
    assert r.returncode == 1 and "pre-ln=NO_BASELINE" in r.stdout, r.stdout + r.stderr
    assert f"FAILED, not covered: pre-ln: no baseline: {os.path.join(baselines, 'pre-ln.json')}" in r.stdout
    r = _compare("--all", env={"FAKE_GRADFLOW_ARCHS": "keel,pre-ln"})  # no --baselines: not asked for
    assert r.returncode == 0, r.stdout + r.stderr


@test
def ideal_rotation_branch():
    x = torch.randn(5, 16, generator=torch.Generator().manual_seed(5))
    y = R.rotate_pairs(x)
    assert torch.allclose((x * y).sum(-1), torch.zeros(5), atol=1e-14)  # orthogonal per token
    assert torch.allclose(y.norm(dim=-1), x.norm(dim=-1))               # as large as the stream
    assert y[0, 1] == x[0, 0] and y[0, 0] == -x[0, 1]
    stack = R.Stack("post-ln", [{} for _ in range(6)], 2, branch="rotation", sublayers=6)
    res = R.analyze(stack, x, torch.randn(1, 5, 16, generator=torch.Generator().manual_seed(6)))
    for l in range(1, 6):  # once the state is normalised: stream_share = 1/sqrt(2) ([A] closed forms)
        assert abs(res["sublayers"]["stream_share"][l] - 1 / math.sqrt(2)) < 1e-6


# ----------------------------------------------------------------------------------------------
# --ffn moe (Mixtral / OLMoE / Qwen-MoE router)
# ----------------------------------------------------------------------------------------------
def moe_weights(rng, d, E, hidden, shared=0, gate="sigmoid", bias=False, router_scale=3.0):
    """One MoE FFN sublayer's tensors under gradflow's export names (W_router, W_i.e<e>, W_i.shared,
    W_gate.shared), with biases b_i.<suffix>, b_router and b_gate.shared when `bias`; the router is scaled up so that the top-K
    probabilities stand apart."""
    W = {"W_router": router_scale * xavier(rng, d, E)}
    parts = [f".e{e}" for e in range(E)] + ([".shared"] if shared else [])
    for suffix in parts:
        h = shared if suffix == ".shared" else hidden
        W["W_1" + suffix], W["W_3" + suffix], W["W_2" + suffix] = xavier(rng, d, h), xavier(rng, d, h), xavier(rng, h, d)
        if bias:
            for i, n in (("1", h), ("3", h), ("2", d)):
                W[f"b_{i}{suffix}"] = 0.1 * rng.normal(size=(n,))
    if shared and gate == "sigmoid":
        W["W_gate.shared"] = xavier(rng, d, 1)
    if bias:  # --bias: the router and the shared gate too
        W["b_router"] = 0.1 * rng.normal(size=(E,))
        if "W_gate.shared" in W:
            W["b_gate.shared"] = 0.1 * rng.normal(size=(1,))
    return W


def make_moe_export(arch, B=2, d=8, T=5, heads=2, block="attn-ffn", E=4, K=2, hidden=12, shared=0,
                    gate="sigmoid", gates="renormalized", bias=False, seed=0, name=None, cfg_moe=True):
    rng = np.random.default_rng(seed)
    t = make_tensors(B, d, T, block, 1, seed)
    kinds = (["attn", "ffn"] * B) if block == "attn-ffn" else [block] * B
    for l, k in enumerate(kinds):
        p = f"sublayer.{l:04d}."
        if k == "attn":
            if bias:
                for n in ("b_Q", "b_K", "b_V", "b_O"):
                    t[p + n] = 0.1 * rng.normal(size=(d,))
            continue
        for n in [n for n in t if n.startswith(p)]:
            del t[n]
        for n, w in moe_weights(rng, d, E, hidden, shared, gate, bias).items():
            t[p + n] = w
    S = len(kinds)
    cfg = {"arch": arch, "blocks": B, "sublayers": S, "width": d, "heads": heads, "seq": T, "block": block,
           "norm": "rms", "norm_eps": 1e-6, "precision": "f64", "probes": 1, "constants": {}, "bias": bias}
    if cfg_moe:
        cfg.update({"ffn": "moe", "ffn_hidden": hidden, "experts": E, "experts_active": K,
                    "shared_expert_hidden": shared, "router_gates": gates, "shared_expert_gate": gate})
    path = os.path.join(TMP, name or f"moe_{arch}_{block}_E{E}K{K}s{shared}{gate}{gates}{int(bias)}.safetensors")
    R.write_safetensors(path, t, {"arch": arch, "seed": seed, "config": json.dumps(cfg)})
    return path


def _torch_weights(W):
    return {n: torch.from_numpy(np.asarray(w, dtype=np.float64)) for n, w in W.items()}


@test
def moe_equal_experts_all_active_is_one_dense_swiglu():
    """E equal experts, K = E, renormalized gates: the gates sum to 1, so the MoE is the one SwiGLU FFN."""
    rng = np.random.default_rng(11)
    d, E, hidden = 8, 4, 12
    x = torch.from_numpy(rng.normal(size=(5, d)))
    for bias in (False, True):
        one = _torch_weights(moe_weights(rng, d, 1, hidden, bias=bias))
        W = {"W_router": torch.from_numpy(3.0 * xavier(rng, d, E))}
        for e in range(E):
            W.update({n.replace(".e0", f".e{e}"): t.clone() for n, t in one.items() if ".e0" in n})
        dense = {n.replace(".e0", ""): t for n, t in one.items() if ".e0" in n}
        want = R.ffn(x, dense, kind="swiglu")
        got = R.ffn(x, W, kind=R.MoeKind(experts=E, experts_active=E))
        assert torch.allclose(got, want, atol=1e-13, rtol=0), (bias, float((got - want).abs().max()))
        # ngpt's hidden scale applies to the experts' hidden pre-activations as it does to the dense FFN
        got = R.ffn(x, W, 4.0, R.MoeKind(experts=E, experts_active=E))
        assert torch.allclose(got, R.ffn(x, dense, 4.0, "swiglu"), atol=1e-12, rtol=0)
        # softmax gates with K = E: g_e = p_e sums to 1 too
        got = R.ffn(x, W, kind=R.MoeKind(experts=E, experts_active=E, router_gates="softmax"))
        assert torch.allclose(got, want, atol=1e-13, rtol=0)
    # K < E with renormalized gates: still sum 1 per token, so equal experts still give the dense FFN
    got = R.ffn(x, W, kind=R.MoeKind(experts=E, experts_active=2))
    assert torch.allclose(got, want, atol=1e-13, rtol=0)


@test
def moe_router_gradient_matches_finite_differences():
    """d/dW_router of L = sum(U * MoE(x)) by torch autograd vs central differences, at a point whose top-K
    probabilities stand apart (no selection changes within +-h), f64, 1e-7 relative."""
    d, E, K, hidden, h = 8, 6, 2, 10, 1e-5
    cases = [dict(gates="renormalized"), dict(gates="softmax"), dict(gates="renormalized", shared=7, bias=True),
             dict(gates="softmax", shared=7, gate="none", K=3)]
    for i, c in enumerate(cases):
        k = c.get("K", K)
        moe = R.MoeKind(experts=E, experts_active=k, shared_expert_hidden=c.get("shared", 0),
                        router_gates=c["gates"], shared_expert_gate=c.get("gate", "sigmoid"))
        for seed in range(100 * i, 100 * i + 100):  # the first seeded point whose K-th and (K+1)-th p differ by 1e-3
            rng = np.random.default_rng(seed)
            W = _torch_weights(moe_weights(rng, d, E, hidden, c.get("shared", 0), c.get("gate", "sigmoid"),
                                           c.get("bias", False)))
            x = torch.from_numpy(rng.normal(size=(5, d)))
            U = torch.from_numpy(rng.normal(size=(5, d)))
            p, _ = R.moe_gates(x, W, moe)
            ps = p.sort(dim=-1, descending=True).values
            if float((ps[:, k - 1] - ps[:, k]).min()) > 1e-3:
                break
        else:
            raise AssertionError("no test point away from ties")
        assert set(W) - {n for n in W if n.startswith("b_")} == R.moe_weight_names(moe)
        base_sel = R.moe_top_k(p, k)
        Wr = W["W_router"].clone().requires_grad_(True)
        loss = (U * R.moe_ffn(x, {**W, "W_router": Wr}, moe)).sum()
        (an,) = torch.autograd.grad(loss, Wr)
        fd = torch.zeros_like(an)
        with torch.no_grad():
            for a in range(d):
                for b in range(E):
                    vals = []
                    for sign in (1.0, -1.0):
                        Wp = W["W_router"].clone()
                        Wp[a, b] += sign * h
                        Wh = {**W, "W_router": Wp}
                        assert torch.equal(R.moe_top_k(R.moe_gates(x, Wh, moe)[0], k), base_sel)
                        vals.append(float((U * R.moe_ffn(x, Wh, moe)).sum()))
                    fd[a, b] = (vals[0] - vals[1]) / (2 * h)
        scale = float(an.abs().max())
        assert scale > 1e-3, "router gradient vanishes: the test would prove nothing"
        err = float((fd - an).abs().max()) / scale
        assert err <= 1e-7, (c, err)


@test
def moe_top_k_picks_the_largest_probabilities():
    p = torch.tensor([[0.1, 0.4, 0.2, 0.3], [0.25, 0.25, 0.25, 0.25], [0.1, 0.3, 0.3, 0.3], [0.5, 0.1, 0.1, 0.3]])
    assert R.moe_top_k(p, 2).tolist() == [[1, 3], [0, 1], [1, 2], [0, 3]]  # ties: lower index first
    assert R.moe_top_k(p, 1).tolist() == [[1], [0], [1], [0]]
    g = torch.Generator().manual_seed(5)
    for k in (1, 2, 3, 5):
        p = torch.softmax(3 * torch.randn(50, 7, generator=g), dim=-1)
        idx = R.moe_top_k(p, k)
        chosen = torch.zeros_like(p, dtype=torch.bool).scatter_(-1, idx, True)
        assert (chosen.sum(-1) == k).all()
        low = torch.where(chosen, p, torch.full_like(p, 2.0)).min(-1).values
        high = torch.where(chosen, torch.full_like(p, -1.0), p).max(-1).values
        assert (low > high).all(), k                                     # every chosen p beats every other
        assert torch.equal(p.gather(-1, idx), p.sort(-1, descending=True).values[:, :k])  # largest first
    # the gates: zero off the top-K; renormalized sums to 1, softmax keeps p
    rng = np.random.default_rng(3)
    W = _torch_weights(moe_weights(rng, 8, 7, 4))
    x = torch.from_numpy(rng.normal(size=(6, 8)))
    for gates in ("renormalized", "softmax"):
        moe = R.MoeKind(experts=7, experts_active=3, router_gates=gates)
        p, G = R.moe_gates(x, W, moe)
        on = torch.zeros_like(p, dtype=torch.bool).scatter_(-1, R.moe_top_k(p, 3), True)
        assert (G[~on] == 0).all() and (G[on] > 0).all()
        if gates == "renormalized":
            assert torch.allclose(G.sum(-1), torch.ones(6), atol=1e-15, rtol=0)
            assert torch.allclose(G[on], (p / (p * on).sum(-1, keepdim=True))[on], atol=1e-15, rtol=0)
        else:
            assert torch.equal(G[on], p[on])


@test
def moe_export_builds_and_steps():
    """A synthetic --ffn moe export: read without notes, VJP chain == whole-graph autograd and finite differences,
    and --update's step_rel keys the MoE matrices by kind (W_router, W_gate.shared, W_1.* -> w_1; W_2.* -> w_2;
    W_3.* -> w_3), one ratio of sums per kind, biases left out."""
    assert [R.matrix_kind(n) for n in ("W_router", "W_gate.shared", "W_1.e3", "W_2.shared", "W_3.e0", "b_1.e0",
                                       "b_2.shared", "W_Q", "W_1")] == ["w_1", "w_1", "w_1", "w_2", "w_3", None,
                                                                         None, "w_q", "w_1"]
    for block, shared, gate, gates, bias in (("ffn", 0, "sigmoid", "renormalized", False),
                                             ("attn-ffn", 6, "sigmoid", "softmax", True),
                                             ("ffn", 6, "none", "renormalized", True)):
        path = make_moe_export("pre-ln", block=block, shared=shared, gate=gate, gates=gates, bias=bias)
        stack, x0, probes, cfg, consts, notes = R.build_from_export(path)
        assert notes == [], notes
        assert stack.ops["ffn"] == "moe" and stack.ops["ffn"].router_gates == gates
        res = R.analyze(stack, x0, probes)
        ref = full_graph_grads(stack, x0, probes[0])
        for l, (a, b) in enumerate(zip([10 ** v for v in res["states"]["log10_grad"]], ref)):
            assert abs(a - b) <= 1e-10 * b, (block, l, a, b)
        states, _, _ = stack.forward(x0)
        for l in range(stack.S):
            out = stack.sublayer(l, states[l])[0]
            cot = tuple(torch.randn(t.shape, generator=torch.Generator().manual_seed(7 + l)) for t in out)
            fd, an = _fd_check(stack, states[l], l, cot)
            assert abs(fd - an) <= 1e-6 * max(1.0, abs(an)), (block, l, fd, an)
        for rule in ("sgd", "adam"):
            up = R.model_update(stack, x0, probes[0], rule, 1e-3)
            want_keys = {"w_1", "w_2", "w_3"} | ({"w_q", "w_k", "w_v", "w_o"} if block == "attn-ffn" else set())
            assert set(up["step_rel"]) == want_keys, up["step_rel"]
            # w_1 by hand: the same optimizer step over every up matrix of every sublayer
            params = [{n: t.clone().requires_grad_(True) for n, t in Wl.items()} for Wl in stack.W]
            base = stack.W
            stack.W = params
            with torch.enable_grad():
                st = stack.init_state(x0)
                for l in range(stack.S):
                    st = stack.sublayer(l, st)[0]
                loss = (probes[0] * stack.output(st)).sum()
                flat = [(l, n, t) for l, Wl in enumerate(params) for n, t in Wl.items()]
                grads = torch.autograd.grad(loss, [t for _, _, t in flat])
            stack.W = base
            ups = [(R._optimizer_step(rule, 1e-3, g), base[l][n]) for (l, n, _), g in zip(flat, grads)
                   if n == "W_router" or n == "W_gate.shared" or n.startswith("W_1.")]
            want = math.sqrt(sum(float((a * a).sum()) for a, _ in ups) / sum(float((w * w).sum()) for _, w in ups))
            assert abs(up["step_rel"]["w_1"] - want) <= 1e-12 * want, (up["step_rel"]["w_1"], want)
    # a config without the ffn key: the router's presence decides, with a note
    path = make_moe_export("pre-ln", block="ffn", cfg_moe=False, E=8, K=2, name="moe_nokey.safetensors")
    stack, *_, notes = R.build_from_export(path)
    assert stack.ops["ffn"] == "moe" and any("W_router" in n for n in notes), notes
    # a config that disagrees with the tensors is reported
    path = make_moe_export("pre-ln", block="ffn", E=4, name="moe_bad.safetensors")
    stack, *_, notes = R.build_from_export(path, overrides={"experts": 5})
    assert any("experts" in n for n in notes), notes


@test
def compare_forwards_the_moe_flags():
    import compare as C
    args = C.build_parser().parse_args(["--gradflow", "/bin/true", "--arch", "pre-ln", "--ffn", "moe", "--experts", "6",
                                        "--experts-active", "3", "--shared-expert-hidden", "16", "--router-gates",
                                        "softmax", "--shared-expert-gate", "none"])
    cmd, p, _, _ = C.run_gradflow(args, "pre-ln", TMP)
    got = {cmd[i]: cmd[i + 1] for i in range(len(cmd) - 1) if cmd[i].startswith("--")}
    assert {k: got.get(k) for k in ("--ffn", "--experts", "--experts-active", "--shared-expert-hidden",
                                    "--router-gates", "--shared-expert-gate")} == {
        "--ffn": "moe", "--experts": "6", "--experts-active": "3", "--shared-expert-hidden": "16",
        "--router-gates": "softmax", "--shared-expert-gate": "none"}, cmd
    assert C.moe_overrides(args) == {"experts": 6, "experts_active": 3, "shared_expert_hidden": 16,
                                     "router_gates": "softmax", "shared_expert_gate": "none"}
    args = C.build_parser().parse_args(["--gradflow", "/bin/true", "--arch", "pre-ln", "--ffn", "moe"])
    cmd = C.run_gradflow(args, "pre-ln", TMP)[0]
    assert not [a for a in cmd if a in ("--experts", "--experts-active", "--shared-expert-hidden", "--router-gates",
                                        "--shared-expert-gate")], cmd  # only when given
    assert C.build_parser().parse_args(["--gradflow", "x", "--all", "--router-gates", "renormalized"]).router_gates
    import contextlib
    import io
    try:
        with contextlib.redirect_stderr(io.StringIO()):
            C.build_parser().parse_args(["--gradflow", "x", "--all", "--router-gates", "sigmoid"])
        raise AssertionError("--router-gates sigmoid accepted")
    except SystemExit:
        pass


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
