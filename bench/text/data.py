"""IMDB-shaped synthetic token batches for the text benchmark (numpy only, fixed seeds).

Lengths are long-tailed like IMDB reviews in BERT tokens: a log-normal clipped to [8, 512].
Its parameters are set so that a random batch of 64 fills about 0.31 of a B x 512 envelope
(the token occupancy issue 14 asks for); the median that implies is printed, not claimed.
  random:   64 lengths drawn independently (the batch a shuffled loader makes).
  bucketed: a pool of 64 x 64 lengths sorted and cut into batches of 64 (a length-bucketing
            loader); the batch whose mean is nearest the pool's mean, so it holds about as
            many tokens as a random batch.
Occupancy rho = sum(N) / (B * max(N)) is what a padded system computes on (it pads to the
batch's longest sample); rho_512 = sum(N) / (B * 512) is the fixed-length view."""
import numpy as np

MU, SIGMA, CAP, MIN = np.log(122.0), 0.8, 512, 8


def lengths(rng, count):
    return np.clip(rng.lognormal(MU, SIGMA, count).astype(np.int64), MIN, CAP)


def batch_lengths(profile, batch=64, seed=0):
    rng = np.random.default_rng(seed)
    if profile == "random":
        n = lengths(rng, batch)
    elif profile == "bucketed":
        pool = np.sort(lengths(rng, batch * batch))
        chunks = pool.reshape(batch, batch)
        n = chunks[np.argmin(np.abs(chunks.mean(axis=1) - pool.mean()))]
        n = rng.permutation(n)
    else:
        raise ValueError(f"profile is random or bucketed, not {profile!r}")
    return n


def batch(profile, vocab, batch=64, seed=0):
    """(lengths, per-sample int32 ids, int64 labels): random ids and labels, fixed seed."""
    n = batch_lengths(profile, batch, seed)
    rng = np.random.default_rng(seed + 1)
    ids = [rng.integers(vocab, size=k).astype(np.int32) for k in n]
    labels = rng.integers(2, size=len(n)).astype(np.int64)
    return n, ids, labels


def occupancy(n):
    n = np.asarray(n, dtype=np.float64)
    return {"rho": float(n.sum() / (len(n) * n.max())), "rho_512": float(n.sum() / (len(n) * CAP)),
            "tokens": int(n.sum()), "n_max": int(n.max()), "n_median": float(np.median(n))}


if __name__ == "__main__":
    for prof in ("random", "bucketed"):
        print(prof, occupancy(batch_lengths(prof)))
    rng = np.random.default_rng(123)
    rhos = [occupancy(lengths(rng, 64))["rho_512"] for _ in range(2000)]
    print("rho_512 over 2000 random batches: mean %.3f" % np.mean(rhos),
          "median length %.0f" % np.median(lengths(rng, 100000)))
