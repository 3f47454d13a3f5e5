// rag.ArgumentError: pybind11 answers a call whose arguments do not convert with a TypeError
// listing C++-flavoured overloads. Every function and method of the module is wrapped once, at
// import, by a small Python function that turns exactly that error into a rag message:
//     rag.Module.init(name: str, seed: int = 0): cannot take (int); pass name as str, ...
// Other exceptions pass through untouched, so the wrappers cost one Python frame per call.
#include "bindings/arguments.hpp"

#include <pybind11/eval.h>

namespace rag::bind {

namespace py = pybind11;

namespace {

const char* wrapper_source = R"PY(
import functools, re

class ArgumentError(Error, TypeError):
    """A call with arguments of the wrong types; the message says what to pass."""
ArgumentError.__module__ = "rag"

# "1. (self: rag.Module, name: str) -> rag.Params"; a constructor's (__init__, __setstate__)
# "1. rag.Tensor(arg0: object)".
_SIG = re.compile(r"^\s*\d+\.\s*[\w.]*\((.*)\)\s*(->|$)")

def _signatures(message):
    out = []
    for line in message.splitlines():
        m = _SIG.match(line)
        if m:
            params = [p.strip() for p in re.split(r",\s*(?![^\[]*\])", m.group(1)) if p.strip()]
            params = [p for p in params if not p.startswith("self:")]
            out.append(", ".join(params))
    return out

def _given(args, kwargs):
    parts = [type(a).__name__ for a in args]
    parts += ["%s=%s" % (k, type(v).__name__) for k, v in kwargs.items()]
    return "(" + ", ".join(parts) + ")"

def _wrap(f, qual, method, setter=False):
    def call(*args, **kwargs):
        try:
            return f(*args, **kwargs)
        except TypeError as e:
            text = str(e)
            if not re.search("incompatible (function|constructor) arguments", text):
                raise
            sigs = _signatures(text) or ["..."]
            if setter:
                wanted = [s.split(",")[-1].split(":")[-1].strip() for s in sigs]
                raise ArgumentError("%s: assign a %s, not a %s" % (
                    qual, " or ".join(wanted), type(args[-1]).__name__)) from None
            shown = args[1:] if method else args
            raise ArgumentError("%s(%s): cannot take %s" % (
                qual, ") or (".join(sigs), _given(shown, kwargs))) from None
    functools.update_wrapper(call, f)
    return call

def _install(mod):
    for name, f in list(vars(mod).items()):
        if type(f).__name__ == "builtin_function_or_method":
            setattr(mod, name, _wrap(f, "rag." + name, False))
    for cls in (mod.Tensor, mod.Params, mod.Module, mod.Function):
        for name, attr in list(vars(cls).items()):
            qual = "rag.%s.%s" % (cls.__name__, name)
            if type(attr).__name__ == "instancemethod":
                setattr(cls, name, _wrap(attr.__func__, qual, True))
            elif isinstance(attr, property) and attr.fset is not None:
                fset = attr.fset.__func__ if hasattr(attr.fset, "__func__") else attr.fset
                setattr(cls, name, property(attr.fget, _wrap(fset, qual, True, True), None, attr.__doc__))
    mod.ArgumentError = ArgumentError
)PY";

} // namespace

void install_argument_errors(py::module_& m) {
    py::dict ns;
    ns["__builtins__"] = py::module_::import("builtins");
    ns["Error"] = m.attr("Error");
    ns["__name__"] = "rag";
    py::exec(wrapper_source, ns);
    ns["_install"](m);
}

} // namespace rag::bind
