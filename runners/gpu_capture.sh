#!/usr/bin/env bash
# Capture the demo/test bundles on a 2-GPU host, in one go, with `cptrace run`.
#
# Usage (from the repository root, on the GPU host):
#   runners/gpu_capture.sh [OUT_DIR]
# Environment:
#   OUT_DIR    where the .tar.gz bundles go ($1 if given, else $OUT_DIR, else $OUT, else ./captures)
#   NSYS_CMD   how to call Nsight Systems (default: ".gpu/gpu-host/nsys.sh .gpu/debs")
#   PYTHON     the interpreter that has torch (default: python3)
#   SPECS      space-separated spec names from runners/examples/ (default: all four below)
#   MAX_MB     budget for all bundles together (default: 20)
#
# Prerequisites: torch with CUDA, pydantic (pip install --no-index --no-deps .gpu/wheels/pydantic*
# annotated_types* typing_inspection*), and for the TE specs Transformer Engine
# (.gpu/gpu-host/install-te.sh). A spec whose prerequisites are missing is skipped and listed at
# the end; one failing capture does not stop the others.
#
# What it captures (each: timed ABBA iterations without a profiler, then a few profiled steps
# per arm; see each spec's comments):
#   te_reference_3arms       TE stock (value-equal clone) vs pad_between_seqs=False vs same
#                            object; nsys + torch profiler
#   te_adapter_vs_stock      TE stock vs cp_attention's TE adapter; torch profiler
#   bundled_fixed_vs_broken  bundled CP attention, fixed vs its broken switches; nsys + torch
#   allgather_dcs_vs_nlb     all-gather CP, DualChunkSwap vs NoLoadBalance (bundled and TE)
# The 4-rank specs of issue 7 need 4 GPUs (nvidia-h200-x4):
#   SPECS="cp4_te_reference cp4_bundled_matrix" runners/gpu_capture.sh
# Each spec runs on as many processes as its `ranks:`; a spec needing more GPUs is skipped.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-${OUT_DIR:-${OUT:-captures}}}
NSYS_CMD=${NSYS_CMD:-".gpu/gpu-host/nsys.sh .gpu/debs"}
PYTHON=${PYTHON:-python3}
MAX_MB=${MAX_MB:-20}
SPECS=${SPECS:-"te_reference_3arms te_adapter_vs_stock bundled_fixed_vs_broken allgather_dcs_vs_nlb"}
# NVLink multicast stays off on shared hosts (NCCL would otherwise try NVLS).
export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0} PYTHONUNBUFFERED=1
mkdir -p "$OUT"
WORK=$(mktemp -d "${TMPDIR:-/tmp}/cptrace-capture.XXXXXX")
trap 'rm -rf "$WORK"' EXIT

cptrace() { PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" "$PYTHON" -c 'from cptrace.cli import main; main()' "$@"; }
has() { PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" "$PYTHON" -c "import $1" 2>/dev/null; }

gpus=$("$PYTHON" -c 'import torch; print(torch.cuda.device_count())' 2>/dev/null || echo 0)
[ "$gpus" -ge 2 ] || { echo "need 2 CUDA GPUs, torch sees $gpus" >&2; exit 1; }
has pydantic || { echo "pydantic is missing: install the wheels from .gpu/wheels first" >&2; exit 1; }

done_list=() skipped=() failed=()
for name in $SPECS; do
  spec=runners/examples/$name.yaml
  [ -f "$spec" ] || { failed+=("$name (no $spec)"); continue; }
  if grep -q 'implementation: te' "$spec" && ! has transformer_engine.pytorch; then
    skipped+=("$name (Transformer Engine not installed)"); continue
  fi
  if grep -q 'te_adapter' "$spec" && ! has cp_attention.te_adapter; then
    skipped+=("$name (cp_attention.te_adapter not available)"); continue
  fi
  echo "=== $name"
  started=$(date +%s)
  nproc=$(awk '/^ranks:/ {print $2; exit}' "$spec"); nproc=${nproc:-2}
  if [ "$gpus" -lt "$nproc" ]; then
    skipped+=("$name (needs $nproc GPUs, torch sees $gpus)"); continue
  fi
  if cptrace run "$spec" --nproc "$nproc" --out "$WORK/$name" --nsys-cmd "$NSYS_CMD" --timeout 580; then
    cptrace bundle pack "$WORK/$name" --out "$OUT/$name.tar.gz" && done_list+=("$name")
    echo "    $(( $(date +%s) - started )) s, $(du -h "$OUT/$name.tar.gz" | cut -f1)"
  else
    failed+=("$name (see $OUT/$name.log)")
    cp "$WORK/$name"/logs/*.log "$OUT/$name.log" 2>/dev/null || true
  fi
done

total=$(du -cb "$OUT"/*.tar.gz 2>/dev/null | tail -1 | cut -f1)
echo
echo "captured: ${done_list[*]:-none}"
echo "skipped:  ${skipped[*]:-none}"
echo "failed:   ${failed[*]:-none}"
echo "total:    $(( ${total:-0} / 1024 / 1024 )) MB of bundles in $OUT (budget ${MAX_MB} MB)"
if [ "${total:-0}" -gt $(( MAX_MB * 1024 * 1024 )) ]; then
  echo "over budget: lower profiled_steps or drop Python stacks in the largest spec" >&2
  exit 2
fi
[ ${#failed[@]} -eq 0 ]
