#!/usr/bin/env bash
# On one GPU with Transformer Engine installed: cptrace profile --nsys --probe on the
# te_transformer model (no CP) and its analysis, the probe's overhead, and the FP8
# misaligned-token case (TE issue #1795) next to its aligned fix.
# Usage (repository root): benchmarks/gpu_profile_te.sh OUT "NSYS_CMD" [BUDGET_S]
#   e.g. benchmarks/gpu_profile_te.sh $OUT "../gpu-host/nsys.sh ../debs" 420
# The device returns few files (at most 8): everything goes into OUT/gpu_profile.tar.gz, next to
# it only results.md (the summary table, also printed last) and the small JSON files a reader
# wants first (the profiled bundle's manifest, the analysis reports, the overhead numbers).
# BUDGET_S: the steps share this many seconds; a step that no longer fits is skipped (listed as
# such), so the packing at the end always runs inside the device call's limit.
# Dry run on CPU: PROFILE_SPEC=... PROFILE_FLAGS="--torch --probe" MISALIGNED_SPEC=... etc.;
# a spec variable set to "" skips its steps (e.g. OVERHEAD_SPEC= MISALIGNED_SPEC= ALIGNED_SPEC=).
set -uo pipefail
OUT=$1; NSYS=${2:-nsys}; BUDGET=${3:-420}
PROFILE_SPEC=${PROFILE_SPEC:-runners/examples/te_transformer.yaml}
PROFILE_FLAGS=${PROFILE_FLAGS:---nsys --probe}
PROFILE_STEPS=${PROFILE_STEPS:-8}
OVERHEAD_SPEC=${OVERHEAD_SPEC-$PROFILE_SPEC}
OVERHEAD_ARGS=${OVERHEAD_ARGS:---steps 100 --repeats 2}
MISALIGNED_SPEC=${MISALIGNED_SPEC-runners/examples/te_fp8_misaligned.yaml}
ALIGNED_SPEC=${ALIGNED_SPEC-runners/examples/te_fp8_aligned.yaml}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
PY=${PYTHON:-python3}
mkdir -p "$OUT/work"; W=$OUT/work   # everything here ends up in the one archive
# `timeout` needs an executable, not a shell function: a two-line cptrace launcher on PATH.
mkdir -p "$W/.bin"
printf '#!/bin/sh\nexec %s -c "from cptrace.cli import main; main()" "$@"\n' "$PY" > "$W/.bin/cptrace"
chmod +x "$W/.bin/cptrace"; export PATH=$W/.bin:$PATH
rows=()
step() {  # step NAME LIMIT STDOUT_FILE CMD...: run (stderr+stdout to NAME.log unless a file is
  # named for stdout), record outcome and wall time; skipped when the budget cannot cover LIMIT
  local name=$1 limit=$2 dest=$3; shift 3
  if [ "${SKIP:-}" = 1 ]; then rows+=("| $name | not asked |  |"); return; fi
  local left=$(( BUDGET - SECONDS - 20 ))
  if (( left < limit / 2 )); then
    rows+=("| $name | skipped (budget: ${left} s left) | 0 |"); echo "=== $name skipped"; return
  fi
  (( limit > left )) && limit=$left
  local t0=$SECONDS rc
  if [ -n "$dest" ]; then timeout "$limit" "$@" > "$dest" 2> "$W/$name.log"; rc=$?
  else timeout "$limit" "$@" > "$W/$name.log" 2>&1; rc=$?; fi
  rows+=("| $name | rc $rc | $(( SECONDS - t0 )) |")
  echo "=== $name rc=$rc ($(( SECONDS - t0 )) s)"; tail -n 8 "$W/$name.log"
}
$PY -c 'import torch; print("torch", torch.__version__, torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu")
try:
    import transformer_engine; print("transformer_engine", transformer_engine.__version__)
except ImportError as exc: print("no transformer_engine:", exc)' | tee "$W/versions.log"
# shellcheck disable=SC2086  # PROFILE_FLAGS / OVERHEAD_ARGS are word lists
step profile-nsys-probe 120 "" cptrace profile $PROFILE_FLAGS --nsys-cmd "$NSYS" --watchdog 20 \
  --name te-transformer-profile --out "$W/te-profile" -- \
  $PY -m runners.models.train "$PROFILE_SPEC" --steps "$PROFILE_STEPS"
step profile-analyze 60 "$OUT/profile_report.json" cptrace analyze "$W/te-profile" --json
[ -f "$W/te-profile/manifest.json" ] && cp "$W/te-profile/manifest.json" "$OUT/profile_manifest.json"
SKIP=$([ -n "$OVERHEAD_SPEC" ] || echo 1)
# shellcheck disable=SC2086
step probe-overhead 150 "" $PY benchmarks/probe_overhead.py "$OVERHEAD_SPEC" $OVERHEAD_ARGS \
  --json "$OUT/probe_overhead.json"
SKIP=$([ -n "$MISALIGNED_SPEC" ] || echo 1)
step fp8-misaligned 70 "" cptrace run "$MISALIGNED_SPEC" --out "$W/fp8-misaligned" --timeout 65
step fp8-misaligned-analyze 30 "$OUT/fp8_misaligned_report.json" \
  cptrace analyze "$W/fp8-misaligned" --json
SKIP=$([ -n "$ALIGNED_SPEC" ] || echo 1)
step fp8-aligned 80 "" cptrace run "$ALIGNED_SPEC" --out "$W/fp8-aligned" --timeout 75
step fp8-aligned-analyze 30 "$OUT/fp8_aligned_report.json" cptrace analyze "$W/fp8-aligned" --json
SKIP=
rm -rf "$W/.bin"
for f in "$OUT"/*.json; do [ -s "$f" ] || rm -f "$f"; done   # a failed analyze leaves nothing
{ echo "| step | outcome | wall s |"; echo "|---|---|---|"; printf '%s\n' "${rows[@]}"
  echo; $PY benchmarks/gpu_profile_summary.py "$OUT" "$W"; } > "$OUT/results.md" 2>&1
tar czf "$OUT/gpu_profile.tar.gz" -C "$OUT" work && rm -rf "$W"
ls -la "$OUT"
cat "$OUT/results.md"
