"""PyTorch padded on the image benchmark, the same math as examples/fcn.rag and vit.rag from
rag's initial params: python3 torch_images.py MODEL DUMP.npz PROFILE [--calls K] [--budget S]
[--threads T] [--channels-last | --danling]. Images are padded to the batch's envelope; every
activation is multiplied by its resolution's mask, so convolutions read zeros outside each
image as rag's do, and the losses average over valid pixels (FCN) or pool over valid tokens
(ViT). --danling runs the FCN on DanLing's NestedTensor instead (no padding: each image its own
tensor; DanLing's CPU path runs every convolution but 1 x 1 image by image); it has no patches
op, so the ViT does not run on it."""
import argparse
import json
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "text"))
import image_data as data  # noqa: E402
import timing  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("model", choices=["fcn", "vit"])
ap.add_argument("dump")
ap.add_argument("profile")
ap.add_argument("--calls", type=int, default=5)
ap.add_argument("--budget", type=float, default=60.0)
ap.add_argument("--threads", type=int, default=2)
ap.add_argument("--channels-last", action="store_true")
ap.add_argument("--danling", action="store_true")
a = ap.parse_args()
if a.danling:
    if a.model != "fcn":
        sys.exit("torch_images.py: DanLing has no patches op; only the FCN runs on it")
    from danling.tensors import NestedTensor  # patches torch: its own process
torch.set_num_threads(a.threads)
torch.set_flush_denormal(True)  # the same speed whatever tiny values the init makes
d = np.load(a.dump)
P = {k[2:]: torch.tensor(d[k], requires_grad=True) for k in d.files if k.startswith("p.")}
hw = [tuple(int(v) for v in r) for r in d["hw"]]
x = torch.tensor(d["x"])
fmt = torch.channels_last if a.channels_last else torch.contiguous_format
x = x.contiguous(memory_format=fmt)


def masks(div):  # [B, 1, ceil(Hm / div), ceil(Wm / div)]: valid rows ceil(h / div)
    hm, wm = -(-x.shape[2] // div), -(-x.shape[3] // div)
    m = torch.zeros(len(hw), 1, hm, wm)
    for b, (h, w) in enumerate(hw):
        m[b, :, :-(-h // div), :-(-w // div)] = 1
    return m.contiguous(memory_format=fmt)


if a.model == "fcn":
    pix = torch.tensor(d["pix"])
    m2, m4 = masks(2), masks(4)

    def logits_of(x, m2=None, m4=None):
        """The FCN's class scores; m2 and m4 (padded runs) zero each resolution's padding."""
        def conv(t, name, **kw):
            return F.conv2d(t, P[name + ".w"], P.get(name + ".b"), **kw)

        def masked(t, m):
            return t if m is None else t * m
        h = masked(F.relu(conv(x, "stem", stride=2, padding=1)), m2)
        t = masked(F.relu(conv(h, "block.conv1", padding=1)), m2)
        h = masked(F.relu(h + conv(t, "block.conv2", padding=1)), m2)
        t = masked(F.relu(conv(h, "down.conv1", stride=2, padding=1)), m4)
        h = masked(F.relu(conv(h, "down.proj", stride=2) + conv(t, "down.conv2", padding=1)), m4)
        return F.interpolate(conv(h, "cls"), scale_factor=4, mode="nearest")

    if a.danling:  # the same layers on unpadded images; the loss over the valid pixels
        xn = NestedTensor([x[b, :, :h, :w] for b, (h, w) in enumerate(hw)])
        pix_n = torch.cat([pix[b, :-(-h // 4) * 4, :-(-w // 4) * 4].reshape(-1)
                           for b, (h, w) in enumerate(hw)])

        def loss_fn():
            z = torch.cat([t.permute(1, 2, 0).reshape(-1, t.shape[0]) for t in logits_of(xn)])
            return F.cross_entropy(z, pix_n)
    else:
        def loss_fn():
            return F.cross_entropy(logits_of(x, m2, m4), pix, ignore_index=-100)
    opt = torch.optim.AdamW(P.values(), lr=1e-2, weight_decay=0.0)
    clip = None
else:
    cls = torch.tensor(d["cls"])
    gw = [w // 16 for _, w in hw]
    n = [(h // 16) * (w // 16) for h, w in hw]
    pmax, grid_w = max(n), x.shape[3] // 16
    idx = torch.zeros(len(hw), pmax, dtype=torch.long)
    valid = torch.zeros(len(hw), pmax, dtype=torch.bool)
    for b in range(len(hw)):
        j = torch.arange(n[b])
        idx[b, :n[b]] = (j // gw[b]) * grid_w + j % gw[b]
        valid[b, :n[b]] = True
    keep = valid[:, None, None, :]
    vf = valid[..., None].float()

    def heads(t, w):
        return (t @ w).view(t.shape[0], t.shape[1], 2, 32).transpose(1, 2)

    def loss_fn():
        t = F.unfold(x, 16, stride=16).transpose(1, 2)         # [B, grid, 768]: c, row, col
        t = torch.gather(t, 1, idx[..., None].expand(-1, -1, t.shape[2]))
        t = t @ P["embed.proj.w"] + P["embed.proj.b"] + P["pos.table"][:pmax]
        for i in range(2):
            L = {k: P[f"layers.{i}.{v}"] for k, v in (  # stdlib's TransformerLayer fields
                ("ln1_g", "ln1.g"), ("ln1_b", "ln1.b"), ("wq", "att.wq"), ("wk", "att.wk"),
                ("wv", "att.wv"), ("wo", "att.wo"), ("ln2_g", "ln2.g"), ("ln2_b", "ln2.b"),
                ("w1", "mlp.fc1.w"), ("b1", "mlp.fc1.b"), ("w2", "mlp.fc2.w"), ("b2", "mlp.fc2.b"))}
            h = F.layer_norm(t, (64,), L["ln1_g"], L["ln1_b"])
            o = F.scaled_dot_product_attention(heads(h, L["wq"]), heads(h, L["wk"]),
                                               heads(h, L["wv"]), attn_mask=keep)
            t = t + o.transpose(1, 2).reshape(t.shape) @ L["wo"]
            h = F.layer_norm(t, (64,), L["ln2_g"], L["ln2_b"])
            t = t + (F.gelu(h @ L["w1"] + L["b1"]) @ L["w2"] + L["b2"])
        h = F.layer_norm(t, (64,), P["ln.g"], P["ln.b"])
        pooled = (h * vf).sum(1) / vf.sum(1)
        return F.cross_entropy(pooled @ P["head.w"] + P["head.b"], cls)
    opt = torch.optim.AdamW(P.values(), lr=1e-3, weight_decay=0.01)
    clip = 1.0


def fwd():
    with torch.no_grad():
        return loss_fn().item()


def train():
    opt.zero_grad(set_to_none=True)
    loss = loss_fn()
    loss.backward()
    if clip:
        torch.nn.utils.clip_grad_norm_(P.values(), clip)
    opt.step()
    return loss.item()


system = "danling-nt" if a.danling else "torch-padded" + ("-channels-last" if a.channels_last else "")
base = dict(model=a.model, profile=a.profile, system=system, threads=a.threads,
            **data.occupancy(hw))
for is_fwd, step in ((True, fwd), (False, train)):
    r = timing.measure(step, a.calls, a.budget)
    print(json.dumps(dict(base, fwd=is_fwd, **r)), flush=True)
