#!/usr/bin/env python3
"""Per-kernel registers, spills, shared memory and PTX instruction counts of kernels/cuda, with
no GPU: NVRTC (the library plait's CUDA backend compiles with) for a chosen architecture.

    pip install --target /tmp/nvrtc nvidia-cuda-nvrtc-cu12
    python3 bench/device/ptx_stats.py [REGEX] [--arch sm_90] [--nvrtc /tmp/nvrtc/.../libnvrtc.so.12]

prints, for each kernel whose name matches REGEX: registers, spill bytes and static shared
memory (ptxas -v), and the PTX instructions by opcode (a static count over all paths, not a
time). The source is kernels/src/device.rs's CUDA_SOURCE: the files in its order.
"""
import argparse, ctypes, glob, re, sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def source():
    rs = (ROOT / "kernels/src/device.rs").read_text()
    block = rs[rs.index("pub const CUDA_SOURCE"):].split(");", 1)[0]
    files = re.findall(r'include_str!\("\.\./cuda/([^"]+)"\)', block)
    return "".join((ROOT / "kernels/cuda" / f).read_text() for f in files).encode()


def nvrtc(path):
    if path:
        return ctypes.CDLL(path)
    for p in glob.glob("/tmp/nvrtc/nvidia/cuda_nvrtc/lib/libnvrtc.so*") + ["libnvrtc.so.12", "libnvrtc.so"]:
        try:
            return ctypes.CDLL(p)
        except OSError:
            continue
    sys.exit("no libnvrtc: pip install --target /tmp/nvrtc nvidia-cuda-nvrtc-cu12, or pass --nvrtc")


def compile_(lib, src, opts):
    prog = ctypes.c_void_p()
    assert lib.nvrtcCreateProgram(ctypes.byref(prog), src, b"plait.cu", 0, None, None) == 0
    arr = (ctypes.c_char_p * len(opts))(*opts)
    rc = lib.nvrtcCompileProgram(prog, len(opts), arr)
    n = ctypes.c_size_t()
    lib.nvrtcGetProgramLogSize(prog, ctypes.byref(n))
    log = ctypes.create_string_buffer(n.value)
    lib.nvrtcGetProgramLog(prog, log)
    return rc, prog, log.value.decode()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("regex", nargs="?", default=".")
    ap.add_argument("--arch", default="sm_90")
    ap.add_argument("--nvrtc")
    a = ap.parse_args()
    lib, src, pat = nvrtc(a.nvrtc), source(), re.compile(a.regex)
    rc, _, log = compile_(lib, src, [f"--gpu-architecture={a.arch}".encode(), b"-Xptxas", b"-v"])
    if rc:
        sys.exit(f"NVRTC failed ({rc}):\n{log[:4000]}")
    stats, cur = {}, None
    for line in log.splitlines():
        m = re.search(r"Compiling entry function '(\w+)'", line)
        if m:
            cur = m.group(1)
        elif cur and ("registers" in line or "spill" in line):
            stats.setdefault(cur, []).append(line.split(":", 1)[-1].strip())
    rc, prog, log = compile_(lib, src, [f"--gpu-architecture=compute_{a.arch.split('_')[1]}".encode()])
    n = ctypes.c_size_t()
    lib.nvrtcGetPTXSize(prog, ctypes.byref(n))
    buf = ctypes.create_string_buffer(n.value)
    lib.nvrtcGetPTX(prog, buf)
    for entry in re.split(r"\n\s*// \.globl\s+", buf.value.decode())[1:]:
        name = entry.split("\n", 1)[0].strip()
        if not pat.search(name):
            continue
        ops = []
        for l in entry.split("\n"):
            l = l.strip()
            if not l or l.startswith(("//", ".", "{", "}", "$", ")", "(")):
                continue
            word = l.split()[1] if l.startswith("@") and len(l.split()) > 1 else l.split()[0]
            ops.append(word.split(".")[0])
        c = Counter(ops)
        print(name)
        for s in stats.get(name, []):
            print("   ", s)
        print(f"    {len(ops)} PTX instructions:", " ".join(f"{k} {v}" for k, v in c.most_common(14)))


if __name__ == "__main__":
    main()
