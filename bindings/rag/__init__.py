"""rag: a tensor language for ragged data.

The compiled module is rag._rag (bindings/rag_py.cpp); this package re-exports it and holds
the pure-Python parts: rag.torch, the PyTorch bridge, imported only when asked for.
"""
from rag._rag import *  # noqa: F401,F403
from rag._rag import __doc__, __version__  # noqa: F401


def example(name):
    """The path of an example program shipped inside the package (the repository's
    examples/NAME, e.g. rag.example("encoder.rag")): works from any directory, installed or
    from the build tree."""
    import os

    folder = os.path.join(os.path.dirname(os.path.abspath(__file__)), "examples")
    path = os.path.join(folder, name)
    if not os.path.isfile(path):
        shipped = sorted(os.listdir(folder)) if os.path.isdir(folder) else []
        raise Error(f"rag.example: no example '{name}' (shipped: {', '.join(shipped)})")
    return path
