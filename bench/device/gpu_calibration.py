#!/usr/bin/env python3
"""Measures what a GPU sustains on the kernels plait's cost model reasons about.

Run on a machine with a CUDA GPU and PyTorch. Prints one JSON object:
  - mamf: best bf16/fp16 matmul TFLOP/s over a sweep of large shapes (the MAMF idea of
    S. Bekman's ml-engineering), and 8192^3;
  - gemm_shapes: TFLOP/s of the GEMMs of GPT layers (forward NN, backward dgrad NT, wgrad TN);
  - elementwise: achieved bytes/s of layernorm, gelu, dropout, residual add, softmax, copy;
  - layers: measured forward and backward seconds of whole GPT layers (materialized attention,
    dropout 0.1, fp16/bf16) so plait's per-layer prediction can be compared with a real run.
Nothing here is fitted: the numbers are measurements to compare against.
"""
import json, math, sys, time

import torch
import torch.nn.functional as F

dev = "cuda"
torch.backends.cuda.matmul.allow_tf32 = False
out = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__,
       "sms": torch.cuda.get_device_properties(0).multi_processor_count}


def timeit(fn, warmup=3, iters=10):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / 1e3 / iters


def gemm_tflops(m, n, k, dtype, ta=False, tb=False, batch=1):
    a = torch.randn((batch, k, m) if ta else (batch, m, k), device=dev, dtype=dtype)
    b = torch.randn((batch, n, k) if tb else (batch, k, n), device=dev, dtype=dtype)
    if batch == 1:
        a, b = a[0], b[0]
    A = a.transpose(-1, -2) if ta else a
    B = b.transpose(-1, -2) if tb else b
    t = timeit(lambda: torch.matmul(A, B))
    return 2.0 * batch * m * n * k / t / 1e12


dtype = torch.bfloat16
mamf = {}
best = 0.0
for m in (4096, 6144, 8192, 12288):
    for n in (4096, 8192, 12288, 16384):
        for k in (2048, 4096, 8192):
            tf = gemm_tflops(m, n, k, dtype)
            best = max(best, tf)
mamf["bf16_best_sweep"] = best
mamf["bf16_8192_cubed"] = gemm_tflops(8192, 8192, 8192, dtype)
mamf["fp16_8192_cubed"] = gemm_tflops(8192, 8192, 8192, torch.float16)
out["mamf"] = mamf

# GEMMs of GPT layers: (name, tokens, hidden, heads, tp)
layers = [("gpt-1.7b tp1 b8", 8 * 2048, 2304, 24, 1), ("gpt-7.5b tp4 b8", 8 * 2048, 4096, 32, 4),
          ("gpt3-175b tp8 b1", 2048, 12288, 96, 8), ("gpt-1t tp8 b1", 2048, 25600, 160, 8)]
shapes = {}
for name, M, h, a, t in layers:
    rows = {}
    for lname, K, N in (("qkv", h, 3 * h // t), ("proj", h // t, h), ("fc1", h, 4 * h // t), ("fc2", 4 * h // t, h)):
        fwd = gemm_tflops(M, N, K, dtype)
        dgrad = gemm_tflops(M, K, N, dtype, tb=True)
        wgrad = gemm_tflops(K, N, M, dtype, ta=True)
        rows[lname] = {"fwd": fwd, "dgrad": dgrad, "wgrad": wgrad}
    d = h // a
    heads = a // t
    b = M // 2048
    rows["qk"] = gemm_tflops(2048, 2048, d, dtype, tb=True, batch=b * heads)
    rows["pv"] = gemm_tflops(2048, d, 2048, dtype, batch=b * heads)
    shapes[name] = rows
out["gemm_shapes"] = shapes

# Memory-bound kernels on a [tokens, hidden] activation (bytes counted: reads + writes).
ew = {}
x = torch.randn(8 * 2048, 8192, device=dev, dtype=dtype)
y = torch.randn_like(x)
g = torch.ones(8192, device=dev, dtype=dtype)
bias = torch.zeros(8192, device=dev, dtype=dtype)
nb = x.numel() * x.element_size()
ew["copy"] = 2 * nb / timeit(lambda: x.clone())
ew["add"] = 3 * nb / timeit(lambda: x + y)
ew["gelu_tanh"] = 2 * nb / timeit(lambda: F.gelu(x, approximate="tanh"))
ew["layernorm"] = 2 * nb / timeit(lambda: F.layer_norm(x, (8192,), g, bias))
ew["dropout"] = (2 * nb + x.numel()) / timeit(lambda: F.dropout(x, 0.1, training=True))
s = torch.randn(8, 16, 2048, 2048, device=dev, dtype=dtype)
ew["softmax"] = 2 * s.numel() * s.element_size() / timeit(lambda: torch.softmax(s, -1))
out["elementwise_bytes_per_s"] = ew


class Layer(torch.nn.Module):
    """A Megatron-style GPT layer with materialized attention and dropout 0.1."""

    def __init__(self, h, a):
        super().__init__()
        self.h, self.a = h, a
        self.ln1 = torch.nn.LayerNorm(h)
        self.qkv = torch.nn.Linear(h, 3 * h)
        self.proj = torch.nn.Linear(h, h)
        self.ln2 = torch.nn.LayerNorm(h)
        self.fc1 = torch.nn.Linear(h, 4 * h)
        self.fc2 = torch.nn.Linear(4 * h, h)

    def forward(self, x):
        b, s, h = x.shape
        d = h // self.a
        q, k, v = self.qkv(self.ln1(x)).split(h, dim=-1)
        q, k, v = (t.view(b, s, self.a, d).transpose(1, 2) for t in (q, k, v))
        scores = torch.matmul(q, k.transpose(-1, -2)) * (1.0 / math.sqrt(d))
        mask = torch.ones(s, s, device=x.device, dtype=torch.bool).triu(1)
        p = F.dropout(torch.softmax(scores.masked_fill(mask, float("-inf")), -1), 0.1, True)
        o = torch.matmul(p, v).transpose(1, 2).reshape(b, s, h)
        x = x + F.dropout(self.proj(o), 0.1, True)
        return x + F.dropout(self.fc2(F.gelu(self.fc1(self.ln2(x)), approximate="tanh")), 0.1, True)


meas = {}
for name, h, a, b in (("h2304 a24 b8", 2304, 24, 8), ("h4096 a32 b4", 4096, 32, 4), ("h8192 a64 b1", 8192, 64, 1)):
    layer = Layer(h, a).to(dev, dtype)
    x = torch.randn(b, 2048, h, device=dev, dtype=dtype, requires_grad=True)
    fwd = timeit(lambda: layer(x))
    def step():
        y = layer(x)
        y.backward(torch.ones_like(y))
    total = timeit(step)
    meas[name] = {"hidden": h, "heads": a, "micro_batch": b, "seq": 2048, "fwd_s": fwd, "fwd_bwd_s": total}
    del layer, x
    torch.cuda.empty_cache()
out["layers"] = meas
print(json.dumps(out, indent=1))
