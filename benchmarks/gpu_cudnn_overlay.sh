#!/usr/bin/env bash
# A newer cuDNN under the GPU host's torch, for the floor benchmark of issue 15.
#
# The offline GPU host has torch 2.11 (cu130) with cuDNN 9.19. The whole cuDNN wheel (~520 MB)
# cannot travel in one call (64 MiB per call, the tree included), but the SDPA graphs the
# bundled attention builds need only five of its libraries: the loader, the graph API, the
# heuristics, the runtime-compiled engines (the `fort_native_sdpa` kernels are generated there)
# and the tensor-IR engines. xz-compressed they are ~141 MB: five parts of 28 MiB.
#
#   stage DEST [VERSION]   here (PyPI reachable): download nvidia-cudnn-cu13==VERSION, keep the
#                          subset, write DEST/part00.. and DEST/sha256
#   install PARTS_DIR      on the GPU host, after the parts were copied there (one `run` per part):
#                          join, check sha256, extract to /tmp/cudnn-overlay, keep the host's
#                          libraries in /tmp/cudnn-host, put the overlay in their place
#   use host|overlay       on the GPU host: switch the libraries torch and the frontend load, so
#                          one call can run the same benchmark on both versions (A/B/A)
#
# The libraries are swapped in the directory torch loads them from (its nvidia/cudnn/lib), so
# torch and cudnn-frontend load the same cuDNN; the host's libraries missing from the subset
# (ops, cnn, adv, precompiled engines) are moved away, never mixed with another version: a
# workload that needs them fails to load them instead of running against a mismatched library.
set -euo pipefail

SUBSET=(libcudnn.so.9 libcudnn_graph.so.9 libcudnn_heuristic.so.9
        libcudnn_engines_runtime_compiled.so.9 libcudnn_engines_tensor_ir.so.9)
OVERLAY=/tmp/cudnn-overlay
HOST_COPY=/tmp/cudnn-host

host_lib_dir() {
    python3 -c "import os, nvidia.cudnn as m; print(os.path.join(list(m.__path__)[0], 'lib'))"
}

switch_to() {  # $1: a directory holding libcudnn*.so.9
    local lib
    lib=$(host_lib_dir)
    rm -f "$lib"/libcudnn*.so.9
    cp "$1"/libcudnn*.so.9 "$lib"/
    echo "cuDNN in $lib now from $1: $(cd "$lib" && ls libcudnn*.so.9 | tr '\n' ' ')"
}

case "${1:-}" in
stage)
    dest=${2:?stage DEST [VERSION]}
    version=${3:-9.28.1.4}
    work=$(mktemp -d)
    trap 'rm -rf "$work"' EXIT
    python3 -m pip download --quiet --no-deps -d "$work/wheel" "nvidia-cudnn-cu13==$version"
    (cd "$work" && python3 -m zipfile -e wheel/*.whl unpacked)
    mkdir -p "$dest"
    tar -C "$work/unpacked/nvidia/cudnn/lib" -cf - "${SUBSET[@]}" | xz -T0 -6 > "$work/subset.tar.xz"
    rm -f "$dest"/part??
    split -b 28M -d -a 2 "$work/subset.tar.xz" "$dest/part"
    sha256sum "$work/subset.tar.xz" | cut -d' ' -f1 > "$dest/sha256"
    echo "$version" > "$dest/version"
    ls -l "$dest"
    ;;
install)
    parts=${2:?install PARTS_DIR}
    cat "$parts"/part?? > /tmp/cudnn-subset.tar.xz
    got=$(sha256sum /tmp/cudnn-subset.tar.xz | cut -d' ' -f1)
    want=$(cat "$parts/sha256")
    [ "$got" = "$want" ] || { echo "sha256 mismatch: $got, expected $want" >&2; exit 1; }
    mkdir -p "$OVERLAY"
    tar -C "$OVERLAY" -xJf /tmp/cudnn-subset.tar.xz
    if [ ! -d "$HOST_COPY" ]; then
        mkdir -p "$HOST_COPY"
        cp "$(host_lib_dir)"/libcudnn*.so.9 "$HOST_COPY"/
    fi
    switch_to "$OVERLAY"
    ;;
use)
    case "${2:-}" in
    host) switch_to "$HOST_COPY" ;;
    overlay) switch_to "$OVERLAY" ;;
    *) echo "use host|overlay" >&2; exit 2 ;;
    esac
    ;;
*)
    echo "usage: $0 stage DEST [VERSION] | install PARTS_DIR | use host|overlay" >&2
    exit 2
    ;;
esac
