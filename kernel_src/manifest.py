"""Merge the per-variant metadata of one arch into that arch's ``manifest.json`` (schema: docs/ARCHITECTURE.md)."""
from __future__ import annotations

import json
from pathlib import Path

SCHEMA_VERSION = 1


def build_manifest(entries: list[dict], *, package: str, version: str, arch: str, toolchain: dict) -> dict:
    """The manifest for one cubin package. Raises ValueError if variants disagree on the PTX ISA."""
    from kernel_src.toolchain import compute_capability

    entries = [dict(e) for e in entries]
    ptx_isas = {e.pop("ptx_isa") for e in entries}
    if len(ptx_isas) > 1:
        raise ValueError(f"variants of {package} were compiled with different PTX ISA versions {sorted(ptx_isas)}")
    keys = [e["key"] for e in entries]
    if len(set(keys)) != len(keys):
        raise ValueError(f"duplicate variant keys in {package}")
    return {
        "schema": SCHEMA_VERSION,
        "package": package,
        "version": version,
        "arch": arch,
        "compute_capability": compute_capability(arch),
        "toolchain": {**toolchain, "ptx_isa": ptx_isas.pop() if ptx_isas else None},
        "variants": sorted(entries, key=lambda e: e["key"]),
    }


def write_manifest(meta_paths: list[Path], out: Path, **fields) -> None:
    entries = [json.loads(Path(p).read_text()) for p in meta_paths]
    manifest = build_manifest(entries, **fields)
    Path(out).write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
