"""rag.set_num_threads / rag.num_threads: the count changes in process, results do not."""
import numpy as np

import rag

SRC = """
fn f(x: f32[B, ~N, 64], w: f32[64, 64]) -> f32[B, ~N, 64] {
    return tanh(x @ w) * 1.5 + x
}
"""


def test_set_num_threads_changes_the_count_not_the_bits():
    m = rag.compile(SRC)
    rng = np.random.default_rng(0)
    x = rag.ragged([rng.standard_normal((n, 64)).astype(np.float32) for n in (700, 3, 1300)])
    w = rng.standard_normal((64, 64)).astype(np.float32) * 0.1
    before = rag.num_threads()
    try:
        results = []
        for n in (1, 2, 3):
            rag.set_num_threads(n)
            assert rag.num_threads() == n
            results.append(m.f(x, w).values.copy())
        for r in results[1:]:
            assert np.array_equal(r, results[0])
    finally:
        rag.set_num_threads(0)
    assert rag.num_threads() >= 1
