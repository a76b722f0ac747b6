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
        "depth-mup": {"branch_scale": o(1 / math.sqrt(8.0), "sublayers")},
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
