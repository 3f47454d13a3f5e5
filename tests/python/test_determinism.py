"""Bitwise determinism across thread counts: every example's loss and parameter gradient is the
same bits under RAG_NUM_THREADS=1, 2, 3 and OPENBLAS_NUM_THREADS=1, 2.

Each configuration runs in a child process (both variables are read when a process starts), on
inputs large enough that elementwise loops, GEMMs and reductions are cut into several chunks.
"""
import hashlib
import json
import os
import pathlib
import re
import subprocess
import sys

import numpy as np
import rag

ROOT = pathlib.Path(__file__).resolve().parents[2]
LOSS = re.compile(r"^fn (loss\w*)\(([^)]*)\) -> f32\[\]", re.M)

# Sample lengths per example: enough rows that the chunked kernels run several chunks
# (elementwise loops take 32768 elements a chunk), short enough for Transformer-XL's L = 64.
LENGTHS = {
    "encoder.rag": [150, 200, 137, 180],
    "relpos_encoder.rag": [40, 63, 51, 17, 60, 44, 58, 33, 62, 49],
    "single_pair_single.rag": [23, 31, 17],
    "bert.rag": [150, 200, 137, 180],
    "gpt.rag": [150, 200, 137, 180],
    "seq2seq.rag": [150, 200, 137, 180],
    # Images: heights; widths are the heights reversed (several GEMM blocks per image).
    "fcn.rag": [40, 64, 24, 52],
    "vit.rag": [32, 80, 48, 64],
    "pairformer.rag": [12, 20, 7],  # pair states: 20 * 20 * 128 cells in the largest sample
}


def grad_functions(src):
    """A `__grad_<loss>` function per loss of the example: the gradient wrt its params."""
    out = []
    for name, args in LOSS.findall(src):
        parts = re.split(r",\s*(?=\w+\s*:)", args)  # commas between arguments, not in shapes
        names = [a.split(":")[0].strip() for a in parts]
        types = [a.split(":")[1].strip() for a in parts]
        p = names[-1]
        out.append((name, names, types))
        src += (f"\nfn __grad_{name}({args}) -> {types[-1]} {{\n"
                f"    return grad({name}, wrt={p})({', '.join(names)})\n}}\n")
    return src, out


def run_child():
    """Prints {"file:fn": {"loss": sha, "param": sha, ...}} for this process's thread settings."""
    result = {}
    for path in sorted((ROOT / "examples").glob("*.rag")):
        src, losses = grad_functions(path.read_text())
        m = rag.compile(src, path.name)
        lengths = LENGTHS[path.name]
        for name, names, types in losses:
            rng = np.random.default_rng(7)
            args = []
            for a, t in zip(names, types):
                if t.startswith("f32[B, 3, ~H, ~W]"):  # images, widths the heights reversed
                    args.append(rag.ragged([rng.standard_normal((3, h, w)).astype(np.float32)
                                            for h, w in zip(lengths, lengths[::-1])],
                                           ragged_axes=[1, 2]))
                elif t.startswith("i64[B, ~H"):  # per-pixel labels at 4 ceil(side / 4)
                    args.append(rag.ragged([rng.integers(0, 4, (-(-h // 4) * 4, -(-w // 4) * 4))
                                            for h, w in zip(lengths, lengths[::-1])],
                                           ragged_axes=[0, 1]))
                elif t.startswith("f32[B") and "~N, ~N" in t:  # a pair state
                    width = int(t.rstrip("]").split(",")[-1])
                    args.append(rag.ragged([rng.standard_normal((k, k, width)).astype(np.float32)
                                            for k in lengths], ragged_axes=f"~N, ~N, {width}"))
                elif t.startswith("f32[B") and path.name == "pairformer.rag":  # singles of ~N
                    width = int(t.rstrip("]").split(",")[-1])
                    args.append(rag.ragged([rng.standard_normal((k, width)).astype(np.float32)
                                            for k in lengths]))
                elif t.startswith("f32[B"):
                    width = int(t.rstrip("]").split(",")[-1])
                    n = lengths if a == "x" else [max(1, k // 2) for k in lengths]
                    args.append(rag.ragged([rng.standard_normal((k, width)).astype(np.float32)
                                            for k in n]))
                elif t.startswith("i32[B"):  # token ids; a second sequence is half as long
                    n = lengths if a in ("ids", "src") else [max(2, k // 2) for k in lengths]
                    args.append(rag.ragged([rng.integers(0, 4000, k).astype(np.int32) for k in n],
                                           ragged_axes="~N"))
                elif t == "i64[B]":  # one label per sample
                    args.append(rag.tensor(rng.integers(0, 2, len(lengths)).astype(np.int64),
                                           batched=True))
                elif t.startswith("i64[B"):
                    args.append(rag.ragged([rng.integers(0, 2, k).astype(np.int64)
                                            for k in lengths]))
                else:
                    args.append(m.init(t, seed=3))
            digests = {"loss": hashlib.sha256(np.asarray(m[name](*args)).tobytes()).hexdigest()}
            g = m[f"__grad_{name}"](*args)
            for k in g.keys():
                digests[k] = hashlib.sha256(np.asarray(g[k]).tobytes()).hexdigest()
            result[f"{path.name}:{name}"] = digests
    print(json.dumps(result))


def child(rag_threads, blas_threads):
    env = dict(os.environ, RAG_NUM_THREADS=str(rag_threads),
               OPENBLAS_NUM_THREADS=str(blas_threads))
    env["PYTHONPATH"] = os.pathsep.join(
        [str(pathlib.Path(rag.__file__).parent)] + [p for p in [env.get("PYTHONPATH")] if p])
    out = subprocess.run([sys.executable, __file__, "--child"], env=env, capture_output=True,
                         text=True, timeout=900)
    assert out.returncode == 0, out.stdout + out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_every_example_gradient_is_bitwise_equal_across_thread_counts():
    base = child(1, 1)
    assert len(base) == 13  # every loss of every example ran
    for rag_threads, blas_threads in [(2, 1), (3, 1), (1, 2), (3, 2)]:
        got = child(rag_threads, blas_threads)
        differ = [f"{fn}.{k}" for fn in base for k in base[fn] if got[fn][k] != base[fn][k]]
        assert not differ, (f"RAG_NUM_THREADS={rag_threads} OPENBLAS_NUM_THREADS={blas_threads} "
                            f"changed the bits of: {', '.join(differ)}")


if __name__ == "__main__" and "--child" in sys.argv:
    run_child()
