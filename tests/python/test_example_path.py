"""rag.example(name): the example programs ship inside the package (bindings/rag/examples/
meson.build), so their paths work from any directory, installed or from the build tree."""
import os
import pathlib

import pytest

import rag


def test_every_example_program_ships_with_the_package(root):
    sources = sorted(p.name for p in (root / "examples").glob("*.rag"))
    assert sources
    for name in sources:
        shipped = pathlib.Path(rag.example(name))
        assert shipped.parent == pathlib.Path(rag.__file__).resolve().parent / "examples"
        assert shipped.read_text() == (root / "examples" / name).read_text(), name


def test_example_paths_work_from_any_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path = rag.example("encoder.rag")
    assert os.path.isabs(path)
    assert "train_step" in rag.load(path).functions()


def test_an_unknown_example_names_the_shipped_ones():
    with pytest.raises(rag.Error, match=r"no example 'nope.rag' \(shipped: .*encoder.rag"):
        rag.example("nope.rag")
