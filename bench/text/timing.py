"""Timing and peak memory shared by every system's process (numpy only): a warm-up call (it
also compiles), more untimed calls until WARMUP_S have passed since it began (a cold process
on this machine ran its first ~0.1 s of steps up to 1.8x slower than later ones, whatever the
system), then up to `calls` timed calls, stopping early (never under 3) once `budget_s`
of timed calls are spent, as a padded CPU step can take minutes; the JSON records how many."""
import ctypes
import gc
import time

import numpy as np

WARMUP_S = 0.5


def status_kb(key):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key):
                return int(line.split()[1])
    return -1


def reset_hwm():  # VmHWM := current RSS
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def measure(step, calls, budget_s, empty_cache=None):
    """step() -> loss. Returns a dict: first call s, median and least ms of the timed calls,
    their count, loss0 (the warm-up's), and peak memory: the growth of peak RSS over one more
    call made after the timed ones with every cache emptied first (`empty_cache`: rag's, whose
    host blocks stay resident between calls, up to the process's own peak; then glibc's free
    heap pages, for every system), so a system's figure is what one step needs, whatever its
    allocator keeps."""
    t = time.perf_counter()
    loss0 = float(step())
    first = time.perf_counter() - t
    while time.perf_counter() - t < WARMUP_S:
        step()
    ms = []
    while len(ms) < calls and (len(ms) < 3 or sum(ms) < 1e3 * budget_s):
        t = time.perf_counter()
        step()
        ms.append(1e3 * (time.perf_counter() - t))
    gc.collect()
    if empty_cache:
        empty_cache()
    # Freed heap pages back to the system for every system alike (glibc keeps blocks below its
    # mmap threshold resident), so the growth below is what this one call touches.
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    rss0 = status_kb("VmRSS:")
    reset_hwm()
    step()
    return {"ms_step": round(float(np.median(ms)), 2), "ms_min": round(min(ms), 2),
            "timed_calls": len(ms), "first_call_s": round(first, 3), "loss0": loss0,
            "peak_rss_bytes": (status_kb("VmHWM:") - rss0) * 1024}


def torch_with_threads(threads):
    """torch, imported and set to `threads` intra-op threads and 1 inter-op thread, with the
    CUDA build's cuDNN SDPA query off: it fails without a driver even for CPU tensors, and off,
    a jagged SDPA on the CPU gets the math kernel or the error that says why not (causal)."""
    import torch
    torch.set_num_threads(threads)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:
        pass
    torch.backends.cuda.enable_cudnn_sdp(False)
    return torch
