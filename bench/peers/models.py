"""The examples' programs (examples/single_pair_single.rag, examples/encoder.rag) in PyTorch,
op for op, written against a small backend so that padded tensors with masks and nested
tensors share them. Means over ragged axes count valid entries only, as rag's do."""
import math

LR = {"square": 0.01, "rect": 0.01, "nonleading": 0.01, "encoder": 0.1}


# examples/encoder.rag builds on the standard library (`layer.att.wq`, `layer.ln1.g`,
# `layer.mlp.fc1.w`, `head.w`); the losses below use the flat names (`wq`, `ln1_g`, `w1`).
FLAT = [("layer.att.", ""), ("layer.mlp.fc1.w", "w1"), ("layer.mlp.fc1.b", "b1"),
        ("layer.mlp.fc2.w", "w2"), ("layer.mlp.fc2.b", "b2"), ("layer.ln1.", "ln1_"),
        ("layer.ln2.", "ln2_"), ("head.w", "head")]


def flat_name(k):
    for a, b in FLAT:
        if k.startswith(a):
            return b + k[len(a):]
    return k


def params(torch, arrays):
    return {flat_name(k[2:]): torch.tensor(v, requires_grad=True) for k, v in arrays.items()
            if k.startswith("p.")}


def sgd(torch, p, lr):
    with torch.no_grad():
        for t in p.values():
            t -= lr * t.grad
            t.grad = None


class Padded:
    """Dense [B, N_max, ...] tensors with float masks: the baseline padded frameworks run."""

    def __init__(self, torch, man, arrays):
        F = torch.nn.functional
        self.torch, self.F = torch, F
        B = len(man["n"])
        self.x = torch.tensor(arrays["x"])
        self.z = torch.tensor(arrays["z"]) if "z" in arrays else None
        self.labels = torch.tensor(arrays["labels"]) if "labels" in arrays else None
        nmax = self.x.shape[1]
        mmax = self.z.shape[1] if self.z is not None else nmax
        n = torch.tensor(man["n"])
        m = torch.tensor(man["m"])
        self.mn = (torch.arange(nmax)[None, :] < n[:, None]).float()  # [B, N]
        self.mm = (torch.arange(mmax)[None, :] < m[:, None]).float()  # [B, M]
        self.n, self.m = n.float(), m.float()
        self.B = B

    def pair_loss(self, p, rect=False):
        torch, F = self.torch, self.F
        x = self.x
        z = self.z if rect else x
        mk = self.mm if rect else self.mn           # mask of the reduced (second) pair axis
        nk = self.m if rect else self.n
        pair = (x @ p["wu"])[:, :, None, :] + (z @ p["wv"])[:, None, :, :]
        pair = pair + F.layer_norm(pair, (128,), p["ln_g"], p["ln_b"], 1e-5) @ p["wh"]
        red = (pair * mk[:, None, :, None]).sum(2) / nk.clamp(min=1)[:, None, None]
        y = x + red @ p["wg"]
        mq = self.mn
        y2 = (y * y * mq[:, :, None]).sum() / (mq.sum() * 384)
        pm = mq[:, :, None, None] * mk[:, None, :, None]
        p2 = (pair * pair * pm).sum() / ((self.n * nk).sum() * 128)
        return y2 + p2

    def nonleading_loss(self, p):
        F = self.F
        x, mn, n = self.x, self.mn, self.n
        a = (x @ p["wu"]).transpose(1, 2)           # [B, 128, N]
        b = (x @ p["wv"]).transpose(1, 2)
        pair = a[:, :, :, None] + b[:, :, None, :]   # [B, 128, N, N]
        h = pair.transpose(1, 3)                     # [B, N, N, 128]
        h = h + F.layer_norm(h, (128,), p["ln_g"], p["ln_b"], 1e-5) @ p["wh"]
        pair = h.transpose(1, 3)
        red = (pair * mn[:, None, None, :]).sum(3) / n.clamp(min=1)[:, None, None]
        y = x + red.transpose(1, 2) @ p["wg"]
        y2 = (y * y * mn[:, :, None]).sum() / (mn.sum() * 384)
        pm = mn[:, None, :, None] * mn[:, None, None, :]
        p2 = (pair * pair * pm).sum() / ((n * n).sum() * 128)
        return y2 + p2

    def encoder_loss(self, p):
        torch, F = self.torch, self.F
        x, mn = self.x, self.mn
        B, N, _ = x.shape
        heads = lambda t: t.view(B, N, 4, 16).transpose(1, 2)
        q, k, v = heads(x @ p["wq"]), heads(x @ p["wk"]), heads(x @ p["wv"])
        mask = mn.bool()[:, None, None, :]           # keys of each sample
        att = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        att = att.transpose(1, 2).reshape(B, N, 64) @ p["wo"]
        h = F.layer_norm(x + att, (64,), p["ln1_g"], p["ln1_b"], 1e-5)
        m = F.gelu(h @ p["w1"] + p["b1"]) @ p["w2"] + p["b2"]
        out = F.layer_norm(h + m, (64,), p["ln2_g"], p["ln2_b"], 1e-5)
        logits = out @ p["head"]
        ce = F.cross_entropy(logits.reshape(-1, 2), self.labels.reshape(-1), reduction="none")
        return (ce * mn.reshape(-1)).sum() / mn.sum()

    def loss(self, case, p):
        if case == "square":
            return self.pair_loss(p)
        if case == "rect":
            return self.pair_loss(p, rect=True)
        if case == "nonleading":
            return self.nonleading_loss(p)
        return self.encoder_loss(p)


def unpad(torch, padded, lengths):
    return [torch.tensor(padded[i, :n]) for i, n in enumerate(lengths)]
