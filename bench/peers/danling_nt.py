"""DanLing NestedTensor (the NestedTensor paper's system): python danling_nt.py DUMP [...]

The examples' programs written as on dense tensors; NestedTensor keeps each sample's extents,
so means over ragged dims and over all entries count valid entries only (checked against
loss0 of the other systems)."""
import common
import models

a = common.args()
torch = common.setup_torch(a.threads)
from danling.tensors import NestedTensor  # noqa: E402  (patches torch: its own process)

F = torch.nn.functional
man, arrays = common.load(a.dump)
case = man["case"]
p = models.params(torch, arrays)
x = NestedTensor(*models.unpad(torch, arrays["x"], man["n"]))
z = NestedTensor(*models.unpad(torch, arrays["z"], man["m"])) if "z" in arrays else None
labels = (torch.cat(models.unpad(torch, arrays["labels"], man["n"]))
          if "labels" in arrays else None)


def pair_loss(p):
    zz = z if case == "rect" else x
    pair = (x @ p["wu"])[:, :, None, :] + (zz @ p["wv"])[:, None, :, :]
    pair = pair + F.layer_norm(pair, (128,), p["ln_g"], p["ln_b"], 1e-5) @ p["wh"]
    y = x + pair.mean(dim=2) @ p["wg"]
    return (y * y).mean() + (pair * pair).mean()


def nonleading_loss(p):
    a_ = (x @ p["wu"]).transpose(1, 2)
    b_ = (x @ p["wv"]).transpose(1, 2)
    pair = a_[:, :, :, None] + b_[:, :, None, :]
    h = pair.transpose(1, 3)
    h = h + F.layer_norm(h, (128,), p["ln_g"], p["ln_b"], 1e-5) @ p["wh"]
    pair = h.transpose(1, 3)
    y = x + pair.mean(dim=3).transpose(1, 2) @ p["wg"]
    return (y * y).mean() + (pair * pair).mean()


def encoder_loss(p):
    heads = lambda t: t.unflatten(-1, (4, 16)).transpose(1, 2)
    q, k, v = heads(x @ p["wq"]), heads(x @ p["wk"]), heads(x @ p["wv"])
    att = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).flatten(-2) @ p["wo"]
    h = F.layer_norm(x + att, (64,), p["ln1_g"], p["ln1_b"], 1e-5)
    m = F.gelu(h @ p["w1"] + p["b1"]) @ p["w2"] + p["b2"]
    out = F.layer_norm(h + m, (64,), p["ln2_g"], p["ln2_b"], 1e-5)
    return F.cross_entropy((out @ p["head"]).concat, labels)


loss_fn = {"square": pair_loss, "rect": pair_loss, "nonleading": nonleading_loss,
           "encoder": encoder_loss}[case]


common.bench("danling-nt", man, a, torch, loss_fn, p, models.LR[case])
