"""Modules: calling functions, params as dicts, errors as exceptions, the GIL, the cache."""
import threading
import time

import numpy as np
import pytest
import rag

from conftest import singles

SMALL = """
params Lin {
    w: f32[4, 2] = normal(0.5)
    b: f32[2] = ones
}
fn apply(x: f32[B, ~N, 4], p: Lin) -> f32[B, ~N, 2] { return x @ p.w + p.b }
fn add(a: f32[B, ~N, 4], b: f32[B, ~N, 4]) -> f32[B, ~N, 4] { return a + b }
fn both(x: f32[B, ~N, 4], p: Lin) -> (f32[B, ~N, 2], f32[]) {
    let h = x @ p.w
    return (h, mean(h))
}
fn per_sample(x: f32[B, ~N, 4]) -> f32[B] { return sum(sum(x, axis=2), axis=1) }
fn pairs(x: f32[B, ~N, ~N, 4]) -> f32[B, ~N, 4] { return mean(x, axis=2) }
fn scale[T](x: T[B, ~N, C], s: T[]) -> T[B, ~N, C] { return x * s }
fn dense(w: f32[4, 2], v: f32[2]) -> f32[4, 2] { return w * v }
"""


@pytest.fixture()
def small():
    return rag.compile(SMALL, "small.rag")


def test_functions_are_attributes(small):
    assert small.functions() == ["apply", "add", "both", "per_sample", "pairs", "scale", "dense"]
    assert "apply" in small and "nope" not in small
    assert "apply" in dir(small)
    assert small.apply.signature == "apply(x: f32[B, ~N, 4], p: Lin) -> f32[B, ~N, 2]"
    assert small["apply"].name == "apply"
    with pytest.raises(AttributeError):
        small.nope
    with pytest.raises(KeyError):
        small["nope"]


def test_tuple_results_and_dense_results(small, rng):
    x = rag.ragged(singles(rng, (2, 3), width=4))
    p = small.init("Lin", seed=3)
    out = small.both(x, p)
    assert isinstance(out, tuple) and len(out) == 2
    h, m = out
    assert isinstance(h, rag.Tensor) and h.schema == "f32[B, ~N, 2]"
    assert isinstance(m, np.ndarray) and m.shape == () and m.dtype == np.float32
    np.testing.assert_allclose(m, np.concatenate(h.to_list()).mean(), rtol=1e-6)
    s = small.per_sample(x)  # batched without ragged axes: stays a rag.Tensor
    assert isinstance(s, rag.Tensor) and s.schema == "f32[B]"
    np.testing.assert_allclose(s.numpy(), [a.sum() for a in x.to_list()], rtol=1e-5)
    w = small.dense(p["w"], np.array([2, 3], np.float32))
    assert isinstance(w, np.ndarray) and w.shape == (4, 2)
    np.testing.assert_allclose(w, p["w"] * [2, 3], rtol=1e-6)


def test_keyword_arguments_and_lists(small, rng):
    xs = singles(rng, (2, 3), width=4)
    p = small.init("Lin")
    a = small.apply(rag.ragged(xs), p)
    b = small.apply(p=p, x=rag.ragged(xs))
    c = small.apply(xs, p)  # a list of per-sample arrays binds to the declared ragged type
    for u, v, w in zip(a.to_list(), b.to_list(), c.to_list()):
        np.testing.assert_array_equal(u, v)
        np.testing.assert_array_equal(u, w)
    with pytest.raises(TypeError, match="missing argument 'p'"):
        small.apply(xs)
    with pytest.raises(TypeError, match="unexpected keyword"):
        small.apply(xs, p, q=1)
    with pytest.raises(TypeError, match="takes 2 arguments"):
        small.apply(xs, p, p)


def test_params_behave_like_a_dict(small):
    p = small.init("Lin", seed=7)
    assert isinstance(p, rag.Params) and p.name == "Lin"
    assert list(p) == ["w", "b"] and len(p) == 2 and "w" in p
    assert p["w"].shape == (4, 2) and p["w"].dtype == np.float32
    np.testing.assert_array_equal(p["b"], np.ones(2, np.float32))
    np.testing.assert_array_equal(p.w, p["w"])
    assert set(dict(p)) == {"w", "b"}
    from collections.abc import Mapping

    assert isinstance(p, Mapping)
    # deterministic for a seed
    np.testing.assert_array_equal(small.init("Lin", seed=7)["w"], p["w"])
    assert not np.array_equal(small.init("Lin", seed=8)["w"], p["w"])
    # views write through; assignment converts to the field's dtype and checks its shape
    p["b"][0] = 5
    assert p["b"][0] == 5
    p["b"] = [1.0, 2.0]
    np.testing.assert_array_equal(p["b"], [1, 2])
    with pytest.raises(rag.Error, match="expected f32\\[2\\]"):
        p["b"] = np.zeros(3)
    with pytest.raises(KeyError):
        p["nope"] = 1
    q = p.copy()
    q["b"][0] = -1
    assert p["b"][0] == 1


def test_dict_params_are_converted_by_the_declared_type(small, rng):
    xs = singles(rng, (2, 3), width=4)
    p = small.init("Lin", seed=1)
    want = small.apply(xs, p)
    d = {k: np.asarray(v, np.float64) for k, v in p.items()}  # float64: cast to the declared f32
    got = small.apply(xs, d)
    for a, b in zip(want.to_list(), got.to_list()):
        np.testing.assert_allclose(a, b, rtol=1e-6)
    with pytest.raises(rag.Error, match="missing field 'b'"):
        small.apply(xs, {"w": d["w"]})
    with pytest.raises(rag.Error, match="has no field 'c'"):
        small.apply(xs, dict(d, c=np.zeros(2)))
    with pytest.raises(rag.Error, match=r"p\.w: expected f32\[4, 2\]"):
        small.apply(xs, dict(d, w=np.zeros((2, 4))))
    with pytest.raises(rag.Error, match="argument p"):
        small.apply(xs, {"w": np.zeros((4, 2), np.int64), "b": np.zeros(2, np.complex64)})


def test_pair_module_accepts_dict_params(pair_module, pair_params, rng):
    x = rag.ragged(singles(rng, (3, 4)))
    y1, _ = pair_module.block(x, pair_params)
    y2, _ = pair_module.block(x, pair_params.to_dict())
    for a, b in zip(y1.to_list(), y2.to_list()):
        np.testing.assert_array_equal(a, b)


def test_generic_functions_bind_scalars_to_the_tensor_dtype(small):
    for dtype in ("f16", "bf16", "f32", "f64"):
        x = rag.ragged([np.ones((2, 3)), np.ones((1, 3))], dtype=dtype)
        y = small.scale(x, 2.5)
        assert y.dtype == dtype
        np.testing.assert_array_equal(y.to_list()[1], np.full((1, 3), 2.5))
    assert small.stats()["scale"]["compilations"] == 4


def test_compile_error_has_location_and_caret():
    src = "fn f(x: f32[]) -> f32[] {\n    return y + 1.0\n}\n"
    with pytest.raises(rag.CompileError) as e:
        rag.compile(src, "bad.rag")
    msg = str(e.value)
    assert "bad.rag:2:12" in msg
    assert "return y + 1.0" in msg
    caret = msg.splitlines()[2]
    assert caret.strip() == "^" and caret.index("^") == msg.splitlines()[1].index("y")
    assert isinstance(e.value, rag.Error)
    # the process survives and keeps working
    assert rag.compile("fn g(x: f32[]) -> f32[] { return x }").g(np.float32(3)) == 3


def test_load_errors(tmp_path):
    bad = tmp_path / "bad.rag"
    bad.write_text("fn f(x: f32[B, ~N, 4]) -> f32[B, ~N, 4] {\n  return x @@ x\n}\n")
    with pytest.raises(rag.CompileError, match=r"bad\.rag:2:\d+"):
        rag.load(bad)
    with pytest.raises(rag.Error, match="no file"):
        rag.load(tmp_path / "missing.rag")


def test_shape_mismatch_names_the_sample(small, rng):
    a = rag.ragged(singles(rng, (2, 3, 4), width=4))
    b = rag.ragged(singles(rng, (2, 5, 4), width=4))
    with pytest.raises(rag.Error, match="sample 1") as e:
        small.add(a, b)
    assert "N = 5" in str(e.value) or "N = 3" in str(e.value)
    with pytest.raises(rag.Error, match="sample 1"):
        small.pairs(rag.ragged([np.zeros((2, 2, 4)), np.zeros((3, 4, 4))]))
    with pytest.raises(rag.Error, match="batch of 2 samples"):
        small.add(a, rag.ragged(singles(rng, (2, 3), width=4)))
    # wrong static extent: a type error at the call, the process survives
    with pytest.raises(rag.Error, match="expected f32\\[B, ~N, 4\\]"):
        small.add(rag.ragged(singles(rng, (2, 3), width=5)), a)
    np.testing.assert_array_equal(small.add(a, a).to_list()[1], 2 * a.to_list()[1])


def test_derived_ragged_names_are_checked_at_the_call():
    # y's ~N[1:] must have one fewer row than x's ~N in every sample; the call says which
    # argument, sample and lengths disagree (before, the result took y's lengths unchecked)
    m = rag.compile("fn g(x: f32[B, ~N], y: f32[B, ~N[1:]]) -> f32[B, ~N[1:]] "
                    "{ return y * 2.0 }")
    x = rag.ragged([np.zeros(3, np.float32), np.zeros(5, np.float32)])
    good = rag.ragged([np.ones(2, np.float32), np.ones(4, np.float32)])
    assert m.g(x, good).lengths(1) == [2, 4]
    bad = rag.ragged([np.ones(2, np.float32), np.ones(7, np.float32)])
    with pytest.raises(rag.Error, match=r"y: sample 1 has N\[1:\] = 7 but argument x has "
                                        r"N = 5, so N\[1:\] = 4"):
        m.g(x, bad)


def test_ragged_argument_needs_a_batch(small):
    with pytest.raises(rag.Error, match="pass rag.ragged"):
        small.apply(np.zeros((3, 4), np.float32), small.init("Lin"))


def test_square_pairs_bind_by_declaration(small):
    # inferred axes are [~N, ~M] (or static when equal); the declaration makes them ~N, ~N
    xs = [np.ones((2, 2, 4), np.float32), np.ones((3, 3, 4), np.float32)]
    assert small.pairs(rag.ragged(xs)).lengths(1) == [2, 3]
    assert small.pairs(rag.ragged(xs[:1] * 2)).lengths(1) == [2, 2]
    assert small.stats()["pairs"]["compilations"] == 1


def test_no_recompilation_when_only_lengths_change(small, rng):
    p = small.init("Lin")
    for lengths in [(1, 2), (7,), (3, 3, 3), (0, 5), (9, 1, 4, 2)]:
        small.apply(rag.ragged(singles(rng, lengths, width=4)), p)
    st = small.stats()["apply"]
    assert st["compilations"] == 1 and st["cache_hits"] == 4
    small.apply(rag.ragged(singles(rng, (2, 3), width=4)), p.to_dict())
    assert small.stats()["apply"]["compilations"] == 1


def test_ir(small):
    text = small.apply.ir()
    assert "matmul" in text or "@" in text
    assert small.ir("apply") == text


def test_calls_from_two_threads(pair_module, pair_params, rng):
    batches = [rag.ragged(singles(rng, lengths)) for lengths in [(3, 5), (4, 2, 6), (7,), (1, 8)]]
    want = [pair_module.block(x, pair_params)[0].to_list() for x in batches]
    got = [None] * len(batches)
    errors = []

    def work(k):
        try:
            got[k] = pair_module.block(batches[k], pair_params)[0].to_list()
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(len(batches))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    for w, g in zip(want, got):
        for a, b in zip(w, g):
            np.testing.assert_array_equal(a, b)


def test_gil_is_released_during_calls(example_path, pair_params, rng):
    # The reference interpreter keeps the call long enough to measure whatever the JIT does.
    pair_module = rag.load(example_path, tier="interpreter")
    x = rag.ragged(singles(rng, (50, 70, 60)))
    pair_module.block(x, pair_params)  # compile first
    ticks = [0]
    stop = threading.Event()

    def ticker():
        while not stop.is_set():
            ticks[0] += 1

    th = threading.Thread(target=ticker)
    th.start()
    try:
        t0, n0 = time.perf_counter(), ticks[0]
        time.sleep(0.1)  # the ticker's rate while this thread waits without the GIL
        rate = (ticks[0] - n0) / (time.perf_counter() - t0)
        t0, n0 = time.perf_counter(), ticks[0]
        pair_module.block(x, pair_params)
        during, seconds = ticks[0] - n0, time.perf_counter() - t0
    finally:
        stop.set()
        th.join()
    # Holding the GIL would let the ticker run for at most a switch interval or two (5 ms each).
    assert seconds > 0.05, "the call is too short to tell"
    assert during > 0.2 * rate * seconds, (during, rate, seconds)


def test_tiers_agree(example_path, pair_params, rng):
    jit = rag.load(example_path)
    ref = rag.load(example_path, tier="interpreter")
    assert jit.tier == "jit" and ref.tier == "interpreter"
    x = rag.ragged(singles(rng, (3, 6, 1)))
    for a, b in zip(jit.block(x, pair_params), ref.block(x, pair_params)):
        for u, v in zip(a.to_list(), b.to_list()):
            np.testing.assert_allclose(u, v, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(jit.loss(x, pair_params), ref.loss(x, pair_params), rtol=1e-5)
    # Gradients directly (a parameter after an SGD step would hide a wrong gradient), each
    # relative to its own size.
    g1, g2 = jit.gradient(x, pair_params), ref.gradient(x, pair_params)
    for k in g2:
        w = np.asarray(g2[k], np.float64)
        assert np.linalg.norm(w) > 0, k
        assert np.linalg.norm(np.asarray(g1[k], np.float64) - w) <= 1e-4 * np.linalg.norm(w), k
    ref.tier = "jit"
    assert ref.tier == "jit"
    with pytest.raises(rag.Error, match="unknown tier"):
        ref.tier = "gpu"
