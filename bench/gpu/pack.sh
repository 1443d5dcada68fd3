#!/usr/bin/env bash
# Builds, here, everything the GPU machine runs, into one ignored folder that a device command
# carries (bench/gpu/README.md): the GPU machine has CUDA and g++ but no Node, GoogleTest or
# network, and one command takes at most 64 MiB along, working tree included.
#
#   bench/gpu/pack.sh            -> .gpu-carry/
#
# .gpu-carry/ holds the CUDA test binary and the bench (sm_90a, the H100; CUDA runtime, GoogleTest,
# libstdc++ and libgcc linked in statically, stripped), the model's header (metadata and tensor
# table: the GPU machine makes a full-size copy with zero weights from it) and a manifest. The
# binaries are checked: H100 code present, no shared library beyond glibc's, no glibc symbol newer
# than this machine's. With .gpu-build/llama-cuda.tar.xz there (bench/gpu/build-llama.sh), llama.cpp's
# CUDA benches travel too, and the run measures them beside ours.
set -euo pipefail
cd "$(dirname "$0")/../.."
model="${CTXBANK_MODEL:-$HOME/.cache/ctxbank/models/SmolLM2-135M-Instruct.Q4_1.gguf}"
carry=.gpu-carry build=.gpu-build
limit=$((64 * 1024 * 1024))

if [ ! -f "$model" ]; then
  echo "pack: no model at $model (npm run model fetches it; or set CTXBANK_MODEL)" >&2
  exit 1
fi
nvcc="$(native/cuda/install-nvcc.sh)"
# cuobjdump (to check the binaries hold sm_90a code): PyPI has no 13.0 build; a newer one reads 13.0 binaries.
tools="${XDG_CACHE_HOME:-$HOME/.cache}/ctxbank/cuobjdump-13.2"
if [ ! -x "$tools/nvidia/cu13/bin/cuobjdump" ]; then
  python3 -m pip install --quiet --disable-pip-version-check --no-deps --target "$tools" nvidia-cuda-cuobjdump==13.2.51 >&2
fi
cuobjdump="$tools/nvidia/cu13/bin/cuobjdump"

cmake -S native -B "$build" -DCMAKE_BUILD_TYPE=Release -DCTXBANK_NATIVE_TESTS=ON -DCTXBANK_CUDA=ON -DCTXBANK_UCX=OFF \
  -DCMAKE_CUDA_COMPILER="$nvcc" -DCMAKE_CUDA_ARCHITECTURES=90a \
  -DCMAKE_EXE_LINKER_FLAGS="-static-libstdc++ -static-libgcc" >/dev/null
cmake --build "$build" --parallel "$(nproc)" --target ctxbank_native_tests ctxbank_gpu_bench

rm -rf "$carry" && mkdir -p "$carry"
glibc_here="$(ldd --version | head -1 | grep -oE '[0-9]+\.[0-9]+$')"
for bin in ctxbank_native_tests ctxbank_gpu_bench; do
  strip -o "$carry/$bin" "$build/$bin"
  elves="$("$cuobjdump" --list-elf "$carry/$bin")"  # (not piped into grep -q: SIGPIPE under pipefail)
  if ! grep -q 'sm_90a' <<<"$elves"; then
    echo "pack: $bin has no sm_90a code" >&2
    exit 1
  fi
  # Shared libraries: only glibc's own (the CUDA driver, libcuda, is loaded at run time by the runtime).
  extra="$(ldd "$carry/$bin" | grep -vE 'linux-vdso|ld-linux|libc\.so|libm\.so|libpthread|libdl\.so|librt\.so' || true)"
  if [ -n "$extra" ]; then
    echo "pack: $bin needs shared libraries the GPU machine may lack:" >&2
    echo "$extra" >&2
    exit 1
  fi
  newest="$(objdump -T "$carry/$bin" | grep -oE 'GLIBC_[0-9]+\.[0-9]+' | sort -uV | tail -1)"
  if [ "$(printf '%s\n' "GLIBC_$glibc_here" "$newest" | sort -V | tail -1)" != "GLIBC_$glibc_here" ]; then
    echo "pack: $bin needs $newest, newer than this machine's glibc $glibc_here" >&2
    exit 1
  fi
done

# The model's header: every byte before the weights, and the file's size.
read -r data_start file_size < <("$carry/ctxbank_gpu_bench" --layout "$model")
head -c "$data_start" "$model" > "$carry/model-head.gguf"
carried=(ctxbank_native_tests ctxbank_gpu_bench model-head.gguf)
if [ -f "$build/llama-cuda.tar.xz" ]; then
  cp "$build/llama-cuda.tar.xz" "$carry/"
  carried+=(llama-cuda.tar.xz)
else
  echo "pack: no $build/llama-cuda.tar.xz (bench/gpu/build-llama.sh): the run compares with llama.cpp's recorded figures" >&2
fi
{
  echo "revision $(git rev-parse HEAD)$(git diff --quiet HEAD -- native bench/gpu || echo ' (with uncommitted changes)')"
  echo "packed $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "model $(basename "$model") $file_size bytes, weights from byte $data_start, sha256 $(sha256sum "$model" | cut -d' ' -f1)"
  (cd "$carry" && sha256sum "${carried[@]}")
} > "$carry/manifest.txt"

# What one device command carries: this folder and the working tree (tracked and untracked files
# that git does not ignore).
tree=$(git ls-files -co --exclude-standard -z | du -cb --files0-from=- 2>/dev/null | tail -1 | cut -f1)
packed=$(du -sb "$carry" | cut -f1)
echo "pack: $carry $((packed / 1024)) KiB + working tree $((tree / 1024)) KiB of $((limit / 1024)) KiB one command carries"
if [ $((packed + tree)) -gt "$limit" ]; then
  echo "pack: over what one device command carries" >&2
  exit 1
fi
cat "$carry/manifest.txt"
