"""Shared setup for the Python tests of the `rag` module.

Run from the repository root after building:
    PYTHONPATH=$RAG_BUILD/bindings python3 -m pytest tests/python
Without PYTHONPATH the tests fall back to $RAG_BUILD/bindings, then build/bindings, then an
installed `rag` (pip install .).
"""
import importlib.util
import os
import pathlib
import sys

import numpy as np
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]

if importlib.util.find_spec("rag") is None:
    for cand in (os.environ.get("RAG_BUILD"), ROOT / "build"):
        if cand and (pathlib.Path(cand) / "bindings").is_dir():
            sys.path.insert(0, str(pathlib.Path(cand) / "bindings"))
            break

import rag  # noqa: E402

# Compiled objects go to a cache of the test run's own, never the user's (./dev test sets one).
if "RAG_CACHE_DIR" not in os.environ:
    import tempfile

    os.environ["RAG_CACHE_DIR"] = tempfile.mkdtemp(prefix="rag-pytest-cache-")


@pytest.fixture(scope="session")
def root():
    return ROOT


@pytest.fixture(scope="session")
def example_path():
    return ROOT / "examples" / "single_pair_single.rag"


@pytest.fixture()
def pair_module(example_path):
    """A fresh module per test, so stats start at zero."""
    return rag.load(example_path)


@pytest.fixture(scope="session")
def pair_params(example_path):
    return rag.load(example_path).init("PairBlock", seed=0)


@pytest.fixture()
def rng():
    return np.random.default_rng(1234)


def singles(rng, lengths, width=384, dtype=np.float32):
    return [rng.standard_normal((n, width)).astype(dtype) for n in lengths]
