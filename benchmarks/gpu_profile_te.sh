#!/usr/bin/env bash
# On one GPU with Transformer Engine installed: cptrace profile --nsys --probe on the
# te_transformer model, the probe's overhead, and the FP8 misaligned-token case (TE issue #1795)
# next to its aligned fix. Writes bundles, logs and results.md under OUT.
# Usage (repository root): benchmarks/gpu_profile_te.sh OUT "NSYS_CMD"
#   e.g. benchmarks/gpu_profile_te.sh $OUT "../gpu-host/nsys.sh ../debs"
set -uo pipefail
OUT=$1; NSYS=${2:-nsys}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
mkdir -p "$OUT"
# `timeout` needs an executable, not a shell function: a two-line cptrace launcher on PATH.
mkdir -p "$OUT/.bin"
printf '#!/bin/sh\nexec python3 -c "from cptrace.cli import main; main()" "$@"\n' > "$OUT/.bin/cptrace"
chmod +x "$OUT/.bin/cptrace"; export PATH=$OUT/.bin:$PATH
rows=()
step() {  # step NAME TIMEOUT CMD...: run, log, record outcome and wall time
  local name=$1 limit=$2; shift 2
  local t0=$(date +%s)
  timeout "$limit" "$@" > "$OUT/$name.log" 2>&1; local rc=$?
  rows+=("| $name | rc $rc | $(( $(date +%s) - t0 )) |")
  echo "=== $name rc=$rc ($(( $(date +%s) - t0 )) s)"; tail -n 6 "$OUT/$name.log"
}
python3 -c 'import torch, transformer_engine; print(torch.__version__, transformer_engine.__version__, torch.cuda.get_device_name(0))'
step profile-nsys-probe 100 cptrace profile --nsys --probe --nsys-cmd "$NSYS" --watchdog 20 \
  --name te-transformer-profile --out "$OUT/te-profile-nsys" -- \
  python3 -m runners.models.train runners/examples/te_transformer.yaml --steps 8
step fp8-misaligned 70 cptrace run runners/examples/te_fp8_misaligned.yaml \
  --out "$OUT/fp8-misaligned" --timeout 65
step fp8-misaligned-analyze 30 cptrace analyze "$OUT/fp8-misaligned" --json
step probe-overhead 90 python3 benchmarks/probe_overhead.py runners/examples/te_transformer.yaml \
  --steps 30 --repeats 2 --json "$OUT/probe_overhead.json"
step fp8-aligned 70 cptrace run runners/examples/te_fp8_aligned.yaml --out "$OUT/fp8-aligned" \
  --timeout 65
step fp8-aligned-analyze 30 cptrace analyze "$OUT/fp8-aligned" --json
{ echo "| step | outcome | wall s |"; echo "|---|---|---|"; printf '%s\n' "${rows[@]}"; } \
  | tee "$OUT/results.md"
# Few files come back from the device: one archive per bundle, one for all logs.
for b in te-profile-nsys fp8-misaligned fp8-aligned; do
  [ -f "$OUT/$b/manifest.json" ] && cptrace bundle pack "$OUT/$b" --out "$OUT/$b.tar.gz" \
    && rm -rf "${OUT:?}/$b"
done
rm -rf "$OUT/.bin"
(cd "$OUT" && logs=$(ls ./*.log | grep -v '/all.log$') && tar czf logs.tar.gz $logs && rm -f $logs)
du -sh "$OUT"/* 2>/dev/null
