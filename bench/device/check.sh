#!/usr/bin/env bash
# Issue 15's GPU acceptance in one run (at most 8 minutes on one GPU): prints a table and writes
# check.json under $OUT (or ./device-check-out).
#
# Prepare on the CPU machine (the GPU machine has no Rust toolchain), then carry bench/device/bin:
#   cargo build --release -p plait --features cuda
#   mkdir -p bench/device/bin && cp target/release/plait bench/device/bin/ && strip bench/device/bin/plait
#   echo /bench/device/bin/ >> .git/info/exclude
# On the GPU machine (device tool: carry ["bench/device/bin"]):
#   bash bench/device/check.sh
#
# Rows:
#   kernels         `plait bench kernels`: every op family forward and backward on the GPU against
#                   the CPU kernels (the same cases pass under the simt emulator in cargo test)
#   f32-one-gpu     tiny GPT (4 layers, hidden 128, seq 64), 20 steps, one rank on CUDA against
#                   the CPU backend: losses within 1e-4 relative
#   dp2-one-gpu     the same model, DP2 (two ranks on the one GPU): against one rank, 1e-4
#   tp2-one-gpu     the same model, TP2 (two ranks on the one GPU): against one rank, 1e-4
#   dp2-two-procs,  DP2 and TP2 again as two processes on the one GPU, launched as torchrun
#   tp2-two-procs   does (they meet over TCP; NCCL refuses two ranks on one device): 1e-4
#   gpt2-124m       GPT-2 124M, seq 1024, micro-batch 8: plait's tokens/s on CUDA beside PyTorch
#                   eager with scaled_dot_product_attention (bf16, AdamW) on the same GPU, each's
#                   MFU, and the plan's predicted step time (dgx-h200) against the measured one
#   step-predict    gpt2-124m's measured step against the same plan compiled for the cluster file
#                   `plait profile --device cuda` measures (plait's own kernels): within 20 %
#   bf16-one-gpu    the tiny GPT's bf16 plan on CUDA (bf16 GEMMs, f32 elsewhere) against the f32
#                   CPU run: within 2e-2 relative, loss falling
#   (every row: the kernels of kernels/cuda, compiled by NVRTC when the backend opens; the same
#    launches are tested on the CPU by the simt emulator, tests/tests/device_*.rs)
#   host-transfers  gpt2-124m: ops run on the host and bytes copied each step (information)
#   peak-memory     gpt2-124m's stage 0: the caching allocator's high-water mark that `plait run`
#                   prints, against the plan's predicted peak: within 10 %
#   dry-memory      the same plan on `--device dry` (allocations counted, no kernel run): its
#                   high-water mark against the GPU's, within 1 %
# Exit: 0 when every built row passes, 1 when one fails, 2 when this machine cannot run it
# (no GPU, no binary): then within seconds, before anything is built or trained.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT="${OUT:-$PWD/device-check-out}"
mkdir -p "$OUT"
PLAIT="${PLAIT:-bench/device/bin/plait}"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
deadline=$(( $(date +%s) + ${CHECK_BUDGET_S:-480} ))

fail_fast() { echo "device check: $*" >&2; exit 2; }
# CHECK_DEVICE=cpu runs every row on the CPU backend instead: a dry run of this script's own
# logic on a machine without a GPU (its figures are not the acceptance's).
DEVICE="${CHECK_DEVICE:-cuda}"

# --- Preflight: everything that would make the run pointless, in seconds -------------------
if [ "$DEVICE" = cuda ]; then
  command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q GPU \
    || fail_fast "no NVIDIA GPU here (nvidia-smi finds none): run this on the GPU machine"
fi
[ -x "$PLAIT" ] || fail_fast "$PLAIT not found: build it here with \`cargo build --release -p plait \
--features cuda\` and copy it to bench/device/bin/plait (see the header), then carry bench/device/bin"
# cudarc loads libcuda from the driver, cuBLAS and NCCL by name: add the toolkit's and
# PyTorch's wheel folders so it finds them.
for d in /usr/local/cuda/lib64 /usr/local/nvidia/lib64 \
  $(python3 -c 'import glob, os, nvidia; print(" ".join(sorted({os.path.dirname(p) for p in glob.glob(os.path.join(list(nvidia.__path__)[0], "*", "lib", "lib*"))})))' 2>/dev/null); do
  [ -d "$d" ] && export LD_LIBRARY_PATH="$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
done
# cudarc (built for CUDA 12) asks for libcublas.so, .so.12, ...: link the unversioned names
# to whatever version is here (CUDA 13 wheels ship only libcublas.so.13). NVRTC compiles plait's
# kernels (kernels/cuda) when the CUDA backend opens: PyTorch's wheels bring it
# (nvidia/cuda_nvrtc/lib).
mkdir -p "$work/cudalibs"
for lib in libcublas libcublasLt libnvrtc; do
  found=$(for d in ${LD_LIBRARY_PATH:+${LD_LIBRARY_PATH//:/ }}; do ls "$d/$lib".so* 2>/dev/null; done | head -1)
  [ -n "$found" ] && ln -sf "$found" "$work/cudalibs/$lib.so"
done
export LD_LIBRARY_PATH="$work/cudalibs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
[ "$DEVICE" != cuda ] || [ -e "$work/cudalibs/libnvrtc.so" ] \
  || fail_fast "no NVRTC library (libnvrtc.so*) in LD_LIBRARY_PATH or PyTorch's nvidia/*/lib: plait compiles its kernels with it"
"$PLAIT" --version >/dev/null 2>&1 || fail_fast "$PLAIT does not start here: $("$PLAIT" --version 2>&1 | head -2)"
if [ "$DEVICE" = cuda ]; then
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
else
  echo "dry run on the CPU backend (CHECK_DEVICE=cpu): not the acceptance's figures"
fi

left() { echo $(( deadline - $(date +%s) )); }
results="$work/rows.jsonl"
: > "$results"
row() { # name status detail [json extras]
  local extra="${4:-}"
  [ -n "$extra" ] || extra='{}'
  printf '%-14s %-6s %s\n' "$1" "$2" "$3"
  python3 - "$1" "$2" "$3" "$extra" >> "$results" <<'PY'
import json, sys
name, status, detail, extra = sys.argv[1:5]
print(json.dumps({"row": name, "status": status, "detail": detail, **json.loads(extra)}))
PY
}

# Losses of a --log-json file, one per line.
losses() { python3 -c 'import json,sys; [print(json.loads(l)["loss"]) for l in open(sys.argv[1])]' "$1"; }
# Largest relative difference between two loss files (inf when lengths differ or one is empty).
max_rel() {
  python3 - "$1" "$2" <<'PY'
import sys
a = [float(x) for x in open(sys.argv[1]).read().split()]
b = [float(x) for x in open(sys.argv[2]).read().split()]
print(max((abs(x - y) / max(abs(y), 1e-12) for x, y in zip(a, b)), default=float("inf")) if len(a) == len(b) and a else "inf")
PY
}
within() { python3 -c 'import sys; sys.exit(0 if float(sys.argv[1]) <= float(sys.argv[2]) else 1)' "$1" "$2"; }

# --- Every op family against the CPU kernels, in seconds: names a kernel that differs here ---
if timeout "$(( $(left) > 120 ? 120 : $(left) ))" "$PLAIT" bench kernels --device "$DEVICE" \
     > "$OUT/kernels.log" 2>&1; then
  row kernels pass "$(tail -1 "$OUT/kernels.log")"
else
  row kernels FAIL "$(grep -c FAIL "$OUT/kernels.log") case(s) failed: $(grep -m1 -E 'FAIL|error' "$OUT/kernels.log" | cut -c1-400)"
fi

# --- Tiny GPT: CUDA against the CPU backend, and DP2 / TP2 on the one GPU ---------------------
cat > "$work/tiny.json" <<'EOF'
{"model_type":"gpt2","n_layer":4,"n_embd":128,"n_head":4,"vocab_size":256,"n_positions":64,
 "resid_pdrop":0.0,"embd_pdrop":0.0,"attn_pdrop":0.0}
EOF
compile_tiny() { # out pins...
  local out=$1; shift
  "$PLAIT" compile "$work/tiny.json" --cluster cpu --gpus "${GPUS:-1}" --global-batch 8 --seq 64 \
    --precision fp32 "$@" -o "$out" > "$work/compile.log" 2>&1 \
    || { echo "compile failed: $(tail -3 "$work/compile.log")"; return 1; }
}
train() { # plan device log
  timeout "$(( $(left) > 60 ? 60 : $(left) ))" "$PLAIT" run "$1" --device "$2" --steps 20 \
    --log-json "$3" > "$3.out" 2>&1 || { echo "run failed: $(tail -3 "$3.out")"; return 1; }
  losses "$3" > "$3.losses"
}

if compile_tiny "$work/one.json" && train "$work/one.json" cpu "$work/cpu.jsonl" \
   && train "$work/one.json" "$DEVICE" "$work/cuda.jsonl"; then
  d=$(max_rel "$work/cuda.jsonl.losses" "$work/cpu.jsonl.losses")
  if within "$d" 1e-4; then s=pass; else s=FAIL; fi
  row f32-one-gpu "$s" "20 steps, max relative loss difference to the CPU backend $d (bar 1e-4)" \
    "{\"max_rel\": \"$d\"}"
else
  row f32-one-gpu FAIL "did not run (see above)"
fi
cp "$work/cuda.jsonl.out" "$OUT/f32-one-gpu.log" 2>/dev/null

for mesh in dp tp; do
  if GPUS=2 compile_tiny "$work/$mesh.json" "--$mesh" 2 \
     && train "$work/$mesh.json" "$DEVICE" "$work/$mesh.jsonl"; then
    d=$(max_rel "$work/$mesh.jsonl.losses" "$work/cpu.jsonl.losses")
    if within "$d" 1e-4; then s=pass; else s=FAIL; fi
    row "${mesh}2-one-gpu" "$s" "two ranks (threads) on GPU 0: max relative loss difference to one rank $d (bar 1e-4)" \
      "{\"max_rel\": \"$d\"}"
  else
    row "${mesh}2-one-gpu" FAIL "did not run (see above)"
  fi
done

# --- DP2 and TP2 as two processes on the one GPU, launched as torchrun launches them -------
# (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT): the ranks meet over TCP, NCCL
# refuses two ranks on one device, so the collectives stage through the TCP communicator.
two_procs() { # plan device log
  local port
  port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  local pids=() r
  for r in 0 1; do
    RANK=$r WORLD_SIZE=2 LOCAL_RANK=$r MASTER_ADDR=127.0.0.1 MASTER_PORT=$(( port - 2 )) \
      timeout "$(( $(left) > 90 ? 90 : $(left) ))" "$PLAIT" run "$1" --device "$2" --steps 20 \
      --log-json "$3" > "$3.$r.out" 2>&1 &
    pids+=($!)
  done
  local ok=0
  for r in 0 1; do wait "${pids[$r]}" || ok=1; done
  [ "$ok" = 0 ] || { echo "run failed: $(tail -3 "$3.0.out" "$3.1.out" | tr '\n' ' ')"; return 1; }
  losses "$3" > "$3.losses"
}
for mesh in dp tp; do
  if [ -s "$work/$mesh.json" ] && two_procs "$work/$mesh.json" "$DEVICE" "$work/$mesh-procs.jsonl"; then
    d=$(max_rel "$work/$mesh-procs.jsonl.losses" "$work/cpu.jsonl.losses")
    if within "$d" 1e-4; then s=pass; else s=FAIL; fi
    row "${mesh}2-two-procs" "$s" "two processes (TCP) on GPU 0: max relative loss difference to one rank $d (bar 1e-4)" \
      "{\"max_rel\": \"$d\"}"
  else
    row "${mesh}2-two-procs" FAIL "did not run: $(cat "$work/$mesh-procs.jsonl.0.out" 2>/dev/null | tail -2 | tr '\n' ' ')"
  fi
done

# --- bf16: the tiny GPT's plan in bf16 (GEMMs on bf16-rounded operands, f32 elsewhere) -----
# (a GPU cluster: the cpu cluster file prices no bf16)
if "$PLAIT" compile "$work/tiny.json" --cluster dgx-h200 --gpus 1 --global-batch 8 --seq 64 \
     --precision bf16 -o "$work/bf16.json" > "$work/compile.log" 2>&1 \
   && train "$work/bf16.json" "$DEVICE" "$work/bf16.jsonl"; then
  d=$(max_rel "$work/bf16.jsonl.losses" "$work/cpu.jsonl.losses")
  falls=$(python3 -c 'import sys; l=[float(x) for x in open(sys.argv[1]).read().split()]; print("yes" if l and l[-1] < l[0] else "no")' "$work/bf16.jsonl.losses")
  s=FAIL; within "$d" 2e-2 && [ "$falls" = yes ] && s=pass
  row bf16-one-gpu "$s" "20 steps, bf16 GEMMs: max relative loss difference to the f32 CPU run $d (bar 2e-2), loss falling: $falls" \
    "{\"max_rel\": \"$d\"}"
else
  row bf16-one-gpu FAIL "did not run: $(cat "$work/compile.log" "$work/bf16.jsonl.out" 2>/dev/null | tail -3 | tr '\n' ' ')"
fi

# --- GPT-2 124M: plait on CUDA beside PyTorch eager (SDPA, bf16, AdamW) ----------------------
cat > "$work/gpt2.json" <<'EOF'
{"model_type":"gpt2","n_layer":12,"n_embd":768,"n_head":12,"vocab_size":50257,"n_positions":1024,
 "resid_pdrop":0.0,"embd_pdrop":0.0,"attn_pdrop":0.0}
EOF
torch_tps=$([ "$DEVICE" = cuda ] && timeout 120 python3 - <<'PY' 2>"$work/torch.err"
import time, torch, torch.nn as nn, torch.nn.functional as F
torch.manual_seed(0)
L, H, NH, V, S, B = 12, 768, 12, 50257, 1024, 8
class Block(nn.Module):
    def __init__(s):
        super().__init__(); s.ln1 = nn.LayerNorm(H); s.qkv = nn.Linear(H, 3 * H); s.proj = nn.Linear(H, H)
        s.ln2 = nn.LayerNorm(H); s.fc = nn.Linear(H, 4 * H); s.out = nn.Linear(4 * H, H)
    def forward(s, x):
        q, k, v = s.qkv(s.ln1(x)).view(B, S, 3, NH, H // NH).unbind(2)
        a = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
        x = x + s.proj(a.transpose(1, 2).reshape(B, S, H))
        return x + s.out(F.gelu(s.fc(s.ln2(x)), approximate="tanh"))
class GPT(nn.Module):
    def __init__(s):
        super().__init__(); s.wte = nn.Embedding(V, H); s.wpe = nn.Embedding(S, H)
        s.blocks = nn.ModuleList(Block() for _ in range(L)); s.ln = nn.LayerNorm(H)
    def forward(s, idx):
        x = s.wte(idx) + s.wpe(torch.arange(S, device=idx.device))
        for b in s.blocks: x = b(x)
        return F.linear(s.ln(x), s.wte.weight)
m = GPT().cuda(); opt = torch.optim.AdamW(m.parameters(), lr=3e-4, fused=True)
x = torch.randint(0, V, (B, S + 1), device="cuda")
def step():
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = F.cross_entropy(m(x[:, :-1]).float().view(-1, V), x[:, 1:].reshape(-1))
    loss.backward(); opt.step(); opt.zero_grad(set_to_none=True)
for _ in range(3): step()
torch.cuda.synchronize(); t = time.time(); n = 10
for _ in range(n): step()
torch.cuda.synchronize(); print(B * S * n / (time.time() - t))
PY
)
[ -n "$torch_tps" ] || torch_tps=0
if "$PLAIT" compile "$work/gpt2.json" --cluster dgx-h200 --gpus 1 --global-batch 8 --seq 1024 \
     --micro-batch 8 -o "$work/gpt2-plan.json" > "$work/gpt2-compile.log" 2>&1; then
  budget=$(( $(left) - 20 )); [ "$budget" -gt 240 ] && budget=240
  if [ "$budget" -gt 30 ] && timeout "$budget" "$PLAIT" run "$work/gpt2-plan.json" --device "$DEVICE" \
       --steps 3 --log-json "$work/gpt2.jsonl" > "$OUT/gpt2-124m.log" 2>&1; then
    # MFU: tokens/s times the plan's model FLOPs per token, over the GPU's bf16 peak (both from
    # the plan: its predicted model TFLOP/s over its tokens/s, and over its MFU).
    read -r plait_tps measured predicted plait_mfu torch_mfu < <(python3 - "$work/gpt2.jsonl" "$work/gpt2-plan.json" "$torch_tps" <<'PY'
import json, sys
steps = [json.loads(l) for l in open(sys.argv[1])][1:] or [json.loads(l) for l in open(sys.argv[1])]
p = json.load(open(sys.argv[2]))["predicted"]
tps = sum(s["tokens_per_s"] for s in steps) / len(steps)
sec = sum(s["step_time_s"] for s in steps) / len(steps)
mfu_per_tps = p["mfu"] / p["tokens_per_s"]
print(tps, sec, p["iteration_time_s"], f"{tps * mfu_per_tps:.4f}", f"{float(sys.argv[3]) * mfu_per_tps:.4f}")
PY
)
    ratio=$(python3 -c "print(f'{$plait_tps / $torch_tps:.4f}' if $torch_tps > 0 else 'n/a')")
    err=$(python3 -c "print(f'{($measured - $predicted) / $predicted:+.1%}')")
    s=FAIL; [ "$ratio" != n/a ] && within 0.7 "$ratio" && s=pass
    row gpt2-124m "$s" "plait $plait_tps tokens/s (MFU $plait_mfu; bf16 GEMMs and tensor-core attention, results held as bf16 words where every reader reads those, f32 elsewhere), PyTorch eager bf16 $torch_tps (MFU $torch_mfu): ratio $ratio (bar 0.7); step ${measured}s measured, ${predicted}s predicted ($err)" \
      "{\"plait_tokens_per_s\": $plait_tps, \"torch_tokens_per_s\": $torch_tps, \"plait_mfu\": $plait_mfu, \"torch_mfu\": $torch_mfu, \"measured_step_s\": $measured, \"predicted_step_s\": $predicted}"
  else
    row gpt2-124m FAIL "plait run did not finish 3 steps in ${budget}s; PyTorch eager bf16 $torch_tps tokens/s" \
      "{\"torch_tokens_per_s\": $torch_tps}"
  fi
else
  row gpt2-124m FAIL "compile failed: $(tail -2 "$work/gpt2-compile.log" | tr '\n' ' ')"
fi
# The step-time prediction on this GPU as plait's runtime runs it: `plait profile` measures the
# runtime's own GEMM, attention, memory-bound kernels, copy and dispatch (the profiled cluster
# file), and the same GPT-2 plan compiled for that file predicts the step: within 20 % of the
# measured one. (CPU dry run: the CPU profile, which prices no bf16, and an fp32 plan.)
if [ -n "${measured:-}" ] && [ "$(left)" -gt 60 ]; then
  if [ "$DEVICE" = cuda ]; then quick=; precision=bf16; else quick=--quick; precision=fp32; fi
  if timeout "$(( $(left) > 150 ? 120 : $(left) - 30 ))" "$PLAIT" profile --device "$DEVICE" $quick \
       -o "$work/profiled.toml" > "$OUT/profile.log" 2>&1 \
     && cp "$work/profiled.toml" "$OUT/profiled.toml" \
     && "$PLAIT" compile "$work/gpt2.json" --cluster "$work/profiled.toml" --gpus 1 --global-batch 8 \
       --seq 1024 --micro-batch 8 --precision "$precision" -o "$work/gpt2-profiled-plan.json" \
       > "$work/gpt2-profiled-compile.log" 2>&1; then
    profiled=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["predicted"]["iteration_time_s"])' "$work/gpt2-profiled-plan.json")
    perr=$(python3 -c "print(f'{($measured - $profiled) / $profiled:+.1%}')")
    s=FAIL; python3 -c "import sys; sys.exit(0 if abs($measured - $profiled) <= 0.2 * $measured else 1)" && s=pass
    row step-predict "$s" "gpt2-124m: ${measured}s measured, ${profiled}s predicted on the profiled cluster ($perr; bar 20 %), ${predicted}s on dgx-h200 ($err)" \
      "{\"measured_step_s\": $measured, \"profiled_predicted_step_s\": $profiled, \"preset_predicted_step_s\": $predicted}"
  else
    row step-predict FAIL "plait profile or the compile on its cluster failed: $(tail -2 "$OUT/profile.log" "$work/gpt2-profiled-compile.log" 2>/dev/null | tr '\n' ' ' | cut -c1-300)"
  fi
fi
# Where GPT-2's step goes on this GPU (information for the next round of kernel work): two
# steps with --op-times, each instruction timed to its completion on the device, beside the
# profiled plan's prediction of each kind (its `kernel_s`; the preset plan's where the profile
# did not run): where the step-time prediction and the runtime part.
op_plan="$work/gpt2-profiled-plan.json"; [ -s "$op_plan" ] || op_plan="$work/gpt2-plan.json"
if [ "$(left)" -gt 60 ] && [ -s "$op_plan" ]; then
  timeout "$(( $(left) - 20 ))" "$PLAIT" run "$op_plan" --device "$DEVICE" --steps 2 \
    --op-times > "$OUT/gpt2-op-times.log" 2>&1
  row gpt2-op-times info "$(basename "$op_plan"): $(grep -A10 '^instruction ' "$OUT/gpt2-op-times.log" | head -11 | tr -s ' ' | tr '\n' ';' | cut -c1-700)"
fi
# CHECK_KERNEL_TIMES=1: every kernel launch of one GPT-2 step timed on the device by Nsight
# Compute (gpu__time_duration, one pass per kernel, caches not flushed), summed by kernel name
# into kernel-times.txt: where the device time goes, without --op-times' per-instruction syncs.
if [ -n "${CHECK_KERNEL_TIMES:-}" ] && command -v ncu >/dev/null 2>&1 && [ "$(left)" -gt 90 ] \
   && [ -s "$work/gpt2-plan.json" ]; then
  timeout "$(( $(left) - 30 ))" ncu --clock-control none --cache-control none \
    --metrics gpu__time_duration.sum --csv \
    "$PLAIT" run "$work/gpt2-plan.json" --device "$DEVICE" --steps 1 > "$work/kernel-times.csv" 2>&1
  python3 - "$work/kernel-times.csv" > "$OUT/kernel-times.txt" <<'PY'
import csv, sys, collections
# Microseconds per unit, as ncu may spell it (an H200 run printed nanoseconds as "ns").
scale = {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3,
         "s": 1e6, "second": 1e6}
lines = [l for l in open(sys.argv[1]) if l.startswith('"')]
total, count = collections.Counter(), collections.Counter()
for r in csv.DictReader(lines):
    if r.get("Metric Name") != "gpu__time_duration.sum":
        continue
    unit = r["Metric Unit"]
    if unit not in scale:
        sys.exit(f"unknown time unit {unit!r} in ncu's output")
    us = float(r["Metric Value"].replace(",", "")) * scale[unit]
    name = r["Kernel Name"].split("(")[0]
    total[name] += us
    count[name] += 1
all_us = sum(total.values())
print(f"{sum(count.values())} kernels, {all_us / 1e3:.2f} ms of device time in one step")
for name, us in total.most_common(40):
    print(f"{name[:60]:<60} {count[name]:>6} {us / 1e3:>9.3f} ms {100 * us / max(all_us, 1e-9):>5.1f}%")
PY
  row kernel-times info "$(head -1 "$OUT/kernel-times.txt"); top: $(sed -n 2,6p "$OUT/kernel-times.txt" | tr -s ' ' | tr '\n' ';' | cut -c1-300)"
fi
# CHECK_NCU=REGEX: Nsight Compute's speed-of-light, occupancy and launch sections for the first
# kernels of one GPT-2 step whose names match REGEX, after skipping CHECK_NCU_SKIP of them
# (default 0), CHECK_NCU_COUNT in all (default 6) (information for kernel work; where
# `ncu` reads the counters: Firecracker machines, KINDS.md).
if [ -n "${CHECK_NCU:-}" ] && command -v ncu >/dev/null 2>&1 && [ "$(left)" -gt 60 ] \
   && [ -s "$work/gpt2-plan.json" ]; then
  timeout "$(( $(left) - 20 ))" ncu --clock-control none --kernel-name "regex:$CHECK_NCU" \
    --launch-skip "${CHECK_NCU_SKIP:-0}" --launch-count "${CHECK_NCU_COUNT:-6}" \
    --section SpeedOfLight --section Occupancy --section LaunchStats \
    "$PLAIT" run "$work/gpt2-plan.json" --device "$DEVICE" --steps 1 > "$OUT/ncu.log" 2>&1
  row ncu info "$(grep -cE '^  [a-z_]+.*\(' "$OUT/ncu.log") kernels profiled into ncu.log"
fi

# `plait run` prints each stage's allocator high-water mark beside the plan's peak (CUDA
# backend: the caching pool), and the step instruction where it was reached. The kernels
# compute in f32; a bf16 plan's declared-bf16 buffers are held as bf16 between distant uses
# (runtime/src/exec/stash.rs), the rest of the time in f32.
mem=$(grep -o 'memory      stage 0: .*' "$OUT/gpt2-124m.log" 2>/dev/null | head -1)
ratio_mem=$(sed -n 's/.*measured \/ predicted \([0-9.]*\)).*/\1/p' <<< "$mem")
if [ -n "$ratio_mem" ]; then
  s=FAIL; python3 -c "import sys; sys.exit(0 if abs($ratio_mem - 1) <= 0.10 else 1)" && s=pass
  row peak-memory "$s" "gpt2-124m: $mem (bar: within 10 %)" \
    "{\"measured_over_predicted\": $ratio_mem}"
else
  row peak-memory "n/a" "no allocator line in plait run's output (the CPU backend keeps no high-water mark)"
fi

# The same plan on `--device dry` (no kernel run, the CUDA run's allocations counted by the
# same caching pool): its high-water mark is what `plait run --device dry` tells a user without
# a GPU, so it should be the GPU's own (bar: within 1 %).
gpu_peak=$(sed -n 's/.*stage 0: peak \([0-9.]*\) GiB in buffers.*/\1/p' <<< "$mem")
if [ -n "$gpu_peak" ] && [ -s "$work/gpt2-plan.json" ] && [ "$(left)" -gt 30 ] \
   && timeout 60 "$PLAIT" run "$work/gpt2-plan.json" --device dry --steps 3 > "$OUT/gpt2-dry.log" 2>&1; then
  dry_peak=$(sed -n 's/^memory      stage 0: peak \([0-9.]*\) GiB in buffers.*/\1/p' "$OUT/gpt2-dry.log" | head -1)
  s=FAIL; python3 -c "import sys; sys.exit(0 if abs(${dry_peak:-0} / $gpu_peak - 1) <= 0.01 else 1)" && s=pass
  row dry-memory "$s" "gpt2-124m on --device dry: peak ${dry_peak:-?} GiB in buffers, on the GPU $gpu_peak GiB (bar: within 1 %)"
else
  row dry-memory "n/a" "no GPU peak to compare, or the dry run failed: $(tail -2 "$OUT/gpt2-dry.log" 2>/dev/null | tr '\n' ' ')"
fi

# What still crosses to the host each step (acceptance 1's goal: the batch up, the loss down).
host=$(grep -o 'host        per step .*' "$OUT/gpt2-124m.log" 2>/dev/null | head -1)
row host-transfers "info" "gpt2-124m: ${host:-no host-transfer line in the plait run output (CPU backend)}"

python3 - "$results" "$OUT/check.json" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
json.dump({"rows": rows}, open(sys.argv[2], "w"), indent=1)
sys.exit(1 if any(r["status"] == "FAIL" for r in rows) else 0)
PY
