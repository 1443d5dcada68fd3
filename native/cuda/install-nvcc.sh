#!/usr/bin/env bash
# Installs the pinned CUDA 13.0 compiler from PyPI into a cache directory outside the repository
# and prints the path of nvcc. Idempotent: a complete install (marked by a stamp file naming the
# pinned versions) is reused. Fails loudly (non-zero exit) if pip cannot install it.
#
#   nvcc="$(native/cuda/install-nvcc.sh)"      # then: CUDACXX="$nvcc" npm run build:native
#
# nvvm and crt are pinned as well: unpinned, pip brings an nvvm whose PTX the 13.0 ptxas rejects.
# --no-deps: the five pins are the whole closure (nvcc requires nvvm, runtime and crt), and no
# dependency can then be resolved to an unpinned version.
set -euo pipefail

PACKAGES=(
  nvidia-cuda-nvcc==13.0.88
  nvidia-nvvm==13.0.88
  nvidia-cuda-crt==13.0.88
  nvidia-cuda-runtime==13.0.96
  nvidia-cuda-cccl==13.0.85
)
DIR="${CTXBANK_CUDA_HOME_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/ctxbank/cuda-13.0}"
STAMP="$DIR/.installed"
NVCC="$DIR/nvidia/cu13/bin/nvcc"

if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "${PACKAGES[*]}" ] && [ -x "$NVCC" ] &&
   [ -f "$DIR/nvidia/cu13/lib64/libcudart_static.a" ]; then
  echo "$NVCC"
  exit 0
fi

PYTHON="${PYTHON:-$(command -v python3 || true)}"
if [ -z "$PYTHON" ]; then
  echo "install-nvcc: python3 is needed to install the CUDA compiler from PyPI" >&2
  exit 1
fi
rm -rf "$DIR.tmp"
mkdir -p "$(dirname "$DIR")"
# Into a temporary folder first, so an interrupted install never looks complete.
"$PYTHON" -m pip install --quiet --disable-pip-version-check --no-deps --target "$DIR.tmp" "${PACKAGES[@]}" >&2
if [ ! -x "$DIR.tmp/nvidia/cu13/bin/nvcc" ]; then
  echo "install-nvcc: pip finished but $DIR.tmp/nvidia/cu13/bin/nvcc is missing" >&2
  exit 1
fi
# The static runtime (libcudart_static.a) is what the addon links; check it came along.
if ! ls "$DIR.tmp"/nvidia/cu13/lib*/libcudart_static.a >/dev/null 2>&1; then
  echo "install-nvcc: libcudart_static.a is missing from nvidia-cuda-runtime" >&2
  exit 1
fi
# nvcc.profile links from lib64 (the toolkit's layout); the wheels put the libraries in lib.
ln -sfn lib "$DIR.tmp/nvidia/cu13/lib64"
rm -rf "$DIR"
mv "$DIR.tmp" "$DIR"
echo "${PACKAGES[*]}" > "$STAMP"
echo "$NVCC"
