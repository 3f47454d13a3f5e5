"""The Pairformer benchmark's batch (numpy only), shared by rag's cell and the PyTorch peer so
both see the same arrays: per sample s [N, 384], z [N, N, 128] and the targets ts [N, 8],
tz [N, N, 8], drawn from one generator in one order."""
import numpy as np

PROFILES = {  # B = 8; pair occupancy rho = sum N_b^2 / (B N_max^2)
    "uniform": [46, 48, 45, 47, 48, 44, 46, 48],
    "variable": [8, 12, 16, 20, 24, 28, 36, 48],
}


def batch(lengths):
    """(s, z, ts, tz): four lists of per-sample float32 arrays."""
    rng = np.random.default_rng(0)
    s = [rng.standard_normal((n, 384)).astype(np.float32) for n in lengths]
    z = [rng.standard_normal((n, n, 128)).astype(np.float32) for n in lengths]
    ts = [rng.standard_normal((n, 8)).astype(np.float32) for n in lengths]
    tz = [rng.standard_normal((n, n, 8)).astype(np.float32) for n in lengths]
    return s, z, ts, tz


def rho_pair(lengths):
    nmax = max(lengths)
    return round(sum(n * n for n in lengths) / (len(lengths) * nmax * nmax), 3)


M64 = (1 << 64) - 1


def splitmix64(z):  # on uint64 arrays, wrapping mod 2^64 (docs/language.md section 14)
    z = z + np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def shared_dropout_scale(lengths, p, seed, shared_axis, nmax, channels):
    """rag's dropout(z, p, seed, shared_axis) on a pair state [B, ~N, ~N, C] as a padded scale
    (0 or 1 / (1 - p)): [B, 1, N_max, C] for shared_axis=1 (row-wise: the mask depends on
    (sample, column, channel)), [B, N_max, 1, C] for shared_axis=2; zero where padded.
    The counter is k = (((b << 20) + j0) << 20 + j1) << 20 + c with the shared index 0."""
    out = np.zeros((len(lengths), nmax, channels), np.float32)
    with np.errstate(over="ignore"):
        for b, n in enumerate(lengths):
            j = np.arange(n, dtype=np.uint64)[:, None]
            c = np.arange(channels, dtype=np.uint64)[None, :]
            j0, j1 = (np.uint64(0), j) if shared_axis == 1 else (j, np.uint64(0))
            k = ((((np.uint64(b) << np.uint64(20)) + j0) << np.uint64(20)) + j1) << np.uint64(20)
            k = k + c
            u = (splitmix64(np.uint64(seed) * np.uint64(0x9E3779B97F4A7C15) + k)
                 >> np.uint64(11)).astype(np.float64) * 2.0 ** -53
            out[b, :n] = np.where(u >= p, np.float32(1 / (1 - p)), np.float32(0))
    return out[:, None] if shared_axis == 1 else out[:, :, None]
