"""The peers on the text benchmark, each in its own process:
  python torch_text.py SYSTEM DUMP.npz MODEL PROFILE [--calls K] [--budget S] [--threads T]
SYSTEM: torch-padded (dense [B, N_max] with masks: SDPA with a key-padding mask, GPT with
causal & key-padding), torch-nested (torch.nested jagged layout), danling-nt (DanLing
NestedTensor). Same math as examples/bert.rag and examples/gpt.rag, op for op, on rag's initial
params from DUMP; the training step is loss, backward, clip_grad_norm_(1.0), torch AdamW.
A system that cannot express a step prints the error it raised."""
import argparse
import json
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import data  # noqa: E402
import timing  # noqa: E402
from models import LR, MODELS  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("system", choices=["torch-padded", "torch-nested", "danling-nt"])
ap.add_argument("dump")
ap.add_argument("model", choices=sorted(MODELS))
ap.add_argument("profile")
ap.add_argument("--calls", type=int, default=5)
ap.add_argument("--budget", type=float, default=60.0)
ap.add_argument("--threads", type=int, default=2)
ap.add_argument("--only", choices=["fwd", "train"])
a = ap.parse_args()
torch = timing.torch_with_threads(a.threads)
F = torch.nn.functional
if a.system == "danling-nt":
    from danling.tensors import NestedTensor  # patches torch: its own process
cfg = MODELS[a.model]
z = np.load(a.dump)
n = z["n"]
B, H = len(n), cfg["heads"]
# examples/*.rag build on the standard library's groups (`layers.0.att.wq`, `tok.table`);
# bench/text/bert_small.rag keeps flat fields (`layers.0.wq`, `tok`). One spelling here.
FLAT = [(".att.", "."), (".ln1.g", ".ln1_g"), (".ln1.b", ".ln1_b"), (".ln2.g", ".ln2_g"),
        (".ln2.b", ".ln2_b"), (".mlp.fc1.w", ".w1"), (".mlp.fc1.b", ".b1"), (".mlp.fc2.w", ".w2"),
        (".mlp.fc2.b", ".b2")]
TOP = {"tok.table": "tok", "pos.table": "pos", "ln.g": "ln_g", "ln.b": "ln_b", "cls.w": "cls_w",
       "cls.b": "cls_b", "lnf.g": "lnf_g", "lnf.b": "lnf_b", "head.w": "head"}


def flat_name(k):
    for a, b in FLAT:
        k = k.replace(a, b)
    return TOP.get(k, k)


p = {flat_name(k[2:]): torch.tensor(z[k], requires_grad=True)
     for k in z.files if k.startswith("p.")}
ids_pad = torch.tensor(z["ids"]).long()
labels = torch.tensor(z["labels"])
causal = cfg["causal"]
# GPT: inputs ids[:, :-1], targets ids[:, 1:] (rag slices the ragged axis; here the host does).
lens = torch.tensor(n - 1 if causal else n)
inp = [ids_pad[b, : int(n[b]) - (1 if causal else 0)] for b in range(B)]
tgt = [ids_pad[b, 1: int(n[b])] for b in range(B)] if causal else None


def ln(x, g, b):
    return F.layer_norm(x, x.shape[-1:], g, b, 1e-5)


def bert_layer(x, i, att):
    q = lambda k: p[f"layers.{i}.{k}"]  # noqa: E731
    h = ln(x + att(x, q("wq"), q("wk"), q("wv")) @ q("wo"), q("ln1_g"), q("ln1_b"))
    f = F.gelu(h @ q("w1") + q("b1")) @ q("w2") + q("b2")
    return ln(h + f, q("ln2_g"), q("ln2_b"))


def gpt_block(x, i, att):
    q = lambda k: p[f"blocks.{i}.{k}"]  # noqa: E731
    h = ln(x, q("ln1_g"), q("ln1_b"))
    x = x + att(h, q("wq"), q("wk"), q("wv")) @ q("wo")
    h = ln(x, q("ln2_g"), q("ln2_b"))
    return x + F.gelu(h @ q("w1") + q("b1")) @ q("w2") + q("b2")


def padded_loss():
    N = int(lens.max())
    ids = torch.zeros(B, N, dtype=torch.long)
    for b, t in enumerate(inp):
        ids[b, : len(t)] = t
    valid = torch.arange(N)[None, :] < lens[:, None]            # [B, N]
    mask = valid[:, None, None, :]                                # keys of each sample
    if causal:
        mask = mask & torch.ones(N, N, dtype=torch.bool).tril()[None, None]
    C = p["tok"].shape[1]

    def att(x, wq, wk, wv):
        hd = lambda t: t.view(B, N, H, C // H).transpose(1, 2)  # noqa: E731
        o = F.scaled_dot_product_attention(hd(x @ wq), hd(x @ wk), hd(x @ wv), attn_mask=mask)
        return o.transpose(1, 2).reshape(B, N, C)

    x = p["tok"][ids] + p["pos"][:N][None]
    if causal:
        for i in range(cfg["layers"]):
            x = gpt_block(x, i, att)
        logits = ln(x, p["lnf_g"], p["lnf_b"]) @ p["head"]
        t = torch.zeros(B, N, dtype=torch.long)
        for b, tt in enumerate(tgt):
            t[b, : len(tt)] = tt
        ce = F.cross_entropy(logits.reshape(B * N, -1), t.reshape(-1), reduction="none")
        return (ce * valid.reshape(-1)).sum() / valid.sum()
    x = ln(x, p["ln_g"], p["ln_b"])
    for i in range(cfg["layers"]):
        x = bert_layer(x, i, att)
    pooled = (x * valid[..., None]).sum(1) / lens[:, None]
    return F.cross_entropy(pooled @ p["cls_w"] + p["cls_b"], labels)


def nested_loss(make):
    """The same model on a nested tensor type: make(list of [n_b, C] tensors) -> nested."""
    x = make(p["tok"][flat_ids] + p["pos"][flat_pos])
    C = p["tok"].shape[1]

    def att(x, wq, wk, wv):
        hd = lambda t: t.unflatten(-1, (H, C // H)).transpose(1, 2)  # noqa: E731
        o = F.scaled_dot_product_attention(hd(x @ wq), hd(x @ wk), hd(x @ wv), is_causal=causal)
        return o.transpose(1, 2).flatten(-2)

    if causal:
        for i in range(cfg["layers"]):
            x = gpt_block(x, i, att)
        logits = ln(x, p["lnf_g"], p["lnf_b"]) @ p["head"]
        return F.cross_entropy(packed(logits), torch.cat(tgt))
    x = ln(x, p["ln_g"], p["ln_b"])
    for i in range(cfg["layers"]):
        x = bert_layer(x, i, att)
    return F.cross_entropy(pooled_mean(x) @ p["cls_w"] + p["cls_b"], labels)


flat_ids = torch.cat(inp)
flat_pos = torch.cat([torch.arange(len(t)) for t in inp])
segment = torch.repeat_interleave(torch.arange(B), lens)
offsets = torch.cat([torch.zeros(1, dtype=torch.long), lens.cumsum(0)])


def packed(x):
    return x.values() if a.system == "torch-nested" else x.concat


def pooled_mean(x):  # the mean over each sample's valid tokens
    if a.system == "danling-nt":
        return x.mean(dim=1)
    # jagged x.mean(dim=1) runs forward, but its backward raises (SymIntArrayRef ...): sum the
    # packed rows per sample instead
    v = x.values()
    return torch.zeros(B, v.shape[1]).index_add(0, segment, v) / lens[:, None]


if a.system == "torch-padded":
    loss_fn = padded_loss
elif a.system == "torch-nested":
    loss_fn = lambda: nested_loss(  # noqa: E731
        lambda v: torch.nested.nested_tensor_from_jagged(v, offsets))
else:  # DanLing takes the samples
    loss_fn = lambda: nested_loss(  # noqa: E731
        lambda v: NestedTensor(*v.split(lens.tolist())))
opt = torch.optim.AdamW(p.values(), lr=LR, betas=(0.9, cfg["b2"]), eps=1e-8,
                        weight_decay=cfg["wd"])


def fwd():
    with torch.no_grad():
        return loss_fn().item()


def train():
    loss = loss_fn()
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(p.values(), 1.0)
    opt.step()
    return loss.item()


base = dict(model=a.model, profile=a.profile, system=a.system, threads=a.threads,
            **data.occupancy(n))
for is_fwd, step in ((True, fwd), (False, train)):
    if a.only and a.only != ("fwd" if is_fwd else "train"):
        continue
    try:
        r = timing.measure(step, a.calls, a.budget)
    except Exception as e:  # not expressible: record why
        msg = str(e).splitlines()[0][:200] if str(e) else ""
        if causal and "No viable backend" in msg:  # what torch logs as the reason
            msg += " (torch: jagged SDPA has no CPU kernel with is_causal=True)"
        r = {"error": f"{type(e).__name__}: {msg}"}
    print(json.dumps(dict(base, fwd=is_fwd, **r)), flush=True)
