#!/usr/bin/env bash
# The GPU run: one device command (bench/gpu/README.md gives the call). Needs .gpu-carry/ from
# bench/gpu/pack.sh, carried along. Writes at most 8 files to $OUT, each as soon as it exists:
#   run.log      what ran, when, and each phase's result     env.txt       the machine, the binaries
#   gtest.log    the CUDA suites' output                     gtest.json    per test: result, failure
#   sanitizer.log  a crashed suite re-run under compute-sanitizer (if any crashed)
#   bench.log    the benches' output (ours, llama.cpp's)      bench.json    every point measured (llama.cpp's
#                                                             too, as "llama", when .gpu-carry holds its benches)
#   summary.md   pass/fail per suite, first failure, our figures beside llama.cpp's
#
#   bash bench/gpu/device-run.sh                     the run (<= 8 min: own deadline, every phase under timeout)
#   bash bench/gpu/device-run.sh diagnose [FILTER]   after a failed run, on the still-warm machine (<= 2.5 min):
#                                                    the failed suites (or FILTER) again, one kernel at a time
#                                                    (CUDA_LAUNCH_BLOCKING) and under compute-sanitizer
#   bash bench/gpu/device-run.sh --device cpu        the same run on a CPU machine (rehearsal: CUDA suites skip)
set -uo pipefail  # not -e: a phase that fails is recorded and the run goes on
cd "$(dirname "$0")/../.."
repo="$PWD"
: "${OUT:?set OUT to the folder that comes back}"
mkdir -p "$OUT"
carry="$repo/.gpu-carry" work=/tmp/ctxbank-gpu
mode=run device=cuda filter=""
while [ $# -gt 0 ]; do
  case "$1" in
    diagnose) mode=diagnose; filter="${2:-}"; [ $# -gt 1 ] && shift ;;
    --device) device="$2"; shift ;;
    *) echo "device-run: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done
start=$(date +%s)
# seconds: 7m50s for the run, 2m20s to diagnose; CTXBANK_GPU_BUDGET overrides (less device time left)
budget=${CTXBANK_GPU_BUDGET:-$([ "$mode" = run ] && echo 470 || echo 140)}
bench_reserve=$((budget * 55 / 100))  # the gtests stop where this much is left for the bench and summary
left() { echo $((budget - ($(date +%s) - start))); }
log() { echo "[$(date -u +%T) +$(($(date +%s) - start))s] $*" | tee -a "$OUT/run.log"; }
tests="$carry/ctxbank_native_tests" bench="$carry/ctxbank_gpu_bench"
sanitizer="$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null || true)"
mkdir -p "$work"

# --- environment and load check -------------------------------------------------------------
log "mode $mode, device $device, budget ${budget}s"
{
  echo "## machine"; uname -a; nvidia-smi 2>&1 || echo "(no nvidia-smi)"
  echo "## carried"; cat "$carry/manifest.txt" 2>&1
  echo "## shared libraries"; ldd "$tests" "$bench" 2>&1
  echo "## compute-sanitizer: ${sanitizer:-none}"
} > "$OUT/env.txt" 2>&1
if ! (cd "$carry" && sha256sum --quiet -c <(grep -E '^[0-9a-f]{64} ' manifest.txt)); then
  log "FAIL: the carried files do not match their manifest (incomplete copy?)"
  exit 1
fi
# A full-size model file with the real header and zero weights: the shapes are the real model's;
# speed does not depend on the values (correctness is the gtests' job, on random weights).
model="$work/model-zero.gguf"
size=$(grep -oE '^model .* ([0-9]+) bytes' "$carry/manifest.txt" | grep -oE '[0-9]+ bytes' | cut -d' ' -f1)
if [ ! -f "$model" ] || [ "$(stat -c %s "$model")" != "$size" ]; then
  cp "$carry/model-head.gguf" "$model" && truncate -s "$size" "$model"
fi
if ! timeout 30 "$tests" --gtest_list_tests > "$work/tests.txt" 2>>"$OUT/run.log" ||
   ! timeout 30 "$bench" --layout "$model" >> "$OUT/run.log" 2>&1; then
  log "FAIL: the carried binaries do not start here (see env.txt: shared libraries)"
  exit 1
fi
log "load check passed: binaries start, model $size bytes (zero weights)"

# One process per suite (a gtest filter), so a crash or a hang ends that suite only; exit status
# 0 = passed (skips included).
run_suite() {  # filter, timeout seconds, then VAR=value... for its environment
  local filter="$1" limit="$2"; shift 2
  local json="$work/gtest-$(tr -c 'A-Za-z0-9_\n' _ <<<"$filter").json"
  rm -f "$json"
  echo "===== $filter" >> "$OUT/gtest.log"
  env "$@" timeout -k 5 "$limit" "$tests" --gtest_filter="$filter" --gtest_output="json:$json" --gtest_color=no >> "$OUT/gtest.log" 2>&1
}
# The CUDA suites as filters, the most telling first (a run short of time stops early): the simple
# kernels, the fast variants' kernel suites, whole forward passes with the simple and the fast
# kernels, then the rest; the parameterized engine suite runs once per kernel set (each set's
# failure, crash or time-out then stays its own).
cuda_suites() {
  local suites params all
  suites="$(grep -E '^[A-Za-z/_]*Cuda[A-Za-z_]*\.$' "$work/tests.txt" | tr -d .)"
  all="$(grep -v Engine <<<"$suites" | sed 's/$/.*/'
    for s in $(grep Engine <<<"$suites"); do
      params="$(awk -v s="$s." '/^[^ ]/ { on = ($0 == s) } on && /^  / { n = split($1, a, "/"); if (n > 1) print a[n] }' "$work/tests.txt" | sort -u)"
      if [ -z "$params" ]; then echo "$s.*"; else for p in $params; do echo "$s.*/$p"; done; fi
    done)"
  for first in 'CudaKernels.*' 'CudaFused.*' 'CudaMatvecFast.*' 'CudaMatvecFused.*' 'CudaGemmFast.*' '*/simple' '*/fast' \
    '*/fast_fused_decode' '*/fast_pdl' 'CudaEngine.*'; do
    grep -F -x -- "$first" <<<"$all" || grep -E -- "${first//\*/.*}$" <<<"$all" | grep '/' || true
  done | awk '!seen[$0]++' > "$work/first.txt"
  cat "$work/first.txt"
  grep -F -x -v -f "$work/first.txt" <<<"$all"
}
if [ "$mode" = diagnose ]; then
  suites="$filter"
  [ -z "$suites" ] && suites="$(awk -F'\t' '$2 != 0 && $2 != "not run" { print $1 }' "$work/suites.tsv" 2>/dev/null)"
  [ -z "$suites" ] && suites="$(cuda_suites)"
  for s in $suites; do
    [ "$(left)" -lt 20 ] && { log "out of time before $s"; break; }
    log "diagnose $s: one kernel at a time (CUDA_LAUNCH_BLOCKING=1)"
    run_suite "$s" $(( $(left) / 2 < 60 ? $(left) / 2 : 60 )) CUDA_LAUNCH_BLOCKING=1
    log "  exit $?"
    if [ -n "$sanitizer" ] && [ "$(left)" -gt 30 ]; then
      log "diagnose $s: compute-sanitizer memcheck"
      timeout -k 5 $(( $(left) - 15 )) "$sanitizer" --tool memcheck --print-limit 20 "$tests" --gtest_filter="$s" \
        --gtest_color=no >> "$OUT/sanitizer.log" 2>&1
      log "  exit $?"
    fi
  done
  tail -n 60 "$OUT/gtest.log" > "$OUT/summary.md"
  exit 0
fi

# --- the CUDA gtests ---------------------------------------------------------------------------
# Each kernel variant is compared with its CPU (or simple-kernel) reference; the engine suites run
# whole forward passes against the CPU engine, once per kernel set (Variants/CudaEngineKernels).
: > "$work/suites.tsv"
sanitized=0
for s in $(cuda_suites); do
  if [ "$(left)" -lt "$bench_reserve" ]; then
    log "not run (out of time): $s"; printf '%s\tnot run\t0\n' "$s" >> "$work/suites.tsv"; continue
  fi
  t0=$(date +%s)
  run_suite "$s" $(( $(left) - bench_reserve < 120 ? $(left) - bench_reserve : 120 ))
  rc=$?
  printf '%s\t%s\t%s\n' "$s" "$rc" "$(($(date +%s) - t0))" >> "$work/suites.tsv"
  log "suite $s: $([ $rc = 0 ] && echo passed || echo "FAILED (exit $rc)") in $(($(date +%s) - t0))s"
  # A crash (signal, or CUDA's abort) rather than failed assertions: once, under compute-sanitizer.
  if [ $rc -ne 0 ] && [ $rc -ne 1 ] && [ $sanitized = 0 ] && [ -n "$sanitizer" ] && [ "$(left)" -gt $((bench_reserve + 70)) ]; then
    sanitized=1
    log "re-running $s under compute-sanitizer (memcheck)"
    timeout -k 5 60 "$sanitizer" --tool memcheck --print-limit 20 "$tests" --gtest_filter="$s" --gtest_color=no \
      > "$OUT/sanitizer.log" 2>&1
    log "  compute-sanitizer exit $?"
  fi
done
python3 bench/gpu/summary.py gtest-json "$work" > "$OUT/gtest.json" 2>>"$OUT/run.log"

# --- the bench: one process per kernel set, so a crash loses that set only ----------------------
if [ "$device" = cpu ]; then sets=("simple"); full=1; quick=(--quick); else
  # fast, and fast with fused-decode and with pdl (neither run on a GPU yet), first and at every
  # point (the sets the targets are judged on; the simple kernels' every point is in run-1), then
  # each set alone at a few points, the decode variants first.
  sets=("fast" "fast,fused-decode" "fast,pdl" "simple" "fused-decode" "attention" "matvec" "fused" "gemm" "prefill-attention"); full=3
  quick=(); fi
rm -f "$work"/bench-*.json "$work"/llama-*.out

# llama.cpp beside ours, when packed (bench/gpu/build-llama.sh): the same zero-weight model and
# points, flash attention on (and off where it could win: decode at 0 and 4K, prefill), jsonl into
# $work (summary.py llama-json reads it), its log into bench.log. Runs after the full sets.
llama_ran=0
llama_phase() {
  [ $llama_ran = 0 ] && [ "$device" = cuda ] && [ -f "$carry/llama-cuda.tar.xz" ] || return 0
  llama_ran=1
  local dir="$work/llama"
  rm -rf "$dir" && mkdir -p "$dir" && tar -C "$dir" -xJf "$carry/llama-cuda.tar.xz" || { log "llama.cpp: unpack failed"; return 0; }
  run_llama() {  # name, seconds at most, then the binary and its arguments
    local name="$1" limit="$2"; shift 2
    limit=$(( $(left) - 60 < limit ? $(left) - 60 : limit ))
    [ "$limit" -lt 10 ] && { log "llama.cpp: out of time before $name"; return 0; }
    log "llama.cpp: $name (at most ${limit}s)"
    echo "===== llama.cpp $name" >> "$OUT/bench.log"
    LD_LIBRARY_PATH="$dir:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}" timeout -k 5 "$limit" "$dir/$@" -m "$model" \
      >> "$work/llama-$name.out" 2>> "$OUT/bench.log"
    log "  exit $?"
  }
  run_llama decode 75 llama-bench -ngl 99 -fa on -p 0 -n 64 -d 0,4096,8192,32768,131072 -r 3 -o jsonl
  run_llama decode 20 llama-bench -ngl 99 -fa off -p 0 -n 64 -d 0,4096 -r 3 -o jsonl
  run_llama prefill 30 llama-bench -ngl 99 -fa on,off -p 512,8192 -n 0 -r 3 -o jsonl
  run_llama batched 75 llama-batched-bench -ngl 99 -fa on -c $((128 * (4096 + 128))) -b 2048 -ub 512 -npp 4096 -ntg 128 \
    -npl 1,8,32,128 --output-format jsonl
  python3 bench/gpu/summary.py bench-json "$work" > "$OUT/bench.json" 2>>"$OUT/run.log"
}

i=0
for k in "${sets[@]}"; do
  [ $i = "$full" ] && llama_phase
  limit=$(( $(left) - 25 ))
  [ "$limit" -lt 15 ] && { log "bench: out of time before kernels $k"; break; }
  # The first `full` sets measure every point, ~25% of what is left each; later sets a few points
  # each (gpu_bench.cc), sharing the rest.
  share=$([ $i -lt $full ] && echo $((limit * 25 / 100)) || echo $((limit / (${#sets[@]} - i))))
  log "bench: kernels $k (at most ${share}s)"
  extra=()
  [ $i -lt $full ] || extra=(--subset)
  timeout -k 5 $((share + 10)) "$bench" --model "$model" --device "$device" --kernels "$k" --deadline "$share" \
    --out "$work/bench-$i-$k.json" "${quick[@]}" "${extra[@]}" >> "$OUT/bench.log" 2>&1
  log "  exit $?"
  python3 bench/gpu/summary.py bench-json "$work" > "$OUT/bench.json" 2>>"$OUT/run.log"
  i=$((i + 1))
done

llama_phase  # if the loop ended before it

# --- summary -------------------------------------------------------------------------------------
python3 bench/gpu/summary.py summary "$work" "$OUT" bench/gpu/llama-h100.json > "$OUT/summary.md" 2>>"$OUT/run.log"
log "done: summary.md written"
