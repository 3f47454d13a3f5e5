"""One cold training step of examples/encoder.rag through whichever `rag` is importable, found
by rag.example() (so it runs from any directory). Prints one JSON line: the loss (and its f32
bits, compared bitwise between the wheel and the normal build by tests/wheel/check.sh), the
import time, the first call's time (compilation included; RAG_CACHE_DIR should point at an
empty folder) and a warm call's time, each also in CPU seconds of the process (all threads),
which a loaded machine disturbs less than the wall clock."""
import json
import sys
import time

t0, c0 = time.perf_counter(), time.process_time()
import rag  # noqa: E402

import_s, import_cpu_s = time.perf_counter() - t0, time.process_time() - c0

import numpy as np  # noqa: E402

rng = np.random.RandomState(0)
lengths = (5, 17, 9, 30)
x = rag.ragged([rng.randn(n, 64).astype(np.float32) for n in lengths], ragged_axes="~N, 64")
labels = rag.ragged([rng.randint(0, 2, size=n).astype(np.int64) for n in lengths], ragged_axes="~N")
m = rag.load(rag.example("encoder.rag"))
p = m.init("Encoder", seed=0)
t0, c0 = time.perf_counter(), time.process_time()
loss, p1 = m.train_step(x, labels, p)
first_s, first_cpu_s = time.perf_counter() - t0, time.process_time() - c0
t0, c0 = time.perf_counter(), time.process_time()
loss2, _ = m.train_step(x, labels, p1)
warm_s, warm_cpu_s = time.perf_counter() - t0, time.process_time() - c0
value = np.float32(loss.item())
print(json.dumps({
    "rag": rag.__file__,
    "version": rag.__version__,
    "loss": float(value),
    "loss_bits": f"{value.view(np.uint32):08x}",
    "loss2_bits": f"{np.float32(loss2.item()).view(np.uint32):08x}",
    "import_s": round(import_s, 3),
    "import_cpu_s": round(import_cpu_s, 3),
    "first_call_s": round(first_s, 3),
    "first_call_cpu_s": round(first_cpu_s, 3),
    "warm_call_s": round(warm_s, 4),
    "warm_call_cpu_s": round(warm_cpu_s, 4),
}))
sys.exit(0 if np.isfinite(value) else 1)
