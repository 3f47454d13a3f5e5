"""The PyTorch peers of rag_bench_relpos on the same inputs (bench venv: ./dev bench-python).

One relative-position attention layer, B * N = --tokens, H = 12, d = 64, float32, on the CPU:
- "PyTorch eager": the relation terms materialised as the models' attention modules build them
  (HF Wav2Vec2-BERT relative_key for Shaw: an [N, N, d] gathered embedding and an einsum; NeMo
  RelPositionMultiHeadAttention for Transformer-XL: (q + u) k^T + rel_shift((q + v) p^T); HF
  DeBERTa-v2 disentangled_att_bias for DeBERTa: c2p and p2c GEMMs onto every relation row,
  then torch.gather; HF T5Attention.compute_bias for T5), softmax and P V in float32.
- "PyTorch SDPA": the same bias (times tau) as attn_mask of scaled_dot_product_attention.
- "FlexAttention": flex_attention compiled for the CPU with a score_mod reading a bias table:
  the dense tau-scaled bias for Shaw, TXL and DeBERTa, the [H, R] table through a per-offset
  bucket index for T5. Forward only (the CPU has no flex backward; PEERS.md).

Inputs are bit-identical to rag_bench_relpos's: value k of stream "<mechanism>.<name>" is
2 u_k - 1 with rag's counter-based generator (runtime/random.hpp) seeded by N. The relation
rows are rag's exact integer maps for every system (T5's float32 truncated log differs at
n = 16, 32, 64, REFERENCE.md section 2; giving every system the same rows keeps the check about
attention numerics). Correctness: each system on sample 0 against a float64 reference that
gathers the relation vector of every (i, j), REFERENCE.md section 3's f32 criterion (relative
l2 <= 1e-5). Peak memory: resident bytes above what the process held before the call
(/proc/self/clear_refs + VmHWM), the measure rag_bench_relpos uses. Writes JSON lines (--json).
"""
import argparse
import ctypes
import gc
import json
import math
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

MASK64 = (1 << 64) - 1


# ---- rag's counter-based generator (runtime/random.hpp), in numpy -------------------------------
def splitmix64_int(x):
    x = (x + 0x9E3779B97F4A7C15) & MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK64
    return x ^ (x >> 31)


def splitmix64_np(x):
    x = x + np.uint64(0x9E3779B97F4A7C15)
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def fnv1a64(s):
    h = 0xCBF29CE484222325
    for c in s.encode():
        h = ((h ^ c) * 0x100000001B3) & MASK64
    return h


def stream(mech, name, n_seed, count):
    """2 u_k - 1 for k < count, float64, as rag_bench_relpos's stream()."""
    key = splitmix64_int(n_seed ^ fnv1a64(f"{mech}.{name}"))
    with np.errstate(over="ignore"):
        k = np.arange(count, dtype=np.uint64) + np.uint64(key)
        u = (splitmix64_np(k) >> np.uint64(11)).astype(np.float64) * 2.0**-53
    return 2.0 * u - 1.0


# ---- the maps, exactly as runtime/relpos_map.cpp ---------------------------------------------
def snapped(x):
    r = round(x)
    return r if abs(x - r) < 1e-9 else x


def t5_row(delta, num=32, max_distance=128):
    rel = -delta
    half, exact = num // 2, num // 4
    base, n = (half if rel > 0 else 0), abs(rel)
    if n < exact:
        return base + n
    x = math.log(n / exact) / math.log(max_distance / exact) * (half - exact)
    return base + min(half - 1, exact + math.floor(snapped(x)))


def log_row(delta, size=256, max_position=512):
    mid, a = size // 2, abs(delta)
    if a <= mid:
        b = delta
    else:
        x = math.log(a / mid) / math.log((max_position - 1) / mid) * (mid - 1)
        b = int(math.copysign(math.ceil(snapped(x)) + mid, delta))
    return min(max(b + size, 0), 2 * size - 1)


def check_maps():
    # REFERENCE.md section 2's reference values.
    t5 = {-200: 15, -91: 15, -90: 14, -64: 14, -63: 13, -32: 12, -31: 11, -16: 10, -15: 9, -8: 8,
          -7: 7, -1: 1, 0: 0, 1: 17, 7: 23, 8: 24, 15: 25, 16: 26, 31: 27, 32: 28, 63: 29,
          64: 30, 90: 30, 91: 31, 200: 31}
    for rel, b in t5.items():
        assert t5_row(-rel) == b, (rel, t5_row(-rel), b)
    lg = {-5000: 0, -512: 0, -511: 1, -300: 49, -200: 87, -129: 127, -128: 128, -1: 255, 0: 256,
          1: 257, 128: 384, 129: 385, 200: 425, 300: 463, 510: 511, 511: 511, 5000: 511}
    for d, r in lg.items():
        assert log_row(d) == r, (d, log_row(d), r)


MECHANISMS = {
    # name: (tables present aq, ak, bias; relation projections credited in the FLOPs)
    "Shaw": dict(aq=True, ak=False, bias=False, projections=1),
    "TXL": dict(aq=True, ak=True, bias=True, projections=1),
    "DeBERTa": dict(aq=True, ak=True, bias=False, projections=2),
    "T5": dict(aq=False, ak=False, bias=True, projections=0),
}


def rows_for(mech, N):
    """(R, rows[delta + N - 1] for delta = -(N-1)..N-1) as rag's map."""
    d = range(-(N - 1), N)
    if mech == "Shaw":
        return 513, [min(max(x, -256), 256) + 256 for x in d]
    if mech == "TXL":
        return 2 * N - 1, [x + N - 1 for x in d]
    if mech == "DeBERTa":
        return 512, [log_row(x) for x in d]
    return 32, [t5_row(x) for x in d]


def scale_of(mech, D):
    return {"DeBERTa": 1 / math.sqrt(3 * D), "T5": 1.0}.get(mech, 1 / math.sqrt(D))


class Problem:
    """One mechanism's inputs at one N: q, k, v, dO [B, H, N, D] and the tables per head."""

    def __init__(self, mech, B, N, H, D):
        self.mech, self.B, self.N, self.H, self.D = mech, B, N, H, D
        self.R, rows = rows_for(mech, N)
        self.tau = scale_of(mech, D)
        offs = torch.arange(N)
        self.rel = torch.tensor(rows, dtype=torch.long)[offs[:, None] - offs[None, :] + N - 1]  # [N, N] row of (i, j)
        self.rows = torch.tensor(rows, dtype=torch.long)

        def tok(name):
            v = stream(mech, name, N, B * N * H * D).reshape(B, N, H, D)
            return torch.from_numpy(v).float().permute(0, 2, 1, 3).contiguous()

        def tab(name, shape):
            return torch.from_numpy(stream(mech, name, N, int(np.prod(shape))).reshape(shape)).float()

        self.q, self.k, self.v, self.dO = tok("q"), tok("k"), tok("v"), tok("dO")
        m = MECHANISMS[mech]
        self.tables = {}
        if mech == "TXL":
            self.tables["p"] = tab("p", (self.R, H, D)).permute(1, 0, 2).contiguous()  # [H, R, D]
            self.tables["u"] = tab("u", (H, D))
            self.tables["vb"] = tab("vb", (H, D))
        else:
            if m["aq"]:
                self.tables["aq"] = tab("aq", (self.R, H, D)).permute(1, 0, 2).contiguous()
            if m["ak"]:
                self.tables["ak"] = tab("ak", (self.R, H, D)).permute(1, 0, 2).contiguous()
            if m["bias"]:
                self.tables["bias"] = tab("bias", (self.R, H)).t().contiguous()  # [H, R]

    def first_sample(self):
        p = Problem.__new__(Problem)
        p.__dict__.update(self.__dict__)
        p.B = 1
        for n in ("q", "k", "v", "dO"):
            setattr(p, n, getattr(self, n)[:1].clone())
        return p

    def leaves(self, dtype=torch.float32, grad=True):
        ts = [self.q, self.k, self.v] + list(self.tables.values())
        return [t.to(dtype).detach().requires_grad_(grad) for t in ts]

    def flops(self):
        fwd = 4.0 * self.B * self.H * self.N**2 * self.D
        fwd += MECHANISMS[self.mech]["projections"] * 2.0 * self.B * self.H * self.N * self.R * self.D
        return fwd


# ---- the relation terms as the models build them (un-scaled; scores = tau * (qk + terms)) ----
def rel_shift(x):
    """NeMo RelPositionMultiHeadAttention.rel_shift."""
    b, h, qlen, pos_len = x.size()
    x = F.pad(x, pad=(1, 0))
    x = x.view(b, h, -1, qlen)
    return x[:, :, 1:].view(b, h, qlen, pos_len)


def txl_position_terms(p, q, tables):
    """NeMo's bd = rel_shift((q + v) p^T)[..., :N], [B, H, N, N]."""
    pt, _, vb = tables
    pos_emb = pt.flip(1)  # [H, 2N-1, D]: positions ordered L-1 .. -(L-1) (ours reversed)
    bd = torch.matmul(q + vb[None, :, None, :], pos_emb.transpose(-1, -2)[None])
    return rel_shift(bd)[:, :, :, : p.N]


def txl_mask(p, q, k, tables):
    """TXL's scores less q k^T, for the systems that add q k^T themselves (SDPA, FlexAttention):
    u.k_j, one row per (batch, head) broadcast over the queries, plus bd. The cheapest correct
    form: no N x N product beyond the one bd needs (issue 18: q.k was computed twice more)."""
    u = tables[1]
    uk = torch.matmul(u[None, :, None, :], k.transpose(-1, -2))  # [B, H, 1, N]
    return txl_position_terms(p, q, tables) + uk


def model_terms(p, q, k, tables):
    """The model's dense [B, H, N, N] relation terms (Shaw, DeBERTa, T5) or, for TXL, the NeMo
    scores (q + u) k^T + rel_shift((q + v) p^T) including the content term."""
    N = p.N
    if p.mech == "Shaw":  # HF Wav2Vec2-BERT, position_embeddings_type == "relative_key"
        aq = tables[0]  # [H, R, D]: the model's distance_embedding is per layer; ours per head
        pos = torch.arange(N)
        distance = torch.clamp(pos[:, None] - pos[None, :], -256, 256) + 256
        emb = aq[:, distance]  # [H, N, N, D]
        return torch.einsum("bhld,hlrd->bhlr", q, emb)
    if p.mech == "TXL":  # NeMo: positions ordered L-1 .. -(L-1) (ours reversed)
        u = tables[1]
        ac = torch.matmul(q + u[None, :, None, :], k.transpose(-1, -2))
        return ac + txl_position_terms(p, q, tables)
    if p.mech == "DeBERTa":  # HF DebertaV2 disentangled_att_bias, att_span = 256
        aq, ak = tables
        B, H = q.shape[0], q.shape[1]
        c2p = torch.matmul(q, aq.transpose(-1, -2)[None])  # [B, H, N, 512]
        c2p = torch.gather(c2p, -1, p.rel.expand(B, H, N, N))
        relT = p.rel.t()  # the p2c index of (j, i): clamp(-r_pos[j, i] + span) = rows of (i, j)
        p2c = torch.matmul(k, ak.transpose(-1, -2)[None])
        p2c = torch.gather(p2c, -1, relT.expand(B, H, N, N)).transpose(-1, -2)
        return c2p + p2c
    bias = tables[0]  # HF T5Attention.compute_bias: embedding(buckets) -> [1, H, N, N]
    return bias[:, p.rel][None]


def eager(p, leaves):
    q, k, v = leaves[:3]
    terms = model_terms(p, q, k, leaves[3:])
    scores = terms if p.mech == "TXL" else torch.matmul(q, k.transpose(-1, -2)) + terms
    attn = torch.softmax(scores * p.tau, dim=-1)
    return torch.matmul(attn, v)


def sdpa(p, leaves):
    q, k, v = leaves[:3]
    if p.mech == "TXL":  # SDPA adds q k^T itself: the mask carries u.k + rel_shift((q + v) p^T)
        terms = txl_mask(p, q, k, leaves[3:])
    else:
        terms = model_terms(p, q, k, leaves[3:])
    return F.scaled_dot_product_attention(q, k, v, attn_mask=terms * p.tau, scale=p.tau)


_flex = {}


def flex(p, leaves):
    from torch.nn.attention.flex_attention import flex_attention

    if "fn" not in _flex:
        _flex["fn"] = torch.compile(flex_attention, dynamic=False)
    q, k, v = leaves[:3]
    if p.mech == "T5":
        table, rows, N = leaves[3], p.rows, p.N

        def score_mod(score, b, h, qi, kj):
            return score + table[h, rows[qi - kj + N - 1]]
    else:
        if p.mech == "TXL":
            bias = txl_mask(p, q, k, leaves[3:]) * p.tau
        else:
            bias = model_terms(p, q, k, leaves[3:]) * p.tau

        def score_mod(score, b, h, qi, kj):
            return score + bias[b, h, qi, kj]
    return _flex["fn"](q, k, v, score_mod=score_mod, scale=p.tau)


SYSTEMS = {"PyTorch eager": eager, "PyTorch SDPA": sdpa, "FlexAttention": flex}
FORWARD_ONLY = {"FlexAttention"}


# ---- float64 reference: gather the relation vector of every (i, j) ---------------------------
def reference(p, leaves):
    q, k, v = leaves[:3]
    t = dict(zip(p.tables.keys(), leaves[3:]))
    s = torch.matmul(q, k.transpose(-1, -2))
    if p.mech == "TXL":
        aq, ak = t["p"], t["u"][:, None, :].expand_as(t["p"])
        bias = torch.einsum("hd,hrd->hr", t["vb"], t["p"])
    else:
        aq, ak, bias = t.get("aq"), t.get("ak"), t.get("bias")
    B, H, N = q.shape[0], q.shape[1], p.N
    idx = p.rel.expand(B, H, N, N)
    if aq is not None:
        s = s + torch.gather(torch.matmul(q, aq.transpose(-1, -2)[None]), -1, idx)
    if ak is not None:  # k_j . aK[phi(i - j)]: row of (i, j), read from key j's projections
        zk = torch.matmul(k, ak.transpose(-1, -2)[None])  # [B, H, N(j), R]
        s = s + torch.gather(zk, -1, p.rel.t().expand(B, H, N, N)).transpose(-1, -2)
    if bias is not None:
        s = s + bias[:, p.rel][None]
    return torch.matmul(torch.softmax(s * p.tau, dim=-1), v)


def rel_l2(got, ref):
    got, ref = got.detach().float().double(), ref.detach()
    den = ref.norm().item()
    err = (got - ref).norm().item()
    return err / den if den > 0 else err


def check(name, p):
    """Worst relative l2 of O and of every gradient on sample 0 against the float64 reference."""
    p1 = p.first_sample()
    ref_leaves = p1.leaves(torch.float64)
    ref = reference(p1, ref_leaves)
    ref.backward(p1.dO.double())
    if name in FORWARD_ONLY:
        with torch.no_grad():
            return rel_l2(SYSTEMS[name](p1, p1.leaves(grad=False)), ref), None
    leaves = p1.leaves()
    out = SYSTEMS[name](p1, leaves)
    fwd = rel_l2(out, ref)
    out.backward(p1.dO)
    bwd = max(rel_l2(a.grad, b.grad) for a, b in zip(leaves, ref_leaves))
    return fwd, bwd


# ---- measuring ------------------------------------------------------------------------------
_libc = ctypes.CDLL("libc.so.6")


def status_kib(key):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key):
                return int(line.split()[1])
    return -1


def peak_rss(fn):
    """(result, bytes of resident memory fn added at its peak)."""
    gc.collect()
    _libc.malloc_trim(0)
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    before = status_kib("VmRSS:")
    r = fn()
    return r, (status_kib("VmHWM:") - before) * 1024


REPEATS = 5  # timed calls after the warm-up, every system at every N (issue 18)


def measure(run, prepare):
    """Seconds of run(prepare()): a first call (warm-up, untimed for the result; it measures
    the peak memory) then the median of REPEATS timed calls, whatever their length, the same
    protocol as rag_bench_relpos; prepare() is neither timed nor counted."""
    def timed(state):
        t0 = time.perf_counter()
        run(state)
        return time.perf_counter() - t0

    state = prepare()
    _, peak = peak_rss(lambda: timed(state))
    del state
    times = sorted(timed(prepare()) for _ in range(REPEATS))
    return times[len(times) // 2], peak


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lengths", default="128,256,512,1024,2048,4096,8192")
    ap.add_argument("--tokens", type=int, default=16384)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--mechanisms", default="Shaw,TXL,DeBERTa,T5")
    ap.add_argument("--systems", default=",".join(SYSTEMS))
    ap.add_argument("--max-n", action="append", default=[], help="system=N")
    ap.add_argument("--cap-s", type=float, default=30.0)
    ap.add_argument("--max-gib", type=float, default=12.0, help="skip cells whose dense state would exceed this")
    ap.add_argument("--check-max-n", type=int, default=2048)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--json", default="")
    a = ap.parse_args()
    check_maps()
    if a.threads:
        torch.set_num_threads(a.threads)
    max_n = {k: int(v) for k, v in (x.split("=") for x in a.max_n)}
    out = open(a.json, "w") if a.json else None

    def emit(rec):
        print(f"{rec['mechanism']:8} {rec['system']:14} {rec['pass']} N={rec['N']:<5} "
              f"{rec['ms'] or float('nan'):10.1f} ms {rec['gflops'] or float('nan'):8.2f} GFLOP/s "
              f"{rec['mib'] or float('nan'):9.1f} MiB  rel_l2 {rec['rel_l2'] if rec['rel_l2'] is not None else float('nan'):.2g} "
              f"{rec['note']}", flush=True)
        if out:
            out.write(json.dumps(rec) + "\n")
            out.flush()

    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads", flush=True)
    for mech in a.mechanisms.split(","):
        last = {}
        for N in map(int, a.lengths.split(",")):
            B = max(1, a.tokens // N)
            p = Problem(mech, B, N, a.heads, a.dim)
            fwd_flop = p.flops()
            dense_gib = 4.0 * B * a.heads * N * N / 2**30
            for name in a.systems.split(","):
                rec = {"mechanism": mech, "system": name, "N": N}
                cells = [dict(rec, **{"pass": "F"}), dict(rec, **{"pass": "B"})]
                for c in cells:
                    c.update(ms=None, gflops=None, mib=None, rel_l2=None, ok=None, note="")
                skip = ""
                if name in max_n and N > max_n[name]:
                    skip = f"skipped: N > {max_n[name]}"
                elif 6 * dense_gib > a.max_gib:
                    skip = f"skipped: ~{6 * dense_gib:.0f} GiB of N x N state"
                elif 2 * last.get(name, 0) > a.cap_s:
                    skip = f"skipped: > {a.cap_s:.0f} s per call"
                if name in FORWARD_ONLY:
                    cells[1]["note"] = "unsupported on the CPU"
                if skip:
                    cells[0]["note"] = skip
                    if name not in FORWARD_ONLY:
                        cells[1]["note"] = skip
                    last[name] = math.inf
                    for c in cells:
                        emit(c)
                    continue
                fn = SYSTEMS[name]
                try:
                    if name == "FlexAttention":  # compile outside the timing
                        t0 = time.perf_counter()
                        with torch.no_grad():
                            fn(p, p.leaves(grad=False))
                        cells[0]["note"] = f"compile {time.perf_counter() - t0:.1f} s excluded"
                        with torch.no_grad():
                            ft, fm = measure(lambda st: fn(p, st), lambda: p.leaves(grad=False))
                        total = ft
                    else:
                        ft, fm = measure(lambda st: fn(p, st), lambda: p.leaves())

                        def forward():
                            leaves = p.leaves()
                            return fn(p, leaves)

                        bt, bm = measure(lambda o: o.backward(p.dO), forward)
                        cells[1].update(ms=bt * 1e3, gflops=2 * fwd_flop / bt * 1e-9, mib=bm / 2**20)
                        total = ft + bt
                    cells[0].update(ms=ft * 1e3, gflops=fwd_flop / ft * 1e-9, mib=fm / 2**20)
                    last[name] = total
                    if N <= a.check_max_n:
                        f, b = check(name, p)
                        cells[0].update(rel_l2=f, ok=f <= 1e-5)
                        if b is not None:
                            cells[1].update(rel_l2=b, ok=b <= 1e-5)
                except Exception as e:  # an unsupported case or out of memory: say so
                    msg = f"failed: {type(e).__name__}: {str(e).splitlines()[0][:120] if str(e) else ''}"
                    cells[0]["note"] = msg
                    if name not in FORWARD_ONLY:
                        cells[1]["note"] = msg
                    last[name] = math.inf
                for c in cells:
                    emit(c)
                gc.collect()
    return 0


if __name__ == "__main__":
    sys.exit(main())
