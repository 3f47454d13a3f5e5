"""rag: a tensor language for ragged data.

The compiled module is rag._rag (bindings/rag_py.cpp); this package re-exports it and holds
the pure-Python parts: rag.torch, the PyTorch bridge, imported only when asked for.
"""
from rag._rag import *  # noqa: F401,F403
from rag._rag import __doc__, __version__  # noqa: F401
