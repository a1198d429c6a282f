"""The summary ``benchmarks/gpu_profile_te.sh`` prints last: what the GPU run showed, as tables.

Reads what the script left in OUT (the profiled bundle's manifest, the analysis reports) and its
work folder (the logs): the probe's observed facts, the findings of each analysis (which ones
cite the probe), the probe-overhead table and the FP8 runs' outcome. A missing piece is named
as missing, so a short device call still says what it did and did not produce.

    python benchmarks/gpu_profile_summary.py OUT OUT/work
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any


def _load(path: Path) -> Any:
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        print(f"{path.name}: unreadable ({exc})")
        return None


def _observed(manifest: dict[str, Any]) -> None:
    for variant in manifest.get("variants") or []:
        observed = (variant.get("facts") or {}).get("observed")
        if not observed:
            continue
        print(f"### probe facts (`facts.observed`, variant {variant.get('name')!r})")
        print("| fact | value |\n|---|---|")
        for key, value in observed.items():
            if key != "not_observed":
                print(f"| {key} | `{json.dumps(value)}` |")
        facts = {k: v for k, v in variant["facts"].items() if k != "observed"}
        print(f"| (variant facts) | `{json.dumps(facts)[:400]}` |")
        for line in observed.get("not_observed") or []:
            print(f"- not observed: {line}")
        return
    print("### probe facts: none in the manifest (no variant has facts.observed)")


def _findings(title: str, report: dict[str, Any] | None) -> None:
    print(f"### {title}")
    if report is None:
        print("no report")
        return
    findings = report.get("findings") or []
    print("| severity | rule | cites the probe | title |\n|---|---|---|---|")
    for f in findings:
        text = json.dumps(f)
        cites = "yes" if "observed in the job" in text.lower() else "no"
        print(f"| {f['severity']} | {f['rule']} | {cites} | {f['title'][:160]} |")
    for f in findings:
        for e in f.get("evidence") or []:
            if "observed" in f"{e.get('name')} {e.get('value')}".lower():
                print(f"- {f['rule']}: {e.get('name')} = {str(e.get('value'))[:300]}")
        if "observed in the job" in f["recommendation"].lower():
            print(f"- {f['rule']} recommendation: {f['recommendation'][:300]}")
    stats = [i for i in report.get("iterations") or [] if i.get("rank") is None]
    for i in stats[:4]:
        print(f"- iterations {i['label']}: n={i['n']} median {i['median_ms']:.3f} ms")


def _log_lines(path: Path, starts: tuple[str, ...]) -> list[str]:
    if not path.is_file():
        return [f"({path.name} missing)"]
    return [x for x in path.read_text(errors="replace").splitlines() if x.startswith(starts)]


def main() -> int:
    out, work = Path(sys.argv[1]), Path(sys.argv[2])
    print("## summary")
    for line in _log_lines(work / "versions.log", ("torch", "transformer_engine", "no ")):
        print(f"- {line}")
    manifest = _load(out / "profile_manifest.json")
    if manifest is None:
        print("### profiled bundle: no manifest")
    else:
        run = manifest.get("run") or {}
        print(f"- profiled run: exit_status {run.get('exit_status')}, wall_s {run.get('wall_s')}, "
              f"traces {[t.get('path') for t in manifest.get('traces') or []]}, "
              f"failure {(manifest.get('failure') or {}).get('summary')}")
        _observed(manifest)
    _findings("cptrace analyze (profiled te_transformer bundle)",
              _load(out / "profile_report.json"))
    print("### probe overhead (benchmarks/probe_overhead.py)")
    starts = ("spec", "|", "probe's own", "per sampled", "steady")
    for line in _log_lines(work / "probe-overhead.log", starts):
        print(line)
    for name in ("fp8-misaligned", "fp8-aligned"):
        for line in _log_lines(work / f"{name}.log", ("bundle", "run failed", "error", "Error")):
            print(f"- {name}: {line[:300]}")
        _findings(f"cptrace analyze ({name})", _load(out / f"{name.replace('-', '_')}_report.json"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
