"""Image batches for the image benchmark: B = 8 images with sides that are multiples of 16
(so FCN's labels cover its output and ViT's patches tile each image), aspect ratios 1:2 to
2:1. near_uniform: sides 96-112 (rho_image ~0.85); variable: sides 32-224 (rho_image ~0.3)."""
import numpy as np

B = 8
PROFILES = {"near_uniform": (96, 112), "variable": (32, 224)}


def sizes(profile, seed=0):
    lo, hi = PROFILES[profile]
    rng = np.random.default_rng(seed)
    out = []
    while len(out) < B:
        h, w = (int(v) * 16 for v in rng.integers(lo // 16, hi // 16 + 1, 2))
        if 0.5 <= h / w <= 2:
            out.append((h, w))
    return out


def batch(profile, seed=0):
    """Images (3, h, w) f32, per-pixel labels (h, w) in [0, 4), one label per image in [0, 10)."""
    rng = np.random.default_rng(seed + 1)
    hw = sizes(profile, seed)
    xs = [rng.standard_normal((3, h, w)).astype(np.float32) for h, w in hw]
    pix = [rng.integers(0, 4, (h, w)).astype(np.int64) for h, w in hw]
    cls = rng.integers(0, 10, B).astype(np.int64)
    return hw, xs, pix, cls


def occupancy(hw):
    hm, wm = max(h for h, _ in hw), max(w for _, w in hw)
    return {"rho_image": round(sum(h * w for h, w in hw) / (len(hw) * hm * wm), 3),
            "pixels": sum(h * w for h, w in hw), "envelope": [hm, wm]}
