"""The demo's bundles that wrap real traces, built when they are needed, never stored twice.

Four of the demo's run bundles are the real H200 traces of ``demo/traces`` (the project's copy
of the shared traces; ``tests/data`` links to the same files) with a manifest around them.
Storing those bundles too would keep every trace twice, so they are built where they are used:
``cptrace serve --seed-demo`` builds them into the data directory before seeding, and the tests
build them once per process (``tests/testkit``). Every fact written into a manifest is taken
from the traces' README (``tests/data/README.md``); nothing is measured or invented here. No
per-iteration timings exist for these captures, so ``iteration_ms`` stays empty and the README's
medians go under ``reported_median_ms``. The output is byte-reproducible: building twice gives
identical archives (so seeding them again finds the runs already there).
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Any

from runners.bundle import add_trace, finalize_bundle, pack_bundle, run_info, trace_entry
from runners.manifest import facts_summary, manifest_workload, variant_entry
from runners.spec import layout_for, parse_spec

DEMO_TRACES = Path(__file__).resolve().parent.parent / "demo" / "traces"
"""The one copy of the real traces the demo bundles wrap (``tests/data`` links to them)."""


def default_demo_traces() -> Path:
    """``demo/traces`` of the source checkout, else of the current directory (an installed
    package has no ``demo/``: the image's working directory has)."""
    return DEMO_TRACES if DEMO_TRACES.is_dir() else Path("demo") / "traces"

TRACE_BUNDLES = (
    "te-2.20.2-kineto-3arms",
    "te-2.20.2-nsys-3arms",
    "synthetic-h200x2-kineto",
    "synthetic-h200x2-nsys",
)
"""The bundles built from ``DEMO_TRACES`` (never stored in the repository)."""

# From the traces README: "All captured on NVIDIA H200 GPUs (torch 2.11.0+cu130, CUDA 13.0,
# NCCL 2.28.9, Nsight Systems from Nsight Compute 2025.3.1)"; the TE traces are TE 2.20.2 on 2 GPUs.
H200_ENV: dict[str, Any] = {
    "gpu_models": ["NVIDIA H200"],
    "torch": "2.11.0+cu130",
    "cuda": "13.0",
    "nccl": "2.28.9",
    "nsys": "Nsight Systems from Nsight Compute 2025.3.1",
    "source": "recorded by hand from the traces README (not captured by cptrace run)",
}

# The reference workload with the three arms of the README's table.
TE_SPEC: dict[str, Any] = {
    "name": "te-2.20.2-reference-3arms",
    "implementation": "te",
    "device": "cuda",
    "ranks": 2,
    "cp_comm": "p2p",
    "strategy": "dual_chunk_swap",
    "seqlens": [8192, 4096, 2048, 2048],
    "heads": 16,
    "head_dim": 128,
    "dtype": "bf16",
    "causal": True,
    "layers": 4,
    "profilers": {"mode": "torch", "profiled_steps": 3},
    "variants": {
        "auto_clone": {"metadata": "value_equal_clone", "pad_between_seqs": None},
        "explicit_false": {"metadata": "value_equal_clone", "pad_between_seqs": False},
        "auto_same": {"metadata": "same_object", "pad_between_seqs": None},
    },
}
REPORTED_MEDIANS = {
    "reported_median_ms": {"auto_clone": 21.28, "explicit_false": 18.59},
    "reported_median_note": (
        "median ms of 50 interleaved iterations (CUDA events) of the same workload, from the "
        "traces README; a separate timing run, not computed from these traces"
    ),
}


def _te_bundle(traces_dir: Path, work: Path, *, fmt: str, window_prefix: str, mode: str) -> Path:
    spec = parse_spec({**TE_SPEC, "profilers": {"mode": mode, "profiled_steps": 3}})
    bundle = work / f"te-2.20.2-{fmt}-3arms"
    bundle.mkdir()
    if fmt == "kineto":
        entries = [
            trace_entry(
                add_trace(bundle, traces_dir / f"kineto_3arms_rank{r}.json.gz"),
                fmt="kineto",
                rank=r,
            )
            for r in (0, 1)
        ]
    else:
        member = add_trace(bundle, traces_dir / "nsys_3arms.sqlite.gz")
        entries = [trace_entry(member, fmt="nsys", rank=None)]
    variants = [
        variant_entry(spec, name, window=f"{window_prefix}{name}") for name in spec.variant_names()
    ]
    if fmt == "nsys":
        # The traces' README: "the last three steps of each arm sit in NVTX ranges
        # nsys_arm:<name>", and the capture marks no step inside them.
        for variant in variants:
            variant["steps_per_window"] = 3
    summaries = {
        name: facts_summary(w, layout_for(w, spec.ranks))
        for name, w in ((n, spec.variant_workload(n)) for n in spec.variant_names())
    }
    finalize_bundle(
        bundle,
        run=run_info(
            name=spec.name,
            spec=spec.model_dump(mode="json"),
            created_at=None,
            capture=(
                "TE 2.20.2 on 2x H200, FusedAttention (cuDNN) backend, inputs partitioned with "
                "thd_get_partitioned_indices, NVTE_NVTX_ENABLED=1; "
                + (
                    "PyTorch profiler with Python stacks, three steps per arm in "
                    "record_function('arm:<name>')"
                    if fmt == "kineto"
                    else "nsys with --python-functions-trace on get_cu_seqlens_on_cp_rank and "
                    "cp_p2p_fwd_prepare_qkv; last three steps per arm in NVTX 'nsys_arm:<name>'"
                )
            ),
        ),
        traces=entries,
        workload=manifest_workload(spec, ranks=spec.ranks),
        variants=variants,
        environment={**H200_ENV, "gpu_count": 2, "transformer_engine": "2.20.2"},
        extra={**REPORTED_MEDIANS, "variant_facts": summaries},
    )
    return bundle


def _synthetic_bundle(traces_dir: Path, work: Path, *, fmt: str) -> Path:
    bundle = work / f"synthetic-h200x2-{fmt}"
    bundle.mkdir()
    if fmt == "kineto":
        entries = [
            trace_entry(
                add_trace(bundle, traces_dir / f"kineto_rank{r}.json.gz"), fmt="kineto", rank=r
            )
            for r in (0, 1)
        ]
        what = (
            "2 ranks, NCCL; five iterations of a 4096^2 bf16 matmul, a fake helper in "
            "record_function+NVTX 'get_cu_seqlens_on_cp_rank' (3 small kernels), an "
            "all-reduce and an arange/compare/masked_fill_ tail-zeroing pattern"
        )
        gpus = 2
    else:
        entries = [
            trace_entry(
                add_trace(bundle, traces_dir / "nsys_single.sqlite.gz"), fmt="nsys", rank=None
            )
        ]
        what = (
            "one process: 20 iterations of an NVTX range 'get_cu_seqlens_on_cp_rank' around "
            "3 small kernels, then a matmul"
        )
        gpus = 1
    finalize_bundle(
        bundle,
        run=run_info(name=bundle.name, spec={}, created_at=None, capture=what),
        traces=entries,
        workload={},  # synthetic: not a CP attention workload, the whole trace is one window
        variants=[],
        environment={**H200_ENV, "gpu_count": gpus},
    )
    return bundle


def build_trace_bundles(out: Path, traces: Path | None = None) -> list[Path]:
    """Write the ``TRACE_BUNDLES`` archives into ``out``; their paths, in that order.

    :param traces: the traces' folder (default: :func:`default_demo_traces`).
    :raises FileNotFoundError: a trace of ``traces`` is missing.
    """
    traces = traces or default_demo_traces()
    out.mkdir(parents=True, exist_ok=True)
    te_dir = traces / "te-2.20.2-h200x2"
    syn_dir = traces / "synthetic-h200x2"
    work = Path(tempfile.mkdtemp(prefix="cptrace-demo-"))
    try:
        bundles = [
            _te_bundle(te_dir, work, fmt="kineto", window_prefix="arm:", mode="torch"),
            _te_bundle(te_dir, work, fmt="nsys", window_prefix="nsys_arm:", mode="nsys"),
            _synthetic_bundle(syn_dir, work, fmt="kineto"),
            _synthetic_bundle(syn_dir, work, fmt="nsys"),
        ]
        archives = []
        for bundle in bundles:
            archive = out / f"{bundle.name}.tar.gz"
            pack_bundle(bundle, archive)
            archives.append(archive)
        return archives
    finally:
        shutil.rmtree(work, ignore_errors=True)
