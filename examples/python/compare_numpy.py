"""Compare rag functions with a NumPy reference computed sample by sample.

    python3 examples/python/compare_numpy.py [--lengths 5,17,9] [--seed 0]

rag runs each batch packed (no padding); the reference loops over the samples in float64 with
plain NumPy. Prints the largest absolute and relative error of every output and exits non-zero
if one exceeds the float32 tolerance.
"""
import argparse
import math
import sys

import numpy as np

import _find_rag
import rag

TOLERANCE = 1e-4  # the programs are f32; rag's reference kernels compute in double


def layernorm(h, g, b, eps=1e-5):
    mu = h.mean(-1, keepdims=True)
    var = ((h - mu) ** 2).mean(-1, keepdims=True)
    return (h - mu) / np.sqrt(var + eps) * g + b


def pair_block(x, z, p):
    """single_pair_single.rag `block_rect` for one sample (`block` is z = x)."""
    pair = (x @ p["wu"])[:, None, :] + (z @ p["wv"])[None, :, :]
    pair = pair + layernorm(pair, p["ln_g"], p["ln_b"]) @ p["wh"]
    mean = pair.sum(axis=1) / max(pair.shape[1], 1)  # rag: the mean of nothing is 0
    return x + mean @ p["wg"], pair


def encoder(x, p, heads=4):
    """encoder.rag `encoder` for one sample: exact softmax attention within the sample."""
    n, c = x.shape
    if n == 0:
        return x
    d = c // heads
    q, k, v = ((x @ p["layer.att." + w]).reshape(n, heads, d) for w in ("wq", "wk", "wv"))
    s = np.einsum("ihd,jhd->hij", q, k) / math.sqrt(d)
    a = np.exp(s - s.max(-1, keepdims=True))
    a /= a.sum(-1, keepdims=True)
    att = np.einsum("hij,jhd->ihd", a, v).reshape(n, c) @ p["layer.att.wo"]
    h = layernorm(x + att, p["layer.ln1.g"], p["layer.ln1.b"])
    u = h @ p["layer.mlp.fc1.w"] + p["layer.mlp.fc1.b"]
    gelu = u * 0.5 * (1 + np.vectorize(math.erf)(u / math.sqrt(2)))
    return layernorm(h + gelu @ p["layer.mlp.fc2.w"] + p["layer.mlp.fc2.b"], p["layer.ln2.g"],
                     p["layer.ln2.b"])


def errors(got, want):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    abs_err = np.abs(got - want).max(initial=0.0)
    rel_err = abs_err / max(np.abs(want).max(initial=0.0), 1e-30)
    return abs_err, rel_err


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lengths", default="5,17,9", help="per-sample lengths N_i")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    lengths = [int(n) for n in args.lengths.split(",")]
    rng = np.random.default_rng(args.seed)

    pair_m = rag.load(_find_rag.ROOT / "examples/single_pair_single.rag")
    enc_m = rag.load(_find_rag.ROOT / "examples/encoder.rag")
    pp = pair_m.init("PairBlock", seed=args.seed)
    ep = enc_m.init("Encoder", seed=args.seed)
    p64 = {k: v.astype(np.float64) for k, v in pp.items()}
    e64 = {k: v.astype(np.float64) for k, v in ep.items()}

    xs = [rng.standard_normal((n, 384)).astype(np.float32) for n in lengths]
    zs = [rng.standard_normal((n, 384)).astype(np.float32) for n in reversed(lengths)]
    es = [rng.standard_normal((n, 64)).astype(np.float32) for n in lengths]
    x, z, e = rag.ragged(xs, "~N, 384"), rag.ragged(zs, "~M, 384"), rag.ragged(es, "~N, 64")

    rows = []  # (function, output, schema, abs, rel)

    def check(fn, name, tensor, reference):
        worst = np.array([errors(got, want) for got, want in zip(tensor.to_list(), reference)]).max(axis=0)
        rows.append((fn, name, tensor.schema, *worst))

    y, pair = pair_m.block(x, pp)
    refs = [pair_block(a.astype(np.float64), a.astype(np.float64), p64) for a in xs]
    check("block", "y", y, [r[0] for r in refs])
    check("block", "pair", pair, [r[1] for r in refs])

    y, pair = pair_m.block_nonleading(x, pp)
    check("block_nonleading", "y", y, [r[0] for r in refs])
    check("block_nonleading", "pair", pair, [r[1].transpose(2, 0, 1) for r in refs])

    y, pair = pair_m.block_rect(x, z, pp)
    refs = [pair_block(a.astype(np.float64), b.astype(np.float64), p64) for a, b in zip(xs, zs)]
    check("block_rect", "y", y, [r[0] for r in refs])
    check("block_rect", "pair", pair, [r[1] for r in refs])

    out = enc_m.encoder(e, ep)
    check("encoder", "out", out, [encoder(a.astype(np.float64), e64) for a in es])

    print(f"lengths {lengths}: rag (packed) vs NumPy per sample (float64)")
    print(f"{'function':<18}{'output':<8}{'schema':<26}{'max abs err':>13}{'max rel err':>13}")
    for fn, name, schema, a, r in rows:
        print(f"{fn:<18}{name:<8}{schema:<26}{a:>13.3e}{r:>13.3e}")
    worst = max(r[4] for r in rows)
    print(f"max error {max(r[3] for r in rows):.3e} (relative {worst:.3e}); "
          f"compilations: { {k: v['compilations'] for k, v in pair_m.stats().items()} }")
    if worst > TOLERANCE:
        sys.exit(f"relative error {worst:.3e} exceeds {TOLERANCE}")


if __name__ == "__main__":
    main()
