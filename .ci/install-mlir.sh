#!/usr/bin/env bash
# Installs LLVM/MLIR 22 for `codegen --features mlir` (melior 0.27) on Debian 12 (bookworm), as
# root. Debian ships LLVM 22 in bookworm-security (1:22.1.8-1~deb12u1); LLVM 19 is in bookworm
# main (pairs with melior 0.22). ~1.2 GB. Idempotent: does nothing when already installed.
#
# Then build with (defaults for these three are in .cargo/config.toml):
#   MLIR_SYS_220_PREFIX=/usr/lib/llvm-22 TABLEGEN_220_PREFIX=/usr/lib/llvm-22 \
#   LIBCLANG_PATH=/usr/lib/llvm-14/lib cargo test -p codegen --features mlir
# Pitfalls: without libpolly-22-dev the link fails ("could not find native static library
# Polly"), without libzstd-dev ("unable to find library -lzstd"); /usr/bin/llvm-config is
# LLVM 14, hence the prefix variables; libmlir-22-dev and libmlir-19-dev conflict.
set -euo pipefail

packages=(libmlir-22-dev mlir-22-tools llvm-22-dev libpolly-22-dev libzstd-dev libclang-dev)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# What melior's build scripts need, checked here so a failure names the missing piece.
test -x /usr/lib/llvm-22/bin/mlir-tblgen || { echo "mlir-tblgen 22 missing" >&2; exit 1; }
test -f /usr/lib/llvm-22/lib/libMLIR.so -o -f /usr/lib/llvm-22/lib/libMLIRIR.a \
  || { echo "MLIR 22 libraries missing" >&2; exit 1; }
ls /usr/lib/llvm-14/lib/libclang.so* >/dev/null 2>&1 \
  || ls /usr/lib/x86_64-linux-gnu/libclang*.so* >/dev/null 2>&1 \
  || { echo "libclang missing" >&2; exit 1; }
echo "MLIR 22 ready: $(/usr/lib/llvm-22/bin/mlir-opt --version | grep -i version | head -1)"
