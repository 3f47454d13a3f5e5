"""The examples rewritten on the standard library compute the same losses as before, bitwise,
given the same weights: loads each example as it was at commit f0c572c (text models) or 7c1653f
(Pairformer, FCN, ViT), with its own layers, and as it is now, initialises the old params,
renames them to the new groups' fields and compares the loss of one batch. (Fresh initialisations differ: init streams are keyed by field names.)

    PYTHONPATH=build/bindings python3 bench/stdlib/equivalence.py"""
import pathlib, subprocess, tempfile
OLD = tempfile.mkdtemp()
ROOT = pathlib.Path(__file__).resolve().parents[2]
for f in ("gpt", "bert", "seq2seq", "encoder", "relpos_encoder"):
    src = subprocess.run(["git", "show", f"f0c572c:examples/{f}.rag"], cwd=ROOT, check=True,
                         capture_output=True, text=True).stdout
    pathlib.Path(OLD, f + ".rag").write_text(src)
import sys, numpy as np, rag
def flat(k):
    for a, b in [(".table", ""), (".att.", "."), (".ln1.g", ".ln1_g"), (".ln1.b", ".ln1_b"),
                 (".ln2.g", ".ln2_g"), (".ln2.b", ".ln2_b"), (".mlp.fc1.w", ".w1"), (".mlp.fc1.b", ".b1"),
                 (".mlp.fc2.w", ".w2"), (".mlp.fc2.b", ".b2")]:
        k = k.replace(a, b)
    return {"ln.g": "ln_g", "ln.b": "ln_b", "cls.w": "cls_w", "cls.b": "cls_b", "lnf.g": "lnf_g",
            "lnf.b": "lnf_b", "head.w": "head"}.get(k, k)
def s2s(k):
    k = k.replace(".table", "").replace("head.w", "head")
    import re
    m = re.match(r"(enc|dec)\.(\d+)\.(.*)", k)
    if not m: return k
    side, i, rest = m.groups()
    if side == "enc":
        rest = {"ln1.g": "att.ln_g", "ln1.b": "att.ln_b", "ln2.g": "mlp.ln_g", "ln2.b": "mlp.ln_b",
                "mlp.fc1.w": "mlp.w1", "mlp.fc1.b": "mlp.b1", "mlp.fc2.w": "mlp.w2", "mlp.fc2.b": "mlp.b2"}.get(rest, rest)
    else:
        rest = {"ln1.g": "self_att.ln_g", "ln1.b": "self_att.ln_b", "ln2.g": "cross_att.ln_g",
                "ln2.b": "cross_att.ln_b", "ln3.g": "mlp.ln_g", "ln3.b": "mlp.ln_b",
                "mlp.fc1.w": "mlp.w1", "mlp.fc1.b": "mlp.b1", "mlp.fc2.w": "mlp.w2", "mlp.fc2.b": "mlp.b2"}.get(rest, rest)
    return f"{side}.{i}.{rest}"
rng = np.random.default_rng(0)
ids = rag.ragged([rng.integers(0, 4000, n).astype(np.int32) for n in (33, 100, 7)])
tgt = rag.ragged([rng.integers(0, 4000, n).astype(np.int32) for n in (9, 41, 20)])
for name, ptype, mapf, args in [("gpt", "Gpt", flat, lambda: (ids,)), ("bert", "Bert", flat, lambda: (ids, np.array([0, 1, 1]))),
                                 ("seq2seq", "Seq2Seq", s2s, lambda: (ids, tgt))]:
    old = rag.load(f"{OLD}/{name}.rag"); new = rag.load(str(ROOT / "examples" / f"{name}.rag"))
    po = old.init(ptype, seed=0); pn = new.init(ptype, seed=0)
    pn2 = {k: np.asarray(po[mapf(k)]) for k in pn.keys()}
    a = args()
    if name == "bert":
        a = (ids, rag.tensor(np.array([0, 1, 1], np.int64), batched=True))
    lo = float(old.loss(*a, po)); ln = float(new.loss(*a, pn2))
    print(name, repr(lo), repr(ln), "bitwise" if lo == ln else f"rel diff {abs(lo-ln)/abs(lo):.2e}")
    if name == "bert":
        lo = float(old.loss_deberta(*a, po)); ln = float(new.loss_deberta(*a, pn2))
        print("bert deberta", repr(lo), repr(ln), "bitwise" if lo == ln else f"rel diff {abs(lo-ln)/abs(lo):.2e}")
def enc(k):
    k = k.replace("layer.att.", "").replace("layer.mlp.fc1.w", "w1").replace("layer.mlp.fc1.b", "b1")
    k = k.replace("layer.mlp.fc2.w", "w2").replace("layer.mlp.fc2.b", "b2").replace("layer.ln1.", "ln1_").replace("layer.ln2.", "ln2_")
    return k.replace("head.w", "head")
x = rag.ragged([rng.standard_normal((n, 64)).astype(np.float32) for n in (9, 1, 40, 17)])
lab = rag.ragged([rng.integers(0, 2, n).astype(np.int64) for n in (9, 1, 40, 17)])
for name, ptype, fn in [("encoder", "Encoder", "loss"), ("relpos_encoder", "Deberta", "loss_deberta"), ("relpos_encoder", "TransformerXL", "loss_txl")]:
    old = rag.load(f"{OLD}/{name}.rag"); new = rag.load(str(ROOT / "examples" / f"{name}.rag"))
    po = old.init(ptype, seed=0); pn = new.init(ptype, seed=0)
    pn2 = {k: np.asarray(po[enc(k)]) for k in pn.keys()}
    lo = float(getattr(old, fn)(x, lab, po)); ln = float(getattr(new, fn)(x, lab, pn2))
    print(name, ptype, repr(lo), repr(ln), "bitwise" if lo == ln else f"rel diff {abs(lo-ln)/abs(lo):.2e}")


# The Pairformer and image examples, rewritten on stdlib/pairformer.rag and stdlib/image.rag
# after 7c1653f: the same comparison against that commit's files, each new dotted field named
# from its old one by the first rename whose pattern matches.
import re
RENAMES = {
    "pairformer": [(r"\.ln\.([gb])$", r".ln_\1"), (r"\.ln_out\.([gb])$", r".lno_\1"),
                   (r"\.ln_z\.([gb])$", r".lnz_\1"), (r"\.ff\.gate$", ".wa"),
                   (r"\.ff\.up$", ".wb"), (r"\.ff\.down$", ".wo"), (r"\.([ab])_gate$", r".w\1g"),
                   (r"\.([ab])_proj$", r".w\1p"), (r"\.gate$", ".wg"), (r"\.out$", ".wo"),
                   (r"single_att\.bias$", "single_att.wz"), (r"\.bias$", ".wb")],
    "fcn": [(r"^stem\.w$", "stem"), (r"^stem\.b$", "stem_b"), (r"^cls\.w$", "cls"),
            (r"^cls\.b$", "cls_b"), (r"\.conv([12])\.([wb])$", r".\g<2>\g<1>"),
            (r"\.proj\.w$", ".proj")],
    "vit": [(r"^embed\.proj\.w$", "embed"), (r"^embed\.proj\.b$", "embed_b"),
            (r"^pos\.table$", "pos"), (r"^ln\.([gb])$", r"ln_\1"), (r"^head\.w$", "head"),
            (r"^head\.b$", "head_b"), (r"\.att\.", "."), (r"\.ln([12])\.([gb])$", r".ln\1_\2"),
            (r"\.mlp\.fc([12])\.([wb])$", r".\g<2>\g<1>")],
}


def renamer(name):
    def old(k):
        for pat, rep in RENAMES[name]:
            if re.search(pat, k):
                return re.sub(pat, rep, k)
        return k
    return old


def compare(name, ptype, rename, fn, args, commit="7c1653f", label=None, edit=None):
    src = subprocess.run(["git", "show", f"{commit}:examples/{name}.rag"], cwd=ROOT, check=True,
                         capture_output=True, text=True).stdout
    if edit:
        assert edit[0] in src, edit
        src = src.replace(*edit)
    path = pathlib.Path(OLD, f"{label or name}_{commit}.rag".replace(" ", "_"))
    path.write_text(src)
    old = rag.load(str(path)); new = rag.load(str(ROOT / "examples" / f"{name}.rag"))
    po = old.init(ptype, seed=0); pn = new.init(ptype, seed=0)
    assert sorted(rename(k) for k in pn.keys()) == sorted(po.keys()), "unmapped fields"
    # Zero-initialised fields (biases, ViT's head) get small random values, so every field
    # reaches the loss.
    po = {k: np.asarray(v) if np.asarray(v).any() else
          (rng.standard_normal(np.shape(v)) * 0.02).astype(np.float32) for k, v in po.items()}
    pn2 = {k: np.asarray(po[rename(k)]) for k in pn.keys()}
    lo = float(getattr(old, fn)(*args, po)); ln = float(getattr(new, fn)(*args, pn2))
    print(label or name, repr(lo), repr(ln),
          "bitwise" if lo == ln else f"rel diff {abs(lo-ln)/abs(lo):.2e}")


ns = (5, 3, 7)
pair = [rag.ragged([rng.standard_normal(sh).astype(np.float32) for sh in shapes])
        for shapes in ([(n, 384) for n in ns], [(n, n, 128) for n in ns], [(n, 8) for n in ns],
                       [(n, n, 8) for n in ns])]
compare("pairformer", "Pairformer", renamer("pairformer"), "loss", pair)

sizes = [(32, 48), (20, 36), (64, 24)]
imgs = rag.ragged([rng.standard_normal((3, h, w)).astype(np.float32) for h, w in sizes],
                  ragged_axes=[1, 2])
pixels = rag.ragged([rng.integers(0, 4, (h, w)).astype(np.int64) for h, w in sizes],
                    ragged_axes=[0, 1])
compare("fcn", "Fcn", renamer("fcn"), "loss", [imgs, pixels])
classes = rag.tensor(np.array([3, 0, 7], np.int64), batched=True)
# The old ViT layer added its second bias last, (x + f @ w2) + b2; the stdlib's pre-norm layer
# adds the MLP's output whole, x + (f @ w2 + b2): one rounding apart. With the old file's sum
# bracketed the stdlib's way the loss is bitwise equal.
compare("vit", "Vit", renamer("vit"), "loss", [imgs, classes])
compare("vit", "Vit", renamer("vit"), "loss", [imgs, classes], label="vit x+(mlp+b2)",
        edit=("return x + gelu(h @ l.w1 + l.b1) @ l.w2 + l.b2",
              "return x + (gelu(h @ l.w1 + l.b1) @ l.w2 + l.b2)"))
