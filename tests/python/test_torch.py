"""rag.torch, the PyTorch bridge: gradients through torch.autograd equal torch's own on the
same math, parameters carry rag's dotted names, and values cross without copies.

Needs torch, which is not a test dependency: `./dev test` skips this file when torch is not
importable (the summary names the reason); `./dev test-torch` runs it in the bench venv."""
import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (./dev test-torch runs these)")
import rag  # noqa: E402
import rag.torch as rt  # noqa: E402

SRC = """
params Layer {
    w: f32[4, 4] = normal(0.4)
    b: f32[4] = uniform(-0.1, 0.1)
}
params Model {
    layers: Layer[2]
    head: f32[4, 2] = normal(0.5)
}
fn layer(x: f32[B, ~N, 4], l: Layer) -> f32[B, ~N, 4] {
    return tanh(x @ l.w + l.b) + x
}
fn encode(x: f32[B, ~N, 4], p: Model) -> f32[B, ~N, 2] {
    let h = x
    for l in p.layers {
        h = layer(h, l)
    }
    return h @ p.head
}
fn loss(x: f32[B, ~N, 4], labels: i64[B, ~N], p: Model) -> f32[] {
    return cross_entropy(encode(x, p), labels)
}
"""

LENGTHS = [3, 6, 1]


def reference_loss(values, labels, params):
    """The same model in torch, on the packed rows (each row is independent but for the mean)."""
    h = values
    for k in range(2):
        h = torch.tanh(h @ params["layers.%d.w" % k] + params["layers.%d.b" % k]) + h
    return torch.nn.functional.cross_entropy(h @ params["head"], labels)


@pytest.fixture(scope="module")
def m():
    return rag.compile(SRC)


def batch(seed):
    g = torch.Generator().manual_seed(seed)
    values = torch.randn(sum(LENGTHS), 4, generator=g)
    labels = torch.randint(0, 2, (sum(LENGTHS),), generator=g)
    return values, labels


def test_parameters_have_rags_dotted_names_and_values(m):
    model = rt.Module(m, "loss", params="Model", seed=3)
    rag_order = ["layers.0.w", "layers.0.b", "layers.1.w", "layers.1.b", "head"]
    assert list(model.params()) == rag_order
    assert sorted(n for n, _ in model.named_parameters()) == sorted(rag_order)
    assert sorted(model.state_dict()) == sorted(rag_order)
    want = m.init("Model", 3)
    for n, p in model.named_parameters():
        assert np.array_equal(p.detach().numpy(), np.asarray(want[n]))
    clone = rt.Module(m, "loss", params="Model", seed=9)
    clone.load_state_dict(model.state_dict())
    assert all(torch.equal(a, b) for a, b in zip(clone.parameters(), model.parameters()))


def test_gradients_equal_torch_autograd_on_the_same_math(m):
    model = rt.Module(m, "loss", params="Model", seed=1)
    values, labels = batch(0)
    x = rt.Ragged(values.clone().requires_grad_(), LENGTHS)
    lab = rt.Ragged(labels, LENGTHS, "~N")
    loss = model(x, lab)
    loss.backward()

    ref_params = {n: p.detach().clone().requires_grad_() for n, p in model.named_parameters()}
    ref_values = values.clone().requires_grad_()
    ref = reference_loss(ref_values, labels, ref_params)
    ref.backward()
    assert loss.item() == pytest.approx(ref.item(), rel=1e-5)
    torch.testing.assert_close(x.values.grad, ref_values.grad, rtol=1e-4, atol=1e-6)
    for n, p in model.named_parameters():
        torch.testing.assert_close(p.grad, ref_params[n].grad, rtol=1e-4, atol=1e-6)


def test_adamw_steps_through_torch_optim_lower_the_loss(m):
    model = rt.Module(m, "loss", params="Model", seed=2)
    opt = torch.optim.AdamW(model.parameters(), lr=0.05)
    values, labels = batch(1)
    x, lab = rt.Ragged(values, LENGTHS), rt.Ragged(labels, LENGTHS, "~N")
    losses = []
    for _ in range(5):
        opt.zero_grad()
        loss = model(x, lab)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0]


def test_every_call_sees_the_parameters_as_they_are_now(m):
    # The bridge reuses its NumPy views of the parameters across calls; an in-place update
    # (an optimiser's) and a replaced tensor (`p.data = ...`, a new storage or shape) must
    # both reach rag on the next call.
    model = rt.Module(m, "loss", params="Model", seed=5)
    values, labels = batch(3)
    x, lab = rt.Ragged(values, LENGTHS), rt.Ragged(labels, LENGTHS, "~N")

    def check():
        want = reference_loss(values, labels, {n: p.detach() for n, p in model.named_parameters()})
        assert model(x, lab).item() == pytest.approx(want.item(), rel=1e-5)

    check()
    head = model.params()["head"]
    with torch.no_grad():
        head.mul_(-2.0)
    check()
    head.data = torch.randn(4, 2, generator=torch.Generator().manual_seed(7))
    check()
    w = model.params()["layers.1.w"]
    w.data = w.data.t().contiguous()  # same shape, new storage
    check()


def test_values_cross_without_copies(m):
    values, _ = batch(2)
    x = rt.Ragged(values, LENGTHS)
    r = x.to_rag()
    assert r.values.ctypes.data == values.data_ptr()  # torch -> rag: adopted
    f = rt.function(m, "encode")
    model = rt.Module(m, "encode", params="Model", seed=0)
    out = f(x, model.params())
    assert isinstance(out, rt.Ragged) and tuple(out.values.shape) == (sum(LENGTHS), 2)
    # rag -> torch: the result's values are the rag tensor's own memory.
    res = m.encode(r, {k: v.detach().numpy() for k, v in model.params().items()})
    back = rt._to_torch(res)
    assert back.values.data_ptr() == res.values.ctypes.data


def test_unused_outputs_and_integer_arguments(m):
    f = rt.function(m, "encode")
    model = rt.Module(m, "encode", params="Model", seed=4)
    values, _ = batch(3)
    x = rt.Ragged(values.clone().requires_grad_(), LENGTHS)
    out = f(x, model.params())
    (out.values[:, 0].sum()).backward()  # a cotangent for only part of the output
    ref_values = values.clone().requires_grad_()
    params = {n: p.detach().clone() for n, p in model.named_parameters()}
    h = ref_values
    for k in range(2):
        h = torch.tanh(h @ params["layers.%d.w" % k] + params["layers.%d.b" % k]) + h
    (h @ params["head"])[:, 0].sum().backward()
    torch.testing.assert_close(x.values.grad, ref_values.grad, rtol=1e-4, atol=1e-6)


def test_a_calls_saved_state_goes_with_its_graph(m):
    # No reference cycle through the autograd node: a cycle keeps rag's saved buffers until
    # Python's collector runs, so every call allocates fresh memory (it cost +0.9 ms on a
    # 1 ms training step). gc.collect() counts what only the collector could free.
    import gc
    model = rt.Module(m, "loss", params="Model", seed=6)
    f = rt.function(m, "encode")
    values, labels = batch(4)
    x = rt.Ragged(values.clone().requires_grad_(), LENGTHS)
    lab = rt.Ragged(labels, LENGTHS, "~N")
    gc.collect()
    gc.disable()
    try:
        for _ in range(3):
            model(x, lab)  # forward only: the graph goes unused
            model(x, lab).backward()
            f(x, model.params()).values.sum().backward()  # a Ragged result
        assert gc.collect() == 0
    finally:
        gc.enable()


def test_ddp_on_two_gloo_ranks_equals_the_full_batch_step(root, tmp_path):
    """examples/python/ddp.py: after one step on 2 ranks with unequal token counts, the
    parameters equal a single-process full-batch step within f32 rounding."""
    import os
    import subprocess
    import sys

    sys.path.insert(0, str(root / "examples/python"))
    import ddp

    lengths, _, _ = ddp.make_batch(1000)
    shards = ddp.balanced_shards(lengths, 2)
    tokens = [sum(lengths[b] for b in s) for s in shards]
    assert sorted(b for s in shards for b in s) == list(range(len(lengths)))
    assert tokens[0] != tokens[1]  # the case where averaging shard means would be wrong
    out = tmp_path / "ddp.pt"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    subprocess.run([sys.executable, str(root / "examples/python/ddp.py"), "--ranks", "2",
                    "--steps", "1", "--port", "29531", "--save", str(out)],
                   check=True, env=env, timeout=600)
    got = torch.load(out)
    want = ddp.single_process_step(steps=1)
    assert sorted(got) == sorted(want)
    start = rt.Module(ddp.load_module(), "scaled_loss", params="Encoder", seed=0).state_dict()
    assert sum(not torch.equal(want[k], start[k]) for k in want) > len(want) // 2  # it moved
    for k in want:
        torch.testing.assert_close(got[k], want[k], rtol=1e-5, atol=1e-6)


def test_dlpack_versioned_capsules_with_torch():
    """torch asks for DLPack 1.x both ways: rag -> torch and torch -> rag share memory."""
    import ctypes

    name = ctypes.pythonapi.PyCapsule_GetName
    name.restype, name.argtypes = ctypes.c_char_p, [ctypes.py_object]
    got = []

    class Spy:
        def __init__(self, inner):
            self.inner = inner

        def __dlpack__(self, **kw):
            cap = self.inner.__dlpack__(**kw)
            got.append(name(cap).decode())
            return cap

        def __dlpack_device__(self):
            return self.inner.__dlpack_device__()

    values, _ = batch(5)
    r = rag.from_dlpack(Spy(values))
    assert got[-1] == "dltensor_versioned" and r.values.ctypes.data == values.data_ptr()
    t = rag.from_packed(values, LENGTHS, "~N, 4")
    back = torch.from_dlpack(Spy(t))
    assert got[-1] == "dltensor_versioned" and back.data_ptr() == t.values.ctypes.data
    legacy = torch.from_dlpack(t.__dlpack__())  # a legacy capsule still imports
    assert legacy.data_ptr() == t.values.ctypes.data
    torch.testing.assert_close(back, values)


def test_torch_compile_traces_around_the_bridge_without_graph_breaks(m):
    """torch.compile(fullgraph=True) goes through torch.ops.rag.call (a custom op with a fake
    implementation and a registered backward): loss and gradients equal eager's bitwise (the
    same rag calls), for two batches with different lengths; the ragged result of `encode`
    comes back as a Ragged with its lengths; nothing is left in the saved-residual table."""
    model = rt.Module(m, "loss", params="Model", seed=1)
    compiled = torch.compile(model, backend="aot_eager", fullgraph=True)

    def step(module, values, labels, lengths):
        for p in model.parameters():
            p.grad = None
        x = rt.Ragged(values.clone().requires_grad_(), lengths)
        loss = module(x, rt.Ragged(labels, lengths, "~N"))
        loss.backward()
        return loss.detach(), x.values.grad, {n: p.grad.clone() for n, p in model.named_parameters()}

    for seed, lengths in ((0, LENGTHS), (1, [5, 2, 7, 4])):
        g = torch.Generator().manual_seed(seed)
        values = torch.randn(sum(lengths), 4, generator=g)
        labels = torch.randint(0, 2, (sum(lengths),), generator=g)
        want = step(model, values, labels, torch.tensor(lengths))
        got = step(compiled, values, labels, torch.tensor(lengths))
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
        for n in want[2]:
            assert torch.equal(got[2][n], want[2][n]), n
    assert not rt._SAVED
    enc = rt.Module(m, "encode", params="Model", seed=1)
    x = rt.Ragged(torch.randn(10, 4), torch.tensor(LENGTHS))
    out = torch.compile(enc, backend="aot_eager", fullgraph=True)(x)
    assert isinstance(out, rt.Ragged) and tuple(out.values.shape) == (10, 2)
    assert torch.equal(out.lengths, x.lengths) and torch.equal(out.values, enc(x).values)


def test_the_custom_op_passes_torch_library_opcheck(m):
    """torch.library.opcheck: schema, fake implementation against the real one, autograd
    registration. Its AOT-dispatch check compares two runs' outputs, and the last output is the
    id of the call's saved residuals, new each call: the compile test above covers AOT."""
    model = rt.Module(m, "loss", params="Model", seed=1)
    fn_id = next(k for k, (f, _) in rt._FUNCTIONS.items() if f is model._call.rag_fn)
    values, labels = batch(0)
    lengths = torch.tensor(LENGTHS)
    key = rt._key(fn_id, [("ragged", "~N, 4"), ("ragged", "~N"),
                          ("params", list(model.params()))])
    tensors = [values.requires_grad_(), labels] + [p.detach().requires_grad_()
                                                   for p in model.params().values()]
    torch.library.opcheck(torch.ops.rag.call, (key, tensors + [lengths, lengths]),
                          test_utils=("test_schema", "test_autograd_registration",
                                      "test_faketensor"))
    enc = rt.Module(m, "encode", params="Model", seed=1)
    fn_id = next(k for k, (f, _) in rt._FUNCTIONS.items() if f is enc._call.rag_fn)
    key = rt._key(fn_id, [("ragged", "~N, 4"), ("params", list(enc.params()))])
    tensors = [values] + [p.detach().requires_grad_() for p in enc.params().values()]
    torch.library.opcheck(torch.ops.rag.call, (key, tensors + [lengths]),
                          test_utils=("test_schema", "test_autograd_registration",
                                      "test_faketensor"))
    rt._SAVED.clear()  # opcheck's forward-only runs leave theirs


def test_gradients_go_only_where_torch_wants_them(m):
    """Inputs that do not require grad (a frozen field, a batch's values) get none, and every
    other field still gets its own: the bridge converts only the gradients torch asked for,
    field by field, and must keep each in its place."""
    model = rt.Module(m, "loss", params="Model", seed=7)
    frozen = {"layers.0.b", "layers.1.w"}
    for n, p in model.named_parameters():
        p.requires_grad_(n not in frozen)
    values, labels = batch(6)
    x = rt.Ragged(values, LENGTHS)  # no grad wanted for the values
    model(x, rt.Ragged(labels, LENGTHS, "~N")).backward()

    ref_params = {n: p.detach().clone().requires_grad_(n not in frozen)
                  for n, p in model.named_parameters()}
    reference_loss(values, labels, ref_params).backward()
    assert x.values.grad is None
    for n, p in model.named_parameters():
        if n in frozen:
            assert p.grad is None, n
        else:
            torch.testing.assert_close(p.grad, ref_params[n].grad, rtol=1e-4, atol=1e-6)


def test_a_params_dict_in_any_order_gets_each_field_its_own_gradient(m):
    """rag.torch.function with a params dict whose keys are not in rag's order: each tensor's
    gradient is its own field's (the bridge reorders rag's gradients by name)."""
    f = rt.function(m, "loss")
    init = m.init("Model", 8)
    params = {n: torch.tensor(np.asarray(init[n])).requires_grad_()
              for n in reversed(list(init.keys()))}
    values, labels = batch(7)
    f(rt.Ragged(values, LENGTHS), rt.Ragged(labels, LENGTHS, "~N"), params).backward()
    ref = {n: p.detach().clone().requires_grad_() for n, p in params.items()}
    reference_loss(values, labels, ref).backward()
    for n, p in params.items():
        torch.testing.assert_close(p.grad, ref[n].grad, rtol=1e-4, atol=1e-6)
