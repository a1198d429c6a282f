#!/usr/bin/env bash
# Capture the open-world test traces on one GPU host (see tests/data/openworld/README.md).
# Usage (repo root, on the GPU host): scripts/openworld/capture.sh NSYS_WRAPPER OUT_DIR
set -uo pipefail
NSYS=$1; OUT=$2; here=$(dirname "$0"); mkdir -p "$OUT"; t=$(mktemp -d)
nvcc -O2 -o "$t/plain_cuda" "$here/plain_cuda.cu" -lcublas && echo "built plain_cuda"
$NSYS profile -t cuda --sample=none --cpuctxsw=none -o "$t/plain_cuda" "$t/plain_cuda"
$NSYS export --type sqlite -o "$OUT/nsys_plain_cuda.sqlite" "$t/plain_cuda.nsys-rep"
python3 "$here/sdpa_model.py" "$OUT"
$NSYS profile -t cuda,nvtx --sample=none --cpuctxsw=none -o "$t/sdpa" python3 "$here/sdpa_model.py" "$OUT" --nsys
$NSYS export --type sqlite -o "$OUT/nsys_sdpa_single_gpu.sqlite" "$t/sdpa.nsys-rep"
python3 "$here/nccl_world1.py" "$OUT"
for f in "$OUT"/*.json "$OUT"/*.sqlite; do [ -f "$f" ] && gzip -9 "$f"; done
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name(0))"
$NSYS --version
ls -la "$OUT"
