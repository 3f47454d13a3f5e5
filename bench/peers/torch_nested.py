"""PyTorch torch.nested, jagged layout (one ragged dim): python torch_nested.py DUMP [...]

The encoder runs on nested tensors (linear, layer_norm, gelu on packed values; SDPA on the
jagged layout). The pair programs need a state with two ragged dims (B, j, j, C), which the
jagged layout cannot hold: the script tries the broadcast and reports the error it raises."""
import common
import models

a = common.args()
torch = common.setup_torch(a.threads)
F = torch.nn.functional
man, arrays = common.load(a.dump)
case = man["case"]
p = models.params(torch, arrays)
nt = lambda ts: torch.nested.nested_tensor(ts, layout=torch.jagged)
x = nt(models.unpad(torch, arrays["x"], man["n"]))


def encoder_loss(p):
    heads = lambda t: t.unflatten(-1, (4, 16)).transpose(1, 2)   # [B, 4, j, 16]
    q, k, v = heads(x @ p["wq"]), heads(x @ p["wk"]), heads(x @ p["wv"])
    att = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).flatten(-2) @ p["wo"]
    h = F.layer_norm(x + att, (64,), p["ln1_g"], p["ln1_b"], 1e-5)
    m = F.gelu(h @ p["w1"] + p["b1"]) @ p["w2"] + p["b2"]
    out = F.layer_norm(h + m, (64,), p["ln2_g"], p["ln2_b"], 1e-5)
    return F.cross_entropy((out @ p["head"]).values(), labels)


def pair_loss(p):
    zz = nt(models.unpad(torch, arrays["z"], man["m"])) if case == "rect" else x
    return ((x @ p["wu"]).unsqueeze(2) + (zz @ p["wv"]).unsqueeze(1)).values().square().mean()


if case == "encoder":
    labels = torch.cat(models.unpad(torch, arrays["labels"], man["n"]))
    loss_fn = encoder_loss
else:
    loss_fn = pair_loss


common.bench("torch-nested", man, a, torch, loss_fn, p, models.LR[case])
