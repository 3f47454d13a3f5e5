"""rag.torch: rag functions inside PyTorch's autograd (optional: needs torch, rag does not).

    import rag, rag.torch, torch
    m = rag.load("examples/encoder.rag")
    model = rag.torch.Module(m, "loss", params="Encoder", seed=0)
    x = rag.torch.Ragged(values, lengths)        # values: torch [sum N, 64], lengths: [B]
    loss = model(x, labels)                       # the params argument is the module's own
    loss.backward()                               # rag's generated backward, no recompute
    torch.optim.AdamW(model.parameters()).step()

Values cross without copies when they are contiguous (and aligned to their element size, as
every torch and NumPy allocation is): torch tensors reach rag as NumPy views (bf16 through
DLPack) and rag's results come back through DLPack. The backward is rag's own reverse pass (Function.call_saving
keeps what it reads), so a step runs the function once forward and once backward.
"""
import ast
import weakref

import numpy as np
import torch

import rag

__all__ = ["Ragged", "Module", "function"]


class Ragged:
    """A ragged batch for rag functions: packed `values` ([rows, static extents...], a torch
    tensor that may require grad) and one row of B `lengths` per ragged name (a list in order,
    a dict by name, or one row). `spec` gives the per-sample axes ("~N, 64", "~N, ~N, 128");
    by default one leading ragged axis ~N followed by the values' trailing extents."""

    def __init__(self, values, lengths, spec=None):
        self.values = values
        self.lengths = lengths
        self.spec = spec if spec is not None else ", ".join(
            ["~N"] + [str(e) for e in values.shape[1:]])

    def to_rag(self, values=None):
        v = (self.values if values is None else values).detach().contiguous()
        # A NumPy view is adopted like a DLPack tensor and costs less to make (bf16 has none).
        return rag.from_packed(v if v.dtype == torch.bfloat16 else v.numpy(), self.lengths,
                               self.spec)

    def __repr__(self):
        return "rag.torch.Ragged(%s, values %s)" % (self.spec, tuple(self.values.shape))


def _to_torch(x):
    """A rag result as torch: batched tensors as Ragged over their packed values, arrays and
    params as tensors (zero copy)."""
    if isinstance(x, rag.Tensor):
        return Ragged(torch.from_dlpack(x), x.packed()[1], x.schema)
    if isinstance(x, rag.Params):
        return {k: torch.from_numpy(np.asarray(v)) for k, v in x.items()}
    if isinstance(x, tuple):
        return tuple(_to_torch(e) for e in x)
    return torch.from_numpy(np.asarray(x))


def _leaves(x):
    """The torch tensors of a converted result, in rag's flat order."""
    if isinstance(x, Ragged):
        return [x.values]
    if isinstance(x, dict):
        return list(x.values())
    if isinstance(x, tuple):
        return [t for e in x for t in _leaves(e)]
    return [x]


def _rebuild(x, leaves):
    """x's structure with its tensors replaced by `leaves` (consumed in order)."""
    if isinstance(x, Ragged):
        return Ragged(leaves.pop(0), x.lengths, x.spec)
    if isinstance(x, dict):
        return {k: leaves.pop(0) for k in x}
    if isinstance(x, tuple):
        return tuple(_rebuild(e, leaves) for e in x)
    return leaves.pop(0)


class _Call(torch.autograd.Function):
    """One call of a rag function; backward through its generated vector-Jacobian product."""

    @staticmethod
    def forward(ctx, call, *tensors):
        args = call.rag_args(tensors)
        result, saved = call.fn.call_saving(*args)
        out = _to_torch(result)
        # ctx keeps the result's structure, not its tensors: those become the outputs, whose
        # grad_fn is this ctx, and a cycle would keep the saved state alive until Python's
        # garbage collector ran (each call's buffers then come from fresh pages: +0.9 ms on a
        # 1 ms call).
        ctx.saved, ctx.call, ctx.out = saved, call, _skeleton(out)
        call.last = out  # taken (and cleared) by the caller
        leaves = _leaves(out)
        integral = [t for t in leaves if not t.is_floating_point()]
        if integral:
            ctx.mark_non_differentiable(*integral)
        return tuple(leaves)

    @staticmethod
    def backward(ctx, *grads):
        per_arg = _saved_backward(ctx.saved, ctx.out, grads)
        return (None,) + tuple(ctx.call.torch_grads(per_arg, ctx.needs_input_grad[1:]))


class _Shape:
    """A result tensor's place in a skeleton: its shape, without its storage."""

    def __init__(self, t):
        self.shape = t.shape


def _skeleton(x):
    """A converted result with each tensor replaced by its _Shape: what backward needs of it."""
    return _rebuild(x, [_Shape(t) for t in _leaves(x)])


def _cotangent(e, g):
    """The cotangent rag takes for the output of skeleton `e` from torch gradients `g`."""
    if all(t is None for t in g):
        return None
    if isinstance(e, Ragged):
        return rag.from_packed(g[0].contiguous(), e.lengths, e.spec)
    if isinstance(e, dict):
        return {k: (np.zeros(tuple(v.shape), np.float32) if t is None else t.contiguous().numpy())
                for (k, v), t in zip(e.items(), g)}
    return g[0].contiguous().numpy()


class _Binding:
    """How the user's arguments of one call become flat torch tensors and back."""

    def __init__(self, fn, args):
        self.fn = fn
        self.kinds = []  # per argument: ("ragged", Ragged) | ("params", keys) | ("tensor",) | ("other", value)
        self.tensors = []
        for a in args:
            if isinstance(a, Ragged):
                self.kinds.append(("ragged", a))
                self.tensors.append(a.values)
            elif isinstance(a, dict):
                self.kinds.append(("params", list(a.keys())))
                self.tensors.extend(a.values())
            elif isinstance(a, torch.Tensor):
                self.kinds.append(("tensor",))
                self.tensors.append(a)
            else:
                self.kinds.append(("other", a))

    def rag_args(self, tensors):
        tensors, args = list(tensors), []
        for kind in self.kinds:
            if kind[0] == "ragged":
                args.append(kind[1].to_rag(tensors.pop(0)))
            elif kind[0] == "params":
                args.append({k: _field_view(tensors.pop(0)) for k in kind[1]})
            elif kind[0] == "tensor":
                args.append(_dense(tensors.pop(0)))
            else:
                args.append(kind[1])
        return args

    def torch_grads(self, per_arg, needed):
        return _torch_grads(self.kinds, per_arg, needed)


def _torch_grads(kinds, per_arg, needed=None):
    """rag's per-argument gradients as one entry per flat torch tensor (None where rag has
    none). `needed` (ctx.needs_input_grad), when given, says which tensors torch wants a
    gradient for: the others get None unconverted (a batch's values seldom require grad, and
    their gradient would cross through DLPack only to be dropped)."""
    out = []
    for kind, g in zip(kinds, per_arg):
        if kind[0] == "other":
            continue
        n = len(kind[1]) if kind[0] == "params" else 1
        wanted = [True] * n if needed is None else needed[len(out):len(out) + n]
        if g is None or not any(wanted):
            out.extend([None] * n)
        elif kind[0] == "params":
            out.extend(None if not w else torch.from_numpy(a)
                       for w, a in zip(wanted, _in_order(g, kind[1])))
        elif kind[0] == "ragged":
            out.append(torch.from_dlpack(g))
        else:
            out.append(torch.from_numpy(np.asarray(g)))
    return out


def _in_order(g, keys):
    """The arrays of rag.Params `g` in the order of `keys`: its own order when they agree (a
    Module's fields always do), without a lookup per field."""
    if g.keys() == keys:
        return g.values()
    by_name = dict(zip(g.keys(), g.values()))
    return [by_name[k] for k in keys]


def _saved_backward(saved, out, grads):
    """saved.backward on torch cotangents `grads` (one per leaf of `out`, None for none)."""
    elems = out if isinstance(out, tuple) else (out,)
    grads, cts = list(grads), []
    for e in elems:
        n = len(_leaves(e))
        g, grads = grads[:n], grads[n:]
        cts.append(_cotangent(e, g))
    return saved.backward(tuple(cts) if isinstance(out, tuple) else cts[0])


# Parameters' NumPy views, reused from call to call: a params group is passed on every call, an
# optimiser updates it in place, and a view costs ~10 us a field to make (detach, numpy) against
# ~1 us to check. A view is valid while the tensor's storage, shape and dtype are the same
# (`p.data = ...` changes the pointer); it keeps that storage alive, so a new tensor cannot
# take its address meanwhile.
_VIEWS = {}  # id(tensor) -> (weak reference, data_ptr, shape, NumPy view)


def _field_view(t):
    """_dense(t), cached for contiguous tensors other than bf16 (params fields)."""
    if t.dtype == torch.bfloat16 or not t.is_contiguous():
        return _dense(t)
    key, ptr, shape = id(t), t.data_ptr(), t.shape
    hit = _VIEWS.get(key)
    if hit is not None and hit[0]() is t and hit[1] == ptr and hit[2] == shape:
        return hit[3]
    view = _dense(t)
    # Torch tensors compare elementwise, so they cannot key a WeakKeyDictionary: the entry
    # goes when the tensor does (and with it the view's hold on the storage).
    _VIEWS[key] = (weakref.ref(t, lambda _, key=key: _VIEWS.pop(key, None)), ptr, shape, view)
    return view


def _dense(t):
    """An unbatched torch tensor for a rag call, zero copy when aligned: as a NumPy view, which
    rag adopts like a DLPack tensor at a tenth of the cost (~3 us against ~30 us a tensor, and
    a params group has one per field); bf16, which NumPy lacks, through DLPack."""
    t = t.detach().contiguous()
    return rag.from_dlpack(t) if t.dtype == torch.bfloat16 else t.numpy()


# ---- torch.compile: the bridge as a custom op -------------------------------------------------
#
# Under torch.compile a call goes through torch.ops.rag.call instead of _Call: an operator on
# flat tensors with a fake implementation (output shapes from the rag signature, rag never
# runs at trace time) and a registered backward, so Dynamo and AOTAutograd trace around it.
# What a custom op cannot carry travels beside it: the call's layout (which rag function,
# which argument is a Ragged with which spec, params keys, Python constants) is a string key
# into _LAYOUTS; lengths are int64 tensor inputs (torch tensors as lengths keep a new batch from
# recompiling; lists are baked into the graph); rag's saved residuals stay on the Python side
# under an id the forward returns as a tensor and the backward op consumes, so the compiled
# step runs the function once forward and once backward, as eager does.

_FUNCTIONS = {}  # id -> rag function, filled by function() (outside any compiled region)
_LAYOUTS = {}  # key -> _Layout, a cache: the key alone determines it (the fake runs on it)
_SAVED = {}  # id -> (rag.Saved, converted result) between a compiled forward and its backward
_next_id = [0]

_DTYPES = {"f16": torch.float16, "bf16": torch.bfloat16, "f32": torch.float32,
           "f64": torch.float64, "i32": torch.int32, "i64": torch.int64, "bool": torch.bool}


class _Signature:
    """A rag signature's argument and result types, parsed once, outside compiled code."""

    def __init__(self, sig):
        self.arg_types = [a.split(":", 1)[1].strip()
                          for a in _split_args(sig[sig.index("(") + 1:sig.index(")")])]
        out = sig[sig.index("->") + 2:].strip()
        self.tuple_result = out.startswith("(")
        self.out_types = [t.strip() for t in _split_args(out[1:-1])] if self.tuple_result else [out]


class _Layout:
    """One call's structure without its tensors: the rag function, per argument its kind, and
    the signature's types for the fake implementation."""

    def __init__(self, key):
        fn_id, *parts = key.split(_SEP)
        self.fn, self.sig = _FUNCTIONS[int(fn_id)]
        # per argument: ("ragged", spec) | ("params", keys) | ("tensor",) | ("other", value)
        self.kinds = [_KIND_OF[p[0]](p[1:]) for p in parts]
        self.arg_types, self.out_types = self.sig.arg_types, self.sig.out_types

    def split(self, tensors):
        """The op's flat inputs as (argument tensors, lengths tensors, one per ragged argument)."""
        n_lengths = sum(k[0] == "ragged" for k in self.kinds)
        return tensors[:len(tensors) - n_lengths], tensors[len(tensors) - n_lengths:]

    def rag_args(self, tensors):
        tensors, lengths = self.split(list(tensors))
        args = []
        for kind in self.kinds:
            if kind[0] == "ragged":
                v = tensors.pop(0).detach().contiguous()
                args.append(rag.from_packed(v, lengths.pop(0).tolist(), kind[1]))
            elif kind[0] == "params":
                args.append({k: _dense(tensors.pop(0)) for k in kind[1]})
            elif kind[0] == "tensor":
                args.append(_dense(tensors.pop(0)))
            else:
                args.append(kind[1])
        return args

    def fake_outputs(self, tensors):
        """Empty tensors shaped like the results, from the signature: a batched result takes
        its rows from the argument with the same ragged axes, a named extent from an argument
        that declares it; what no argument determines is a data-dependent size."""
        tensors, _ = self.split(list(tensors))
        dims = {}  # symbol -> size; ("rows", ragged names) -> rows
        for kind, ty in zip(self.kinds, self.arg_types):
            if kind[0] == "other":
                continue
            if kind[0] == "params":
                del tensors[:len(kind[1])]
                continue
            t = tensors.pop(0)
            batched, ragged, static = _parse_type(ty)
            if batched:
                dims.setdefault(("rows", tuple(ragged)), t.shape[0])
                sizes = t.shape[1:]
            else:
                sizes = t.shape
            for sym, size in zip(static, sizes):
                if not sym.lstrip("-").isdigit():
                    dims.setdefault(sym, size)
        outs = []
        for ty in self.out_types:
            if "[" not in ty:
                raise rag.Error("rag.torch under torch.compile: the result type %s (a params "
                                "group) is not supported; call it outside the compiled region"
                                % ty)
            batched, ragged, static = _parse_type(ty)
            shape = [dims[("rows", tuple(ragged))] if ("rows", tuple(ragged)) in dims
                     else torch.library.get_ctx().new_dynamic_size()] if batched else []
            for sym in static:
                if sym.isdigit():
                    shape.append(int(sym))
                else:
                    shape.append(dims[sym] if sym in dims
                                 else torch.library.get_ctx().new_dynamic_size())
            outs.append(torch.empty(shape, dtype=_DTYPES[ty[:ty.index("[")].strip()]))
        return outs


# The key: the function's id, then one field per argument, a letter and its detail. Built
# from string operations Dynamo folds to a constant (json is not traceable).
_SEP = "\x1f"
_KIND_OF = {"R": lambda d: ("ragged", d), "P": lambda d: ("params", d.split(",")),
            "T": lambda d: ("tensor",), "O": lambda d: ("other", ast.literal_eval(d))}


def _key(fn_id, kinds):
    fields = [str(fn_id)]
    for k in kinds:
        if k[0] == "ragged":
            fields.append("R" + k[1])
        elif k[0] == "params":
            fields.append("P" + ",".join(k[1]))
        elif k[0] == "tensor":
            fields.append("T")
        else:
            fields.append("O" + repr(k[1]))
    return _SEP.join(fields)


def _parse_type(ty):
    """'f32[B, ~N, 4]' -> (batched, ragged names in order, static extents as strings)."""
    axes = [a.strip() for a in ty[ty.index("[") + 1:ty.rindex("]")].split(",") if a.strip()]
    batched = bool(axes) and not axes[0].startswith("~") and not axes[0].isdigit()
    if batched:
        axes = axes[1:]
    return (batched, [a[1:] for a in axes if a.startswith("~")],
            [a for a in axes if not a.startswith("~")])


@torch.library.custom_op("rag::call", mutates_args=())
def _op_call(key: str, tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    layout = _layout(key)
    result, saved = layout.fn.call_saving(*layout.rag_args(tensors))
    out = _to_torch(result)
    _next_id[0] += 1
    _SAVED[_next_id[0]] = (saved, _skeleton(out))
    return [t.clone() for t in _leaves(out)] + [torch.tensor(_next_id[0])]


@_op_call.register_fake
def _(key, tensors):
    return _layout(key).fake_outputs(tensors) + [torch.empty((), dtype=torch.int64)]


@torch.library.custom_op("rag::call_backward", mutates_args=())
def _op_call_backward(key: str, handle: torch.Tensor, tensors: list[torch.Tensor],
                      cotangents: list[torch.Tensor]) -> list[torch.Tensor]:
    """One gradient per input tensor: float inputs get theirs (zeros where rag has none),
    others (lengths, labels) an empty placeholder, as an op returns tensors only."""
    saved, out = _SAVED.pop(int(handle))
    flat = _torch_grads(_layout(key).kinds, _saved_backward(saved, out, cotangents))
    flat += [None] * (len(tensors) - len(flat))
    return [(torch.zeros_like(t) if g is None else g.clone()) if t.is_floating_point()
            else torch.empty(0, dtype=t.dtype) for g, t in zip(flat, tensors)]


@_op_call_backward.register_fake
def _(key, handle, tensors, cotangents):
    return [torch.empty_like(t) if t.is_floating_point() else torch.empty(0, dtype=t.dtype)
            for t in tensors]


def _setup_context(ctx, inputs, output):
    key, tensors = inputs
    ctx.key, ctx.n = key, len(tensors)
    ctx.save_for_backward(output[-1], *tensors, *output[:-1])


def _backward(ctx, grads):
    handle, *rest = ctx.saved_tensors
    tensors, outs = rest[:ctx.n], rest[ctx.n:]
    cts = [torch.zeros_like(o) if g is None else g for g, o in zip(grads[:-1], outs)]
    gs = torch.ops.rag.call_backward(ctx.key, handle, list(tensors), cts)
    return None, [g if t.is_floating_point() else None for g, t in zip(gs, tensors)]


_op_call.register_autograd(_backward, setup_context=_setup_context)


def _compiled_call(fn_id, binding):
    """binding's call through torch.ops.rag.call (see above)."""
    kinds, lengths = [], []
    for kind in binding.kinds:
        if kind[0] == "ragged":
            r = kind[1]
            if isinstance(r.lengths, dict):
                raise rag.Error("rag.torch under torch.compile: give Ragged lengths as a list "
                                "or tensor (rows in order of the spec's ragged names), not a dict")
            lengths.append(r.lengths if isinstance(r.lengths, torch.Tensor)
                           else torch.tensor(r.lengths, dtype=torch.int64))
            kinds.append(("ragged", r.spec))
        elif kind[0] == "params":
            kinds.append(("params", list(kind[1])))
        else:
            kinds.append(kind)
    # Python constants travel in the key: a graph constant, so a new value recompiles.
    outs = torch.ops.rag.call(_key(fn_id, kinds), list(binding.tensors) + lengths)
    # Results as eager returns them: a batched result shares the lengths of the argument with
    # its ragged axes.
    sig = _FUNCTIONS[fn_id][1]
    ragged_lengths = {}
    for ty, n in zip(sig.arg_types, _ragged_slots(kinds, lengths)):
        if n is not None:
            ragged_lengths.setdefault(tuple(_parse_type(ty)[1]), n)
    results = []
    for ty, t in zip(sig.out_types, outs[:-1]):
        batched, ragged, _ = _parse_type(ty)
        results.append(Ragged(t, ragged_lengths[tuple(ragged)], ty) if batched else t)
    return tuple(results) if sig.tuple_result else results[0]


def _layout(key):
    if key not in _LAYOUTS:
        _LAYOUTS[key] = _Layout(key)
    return _LAYOUTS[key]


def _ragged_slots(kinds, lengths):
    """Per argument: its lengths when it is a Ragged, else None."""
    it = iter(lengths)
    return [next(it) if k[0] == "ragged" else None for k in kinds]


def function(module, name):
    """The rag function `name` of `module` as a differentiable torch function: arguments are
    Ragged batches, torch tensors (unbatched values such as weights or f32[] scalars), dicts
    of torch tensors for params groups (dotted field names), and plain Python values. Results:
    Ragged for batched tensors, tensors for unbatched ones, dicts for params; a tuple result
    is a tuple."""
    fn = module[name]
    fn_id = len(_FUNCTIONS)
    _FUNCTIONS[fn_id] = (fn, _Signature(fn.signature))

    def call(*args):
        b = _Binding(fn, args)
        if torch.compiler.is_compiling():
            return _compiled_call(fn_id, b)
        leaves = _Call.apply(b, *b.tensors)
        last, b.last = b.last, None  # b lives on in the autograd graph; the result must not
        return _rebuild(last, list(leaves))

    call.__name__ = name
    call.rag_fn = fn
    call.__doc__ = "rag function %s, differentiable in torch." % fn.signature
    return call


class _Group(torch.nn.Module):
    """A params group's fields as nested modules, so state_dict keys are rag's dotted names."""


class Module(torch.nn.Module):
    """A torch.nn.Module whose parameters are the fields of a rag params group and whose forward
    calls a rag function with them. `params` names the group type ("Encoder"); the rag
    function's argument of that type is filled with the module's parameters, the others come
    from forward's arguments in order. Parameters start from rag's initialiser with `seed`
    (or `init`, a rag.Params or a dict); state_dict() round trips with dotted names."""

    def __init__(self, module, name, params, seed=0, init=None):
        super().__init__()
        self.rag_module = module
        self.fn_name = name
        self.params_type = params
        self._call = function(module, name)
        sig = module[name].signature
        self._params_index = _params_position(sig, params)
        values = init if init is not None else module.init(params, seed)
        self._names = list(values.keys())
        for dotted in self._names:
            owner, leaf = self._owner(dotted)
            arr = np.array(values[dotted], copy=True)
            owner.register_parameter(leaf, torch.nn.Parameter(_aligned_tensor(arr)))
        # (dotted name, owning submodule, leaf name) per field, for params() on every call.
        self._fields = [(dotted,) + self._owner(dotted) for dotted in self._names]

    def _owner(self, dotted):
        parts = dotted.split(".")
        owner = self
        for p in parts[:-1]:
            if p not in owner._modules:
                owner.add_module(p, _Group())
            owner = owner._modules[p]
        return owner, parts[-1]

    def params(self):
        """The parameters as a dict by dotted name (rag's order)."""
        return {dotted: owner._parameters[leaf] for dotted, owner, leaf in self._fields}

    def forward(self, *args):
        args = list(args)
        args.insert(self._params_index, self.params())
        return self._call(*args)


def _params_position(signature, params):
    """The position of the argument of type `params` in a signature string
    `name(a: T, p: Encoder) -> ...`."""
    inside = signature[signature.index("(") + 1:signature.index(")")]
    types = [a.split(":", 1)[1].strip() for a in _split_args(inside)]
    if params not in types:
        raise rag.Error("%s takes no argument of type %s" % (signature, params))
    return types.index(params)


def _split_args(s):
    out, depth, cur = [], 0, ""
    for ch in s:
        if ch in "[(":
            depth += 1
        elif ch in "])":
            depth -= 1
        if ch == "," and depth == 0:
            out.append(cur)
            cur = ""
        else:
            cur += ch
    if cur.strip():
        out.append(cur)
    return out


def _aligned_tensor(arr):
    """A torch tensor holding arr in 64-byte aligned memory (torch's allocator aligns to 64)."""
    t = torch.empty(arr.shape, dtype=torch.from_numpy(arr[:0].reshape(-1)).dtype)
    t.copy_(torch.from_numpy(arr))
    return t
