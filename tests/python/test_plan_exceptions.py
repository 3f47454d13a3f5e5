"""`rag ir --plan` on every example function and on small programs covering every op family:
a step may run a reference kernel only for the exceptions the README lists ("What works today",
CPU JIT). A new reference step (an op that silently stopped compiling, or a new op added
without a kernel) fails here until it is compiled or listed in README and below."""
import os
import pathlib
import re
import subprocess

ROOT = pathlib.Path(__file__).resolve().parents[2]

# op -> why it still runs its reference kernel (README lists the same).
ANY_DTYPE = {
    "cast": "conversions between element types",
    "concat": "copies by the reference kernel", "pad": "copies into the dense envelope",
    "index": "slicing and integer indexing copy (keep/new indexing is a view)",
    "mse": "loss reduction", "binary_grad": "pow/div-style binary derivatives",
    "ones_like": "a fill", "zeros_like": "a fill",
}
HALF = ("f16", "bf16")  # every f16/bf16 op: no half kernels on the CPU tier
# Reductions over unbatched (parameter-sized) tensors: the segmented loops take batched ones.
UNBATCHED = {"sum", "mean", "sum_to", "reduce_grad", "max", "min"}

SMALL = """
fn cmp(a: f32[B, ~N, 8], b: f32[B, ~N, 8]) -> f32[B, ~N, 8] { return where(a < b, a, b * 2.0) }
fn drop(a: f32[B, ~N, 8]) -> f32[B, ~N, 8] { return dropout(a, 0.1, 3) }
fn cat(a: f32[B, ~N, 8], b: f32[B, ~N, 8]) -> f32[B, ~N, 16] { return concat((a, b), axis=2) }
fn sl(a: f32[B, ~N, 8]) -> f32[B, ~N, 4] { return a[:, :, 2:6] }
fn ms(a: f32[B, ~N, 8], b: f32[B, ~N, 8]) -> f32[] { return mse(a, b) }
fn pd(a: f32[B, ~N, 8]) -> f32[B, N_max, 8] { return pad(a) }
fn rs(a: f64[B, ~N, 8]) -> f64[B, ~N, 2, 4] { return reshape(a, 2, 4) }
fn ce(a: f32[B, ~N, 8], l: i64[B, ~N]) -> f32[] { return cross_entropy(a, l) }
fn ce_grad(a: f32[B, ~N, 8], l: i64[B, ~N]) -> f32[B, ~N, 8] { return grad(ce, wrt=a)(a, l) }
fn q(a: f32[B, ~N, 8], b: f32[B, ~N, 8]) -> f32[] { return sum(maximum(a, b) / b) }
fn dq(a: f32[B, ~N, 8], b: f32[B, ~N, 8]) -> f32[B, ~N, 8] { return grad(q, wrt=a)(a, b) }
fn imax(a: i64[B, ~N, 8]) -> i64[B, 8] { return max(a, axis=1) }
fn h16(a: f16[B, ~N, 8], b: f16[B, ~N, 8]) -> f16[B, ~N, 8] { return tanh(a) * b + a }
fn hb16(a: bf16[B, ~N, 8], b: bf16[B, ~N, 8]) -> bf16[B, ~N, 8] { return exp(a) - b }
fn hmm(a: f16[B, ~N, 8], w: f16[8, 4]) -> f16[B, ~N, 4] { return a @ w }
fn scalars(a: f32[B, ~N, 8]) -> f32[] { return mean(a) * 2.0 + sum(a) }
fn norms(a: f64[B, ~N, 8], g: f64[8], b: f64[8]) -> f64[B, ~N, 8] {
    return softmax(layernorm(a, g, b), axis=2) + rmsnorm(a, g)
}
fn att(q: f32[B, ~N, 2, 8], k: f32[B, ~N, 2, 8], v: f32[B, ~N, 2, 8]) -> f32[B, ~N, 2, 8] {
    return attention(q, k, v)
}
fn rel(q: f32[B, ~N, 2, 8], k: f32[B, ~N, 2, 8], v: f32[B, ~N, 2, 8], t: f32[9, 2, 8]) -> f32[B, ~N, 2, 8] {
    return relpos_attention(q, k, v, map=clip(4), aq=t)
}
fn tri(q: f32[B, ~N, ~N, 2, 8], b: f32[B, ~N, ~N, 2]) -> f32[B, ~N, ~N, 2, 8] {
    return attention(q, q, q, axis=2, bias=b)
}
fn pb(q: f32[B, ~N, 2, 8], b: f32[B, ~N, ~N, 2]) -> f32[B, ~N, 2, 8] { return attention(q, q, q, bias=b) }
fn trimul(a: f32[B, ~N, ~N, 8]) -> f32[B, ~N, ~N, 8] { return einsum("bkic,bkjc->bijc", a, a) }
fn rel64(q: f64[B, ~N, 2, 8], k: f64[B, ~N, 2, 8], v: f64[B, ~N, 2, 8], t: f64[9, 2, 8]) -> f64[B, ~N, 2, 8] {
    return relpos_attention(q, k, v, map=clip(4), aq=t)
}
"""
NODE = re.compile(r"^\s*%(\d+) = \w+\(")


def cli(*args):
    exe = ROOT / os.environ.get("RAG_BUILD", "build") / "dsl" / "rag"
    out = subprocess.run([str(exe)] + [str(a) for a in args], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr
    return out.stdout


def unexpected_reference_steps(path, fn):
    types = {}
    for line in cli("ir", path, "--fn", fn).splitlines():
        m = NODE.match(line)
        if m:  # "  %i = op(args) {attrs} : dtype[shape]"; attrs may hold " : " themselves
            schema = line.rsplit(" : ", 1)[1].strip()
            types[int(m.group(1))] = (schema.split("[")[0], schema.split("[")[1].startswith("B"))
    bad = []
    for line in cli("ir", path, "--fn", fn, "--plan").splitlines():
        if not line.startswith("reference "):
            continue
        i, op = line.split()[1], line.split(" = ")[1]
        dtype, batched = types[int(i[1:])]
        ok = (op in ANY_DTYPE or dtype in HALF or (op in UNBATCHED and not batched) or
              (op in ("max", "min") and dtype.startswith(("i", "u"))) or
              (op.startswith("relpos_attention") and dtype == "f64"))
        if not ok:
            bad.append(f"{path.name}:{fn}: {line}")
    return bad


def test_plans_show_only_the_listed_reference_kernels(tmp_path):
    small = tmp_path / "ops.rag"
    small.write_text(SMALL)
    files = sorted((ROOT / "examples").glob("*.rag")) + [small]
    bad, fns = [], 0
    for path in files:
        for fn in re.findall(r"^fn (\w+)", path.read_text(), re.M):
            bad += unexpected_reference_steps(path, fn)
            fns += 1
    assert fns >= 40
    assert not bad, "reference steps not in the README's exceptions:\n" + "\n".join(bad)
