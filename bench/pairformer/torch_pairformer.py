"""The PyTorch peer of the Pairformer benchmark, one cell in this process:
  python torch_pairformer.py PARAMS.npz --profile P --what fwd|train [--calls K] [--threads T]
Padded with masks (torch-padded): the batch as dense [B, N_max, ...] tensors, zero where padded,
and examples/pairformer.rag op for op on rag's initial params (cell.py --dump): the triangle
products see a and b multiplied by the pair mask, every attention (SDPA) adds -inf to padded
keys, the row-/column-wise dropout is rag's counter-based mask (data.shared_dropout_scale,
computed once: it is a constant of the batch), and the loss averages valid entries only. The
training step is loss, backward, clip_grad_norm_(1.0), torch AdamW (rag's adam). Prints one
JSON line (bench/text/timing.py); loss0 must equal rag's within f32 rounding."""
import argparse
import json
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "text"))
sys.path.insert(0, HERE)  # first: bench/text has a data.py too
import data  # noqa: E402
import timing  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("params")
ap.add_argument("--profile", choices=sorted(data.PROFILES), required=True)
ap.add_argument("--what", choices=["fwd", "train"], required=True)
ap.add_argument("--calls", type=int, default=5)
ap.add_argument("--budget", type=float, default=120)
ap.add_argument("--threads", type=int, default=2)
a = ap.parse_args()
torch = timing.torch_with_threads(a.threads)
F = torch.nn.functional

lengths = data.PROFILES[a.profile]
B, N = len(lengths), max(lengths)
dump = np.load(a.params)
p = {k: torch.tensor(dump[k], requires_grad=True) for k in dump.files}


def padded(xs, tail):
    out = np.zeros((B,) + (N,) * (len(xs[0].shape) - 1) + tail, np.float32)
    for b, x in enumerate(xs):
        out[(b,) + tuple(slice(0, d) for d in x.shape)] = x
    return torch.from_numpy(out)


s_in, z_in, ts_in, tz_in = data.batch(lengths)
s0, z0 = padded(s_in, (384,)), padded(z_in, (128,))
ts, tz = padded(ts_in, (8,)), padded(tz_in, (8,))
valid = torch.arange(N)[None, :] < torch.tensor(lengths)[:, None]  # [B, N]
pair = (valid[:, :, None] & valid[:, None, :]).float()[..., None]  # [B, N, N, 1]
key_bias = torch.zeros(B, N).masked_fill(~valid, float("-inf"))  # added to padded keys' logits
n_s, n_z = 8 * sum(lengths), 8 * sum(n * n for n in lengths)
# rag's fixed seeds per triangle op (examples/pairformer.rag's block), one mask per op.
drop = {seed: torch.from_numpy(data.shared_dropout_scale(lengths, 0.25, seed, axis, N, 128))
        for seed, axis in ((1, 1), (2, 1), (3, 1), (4, 2))}


def ln(x, g, b):
    return F.layer_norm(x, x.shape[-1:], g, b, 1e-5)


def tri_mul(z, m, outgoing):
    x = ln(z, m["ln.g"], m["ln.b"])
    ga = torch.sigmoid(x @ m["a_gate"]) * (x @ m["a_proj"]) * pair
    gb = torch.sigmoid(x @ m["b_gate"]) * (x @ m["b_proj"]) * pair
    t = torch.einsum("bikc,bjkc->bijc" if outgoing else "bkic,bkjc->bijc", ga, gb)
    return torch.sigmoid(x @ m["gate"]) * (ln(t, m["ln_out.g"], m["ln_out.b"]) @ m["out"])


def tri_att(x, bias, m):
    """Row r of x [B, R, J, 128]: query x[r, j] over keys x[r, k], bias[b, j, k, h]."""
    heads = lambda t: t.unflatten(-1, (4, 32)).transpose(2, 3)  # noqa: E731  [B, R, 4, J, 32]
    q, k, v = heads(x @ m["wq"]), heads(x @ m["wk"]), heads(x @ m["wv"])
    mask = (bias.permute(0, 3, 1, 2) + key_bias[:, None, None, :])[:, None]  # [B, 1, 4, J, K]
    o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask).transpose(2, 3).flatten(-2)
    return (torch.sigmoid(x @ m["gate"]) * o) @ m["wo"]


def tri_att_start(z, m):
    x = ln(z, m["ln.g"], m["ln.b"])
    return tri_att(x, x @ m["bias"], m)


def tri_att_end(z, m):  # the bias from the untransposed LN(z), read at (i, k) (AlphaFold 3)
    x = ln(z, m["ln.g"], m["ln.b"])
    return tri_att(x.transpose(1, 2), x @ m["bias"], m).transpose(1, 2)


def transition(x, t):
    x = ln(x, t["ln.g"], t["ln.b"])
    return (F.silu(x @ t["ff.gate"]) * (x @ t["ff.up"])) @ t["ff.down"]


def single_att(s, z, m):
    x = ln(s, m["ln.g"], m["ln.b"])
    bias = ln(z, m["ln_z.g"], m["ln_z.b"]) @ m["bias"]  # [B, N, N, 16]
    heads = lambda t: t.unflatten(-1, (16, 24)).transpose(1, 2)  # noqa: E731  [B, 16, N, 24]
    q, k, v = heads(x @ m["wq"]), heads(x @ m["wk"]), heads(x @ m["wv"])
    mask = bias.permute(0, 3, 1, 2) + key_bias[:, None, None, :]
    o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask).transpose(1, 2).flatten(-2)
    return (torch.sigmoid(x @ m["gate"]) * o) @ m["wo"]


def group(prefix):
    return {k[len(prefix):]: v for k, v in p.items() if k.startswith(prefix)}


BLOCKS = [{part: group(f"blocks.{i}.{part}.") for part in
           ("mul_out", "mul_in", "att_start", "att_end", "pair", "single_att", "single")}
          for i in range(4)]


def block(s, z, l):
    z = z + tri_mul(z, l["mul_out"], True) * drop[1]
    z = z + tri_mul(z, l["mul_in"], False) * drop[2]
    z = z + tri_att_start(z, l["att_start"]) * drop[3]
    z = z + tri_att_end(z, l["att_end"]) * drop[4]
    z = z + transition(z, l["pair"])
    s = s + single_att(s, z, l["single_att"])
    return s + transition(s, l["single"]), z


def loss_fn():
    s, z = s0, z0
    for l in BLOCKS:
        s, z = block(s, z, l)
    es = (s @ p["out_s"] - ts) * valid[..., None]
    ez = (z @ p["out_z"] - tz) * pair
    return (es * es).sum() / n_s + (ez * ez).sum() / n_z


opt = torch.optim.AdamW(p.values(), lr=1e-4, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)


def fwd():
    with torch.no_grad():
        return loss_fn().item()


def train():  # AdamW updates p in place; rag's cell drops the update: the same work per call
    loss = loss_fn()
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(p.values(), 1.0)
    opt.step()
    return loss.item()


r = timing.measure(fwd if a.what == "fwd" else train, a.calls, a.budget)
r.update(system="torch padded", profile=a.profile, what=a.what, lengths=lengths,
         rho_pair=data.rho_pair(lengths))
print(json.dumps(r))
