"""Images [B, C, ~H, ~W]: conv2d (every option), max_pool2d, avg_pool2d, upsample2d, patches and
global pooling against per-image float64 NumPy references (image_ref.py), their gradients
against float64 central differences of rag's own forward pass, the derived names of the result
axes, bitwise determinism across RAG_NUM_THREADS, and the padded tier's refusal."""
import hashlib
import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest
import rag

import image_ref as ref

ROOT = pathlib.Path(__file__).resolve().parents[2]

# 1 x 1, smaller than a 3 x 3 kernel along one axis, odd sizes, wider than tall.
SIZES = [(1, 1), (2, 5), (5, 3), (4, 7)]

# name -> (Cin, Cout, kh, kw, rag keyword arguments, reference keyword arguments, bias)
CONVS = {
    "same3": (2, 3, 3, 3, "padding=1", dict(pad=(1, 1, 1, 1)), True),
    "s2p1": (2, 3, 3, 3, "stride=2, padding=1", dict(stride=(2, 2), pad=(1, 1, 1, 1)), False),
    "valid3": (2, 2, 3, 3, "", dict(), True),
    "pointwise": (3, 2, 1, 1, "", dict(), True),
    "dil2": (2, 2, 3, 3, "padding=2, dilation=2", dict(pad=(2, 2, 2, 2), dil=(2, 2)), False),
    "groups2": (4, 2, 3, 3, "padding=1, groups=2", dict(pad=(1, 1, 1, 1), groups=2), True),
    "depthwise": (3, 3, 3, 3, "stride=(2, 1), padding=(1, 0), groups=3",
                  dict(stride=(2, 1), pad=(1, 1, 0, 0), groups=3), False),
    "same_even": (2, 2, 2, 4, 'padding="same", dilation=(1, 2)',
                  dict(pad=(0, 1, 3, 3), dil=(1, 2)), True),
    "grow": (2, 2, 1, 1, "padding=1", dict(pad=(1, 1, 1, 1)), False),
    "patchify": (2, 3, 2, 2, "stride=2", dict(stride=(2, 2)), True),
    "rect": (2, 2, 1, 3, "stride=(1, 2), padding=(0, 1)", dict(stride=(1, 2), pad=(0, 0, 1, 1)),
             False),
}

# name -> (rag call, reference on one image)
POOLS = {
    "max2": ("max_pool2d(x, 2)", lambda x: ref.max_pool2d(x, (2, 2), (2, 2), (0, 0))),
    "max3s2p1": ("max_pool2d(x, 3, stride=2, padding=1)",
                 lambda x: ref.max_pool2d(x, (3, 3), (2, 2), (1, 1))),
    "max_rect": ("max_pool2d(x, (2, 3), stride=(1, 2))",
                 lambda x: ref.max_pool2d(x, (2, 3), (1, 2), (0, 0))),
    "avg2": ("avg_pool2d(x, 2)", lambda x: ref.avg_pool2d(x, (2, 2), (2, 2), (0, 0))),
    "avg3s2p1": ("avg_pool2d(x, 3, stride=2, padding=1)",
                 lambda x: ref.avg_pool2d(x, (3, 3), (2, 2), (1, 1))),
    "up2": ("upsample2d(x)", lambda x: ref.upsample2d(x, 2)),
    "up3": ("upsample2d(x, scale=3)", lambda x: ref.upsample2d(x, 3)),
}

EPS = 1e-6


# Channels in multiples of 16: the f32 steps run the direct kernel (jit/conv_kernels.cpp) for
# the forward pass, input gradients (strided too) and weight gradients; images with full
# 8-pixel tiles and a tail.
WIDE = {
    "wide_same3": (16, 16, 3, 3, "padding=1", dict(pad=(1, 1, 1, 1)), True),
    "wide_stem": (3, 32, 3, 3, "stride=2, padding=1", dict(stride=(2, 2), pad=(1, 1, 1, 1)),
                  False),
    "wide_groups": (32, 32, 3, 3, "padding=2, dilation=2, groups=2",
                    dict(pad=(2, 2, 2, 2), dil=(2, 2), groups=2), True),
    "wide_valid": (16, 48, 2, 3, "", dict(), False),
    "wide_strided": (32, 32, 3, 3, "stride=2, padding=1, groups=2",
                     dict(stride=(2, 2), pad=(1, 1, 1, 1), groups=2), True),
}
WIDE_SIZES = [(1, 1), (9, 11), (5, 3), (2, 7)]


def conv_source(dt, table=CONVS):
    src = ""
    for name, (ci, co, kh, kw, kwargs, _, bias) in table.items():
        g = dict(table[name][5]).get("groups", 1)
        b = f", b: {dt}[{co}]" if bias else ""
        call = f"conv2d(x, w{', bias=b' if bias else ''}{', ' + kwargs if kwargs else ''})"
        args = f"x: {dt}[B, {ci}, ~H, ~W], w: {dt}[{co}, {ci // g}, {kh}, {kw}]{b}"
        names = "x, w" + (", b" if bias else "")
        src += f"fn {name}({args}) -> {dt}[B, {co}, ~H2, ~W2] {{ return {call} }}\n"
        src += (f"fn loss_{name}({args}) -> {dt}[] {{ let y = {call}\n"
                f"    return sum(y * y) + sum(y * 0.3) }}\n")
        for p in names.split(", "):
            src += (f"fn d{p}_{name}({args}) -> {dt}[{'B, ' + str(ci) + ', ~H, ~W' if p == 'x' else str(co) if p == 'b' else f'{co}, {ci // g}, {kh}, {kw}'}] "
                    f"{{ return grad(loss_{name}, wrt={p})({names}) }}\n")
    return src


def pool_source(dt, c=3):
    src = ""
    for name, (call, _) in POOLS.items():
        args = f"x: {dt}[B, {c}, ~H, ~W]"
        src += f"fn {name}({args}) -> {dt}[B, {c}, ~H2, ~W2] {{ return {call} }}\n"
        # The column index weighs each output differently, so a gradient that mixes up the
        # outputs of one window (equal under sum(y * y) for an upsampling) is seen.
        src += (f"fn loss_{name}({args}) -> {dt}[] {{ let y = {call}\n"
                f" return sum(y * y) + sum(y * {dt}(positions(y, axis=3))) }}\n")
        src += f"fn dx_{name}({args}) -> {dt}[B, {c}, ~H, ~W] {{ return grad(loss_{name}, wrt=x)(x) }}\n"
    for p in (2, 3):
        src += (f"fn patches{p}({args}) -> {dt}[B, ~P, {c * p * p}] {{ return patches(x, {p}) }}\n"
                f"fn loss_patches{p}({args}) -> {dt}[] {{ let y = patches(x, {p})\n"
                f"    return sum(y * y) + sum(y) }}\n"
                f"fn dx_patches{p}({args}) -> {dt}[B, {c}, ~H, ~W] {{ return grad(loss_patches{p}, wrt=x)(x) }}\n")
    return src


# "f64", "f32": the CPU JIT; "interp": the reference kernels (f64), the oracle of every tier.
@pytest.fixture(scope="module")
def convs():
    m = {dt: rag.compile(conv_source(dt), f"convs_{dt}.rag") for dt in ("f64", "f32")}
    m["interp"] = rag.compile(conv_source("f64"), "convs_interp.rag", tier="interpreter")
    return m


@pytest.fixture(scope="module")
def pools():
    m = {dt: rag.compile(pool_source(dt), f"pools_{dt}.rag") for dt in ("f64", "f32")}
    m["interp"] = rag.compile(pool_source("f64"), "pools_interp.rag", tier="interpreter")
    return m


def np_dtype(dt):
    return np.float32 if dt == "f32" else np.float64


def images(rng, c, sizes=SIZES, dtype=np.float64):
    return [rng.standard_normal((c, h, w)).astype(dtype) for h, w in sizes]


def batch(xs):
    return rag.ragged(xs, ragged_axes=[1, 2])


def conv_inputs(name, rng, table=CONVS, sizes=SIZES):
    ci, co, kh, kw, _, kw_ref, bias = table[name]
    g = kw_ref.get("groups", 1)
    xs = images(rng, ci, sizes)
    w = rng.standard_normal((co, ci // g, kh, kw)) * 0.5
    b = rng.standard_normal(co) if bias else None
    return xs, w, b


def call_args(x, w, b):
    return (x, w) if b is None else (x, w, b)


@pytest.mark.parametrize("name", list(CONVS))
@pytest.mark.parametrize("dt", ["f64", "f32", "interp"])
def test_conv2d_matches_dense_reference(convs, name, dt):
    rng = np.random.default_rng(len(name))
    xs, w, b = conv_inputs(name, rng)
    npdt = np_dtype(dt)
    cast = lambda a: None if a is None else a.astype(npdt)  # noqa: E731
    y = getattr(convs[dt], name)(*call_args(batch([cast(x) for x in xs]), cast(w), cast(b)))
    kw_ref = CONVS[name][5]
    tol = dict(rtol=1e-5, atol=1e-5) if dt == "f32" else dict(rtol=1e-12, atol=1e-12)
    for x, yi in zip(xs, y.to_list()):
        want = ref.conv2d(x, w, b, **kw_ref)
        assert yi.shape == want.shape
        np.testing.assert_allclose(yi, want, **tol)


@pytest.mark.parametrize("name", list(CONVS))
@pytest.mark.parametrize("tier", ["f64", "interp"])
def test_conv2d_gradients_match_finite_differences(convs, name, tier):
    m = convs[tier]
    rng = np.random.default_rng(100 + len(name))
    xs, w, b = conv_inputs(name, rng)
    loss = lambda: float(getattr(m, "loss_" + name)(*call_args(batch(xs), w, b)))  # noqa: E731
    args = call_args(batch(xs), w, b)
    dx = getattr(m, "dx_" + name)(*args).to_list()
    for i, x in enumerate(xs):
        np.testing.assert_allclose(dx[i], central(loss, x), rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(np.asarray(getattr(m, "dw_" + name)(*args)), central(loss, w),
                               rtol=1e-6, atol=1e-7)
    if b is not None:
        np.testing.assert_allclose(np.asarray(getattr(m, "db_" + name)(*args)), central(loss, b),
                                   rtol=1e-6, atol=1e-7)


@pytest.fixture(scope="module")
def wide_convs():
    return {dt: rag.compile(conv_source(dt, WIDE), f"wide_{dt}.rag") for dt in ("f64", "f32")}


@pytest.mark.parametrize("name", list(WIDE))
def test_wide_f32_convolutions_and_gradients_match_f64(wide_convs, name):
    # The forward pass against the NumPy reference; the gradients against the f64 step (which
    # the finite-difference tests above check), as the direct kernel only runs in f32.
    rng = np.random.default_rng(7 + len(name))
    xs, w, b = conv_inputs(name, rng, WIDE, WIDE_SIZES)
    f32 = lambda a: None if a is None else a.astype(np.float32)  # noqa: E731
    args32 = call_args(batch([f32(x) for x in xs]), f32(w), f32(b))
    args64 = call_args(batch(xs), w, b)
    m32, m64 = wide_convs["f32"], wide_convs["f64"]
    for x, yi in zip(xs, getattr(m32, name)(*args32).to_list()):
        want = ref.conv2d(x, w, b, **WIDE[name][5])
        np.testing.assert_allclose(yi, want, rtol=1e-4, atol=1e-4 * np.abs(want).max(initial=1))
    for p in ("x", "w") + (("b",) if b is not None else ()):
        got, want = (getattr(m, f"d{p}_{name}")(*a) for m, a in ((m32, args32), (m64, args64)))
        got, want = ((v.to_list() if p == "x" else [np.asarray(v)]) for v in (got, want))
        for g, e in zip(got, want):
            np.testing.assert_allclose(g, e, rtol=1e-4, atol=1e-4 * np.abs(e).max(initial=1), err_msg=p)


def central(fun, arr):
    g = np.zeros_like(arr)
    for idx in np.ndindex(arr.shape):
        old = arr[idx]
        arr[idx] = old + EPS
        up = fun()
        arr[idx] = old - EPS
        down = fun()
        arr[idx] = old
        g[idx] = (up - down) / (2 * EPS)
    return g


@pytest.mark.parametrize("name", list(POOLS) + ["patches2", "patches3"])
@pytest.mark.parametrize("dt", ["f64", "f32", "interp"])
def test_pooling_upsampling_patches_match_dense_reference(pools, name, dt):
    rng = np.random.default_rng(7)
    npdt = np_dtype(dt)
    xs = images(rng, 3, SIZES + [(6, 4)])
    y = getattr(pools[dt], name)(batch([x.astype(npdt) for x in xs]))
    fn = POOLS[name][1] if name in POOLS else (lambda x: ref.patches(x, int(name[-1])))
    tol = dict(rtol=1e-6, atol=1e-6) if dt == "f32" else dict(rtol=1e-12, atol=1e-12)
    for x, yi in zip(xs, y.to_list()):
        want = fn(x)
        assert yi.shape == want.shape
        np.testing.assert_allclose(yi, want, **tol)


@pytest.mark.parametrize("name", list(POOLS) + ["patches2", "patches3"])
@pytest.mark.parametrize("tier", ["f64", "interp"])
def test_pooling_upsampling_patches_gradients(pools, name, tier):
    m = pools[tier]
    rng = np.random.default_rng(9)
    xs = images(rng, 3, [(1, 1), (3, 5), (4, 4)])
    loss = lambda: float(getattr(m, "loss_" + name)(batch(xs)))  # noqa: E731
    dx = getattr(m, "dx_" + name)(batch(xs)).to_list()
    for i, x in enumerate(xs):
        np.testing.assert_allclose(dx[i], central(loss, x), rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("dt", ["f64", "f32", "interp"])
def test_max_pool_propagates_nan_like_pytorch(pools, dt):
    x = np.arange(3 * 4 * 5, dtype=np.float64).reshape(3, 4, 5)
    x[0, 1, 1] = np.nan
    x[1, 3, 4] = -np.inf
    x[2, :2, :2] = -np.inf   # a window of -inf only
    npdt = np_dtype(dt)
    y = pools[dt].max2(batch([x.astype(npdt)])).to_list()[0]
    want = ref.max_pool2d(x, (2, 2), (2, 2), (0, 0))
    assert np.isnan(y[0, 0, 0]) and np.isnan(want[0, 0, 0])
    np.testing.assert_array_equal(y, want.astype(npdt))


def test_result_axes_have_derived_names(convs, pools):
    rng = np.random.default_rng(3)
    x = batch(images(rng, 2))
    assert convs["f64"].same3(x, np.zeros((3, 2, 3, 3)), np.zeros(3)).schema == \
        "f64[B, 3, ~H, ~W]"
    assert convs["f64"].s2p1(x, np.zeros((3, 2, 3, 3))).schema == "f64[B, 3, ~H[::2], ~W[::2]]"
    assert convs["f64"].valid3(x, np.zeros((2, 2, 3, 3)), np.zeros(2)).schema == \
        "f64[B, 2, ~H[2:], ~W[2:]]"
    assert convs["f64"].grow(x, np.zeros((2, 2, 1, 1))).schema == "f64[B, 2, ~H[+2], ~W[+2]]"
    x3 = batch(images(rng, 3))
    assert pools["f64"].max2(x3).schema == "f64[B, 3, ~H[1::2], ~W[1::2]]"
    assert pools["f64"].up2(x3).schema == "f64[B, 3, ~H[*2], ~W[*2]]"
    assert pools["f64"].patches2(x3).schema == "f64[B, ~(H[1::2]*W[1::2]), 12]"


NAMES = """
fn down(x: f32[B, 4, ~H, ~W], w: f32[4, 4, 2, 2]) -> f32[B, 4, ~H[1::2], ~W[1::2]] {
    return conv2d(x, w, stride=2) + max_pool2d(x, 2)    # equal derivations: one axis
}
fn twice(x: f32[B, 4, ~H, ~W], w: f32[4, 4, 3, 3]) -> f32[B, 4, ~H[::4], ~W[::2][::2]] {
    return conv2d(conv2d(x, w, stride=2, padding=1), w, stride=2, padding=1)
}
fn up(x: f32[B, 4, ~H, ~W]) -> f32[B, 4, ~H[+1][::2][*4], ~W[+1][::2][*2][*2]] {
    return upsample2d(avg_pool2d(x, 2, padding=1), scale=4)
}
fn grow(x: f32[B, 4, ~H, ~W], w: f32[4, 4, 1, 1]) -> f32[B, 4, ~H[+4][::2], ~W[+2][+2][::2]] {
    return conv2d(conv2d(x, w, padding=1), w, stride=2, padding=1)
}
fn gpool(x: f32[B, 4, ~H, ~W]) -> f32[B, 4] { return mean(x, axis=(2, 3)) }
fn gmax(x: f32[B, 4, ~H, ~W]) -> f32[B, 4] { return max(x, axis=(-1, -2)) }
"""


def test_equal_derivations_are_one_axis_and_users_spell_them():
    m = rag.compile(NAMES, "names.rag")
    rng = np.random.default_rng(2)
    xs = images(rng, 4, [(5, 6), (8, 3), (1, 2)], np.float32)
    y = m.down(batch(xs), np.ones((4, 4, 2, 2), np.float32))
    assert y.schema == "f32[B, 4, ~H[1::2], ~W[1::2]]"
    assert [t.shape for t in y.to_list()] == [(4, 2, 3), (4, 4, 1), (4, 0, 1)]
    assert m.twice(batch(xs), np.ones((4, 4, 3, 3), np.float32)).lengths(2) == [2, 2, 1]
    assert m.up(batch(xs)).lengths(3) == [16, 8, 8]
    assert m.grow(batch(xs), np.ones((4, 4, 1, 1), np.float32)).lengths(2) == [5, 6, 3]
    np.testing.assert_allclose(m.gpool(batch(xs)), [x.mean(axis=(1, 2)) for x in xs], rtol=1e-5)
    np.testing.assert_array_equal(m.gmax(batch(xs)), [x.max(axis=(1, 2)) for x in xs])


def test_unequal_derivations_do_not_combine():
    src = """
fn bad(x: f32[B, 4, ~H, ~W], w: f32[4, 4, 3, 3]) -> f32[B, 4, ~H2, ~W2] {
    return conv2d(x, w, stride=2, padding=1) + max_pool2d(x, 2)
}
"""
    with pytest.raises(rag.Error, match=r"~H\[::2\].*~H\[1::2\]|~H\[1::2\].*~H\[::2\]"):
        rag.compile(src, "bad.rag")


@pytest.mark.parametrize("src, message", [
    ("fn f(x: f32[B, 4, ~H, ~W], w: f32[4, 3, 3, 3]) -> f32[B, 4, ~H, ~W] "
     "{ return conv2d(x, w, padding=1) }", "needs Cin/groups = 4"),
    ("fn f(x: f32[B, 4, ~H, ~W], w: f32[4, 4, 3, 3]) -> f32[B, 4, ~H2, ~W2] "
     "{ return conv2d(x, w, stride=2, padding=\"same\") }", "needs stride 1"),
    ("fn f(x: f32[B, 4, ~H, ~W], w: f32[4, 4, 3, 3]) -> f32[B, 4, ~H2, ~W2] "
     "{ return conv2d(x, w, padding=\"full\") }", "padding must be an integer"),
    ("fn f(x: f32[B, ~H, 4]) -> f32[B, ~H, 4] { return max_pool2d(x, 2) }",
     "must be an image batch"),
    ("fn f(x: f32[B, 4, ~H, ~W]) -> f32[B, 4, ~H2, ~W2] { return max_pool2d(x, 2, padding=2) }",
     "at most half the kernel"),
    ("fn f(x: f32[B, 6, ~H, ~W], w: f32[4, 3, 3, 3]) -> f32[B, 4, ~H, ~W] "
     "{ return conv2d(x, w, padding=1, groups=4) }", "must divide"),
])
def test_image_type_errors_name_the_problem(src, message):
    with pytest.raises(rag.Error, match=message) as e:
        rag.compile(src, "err.rag")
    assert "err.rag:1:" in str(e.value)


IMAGE_OPS = {"conv2d", "conv2d_input_grad", "conv2d_weight_grad", "conv2d_bias_grad",
             "max_pool2d", "max_pool2d_grad", "avg_pool2d", "avg_pool2d_grad", "upsample2d",
             "upsample2d_grad", "patches", "patches_grad"}


def test_every_image_step_runs_compiled(convs, pools):
    """No image op of any configuration runs its reference kernel (ones_like, the loss's seed,
    is an allowed reference step: tests/python/test_plan_exceptions.py)."""
    rng = np.random.default_rng(4)
    for name in CONVS:
        xs, w, b = conv_inputs(name, rng)
        f32 = lambda a: None if a is None else a.astype(np.float32)  # noqa: E731
        args = call_args(batch([f32(x) for x in xs]), f32(w), f32(b))
        for fn in [name] + [f"d{p}_{name}" for p in ("x", "w", "b")[:len(args)]]:
            getattr(convs["f32"], fn)(*args)
            ref_steps = convs["f32"].stats()[fn]["steps"]["reference"]
            assert not set(ref_steps) & IMAGE_OPS, (fn, ref_steps)
    x = batch(images(rng, 3, SIZES, np.float32))
    for name in list(POOLS) + ["patches2", "patches3"]:
        for fn in (name, "dx_" + name):
            getattr(pools["f32"], fn)(x)
            ref_steps = pools["f32"].stats()[fn]["steps"]["reference"]
            assert not set(ref_steps) & IMAGE_OPS, (fn, ref_steps)


# Determinism: forward and every gradient, f32, images large enough for several blocks.
DET = """
params P {
    w1: f32[16, 8, 3, 3] = normal(0.1)
    b1: f32[16] = normal(0.1)
    w2: f32[16, 1, 3, 3] = normal(0.1)
    w3: f32[8, 16, 1, 1] = normal(0.1)
}
fn loss(x: f32[B, 8, ~H, ~W], p: P) -> f32[] {
    let h = relu(conv2d(x, p.w1, bias=p.b1, stride=2, padding=1))
    let h = conv2d(h, p.w2, padding=1, groups=16)
    let h = upsample2d(max_pool2d(h, 3, stride=2, padding=1), scale=2)
    let h = conv2d(avg_pool2d(h, 2), p.w3)
    return mean(h * h) + mean(patches(h, 2))
}
fn g(x: f32[B, 8, ~H, ~W], p: P) -> P { return grad(loss, wrt=p)(x, p) }
fn gx(x: f32[B, 8, ~H, ~W], p: P) -> f32[B, 8, ~H, ~W] { return grad(loss, wrt=x)(x, p) }
"""


def det_child():
    """f32 and f64: the f64 sums show a thread-dependent order that f32's double accumulation
    would round away."""
    out = {}
    for dt, npdt in (("f32", np.float32), ("f64", np.float64)):
        m = rag.compile(DET.replace("f32", dt), f"det_{dt}.rag")
        rng = np.random.default_rng(11)
        sizes = [(61, 40), (17, 90), (33, 33), (80, 57), (9, 12)]
        x = batch([rng.standard_normal((8, h, w)).astype(npdt) for h, w in sizes])
        p = m.init("P", seed=3)
        out[dt + ".loss"] = hashlib.sha256(np.asarray(m.loss(x, p)).tobytes()).hexdigest()
        for k, v in m.g(x, p).to_dict().items():
            out[dt + "." + k] = hashlib.sha256(np.ascontiguousarray(v).tobytes()).hexdigest()
        out[dt + ".gx"] = hashlib.sha256(
            b"".join(np.ascontiguousarray(a).tobytes() for a in m.gx(x, p).to_list())).hexdigest()
    print(json.dumps(out))


def test_bitwise_deterministic_across_thread_counts():
    runs = []
    for threads in ("1", "2", "3"):
        env = dict(os.environ, RAG_NUM_THREADS=threads)
        r = subprocess.run([sys.executable, __file__, "--det-child"], env=env, cwd=ROOT,
                           capture_output=True, text=True, check=True)
        runs.append(json.loads(r.stdout.strip().splitlines()[-1]))
    assert runs[0] == runs[1] == runs[2]


if __name__ == "__main__" and "--det-child" in sys.argv:
    sys.path.insert(0, str(pathlib.Path(__file__).parent))
    import conftest  # noqa: F401  (finds the build's bindings)
    det_child()
