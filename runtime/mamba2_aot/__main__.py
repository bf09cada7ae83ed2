"""``python -m mamba2_aot {list,doctor,verify}``: what is installed, what runs here, are the cubins intact.

Exit codes:
  0  fine (``list`` also exits 0 when there is no GPU or driver: it says so per variant)
  1  a problem: a broken or version-mismatched cubin package, a cubin file missing (list), a variant that fails
     to load (doctor),
     a cubin whose sha256 differs from its manifest or no cubins at all (verify)
  2  doctor only: no usable CUDA driver or no CUDA device
"""
from __future__ import annotations

import argparse
import sys

from . import __version__, dispatch, driver, manifest
from .errors import Mamba2AOTError


def _driver_or_reason():
    """``(CudaDriver, None)``, or ``(None, why not)`` on machines without a GPU or driver."""
    try:
        drv = driver.get()
        if drv.device_count() == 0:
            return None, "no CUDA device visible"
        return drv, None
    except Mamba2AOTError as exc:
        return None, str(exc)


def _print_problems(catalog) -> None:
    for problem in catalog.problems:
        print(f"  PROBLEM {problem.where}: {problem.error}")


def _validation_note(catalog, variant) -> str:
    """`` [not validated on hardware; experiments: ...; not used unless MAMBA2_AOT_ALLOW_UNVALIDATED=1]``, or ``""``;
    the opt-in is named only where it would make this variant the one calls use (no earlier source has it)."""
    if variant.validated:
        return ""
    notes = ["not validated on hardware"]
    if variant.experiments:
        notes.append(f"experiments: {', '.join(variant.experiments)}")
    if not catalog.usable(variant) and catalog.served_if_allowed(variant):
        notes.append(f"not used unless {manifest.ENV_ALLOW_UNVALIDATED}=1")
    return f" [{'; '.join(notes)}]"


def _source(variant) -> str:
    return f"{variant.manifest.package} at {variant.manifest.path.parent}"


def _shadowed_note(catalog, variant) -> str:
    """``"; calls use <package> at <dir>"`` when another source's build of ``variant``'s constants serves its calls
    (an earlier source, or a validated build beside an unvalidated one held back), else ``""``."""
    serving = catalog.serving(variant)
    return f"; calls use {_source(serving)}" if serving is not None and serving is not variant else ""


def cmd_list(_args) -> int:
    catalog = manifest.catalog()
    drv, reason = _driver_or_reason()
    capabilities = {drv.compute_capability(d) for d in range(drv.device_count())} if drv else set()
    families = dispatch.launchable_families()
    steps = sorted(set(dispatch.PLANS) - set(families))
    missing = 0
    print(f"mamba2_aot {__version__}; families: {', '.join(families)} (their steps' kernels: {', '.join(steps)})")
    if drv is None:
        print(f"CUDA: unavailable here: {reason}")
    for m in catalog.manifests:
        print(f"{m.package} {m.version} ({m.arch}, compute capability {m.compute_capability[0]}."
              f"{m.compute_capability[1]}) at {m.path.parent}")
        if drv is None:
            here = "unknown (no CUDA here)"
        else:
            here = "runs here" if any(m.loads_on(cc) for cc in capabilities) else "no device of this arch here"
        for v in m.variants:
            status = here if catalog.serving(v) is v else "not used" + _shadowed_note(catalog, v)
            if not v.path.is_file():  # (a stat, not a read: `verify` checks the bytes)
                status, missing = f"CUBIN MISSING ({v.path}); {status}", missing + 1
            print(f"  {v.key}: {status}{_validation_note(catalog, v)}")
    if not catalog.manifests:
        print(f"no cubin packages found (install one, e.g. {manifest.PACKAGE_PREFIX}sm90, or set "
              f"{manifest.ENV_CUBIN_DIR})")
    _print_problems(catalog)
    return 1 if catalog.problems or missing else 0


def cmd_doctor(_args) -> int:
    print(f"mamba2_aot {__version__} ({sys.executable})")
    catalog = manifest.catalog()
    print("cubin packages:")
    for m in catalog.manifests:
        print(f"  {m.package} {m.version} {m.arch} ({len(m.variants)} variants) at {m.path.parent}; "
              f"toolchain {dict(m.toolchain)}")
    if not catalog.manifests:
        print("  none found")
    _print_problems(catalog)
    drv, reason = _driver_or_reason()
    if drv is None:
        print(f"CUDA: unavailable: {reason}")
        return 2
    print(f"CUDA driver: {drv.version_string}")
    status = 1 if catalog.problems else 0
    for device in range(drv.device_count()):
        cc = drv.compute_capability(device)
        print(f"cuda:{device} {drv.device_name(device)} ({manifest.arch_name(cc)})")
        try:
            variants = catalog.index(cc).values()
        except Mamba2AOTError as exc:
            print(f"  cannot run: {exc}")
            status = 1
            continue
        sources = catalog.for_capability(cc)
        for variant in sorted(catalog.held_back(sources), key=lambda v: v.key):
            print(f"  {variant.key}: not loaded{_shadowed_note(catalog, variant)}{_validation_note(catalog, variant)}")
        for variant in sorted(variants, key=lambda v: v.key):
            where = f" ({_source(variant)})" if len(sources) > 1 else ""  # (which of several sources serves it)
            plan = dispatch.PLANS.get(variant.family)
            if plan is None:
                print(f"  {variant.key}: no launch plan in this runtime version")
                continue
            try:
                dispatch.load_kernel(drv, plan, dict(variant.constants), device)
                print(f"  {variant.key}: loads{where}")
            except Mamba2AOTError as exc:
                print(f"  {variant.key}: FAILS{where}: {exc}")
                status = 1
    return status


def cmd_verify(_args) -> int:
    catalog = manifest.catalog()
    status = 1 if catalog.problems or not catalog.manifests else 0
    for m in catalog.manifests:
        for v in m.variants:
            try:
                manifest.read_cubin(v, verify=True)
                print(f"ok       {m.package} {v.key}")
            except Mamba2AOTError as exc:
                print(f"MISMATCH {m.package} {v.key}: {exc}")
                status = 1
    if not catalog.manifests:
        print("no cubin packages found: nothing to verify")
    _print_problems(catalog)
    return status


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mamba2_aot", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("list", help="families, variants, archs and whether each can run here")
    sub.add_parser("doctor", help="driver, devices, cubin packages and which variants load")
    sub.add_parser("verify", help="check every cubin's sha256 against its manifest")
    args = parser.parse_args(argv)
    return {"list": cmd_list, "doctor": cmd_doctor, "verify": cmd_verify}[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
