"""The PyTorch peers of rag_bench_gpu on the same machine (bench/gpu/run.sh runs it).

One relative-position attention layer, forward and backward, fp16 on the CUDA device,
B * N = --tokens (16K), H = 12, d = 64, bidirectional, the four mechanisms with rag_bench_gpu's
maps (Shaw clip(256), Transformer-XL identity, DeBERTa log_buckets(256, 512), T5
t5_buckets(32, 128); the DeBERTa and T5 buckets as the HF models compute them):
- "SDPA + bias": the relation terms materialised as a [B, H, N, N] fp16 bias (c2p = Q aQ^T and
  p2c = K aK^T onto every relation row, then gathered by the offset's row; T5's [H, R] table
  gathered), times tau, as attn_mask of scaled_dot_product_attention.
- "Flex + score_mod": torch.compile(flex_attention) with a score_mod that reads the same
  per-row terms (c2p[b, h, i, row], p2c[b, h, j, row], table[h, row]) through a per-offset
  row index: nothing N x N is materialised.
Inputs are random (torch.manual_seed(N)); the timings do not depend on the values. FLOPs are
counted as rag_bench_gpu counts them (REFERENCE.md section 4): forward 4BHN^2d plus 2BHNRd per
relation projection, backward twice that. Times: CUDA events, median of --reps after one
warm-up; forward is the whole layer (projections, bias, attention), backward is
autograd.backward of the output with a fixed dO. Peak memory: torch.cuda.max_memory_allocated
above what the inputs hold. Correctness: at N <= --check-max-n each system's output against a
float64 computation on the same inputs (relative l2). Writes JSON lines (--json).
"""
import argparse
import json
import math
import statistics
import sys

import torch
import torch.nn.functional as F

MECHANISMS = {
    # name: (aq, ak, bias, relation projections credited, scale(d))
    "Shaw": (True, False, False, 1, lambda d: 1 / math.sqrt(d)),
    "TXL": (True, True, True, 1, lambda d: 1 / math.sqrt(d)),
    "DeBERTa": (True, True, False, 2, lambda d: 1 / math.sqrt(3 * d)),
    "T5": (False, False, True, 0, lambda d: 1.0),
}


def offset_rows(mech, N, device):
    """The relation row of every offset delta = i - j in [-(N - 1), N - 1], and R."""
    delta = torch.arange(-(N - 1), N, device=device)
    if mech == "Shaw":
        return delta.clamp(-256, 256) + 256, 513
    if mech == "TXL":
        return delta + N - 1, 2 * N - 1
    if mech == "DeBERTa":  # HF DeBERTa-v2 make_log_bucket_position(delta, 256, 512)
        size, max_position = 256, 512
        mid = size // 2
        sign = torch.sign(delta)
        abs_pos = torch.where((delta < mid) & (delta > -mid), torch.full_like(delta, mid - 1),
                              delta.abs())
        log_pos = torch.ceil(torch.log(abs_pos / mid) / math.log((max_position - 1) / mid) *
                             (mid - 1)).long() + mid
        bucket = torch.where(abs_pos <= mid, delta, log_pos * sign)
        return (bucket + size).clamp(0, 2 * size - 1), 2 * size
    # HF T5 _relative_position_bucket(j - i, bidirectional, 32 buckets, max_distance 128)
    rel = -delta
    num, max_distance = 32 // 2, 128
    ret = (rel > 0).long() * num
    n = rel.abs()
    max_exact = num // 2
    large = max_exact + (torch.log(n.float().clamp(min=1) / max_exact) /
                         math.log(max_distance / max_exact) * (num - max_exact)).long()
    large = large.clamp(max=num - 1)
    return ret + torch.where(n < max_exact, n, large), 2 * num


def inputs(mech, N, tokens, H, D, device):
    torch.manual_seed(N)
    aq, ak, bias, _, _ = MECHANISMS[mech]
    B = max(tokens // N, 1)
    rows, R = offset_rows(mech, N, device)

    def rand(*shape):
        return (torch.rand(*shape, device=device) * 2 - 1).half()

    q, k, v, dO = (rand(B, H, N, D) for _ in range(4))
    t = {"aq": rand(H, R, D) if aq else None, "ak": rand(H, R, D) if ak else None,
         "bias": rand(H, R) if bias else None}
    return B, R, rows, q, k, v, dO, t


def relation_terms(q, k, t):
    """c2p = Q aQ^T and p2c = K aK^T onto every relation row: [B, H, N, R] or None."""
    c2p = torch.einsum("bhnd,hrd->bhnr", q, t["aq"]) if t["aq"] is not None else None
    p2c = torch.einsum("bhnd,hrd->bhnr", k, t["ak"]) if t["ak"] is not None else None
    return c2p, p2c


def sdpa_layer(q, k, v, t, rows, scale):
    N = q.shape[2]
    i = torch.arange(N, device=q.device)
    idx = rows[i[:, None] - i[None, :] + N - 1]  # [N, N] relation row of (i, j)
    B, H = q.shape[0], q.shape[1]
    c2p, p2c = relation_terms(q, k, t)
    bias = torch.zeros(B, H, N, N, device=q.device, dtype=q.dtype)
    if c2p is not None:
        bias = bias + torch.gather(c2p, -1, idx.expand(B, H, N, N))
    if p2c is not None:  # p2c[b, h, j, idx[i, j]], gathered along j's rows then transposed
        bias = bias + torch.gather(p2c, -1, idx.t().expand(B, H, N, N)).transpose(-1, -2)
    if t["bias"] is not None:
        bias = bias + t["bias"][:, idx]
    return F.scaled_dot_product_attention(q, k, v, attn_mask=bias * scale, scale=scale)


_flex = None


def flex_layer(q, k, v, t, rows, scale):
    global _flex
    if _flex is None:
        from torch.nn.attention.flex_attention import flex_attention
        _flex = torch.compile(flex_attention, dynamic=False)
    N = q.shape[2]
    c2p, p2c = relation_terms(q, k, t)
    tab = t["bias"]

    def score_mod(score, b, h, q_idx, kv_idx):
        r = rows[q_idx - kv_idx + N - 1]
        extra = torch.zeros_like(score)
        if c2p is not None:
            extra = extra + c2p[b, h, q_idx, r]
        if p2c is not None:
            extra = extra + p2c[b, h, kv_idx, r]
        if tab is not None:
            extra = extra + tab[h, r]
        return score + extra * scale

    return _flex(q, k, v, score_mod=score_mod, scale=scale)


def reference(q, k, v, t, rows, scale):
    """float64 on sample 0: scores with every relation term gathered per (i, j)."""
    q, k, v = (x[:1].double() for x in (q, k, v))
    N = q.shape[2]
    i = torch.arange(N, device=q.device)
    idx = rows[i[:, None] - i[None, :] + N - 1]
    s = q @ k.transpose(-1, -2)
    if t["aq"] is not None:
        s = s + torch.einsum("bhid,hijd->bhij", q, t["aq"].double()[:, idx])
    if t["ak"] is not None:
        s = s + torch.einsum("bhjd,hijd->bhij", k, t["ak"].double()[:, idx])
    if t["bias"] is not None:
        s = s + t["bias"].double()[:, idx]
    return torch.softmax(s * scale, -1) @ v


def rel_l2(a, b):
    a, b = a.double(), b.double()
    return (torch.linalg.vector_norm(a - b) / torch.linalg.vector_norm(b)).item()


def time_ms(fn, reps):
    out = []
    for _ in range(reps):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        out.append(start.elapsed_time(stop))
    return statistics.median(out)


def cell(system, layer, mech, N, args):
    device = "cuda"
    B, R, rows, q, k, v, dO, t = inputs(mech, N, args.tokens, args.heads, args.dim, device)
    _, _, _, projections, scale_of = MECHANISMS[mech]
    scale = scale_of(args.dim)
    rec = {"system": system, "mechanism": mech, "N": N, "B": B, "R": R}
    leaves = [x for x in (q, k, v, *t.values()) if x is not None]
    try:
        for x in leaves:
            x.requires_grad_(True)
        torch.cuda.synchronize()
        held = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        out = layer(q, k, v, t, rows, scale)  # warm-up (FlexAttention compiles here)
        torch.autograd.backward(out, dO)
        torch.cuda.synchronize()
        for x in leaves:
            x.grad = None
        holder = {}

        def forward():
            holder["out"] = layer(q, k, v, t, rows, scale)

        def backward():
            torch.autograd.backward(holder.pop("out"), dO)

        fwd, bwd = [], []
        for _ in range(args.reps):
            fwd.append(time_ms(forward, 1))
            bwd.append(time_ms(backward, 1))
            for x in leaves:
                x.grad = None
        peak = torch.cuda.max_memory_allocated() - held
        attn = 4.0 * B * args.heads * N * N * args.dim
        flops = attn + projections * 2.0 * B * args.heads * N * R * args.dim
        f_ms, b_ms = statistics.median(fwd), statistics.median(bwd)
        rec.update(fwd_ms=f_ms, bwd_ms=b_ms, fwd_tflops=flops / (f_ms * 1e-3) / 1e12,
                   bwd_tflops=2 * flops / (b_ms * 1e-3) / 1e12, peak_mib=peak / 2**20)
        if N <= args.check_max_n:
            with torch.no_grad():
                got = layer(q, k, v, t, rows, scale)[:1]
                rec["rel_l2_vs_f64"] = rel_l2(got, reference(q, k, v, t, rows, scale))
    except Exception as e:  # noqa: BLE001 - an unsupported case is a cell, not a crash
        rec["error"] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300]
    finally:
        del q, k, v, dO, t, leaves
        torch.cuda.empty_cache()
    return rec


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--lengths", default="128,256,512,1024,2048,4096,8192")
    p.add_argument("--mechanisms", default="Shaw,TXL,DeBERTa,T5")
    p.add_argument("--systems", default="SDPA + bias,Flex + score_mod")
    p.add_argument("--tokens", type=int, default=16384)
    p.add_argument("--heads", type=int, default=12)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--check-max-n", type=int, default=256)
    p.add_argument("--json", default="")
    args = p.parse_args()
    if not torch.cuda.is_available():
        sys.exit("peers.py: PyTorch sees no CUDA device")
    layers = {"SDPA + bias": sdpa_layer, "Flex + score_mod": flex_layer}
    out = open(args.json, "w") if args.json else sys.stdout
    for system in args.systems.split(","):
        for mech in args.mechanisms.split(","):
            for N in (int(x) for x in args.lengths.split(",")):
                rec = cell(system, layers[system], mech, N, args)
                print(json.dumps(rec), file=out, flush=True)
                print(json.dumps(rec), file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()
