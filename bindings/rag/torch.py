"""rag.torch: rag functions inside PyTorch's autograd (optional: needs torch, rag does not).

    import rag, rag.torch, torch
    m = rag.load("examples/encoder.rag")
    model = rag.torch.Module(m, "loss", params="Encoder", seed=0)
    x = rag.torch.Ragged(values, lengths)        # values: torch [sum N, 64], lengths: [B]
    loss = model(x, labels)                       # the params argument is the module's own
    loss.backward()                               # rag's generated backward, no recompute
    torch.optim.AdamW(model.parameters()).step()

Values cross without copies when they are contiguous and 64-byte aligned (PyTorch's CPU
allocator aligns to 64 bytes): torch tensors are handed to rag through DLPack and rag's
results come back through DLPack. The backward is rag's own reverse pass (Function.call_saving
keeps what it reads), so a step runs the function once forward and once backward.
"""
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
        v = (self.values if values is None else values).detach()
        return rag.from_packed(v.contiguous(), self.lengths, self.spec)

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
        ctx.saved, ctx.call, ctx.out = saved, call, out
        ctx.n_inputs = len(tensors)
        call.last = out
        leaves = _leaves(out)
        ctx.mark_non_differentiable(*[t for t in leaves if not t.is_floating_point()])
        return tuple(leaves)

    @staticmethod
    def backward(ctx, *grads):
        out = ctx.out
        elems = out if isinstance(out, tuple) else (out,)
        grads = list(grads)
        cts = []
        for e in elems:
            n = len(_leaves(e))
            g, grads = grads[:n], grads[n:]
            cts.append(_cotangent(e, g))
        per_arg = ctx.saved.backward(tuple(cts) if isinstance(out, tuple) else cts[0])
        return (None,) + tuple(ctx.call.torch_grads(per_arg))


def _cotangent(e, g):
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
                args.append({k: _dense(tensors.pop(0)) for k in kind[1]})
            elif kind[0] == "tensor":
                args.append(_dense(tensors.pop(0)))
            else:
                args.append(kind[1])
        return args

    def torch_grads(self, per_arg):
        """rag's per-argument gradients as one entry per flat torch tensor."""
        out = []
        for kind, g in zip(self.kinds, per_arg):
            if kind[0] == "ragged":
                out.append(None if g is None else torch.from_dlpack(g))
            elif kind[0] == "params":
                out.extend(None if g is None else torch.from_numpy(np.asarray(g[k]))
                           for k in kind[1])
            elif kind[0] == "tensor":
                out.append(None if g is None else torch.from_numpy(np.asarray(g)))
        return out


def _dense(t):
    """An unbatched torch tensor as a rag tensor, through DLPack (zero copy when aligned)."""
    return rag.from_dlpack(t.detach().contiguous())


def function(module, name):
    """The rag function `name` of `module` as a differentiable torch function: arguments are
    Ragged batches, torch tensors (unbatched values such as weights or f32[] scalars), dicts
    of torch tensors for params groups (dotted field names), and plain Python values. Results:
    Ragged for batched tensors, tensors for unbatched ones, dicts for params; a tuple result
    is a tuple."""
    fn = module[name]

    def call(*args):
        b = _Binding(fn, args)
        leaves = _Call.apply(b, *b.tensors)
        return _rebuild(b.last, list(leaves))

    call.__name__ = name
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
        out = {}
        for dotted in self._names:
            owner, leaf = self._owner(dotted)
            out[dotted] = owner._parameters[leaf]
        return out

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
