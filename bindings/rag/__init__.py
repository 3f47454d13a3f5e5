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
    shipped = []
    if os.path.isdir(folder):
        shipped = sorted(f for f in os.listdir(folder) if f.endswith(".rag"))
    # Only a shipped name: "../__init__.py" or "/etc/passwd" would join to a path outside.
    if name not in shipped:
        raise Error(f"rag.example: no example '{name}' (shipped: {', '.join(shipped)})")
    return os.path.join(folder, name)
