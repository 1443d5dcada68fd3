#!/usr/bin/env bash
# Runs on the GPU machine (see bench/gpu/README.md): builds the addon with the CUDA backend there,
# runs the GPU tests (gtest + vitest) and our benchmark, and leaves logs and JSON under $OUT.
# Needs the folders bench/gpu/pack.sh makes here, carried along with the command.
#
#   bash bench/gpu/run-on-device.sh stash N   keep .gpu-model/partN in /tmp (real weights, N = 0, 1)
#   bash bench/gpu/run-on-device.sh ours      build, GPU tests, our bench    (carry .gpu-carry)
#   bash bench/gpu/run-on-device.sh llama     llama.cpp CUDA llama-bench     (carry .gpu-llama; after ours)
#
# /tmp survives between commands while the machine stays up, so the pieces meet there.
set -uo pipefail
cd "$(dirname "$0")/../.."
phase="${1:-ours}"
OUT="${OUT:-/tmp/ctxbank-gpu/out}"
W=/tmp/ctxbank-gpu
mkdir -p "$W" "$OUT"
log="$OUT/run.log"
say() { echo "== $(date -u +%H:%M:%S) $*" | tee -a "$log"; }
nproc_=$(nproc)

if [ "$phase" = stash ]; then
  part=".gpu-model/part${2:?which part: 0 or 1}"
  cp "$part" "$W/model.part$2" && say "stashed $part ($(du -h "$W/model.part$2" | cut -f1))"
  exit
fi

# The model: the real weights when both halves were stashed (and match), else a full-size file
# with the real header and zero weights (speed does not depend on the values).
model_file() {
  if [ -f "$W/model.gguf" ]; then echo "$W/model.gguf"; return; fi
  if [ -f "$W/model.part0" ] && [ -f "$W/model.part1" ]; then
    cat "$W/model.part0" "$W/model.part1" > "$W/model.tmp"
    if [ "$(sha256sum "$W/model.tmp" | cut -d' ' -f1)" = "$(cat .gpu-carry/model.sha256)" ]; then
      mv "$W/model.tmp" "$W/model.gguf"
      echo "$W/model.gguf"
      return
    fi
    echo "run-on-device: the stashed halves do not match model.sha256; using zero weights" >&2
  fi
  if [ ! -f "$W/model-zero.gguf" ]; then
    read -r _ size < .gpu-carry/model-layout.txt
    xz -dc .gpu-carry/model-head.xz > "$W/model-zero.gguf"
    truncate -s "$size" "$W/model-zero.gguf"
  fi
  echo "$W/model-zero.gguf"
}

if [ "$phase" = ours ]; then
  say "machine"
  { nvidia-smi; nvcc --version; cmake --version | head -1; g++ --version | head -1; } >> "$log" 2>&1
  say "unpack node, node_modules, googletest"
  [ -x "$W/node/bin/node" ] || { mkdir -p "$W/node/bin" && xz -dc .gpu-carry/node.xz > "$W/node/bin/node" && chmod +x "$W/node/bin/node"; }
  export PATH="$W/node/bin:$PATH"
  rm -rf node_modules && tar -xJf .gpu-carry/node_modules.tar.xz
  [ -d "$W/googletest" ] || tar -C "$W" -xJf .gpu-carry/googletest.tar.xz
  node --version >> "$log"
  model="$(model_file)"
  real=0
  [ "$model" = "$W/model.gguf" ] && real=1
  say "model: $model (real weights: $real)"

  say "build (CUDA on, sm_90a)"
  cmake -S native -B "$W/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCTXBANK_CUDA=ON \
    -DCMAKE_CUDA_COMPILER="${CUDACXX:-/usr/local/cuda/bin/nvcc}" -DCMAKE_CUDA_ARCHITECTURES=90a \
    -DCTXBANK_NATIVE_TESTS=ON -DCTXBANK_GTEST_SOURCE="$W/googletest" -DCMAKE_POLICY_VERSION_MINIMUM=3.5 \
    -DCMAKE_JS_VERSION=8.0.0 -DCMAKE_JS_INC="$PWD/node_modules/node-api-headers/include" \
    -DCMAKE_LIBRARY_OUTPUT_DIRECTORY="$W/build/Release" >> "$log" 2>&1 &&
    cmake --build "$W/build" -j"$nproc_" >> "$log" 2>&1
  build_rc=$?
  say "build exit $build_rc"
  if [ "$build_rc" != 0 ]; then tail -50 "$log"; exit 1; fi
  export CTXBANK_ADDON="$W/build/Release/ctxbank_native.node"

  say "gtest: every C++ test, the CUDA ones included (real model: $real)"
  if [ "$real" = 1 ]; then export CTXBANK_MODEL="$model"; fi
  "$W/build/ctxbank_native_tests" --gtest_output="json:$OUT/gtest.json" 2>&1 | tee -a "$log" | grep -E '^\[  (FAILED|PASSED|SKIPPED) |no usable GPU' | head -40
  say "gtest exit ${PIPESTATUS[0]}"

  say "vitest: test/device.test.ts$([ "$real" = 1 ] && echo ' test/gpu-engine.test.ts')"
  files=(test/device.test.ts)
  [ "$real" = 1 ] && files+=(test/gpu-engine.test.ts)
  CTXBANK_GPU_RESULTS="$OUT" node node_modules/vitest/vitest.mjs run "${files[@]}" --reporter=verbose 2>&1 | tee -a "$log" | tail -40
  say "vitest exit ${PIPESTATUS[0]}"

  say "bench: ours"
  node node_modules/tsx/dist/cli.mjs bench/gpu/bench.ts --model "$model" --out "$OUT/bench-ours.json" 2>&1 | tee -a "$log"
  say "bench exit ${PIPESTATUS[0]}"
  exit 0
fi

if [ "$phase" = llama ]; then
  model="$(model_file)"
  L=/root/llama.cpp
  if [ ! -x "$L/build/bin/llama-bench" ]; then
    say "build llama.cpp (CUDA, sm_90a): about 5 minutes on 16 cores"
    mkdir -p "$L" && tar -C "$L" -xJf .gpu-llama/llama-src.tar.xz
    cmake -S "$L" -B "$L/build" -G Ninja -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a -DLLAMA_CURL=OFF \
      -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF \
      -DGGML_NATIVE=ON >> "$log" 2>&1 &&
      cmake --build "$L/build" -j"$nproc_" --target llama-bench llama-batched-bench >> "$log" 2>&1
    say "llama.cpp build exit $?"
  fi
  B="$L/build/bin"
  say "llama-bench: prefill 512 / 8192, flash attention off and on"
  "$B/llama-bench" -m "$model" -ngl 99 -p 512,8192 -n 0 -fa 0,1 -r 3 -o json > "$OUT/llama-prefill.json" 2>> "$log"
  say "llama-bench: batch-1 decode at depth 0, 4K, 8K, 32K, 128K, flash attention off and on"
  "$B/llama-bench" -m "$model" -ngl 99 -p 0 -n 64 -d 0,4096,8192,32768,131072 -fa 0,1 -r 3 -o json > "$OUT/llama-decode.json" 2>> "$log"
  say "llama-batched-bench: 4K prompts + 128 tokens at B = 1, 8, 32, 128 (flash attention on)"
  "$B/llama-batched-bench" -m "$model" -ngl 99 -fa on -c $((128 * (4096 + 128))) -b 2048 -ub 512 \
    -npp 4096 -ntg 128 -npl 1,8,32,128 --output-format jsonl > "$OUT/llama-batched.jsonl" 2>&1  # report.ts keeps the JSON lines
  say "llama phase done"
  exit 0
fi

echo "run-on-device: unknown phase '$phase' (stash N | ours | llama)" >&2
exit 2
