"""The `rag` command: exit codes and messages of check/run/ir/ptx/repl on good and bad input,
--version, --help, unknown commands, and run's --load/--save.

The binary is the one beside the Python module under test ($BUILD/dsl/rag when PYTHONPATH is
$BUILD/bindings); RAG_BIN overrides it.
"""
import os
import pathlib
import re
import subprocess

import numpy as np
import pytest

import rag

ROOT = pathlib.Path(__file__).resolve().parents[2]
EXAMPLE = str(ROOT / "examples" / "single_pair_single.rag")
BROKEN = str(ROOT / "tests" / "repl" / "data" / "broken.rag")
GPT = str(ROOT / "examples" / "gpt.rag")  # train_step takes two params arguments


def find_rag():
    if os.environ.get("RAG_BIN"):
        return pathlib.Path(os.environ["RAG_BIN"])
    for build in (pathlib.Path(rag.__file__).resolve().parent.parent,
                  pathlib.Path(os.environ.get("RAG_BUILD", ROOT / "build"))):
        if (build / "dsl" / "rag").is_file():
            return build / "dsl" / "rag"
    return None


RAG = find_rag()
pytestmark = pytest.mark.skipif(RAG is None, reason="no rag binary (build dsl/rag or set RAG_BIN)")


def run(*args, stdin=None):
    p = subprocess.run([str(RAG), *args], input=stdin, capture_output=True, text=True,
                       cwd=ROOT, timeout=300)
    return p.returncode, p.stdout, p.stderr


def no_exception_text(err):
    for leak in ("stoi", "stoull", "stoll", "std::", "terminate", "what()"):
        assert leak not in err


def test_version():
    rc, out, err = run("--version")
    assert rc == 0 and out == f"rag {rag.__version__}\n" and not err


def test_help_lists_every_command():
    rc, out, err = run("--help")
    assert rc == 0 and not err
    for cmd in ("check FILE", "run FILE", "ir FILE", "ptx FILE", "repl", "--version"):
        assert cmd in out


@pytest.mark.parametrize("cmd", ["check", "run", "ir", "ptx", "repl"])
def test_each_command_has_help(cmd):
    rc, out, err = run(cmd, "--help")
    assert rc == 0 and not err
    assert out.startswith("usage:\n  " + cmd)
    assert run("help", cmd)[1] == out


def test_run_help_documents_checkpoints():
    out = run("run", "--help")[1]
    assert "--load CKPT" in out and "--save CKPT" in out


def test_no_arguments_is_a_usage_error():
    rc, out, err = run()
    assert rc == 2 and not out and err.startswith("usage: rag COMMAND")


def test_unknown_command_lists_the_commands():
    rc, out, err = run("frob", EXAMPLE)
    assert rc == 2 and not out
    assert err == ("rag: error: unknown command 'frob'; the commands are check, run, ir, ptx, "
                   "repl (rag --help)\n")
    rc, _, err = run("--frob")
    assert rc == 2 and "unknown option '--frob'" in err


def test_check_good_and_bad_files():
    rc, out, err = run("check", EXAMPLE)
    assert rc == 0 and out == f"{EXAMPLE}: ok\n" and not err
    rc, out, err = run("check", BROKEN)
    assert rc == 1 and not out
    assert re.search(r"broken\.rag:\d+:\d+: error: ", err) and "^" in err
    rc, out, err = run("check", "no/such/file.rag")
    assert rc == 1 and err == "rag: error: no file no/such/file.rag\n"


def test_run_good_and_bad():
    rc, out, err = run("run", EXAMPLE, "--fn", "loss", "--lengths", "3,4")
    assert rc == 0 and not err
    assert re.search(r"^loss: f32\[\]  values=1  value=[0-9.]+$", out, re.M)
    rc, out, err = run("run", EXAMPLE, "--fn", "nosuch")
    # about the file, not a line of it: no line:col, no caret under its first line
    assert rc == 1 and not out and err == f"{EXAMPLE}: error: no function named 'nosuch'\n"
    rc, out, err = run("run", EXAMPLE)
    assert rc == 2 and err == "rag: error: run needs --fn NAME\n"  # a usage error
    rc, out, err = run("run", BROKEN, "--fn", "f")
    assert rc == 1 and re.search(r"broken\.rag:\d+:\d+: error: ", err)
    rc, out, err = run("run", "--fn", "loss")
    assert rc == 2 and err == "rag: error: run needs a FILE (rag run --help)\n"


def test_run_gives_derived_ragged_axes_their_bases_lengths(tmp_path):
    # labels typed ~N[1:] get one fewer row than ~N per sample, and an image's labels at
    # ~H[::2][*2] twice the strided height (H, a second name, takes the lengths reversed)
    src = tmp_path / "derived.rag"
    src.write_text("fn f(x: f32[B, ~N, 2], y: f32[B, ~N[1:], 2], z: f32[B, ~H[::2][*2]]) -> "
                   "f32[] { return sum(x[:, 1:] * y) }\n")
    rc, out, err = run("run", str(src), "--fn", "f", "--lengths", "5,2,9")
    assert rc == 0 and not err, err
    assert "y: f32[B, ~N[1:], 2] B=3 N[1:]=[4, 1, 8]" in out, out
    assert "z: f32[B, ~H[::2][*2]] B=3 H[::2][*2]=[10, 2, 6]" in out, out


def test_run_with_an_impossible_extent_says_so(tmp_path):
    src = tmp_path / "big.rag"
    src.write_text("fn b(x: f32[B, ~N, 9223372036854775807]) -> f32[] { return sum(x) }\n")
    rc, out, err = run("run", str(src), "--fn", "b")
    assert rc == 1 and "std::" not in err, err
    assert "an array of shape (5, 9223372036854775807) is larger than any allocation" in err


def test_save_paths_are_checked_before_the_steps(tmp_path):
    # a path that cannot be written, or one file for two params arguments, fails before any
    # step runs (no "step 1" line), and leaves no file behind
    bad = tmp_path / "no" / "such" / "dir.st"
    rc, out, err = run("run", EXAMPLE, "--fn", "train_step", "--steps", "3", "--save", str(bad))
    assert rc == 1 and "step 1" not in out and f"--save {bad}: cannot write there" in err, err
    twice = tmp_path / "p.st"
    rc, out, err = run("run", GPT, "--fn", "train_step", "--steps", "1",
                       "--save", str(twice), "--save", str(tmp_path / "." / "p.st"))
    assert rc == 2 and "step 1" not in out and "is given twice" in err, err
    assert not twice.exists()


@pytest.mark.parametrize("flags, message", [
    (["--steps", "x"], "--steps takes an integer from 0 to 1073741824, got 'x'"),
    (["--steps", "99999999999999999999"], "--steps takes an integer"),
    (["--seed", "-1"], "--seed takes an integer from 0 to 18446744073709551615, got '-1'"),
    (["--lengths", "5,a"], "--lengths takes an integer from 0 to 1099511627776, got 'a'"),
    (["--lengths", "5,,3"], "--lengths takes an integer"),
    (["--lengths", "5,3,"], "--lengths takes an integer"),
    (["--fn", "loss"], "--fn is given twice: run runs one function"),
    (["--steps"], "--steps needs a value"),
    (["--tier", "fast"], "--tier takes jit or interp, got 'fast'"),
    (["--bogus"], "unknown option '--bogus' for rag run (rag run --help)"),
])
def test_bad_flags_are_clear(flags, message):
    rc, out, err = run("run", EXAMPLE, "--fn", "loss", *flags)
    assert rc == 2 and not out
    assert err.startswith(f"rag: error: {message}") and err.count("\n") == 1
    no_exception_text(err)


def test_ir_and_ptx_good_and_bad():
    for cmd in ("ir", "ptx"):
        rc, out, err = run(cmd, EXAMPLE, "--fn", "loss")
        assert rc == 0 and out and not err, cmd
        rc, out, err = run(cmd, EXAMPLE)
        assert rc == 2 and err == f"rag: error: {cmd} needs --fn NAME\n"
        rc, out, err = run(cmd, BROKEN, "--fn", "f")
        assert rc == 1 and re.search(r"broken\.rag:\d+:\d+: error: ", err), cmd
    rc, out, err = run("ir", EXAMPLE, "--fn", "loss", "--plan")
    assert rc == 0 and out


def losses(out):
    return [float(x) for x in re.findall(r"^step \d+ loss ([-0-9.]+)$", out, re.M)]


def test_run_save_then_load_continues_training(tmp_path):
    ck = str(tmp_path / "ck.safetensors")
    common = ["run", EXAMPLE, "--fn", "train_step", "--lengths", "3,5"]
    rc, out5, err = run(*common, "--steps", "5")
    assert rc == 0, err
    rc, out3, err = run(*common, "--steps", "3", "--save", ck)
    assert rc == 0, err
    assert f"saved PairBlock to {ck}" in out3
    rc, out2, err = run(*common, "--steps", "2", "--load", ck)
    assert rc == 0, err
    # The same inputs every step: 3 + 2 steps through a checkpoint are the 5 steps.
    assert losses(out3) + losses(out2) == losses(out5)


def test_run_save_writes_the_params_python_sees(tmp_path):
    ck = tmp_path / "init.safetensors"
    rc, out, err = run("run", EXAMPLE, "--fn", "loss", "--seed", "4", "--save", str(ck))
    assert rc == 0, err
    m = rag.load(EXAMPLE)
    got, want = m.load_params("PairBlock", ck), m.init("PairBlock", 4)
    for k in want:
        assert np.array_equal(got[k], want[k])
    # A step function without --steps saves the params it returns (one step).
    ck1 = tmp_path / "one.safetensors"
    assert run("run", EXAMPLE, "--fn", "train_step", "--save", str(ck1))[0] == 0
    assert not np.array_equal(m.load_params("PairBlock", ck1)["wu"], m.init("PairBlock", 0)["wu"])


def test_run_load_errors(tmp_path):
    bad = tmp_path / "bad.safetensors"
    m = rag.compile("params Other { w: f32[2] = ones }")
    m.init("Other").save(bad)
    rc, out, err = run("run", EXAMPLE, "--fn", "loss", "--load", str(bad))
    assert rc == 1
    assert f"rag: error: {bad} does not hold PairBlock params (it was saved from Other):" in err
    assert "missing 'wu' (PairBlock expects f32[384, 128])" in err
    rc, out, err = run("run", EXAMPLE, "--fn", "loss", "--load", str(bad), "--load", str(bad))
    assert rc == 1 and "--load is given 2 time(s) but loss takes 1 params argument(s)" in err
    rc, out, err = run("run", EXAMPLE, "--fn", "loss", "--load", str(tmp_path / "none"))
    assert rc == 1 and "cannot read checkpoint" in err


def test_steps_need_a_step_function():
    rc, out, err = run("run", EXAMPLE, "--fn", "loss", "--steps", "2")
    assert rc == 1 and "--steps needs a function returning (loss, params...)" in err


def test_repl_from_a_pipe_reports_errors_on_stderr():
    rc, out, err = run("repl", stdin="let a = 1.0\na + b\na * 2.0\n")
    assert rc == 1
    assert "2" in out and "error" not in out
    assert "error" in err and "b" in err
    rc, out, err = run("repl", stdin="let a = 1.0\na * 2.0\n")
    assert rc == 0 and not err
