"""conv2d against OpenBLAS alone on the same GEMM: rag's 3 x 3 convolution (stride 1, padding 1)
of B = 8 images at near-uniform sizes, forward and input gradient, against rag's `x @ W` on a
ready-made [pixels, 9 Cin] panel (one OpenBLAS GEMM over packed rows, the same M, N, K). The
ratio is what building panels per block costs. Median of 7 after a warm-up:
    PYTHONPATH=build/bindings python3 bench/images/gemm_ratio.py [--threads 2]"""
import argparse
import json
import os
import subprocess
import time

import numpy as np

ap = argparse.ArgumentParser()
ap.add_argument("--threads", type=int, default=2)
a = ap.parse_args()
os.environ["RAG_NUM_THREADS"] = str(a.threads)
import rag  # noqa: E402


def median_ms(f, n=7):
    f()
    ts = []
    for _ in range(n):
        t = time.perf_counter()
        f()
        ts.append(1e3 * (time.perf_counter() - t))
    return float(np.median(ts))


rng = np.random.default_rng(0)
commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                        text=True).stdout.strip()
for c in (16, 32, 64):
    src = f"""
fn conv(x: f32[B, {c}, ~H, ~W], w: f32[{c}, {c}, 3, 3]) -> f32[B, {c}, ~H, ~W] {{
    return conv2d(x, w, padding=1)
}}
fn loss(x: f32[B, {c}, ~H, ~W], w: f32[{c}, {c}, 3, 3]) -> f32[] {{ return sum(conv(x, w)) }}
fn dx(x: f32[B, {c}, ~H, ~W], w: f32[{c}, {c}, 3, 3]) -> f32[B, {c}, ~H, ~W] {{
    return grad(loss, wrt=x)(x, w)
}}
fn gemm(p: f32[B, ~N, {9 * c}], w: f32[{9 * c}, {c}]) -> f32[B, ~N, {c}] {{ return p @ w }}
"""
    m = rag.compile(src, "gemm_ratio.rag")
    sizes = [(int(h), int(w)) for h, w in rng.integers(96, 113, (8, 2))]
    x = rag.ragged([rng.standard_normal((c, h, w)).astype(np.float32) for h, w in sizes],
                   ragged_axes=[1, 2])
    w = rng.standard_normal((c, c, 3, 3)).astype(np.float32)
    p = rag.ragged([rng.standard_normal((h * w, 9 * c)).astype(np.float32) for h, w in sizes])
    wg = rng.standard_normal((9 * c, c)).astype(np.float32)
    conv, grad_x, gemm = (median_ms(lambda: m.conv(x, w)), median_ms(lambda: m.dx(x, w)),
                          median_ms(lambda: m.gemm(p, wg)))
    print(json.dumps({"commit": commit, "threads": a.threads, "channels": c,
                      "pixels": sum(h * w for h, w in sizes), "conv_ms": round(conv, 2),
                      "fwd_plus_input_grad_ms": round(grad_x, 2), "gemm_ms": round(gemm, 2),
                      "conv_over_gemm": round(conv / gemm, 2),
                      "loadavg": open("/proc/loadavg").read().split()[0]}), flush=True)
