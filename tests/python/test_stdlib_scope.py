"""The standard library is in scope without an import; a program's own definition of a name
shadows it (with a note naming both); `rag check --stdlib` lists it and docs/stdlib.md is
exactly its `--markdown` output, so the page cannot drift from stdlib/*.rag."""
import pathlib
import subprocess

import numpy as np
import pytest
import rag

from test_cli import RAG, ROOT


def test_in_scope_without_an_import():
    m = rag.compile("""
params Net { proj: Linear[4, 2]; norm: LayerNorm[4] }
fn f(x: f32[B, ~N, 4], p: Net) -> f32[B, ~N, 2] { return linear(layer_norm(x, p.norm), p.proj) }
""", "net.rag")
    assert m.notes() == "" and m.functions() == ["f"]
    p = m.init("Net", seed=0)
    x = rag.ragged([np.ones((2, 4), np.float32), np.zeros((1, 4), np.float32)])
    assert m.f(x, p).schema == "f32[B, ~N, 2]"


def test_a_user_definition_shadows_the_stdlib_with_a_note():
    m = rag.compile("""
fn linear(x: f32[B, ~N, 4], p: Linear[4, 2]) -> f32[B, ~N, 2] { return x @ p.w - p.b }
fn f(x: f32[B, ~N, 4], p: Linear[4, 2]) -> f32[B, ~N, 2] { return linear(x, p) }
""", "mine.rag")
    notes = m.notes()
    assert notes.startswith("mine.rag:2:4: note: fn linear shadows the standard library's linear "
                            "(stdlib/nn.rag:")
    assert "this definition is used" in notes and "error" not in notes
    p = {"w": np.zeros((4, 2), np.float32), "b": np.ones(2, np.float32)}
    out = m.f(rag.ragged([np.ones((1, 4), np.float32)]), p)
    np.testing.assert_array_equal(out.to_list()[0], [[-1.0, -1.0]])   # the user's minus


def test_a_user_group_shadows_the_stdlib_group():
    m = rag.compile("""
params LayerNorm { g: f32[3] = ones }
fn f(x: f32[B, ~N, 3], p: LayerNorm) -> f32[B, ~N, 3] { return x * p.g }
""", "g.rag")
    assert "note: params LayerNorm shadows the standard library's LayerNorm" in m.notes()
    assert list(m.init("LayerNorm").keys()) == ["g"]


def test_two_user_definitions_are_still_an_error():
    with pytest.raises(rag.CompileError, match="fn f is defined twice"):
        rag.compile("fn f(x: f32[]) -> f32[] { return x }\nfn f(x: f32[]) -> f32[] { return x }")


def test_stdlib_functions_cannot_be_run_without_sizes():
    m = rag.compile("fn g(x: f32[]) -> f32[] { return x }")
    assert m.functions() == ["g"]     # the library's functions are not the module's


needs_rag = pytest.mark.skipif(RAG is None, reason="no rag binary")


@needs_rag
def test_check_stdlib_lists_every_declaration():
    out = subprocess.run([str(RAG), "check", "--stdlib"], capture_output=True, text=True,
                         check=True).stdout
    for name in ("params Linear[I, O]", "fn linear(x: f32[B, ~N, I], p: Linear[I, O])",
                 "params TransformerLayer[C, H, F]", "fn bce_with_logits[T]", "fn swiglu("):
        assert name in out, name


@needs_rag
def test_docs_page_is_generated_from_the_library():
    out = subprocess.run([str(RAG), "check", "--stdlib", "--markdown"], capture_output=True,
                         text=True, check=True).stdout
    page = (ROOT / "docs" / "stdlib.md").read_text()
    assert page == out, "docs/stdlib.md is stale: rag check --stdlib --markdown > docs/stdlib.md"
    # Every declaration is documented in place.
    for block in out.split("\n### ")[1:]:
        name, _, rest = block.partition("\n")
        assert rest.strip().count("\n") >= 2, f"{name} has no doc comment in stdlib/"


@needs_rag
def test_check_reports_shadowing_on_stderr(tmp_path):
    f = tmp_path / "s.rag"
    f.write_text("fn mlp(x: f32[]) -> f32[] { return x }\n")
    p = subprocess.run([str(RAG), "check", str(f)], capture_output=True, text=True)
    assert p.returncode == 0 and p.stdout.endswith(": ok\n")
    assert "s.rag:1:4: note: fn mlp shadows the standard library's mlp" in p.stderr


def test_a_stdlib_function_called_from_python_binds_the_instance():
    m = rag.compile("fn g(x: f32[]) -> f32[] { return x }")
    p = m.init("Linear[4, 3]", seed=1)
    x = rag.ragged([np.ones((2, 4), np.float32)])
    y = m.linear(x, p)
    assert y.schema == "f32[B, ~N, 3]"
    np.testing.assert_allclose(y.to_list()[0][0], p["w"].sum(0) + p["b"], rtol=1e-6)


def test_the_library_keeps_calling_its_own_functions_when_a_name_is_shadowed():
    # The program's `mlp` has another signature; the library's transformer_layer still calls
    # the library's mlp.
    m = rag.compile("""
fn mlp(x: f32[]) -> f32[] { return x * 2.0 }
fn f(x: f32[B, ~N, 4], p: TransformerLayer[4, 2, 8]) -> f32[B, ~N, 4] {
    return transformer_layer(x, p)
}
fn g(x: f32[]) -> f32[] { return mlp(x) }
""", "hyg.rag")
    assert "fn mlp shadows the standard library's mlp" in m.notes()
    out = m.f(rag.ragged([np.ones((3, 4), np.float32)]), m.init("TransformerLayer[4, 2, 8]"))
    assert out.schema == "f32[B, ~N, 4]"
    assert float(m.g(np.float32(3.0))) == 6.0
