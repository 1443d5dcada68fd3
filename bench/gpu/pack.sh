#!/usr/bin/env bash
# Packs what the GPU machine lacks into ignored folders, for bench/gpu/run-on-device.sh. The GPU
# machine has CUDA, cmake, ninja and g++ but no Node, npm, GoogleTest or network, and a command
# takes at most 64 MiB along, so the pieces go in separate folders, one per device command:
#
#   .gpu-carry/        node (xz), node_modules (xz, without the dev-only giants), GoogleTest
#                      source, the model's header (a full-size zero-weight copy is made from it)
#   .gpu-model/partN   the real model's weights in two halves (two small commands before the run)
#   .gpu-llama/        llama.cpp's source, from the copy node-llama-cpp bundles (llama phase)
#
#   bench/gpu/pack.sh [carry|model|llama|all]      (default all)
set -euo pipefail
cd "$(dirname "$0")/../.."
what="${1:-all}"
model="${CTXBANK_MODEL:-$HOME/.cache/ctxbank/models/SmolLM2-135M-Instruct.Q4_1.gguf}"
nm="$(readlink -f node_modules)"
max=$((64 * 1024 * 1024 - 2 * 1024 * 1024))  # what one command carries, less room for the tree

check_size() {
  local bytes
  bytes=$(du -sb "$1" | cut -f1)
  echo "$1: $((bytes / 1024 / 1024)) MiB"
  if [ "$bytes" -gt "$max" ]; then
    echo "pack: $1 is over what one device command can carry" >&2
    exit 1
  fi
}

if [ "$what" = carry ] || [ "$what" = all ]; then
  rm -rf .gpu-carry && mkdir -p .gpu-carry
  xz -T2 -6 -c "$(readlink -f "$(command -v node)")" > .gpu-carry/node.xz
  # Every installed package except the large dev-only ones nothing on the GPU machine runs.
  (cd "$(dirname "$nm")" && ls -A node_modules |
    grep -vxE 'node-llama-cpp|@node-llama-cpp|typescript|kubernetes-models|@kubernetes-models|playwright-core|@resvg|drizzle-kit|@types|\.cache|\.vite|\.vitest' |
    sed 's#^#node_modules/#' | tar -cf - -T -) | xz -T2 -6 > .gpu-carry/node_modules.tar.xz
  gtest="${GTEST_SOURCE:-/usr/src/googletest}"
  tar -C "$(dirname "$gtest")" -cJf .gpu-carry/googletest.tar.xz "$(basename "$gtest")"
  # The model's header (metadata + tensor table, up to where the weights start) and its size.
  node -e '
    const a = require(process.argv[1]);
    const i = a.ggufInfo(process.argv[2]);
    const start = Math.ceil(i.headerBytes / i.alignment) * i.alignment;
    console.log(start + " " + i.fileSize);
  ' "$PWD/native/build/Release/ctxbank_native.node" "$model" > .gpu-carry/model-layout.txt
  read -r head_bytes _ < .gpu-carry/model-layout.txt
  head -c "$head_bytes" "$model" | xz -T2 -6 > .gpu-carry/model-head.xz
  sha256sum "$model" | cut -d' ' -f1 > .gpu-carry/model.sha256
  git rev-parse HEAD > .gpu-carry/revision
  check_size .gpu-carry
fi

if [ "$what" = model ] || [ "$what" = all ]; then
  rm -rf .gpu-model && mkdir -p .gpu-model
  split -n 2 -d -a 1 "$model" .gpu-model/part
  check_size .gpu-model/part0
  check_size .gpu-model/part1
fi

if [ "$what" = llama ] || [ "$what" = all ]; then
  rm -rf .gpu-llama && mkdir -p .gpu-llama
  tmp="$(mktemp -d)"
  git -c advice.detachedHead=false clone -q "$nm/node-llama-cpp/llama/gitRelease.bundle" "$tmp/llama.cpp"
  (cd "$tmp/llama.cpp" && tar -cJf - --ignore-failed-read CMakeLists.txt cmake common ggml include src vendor tools licenses LICENSE app 2>/dev/null) > .gpu-llama/llama-src.tar.xz
  rm -rf "$tmp"
  check_size .gpu-llama
fi
