"""Dense float64 NumPy references for the image ops, one image (C, H, W) at a time, written from
PyTorch's definitions (output lengths floor((H + 2p - d (k - 1) - 1) / s) + 1, here 0 when the
image is smaller than the kernel)."""
import numpy as np


def out_len(n, k, s, lo, hi, d=1):
    span = n + lo + hi - d * (k - 1)
    return 0 if span <= 0 else (span - 1) // s + 1


def conv2d(x, w, b=None, stride=(1, 1), pad=(0, 0, 0, 0), dil=(1, 1), groups=1):
    """x (Cin, H, W), w (Cout, Cin/groups, kh, kw), pad (top, bottom, left, right)."""
    cin, h, wd = x.shape
    cout, cig, kh, kw = w.shape
    cog = cout // groups
    xp = np.zeros((cin, h + pad[0] + pad[1], wd + pad[2] + pad[3]))
    xp[:, pad[0]:pad[0] + h, pad[2]:pad[2] + wd] = x
    ho = out_len(h, kh, stride[0], pad[0], pad[1], dil[0])
    wo = out_len(wd, kw, stride[1], pad[2], pad[3], dil[1])
    y = np.zeros((cout, ho, wo))
    for co in range(cout):
        g = co // cog
        for oy in range(ho):
            for ox in range(wo):
                acc = 0.0 if b is None else b[co]
                for ky in range(kh):
                    for kx in range(kw):
                        iy, ix = oy * stride[0] + ky * dil[0], ox * stride[1] + kx * dil[1]
                        acc += xp[g * cig:(g + 1) * cig, iy, ix] @ w[co, :, ky, kx]
                y[co, oy, ox] = acc
    return y


def max_pool2d(x, k, s, p):
    c, h, w = x.shape
    ho, wo = out_len(h, k[0], s[0], p[0], p[0]), out_len(w, k[1], s[1], p[1], p[1])
    y = np.full((c, ho, wo), -np.inf)
    for oy in range(ho):
        for ox in range(wo):
            y0, x0 = oy * s[0] - p[0], ox * s[1] - p[1]
            win = x[:, max(y0, 0):y0 + k[0], max(x0, 0):x0 + k[1]].reshape(c, -1)
            has_nan = np.isnan(win).any(axis=1)
            y[:, oy, ox] = np.where(has_nan, np.nan, win.max(axis=1, initial=-np.inf))
    return y


def avg_pool2d(x, k, s, p):
    c, h, w = x.shape
    xp = np.zeros((c, h + 2 * p[0], w + 2 * p[1]))
    xp[:, p[0]:p[0] + h, p[1]:p[1] + w] = x
    ho, wo = out_len(h, k[0], s[0], p[0], p[0]), out_len(w, k[1], s[1], p[1], p[1])
    y = np.zeros((c, ho, wo))
    for oy in range(ho):
        for ox in range(wo):
            y[:, oy, ox] = xp[:, oy * s[0]:oy * s[0] + k[0], ox * s[1]:ox * s[1] + k[1]].mean(
                axis=(1, 2))
    return y


def upsample2d(x, m):
    return x.repeat(m, axis=1).repeat(m, axis=2)


def patches(x, p):
    c, h, w = x.shape
    ph, pw = h // p, w // p
    x = x[:, :ph * p, :pw * p].reshape(c, ph, p, pw, p)
    return x.transpose(1, 3, 0, 2, 4).reshape(ph * pw, c * p * p)
