"""1024x1024x1024 float32 matmul throughput of numpy (its BLAS), timed like benches/sgemm.rs:
one warm-up, then the best of REPS runs, GFLOP/s = 2*n^3 / seconds / 1e9.

Debian's OpenBLAS misdetects this CPU unless OPENBLAS_CORETYPE is set (16-20 GFLOP/s
otherwise, see shared/notes/dependencies.md); the environment is printed with the figure."""

import os
import time

import numpy as np

N = 1024
REPS = 10


def main() -> None:
    rng = np.random.default_rng(0)
    a = rng.random((N, N), dtype=np.float32) - 0.5
    b = rng.random((N, N), dtype=np.float32) - 0.5
    c = np.empty((N, N), dtype=np.float32)
    np.matmul(a, b, out=c)
    best = float("inf")
    for _ in range(REPS):
        t = time.perf_counter()
        np.matmul(a, b, out=c)
        best = min(best, time.perf_counter() - t)
    gflops = 2.0 * N**3 / best / 1e9
    blas = "unknown"
    try:
        cfg = np.show_config(mode="dicts")
        blas = cfg["Build Dependencies"]["blas"]["name"]
    except Exception:  # older numpy: no dict mode
        pass
    env = {k: os.environ.get(k, "unset") for k in ("OPENBLAS_CORETYPE", "OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS")}
    print(f"numpy {np.__version__} ({blas}) sgemm {N}^3: {gflops:.1f} GFLOP/s (best of {REPS}, {best * 1e3:.2f} ms; {env})")


if __name__ == "__main__":
    main()
