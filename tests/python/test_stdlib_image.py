"""The standard library's image layers (stdlib/image.rag) on ragged batches of images of their
own sizes (odd, even, one narrower than a 3 x 3 kernel's padding), each against a per-image
NumPy float64 reference (image_ref.py), and their gradients (every parameter and the images)
against float64 central differences of it (the machinery of test_stdlib.py)."""
import numpy as np
import rag

import image_ref as ref
from test_stdlib import batch, layer_tests


def relu(x):
    return np.maximum(x, 0)


def conv(x, p, pre, k, stride=1, bias=True):
    pad = (k - 1) // 2
    return ref.conv2d(x, p[pre + "w"], p[pre + "b"] if bias else None, stride=(stride, stride),
                      pad=(pad,) * 4)


def resblock(x, p):
    return relu(x + conv(relu(conv(x, p, "conv1.", 3)), p, "conv2.", 3))


def resblock_down(x, p):
    h = relu(conv(x, p, "conv1.", 3, 2))
    return relu(conv(x, p, "proj.", 1, 2, bias=False) + conv(h, p, "conv2.", 3))


X3, X2 = ("x", "f32[B, 3, ~H, ~W]"), ("x", "f32[B, 2, ~H, ~W]")
SAME, DOWN = "f32[B, 2, ~H, ~W]", "f32[B, 2, ~H[::2], ~W[::2]]"
LAYERS = {
    "conv2d_same": ("conv2d_same(x, p)", "Conv2d[3, 2, 3]", [X3], SAME,
                    lambda i, p: conv(i["x"], p, "", 3)),
    "conv2d_same 5x5": ("conv2d_same(x, p)", "Conv2d[3, 2, 5]", [X3], SAME,
                        lambda i, p: conv(i["x"], p, "", 5)),
    "conv2d_down": ("conv2d_down(x, p)", "Conv2d[3, 2, 3]", [X3], DOWN,
                    lambda i, p: conv(i["x"], p, "", 3, 2)),
    "conv2d_nobias_same": ("conv2d_nobias_same(x, p)", "Conv2dNoBias[3, 2, 1]", [X3], SAME,
                           lambda i, p: conv(i["x"], p, "", 1, bias=False)),
    "conv2d_nobias_down": ("conv2d_nobias_down(x, p)", "Conv2dNoBias[3, 2, 3]", [X3], DOWN,
                           lambda i, p: conv(i["x"], p, "", 3, 2, bias=False)),
    "resblock": ("resblock(x, p)", "ResBlock[2]", [X2], SAME, lambda i, p: resblock(i["x"], p)),
    "resblock_down": ("resblock_down(x, p)", "ResBlockDown[3, 2]", [X3], DOWN,
                      lambda i, p: resblock_down(i["x"], p)),
    # The patch axis cannot be written in a type (a fresh name in a result type only), so the
    # table's loss reads it through a per-sample sum of squares; test_patch_embed_per_token
    # checks every token.
    "patch_embed": ("sum(patch_embed(x, p) * patch_embed(x, p), axis=1)", "PatchEmbed[12, 4, 2]",
                    [X3], "f32[B, 4]", lambda i, p: (patch_embed(i["x"], p) ** 2).sum(0)),
}


def patch_embed(x, p):
    return ref.patches(x, 2) @ p["proj.w"] + p["proj.b"]


case, test_forward_matches_float64_reference, test_gradients_match_float64_finite_differences = \
    layer_tests(LAYERS)


def test_patch_embed_per_token():
    m = rag.compile("fn run(x: f32[B, 3, ~H, ~W], p: PatchEmbed[12, 4, 2]) -> f32[B, ~T, 4] {\n"
                    "    return patch_embed(x, p)\n}", "patch_embed.rag")
    rng = np.random.default_rng(0)
    xs = [rng.standard_normal(shape) for shape in ((3, 5, 3), (3, 4, 6), (3, 7, 4), (3, 1, 8))]
    p = {k: rng.standard_normal(v.shape) for k, v in m.init("PatchEmbed[12, 4, 2]").items()}
    got = m.run(batch(xs, "f32[B, 3, ~H, ~W]"), {k: v.astype(np.float32) for k, v in p.items()})
    for g, x in zip(got.to_list(), xs):
        np.testing.assert_allclose(g, patch_embed(x, p), rtol=2e-5, atol=2e-5)
