"""Compile one kernel variant to a cubin plus its metadata, and check the result.

Run once per variant, in its own process (``cute.compile`` is not thread-safe)::

    python -m kernel_src.compile_variant --family ssd_chunk_cumsum \
        --constants '{"chunk_size": 256, "dt_dtype": "bf16"}' --arch sm_90a \
        --cubin build/stage/mamba2_aot_cubins_sm90/cubins/X.cubin --meta build/meta/sm_90a/X.json

The metadata JSON holds the variant's manifest entry (everything but the path prefix). Any failure
prints the variant's name and exits non-zero, leaving no output files behind. This compiles in the calling process,
whose paths and environment can renumber a cubin's registers; the build runs it through
``build_tools.reproducible_compile`` (same arguments), which compiles it in a child that holds none of them.

``--experiment NAME`` (repeatable) turns on a build experiment in the kernel classes that declare it (their
``experiments`` class attribute; the kernel code asks ``families.experiment_enabled``). A variant built with one is marked
unvalidated in its entry (``"validated": false``, ``"experiments": [...]``): the runtime uses it only on request.
"""
from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path

from kernel_src import abi, cubin_checks, toolchain
from kernel_src.families import new_kernel, variant_key, variant_stem


def compile_variant(family: str, constants: dict, arch: str, experiments=(), ptxas_info: bool = False,
                    dump_dir: Path | None = None) -> tuple[bytes, dict]:
    """Compile and check one variant, with those of the requested ``experiments`` its class implements; return the
    cubin bytes and its manifest entry. ``ptxas_info``: also print what ptxas says of it (``-v``: registers, spills;
    its remarks, such as the C75xx reasons it serializes warpgroup MMAs), a developer's view of a failed check.
    ``dump_dir``: a folder, not yet there, in a folder that is, where the DSL leaves its PTX, removed afterwards
    (default: a new temporary directory)."""
    def build(min_ctas_per_sm=None):
        kernel = new_kernel(family, constants, arch, experiments)
        if min_ctas_per_sm is not None:
            kernel.min_ctas_per_sm = min_ctas_per_sm
        return kernel

    kernel = build()
    params = kernel.params()
    param_rows = abi.layout(params)
    cubin, symbol, ptx_isa = _compile(kernel, params, arch, ptxas_info, dump_dir)
    res = cubin_checks.resources(cubin, symbol, toolchain.cuobjdump())
    # A kernel that spills at its occupancy target (min_ctas_per_sm) is built at a lower one, down to the floor
    # it allows (min_ctas_floor): the target was chosen on one arch and toolchain, whose register allocation
    # another's need not match. Said in the build log; a spill at the floor fails the check below.
    floor = getattr(kernel, "min_ctas_floor", None)
    while (res.stack or res.local) and floor is not None and kernel.min_ctas_per_sm > floor:
        kernel = build(kernel.min_ctas_per_sm - 1)
        print(f"note: {arch} {variant_key(family, constants)} spilled ({res.stack} B stack, {res.local} B local): "
              f"building it at {kernel.min_ctas_per_sm} CTAs per SM", file=sys.stderr)
        cubin, symbol, ptx_isa = _compile(kernel, params, arch, ptxas_info, dump_dir)
        res = cubin_checks.resources(cubin, symbol, toolchain.cuobjdump())

    cubin_checks.check_arch(cubin, arch)
    cubin_checks.check_symbols(cubin, symbol)
    cubin_checks.check_params(cubin, symbol, param_rows)
    cubin_checks.check_resources(res, arch, kernel.dynamic_smem)
    if getattr(kernel, "setmaxnreg_budget", None) is not None:
        cubin_checks.check_register_budget(res, kernel.setmaxnreg_budget)
    if arch == "sm_90a":  # (the only target with warpgroup MMAs)
        cubin_checks.check_wgmma_pipelined(cubin_checks.sass(cubin, toolchain.cuobjdump()))

    entry = {
        "family": family,
        "key": variant_key(family, constants),
        "constants": constants,
        "file": f"cubins/{variant_stem(family, constants)}.cubin",
        "sha256": hashlib.sha256(cubin).hexdigest(),
        "size": len(cubin),
        "kernel": symbol,
        "block": list(kernel.block),
        "cluster": list(kernel.cluster),
        "dynamic_smem": kernel.dynamic_smem,
        "static_smem": res.static_smem,
        "registers": res.registers,
        "grid": kernel.grid_rule,
        "params": param_rows,
        "ptx_isa": ptx_isa,
        **validation_fields(kernel),
    }
    return cubin, entry


def validation_fields(kernel) -> dict:
    """The entry's ``validated`` and, only when experiments were applied, ``experiments`` (sorted): a variant built
    with an experiment is unvalidated; otherwise the kernel's own ``validated`` (default True) stands."""
    applied = sorted(kernel.enabled_experiments)
    if applied:
        return {"validated": False, "experiments": applied}
    return {"validated": getattr(kernel, "validated", True)}


def _compile(kernel, params, arch: str, ptxas_info: bool = False, dump_dir: Path | None = None
             ) -> tuple[bytes, str, str]:
    """``kernel`` compiled for ``arch``: the cubin, its one kernel symbol and the PTX ISA version it was built at
    (with ``ptxas_info``, the DSL prints ptxas' report and remarks as it compiles; ``dump_dir``: see
    :func:`compile_variant`)."""
    import cuda.bindings.driver as cuda
    import cutlass.cute as cute

    placeholders = [abi.placeholder(p) for p in params]
    report = " warnings remarks{ptx} --ptxas-options=-v" if ptxas_info else ""
    with _new_folder(dump_dir) if dump_dir is not None else tempfile.TemporaryDirectory() as dump:
        compiled = cute.compile(kernel, tuple(placeholders), cuda.CUstream(0),
                                options=f"{toolchain.compile_options(arch)} --keep-ptx --dump-dir {dump}{report}")
        cubin = compiled.__cubin__
        if not isinstance(cubin, bytes):  # the DSL returns the intended path when it could not dump
            raise RuntimeError(f"cute.compile produced no cubin bytes (got {cubin!r})")
        ptx_isa = _ptx_isa_version(Path(dump))
    symbols = list(compiled.kernel_info)
    if len(symbols) != 1:
        raise RuntimeError(f"expected one kernel per variant, the DSL reports {symbols}")
    return cubin, symbols[0], ptx_isa


@contextlib.contextmanager
def _new_folder(folder: Path):
    """``folder``, created (FileExistsError when it is there already: nothing of the caller's is removed;
    FileNotFoundError when its parent is not, which would outlive the compile) and removed afterwards."""
    folder.mkdir()
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _ptx_isa_version(dump_dir: Path) -> str:
    ptx = next(dump_dir.glob("*.ptx"), None)
    match = re.search(r"^\.version\s+(\S+)", ptx.read_text(), re.M) if ptx else None
    if match is None:
        raise RuntimeError("the DSL left no PTX with a .version line")
    return match.group(1)


def write_atomically(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def argument_parser(*, dump_dir: bool = True) -> argparse.ArgumentParser:
    """The command line of :func:`main`; without ``--dump-dir`` when not ``dump_dir`` (the isolated compile's, which
    names the child's dump folder itself)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--family", required=True)
    parser.add_argument("--constants", required=True, help="JSON object of the variant's constants")
    parser.add_argument("--arch", required=True, help="e.g. sm_90a, sm_100a")
    parser.add_argument("--cubin", required=True, type=Path)
    parser.add_argument("--meta", required=True, type=Path)
    parser.add_argument("--experiment", action="append", default=[], metavar="NAME",
                        help="a build experiment to turn on where the family implements it (repeatable)")
    parser.add_argument("--ptxas-info", action="store_true",
                        help="print ptxas' report and remarks (spills, why it serializes warpgroup MMAs)")
    if dump_dir:
        parser.add_argument("--dump-dir", type=Path,
                            help="a folder, not yet there, in a folder that is, for the DSL's PTX, removed afterwards "
                                 "(default: a new temporary directory)")
    return parser


def command_line_name(args: argparse.Namespace) -> str:
    """The variant the parsed command line asks for, as the build log names it (``sm_90a family[k=v,...]``), or its
    raw arguments when its constants do not make a variant."""
    try:
        return f"{args.arch} {variant_key(args.family, json.loads(args.constants))}"
    except Exception:  # (named for the FAILED line that follows)
        return f"{args.arch} {args.family} {args.constants}"


def main(argv=None) -> int:
    """The command line's compile, in this process."""
    args = argument_parser().parse_args(argv)
    name = command_line_name(args)
    start = time.perf_counter()
    try:
        cubin, entry = compile_variant(args.family, json.loads(args.constants), args.arch, args.experiment,
                                       args.ptxas_info, args.dump_dir)
    except Exception as exc:  # the build must name the variant whatever went wrong
        print(f"FAILED {name}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    write_atomically(args.cubin, cubin)
    write_atomically(args.meta, (json.dumps(entry, indent=1, sort_keys=True) + "\n").encode())
    unvalidated = f"  unvalidated: experiments {', '.join(entry['experiments'])}" if "experiments" in entry else ""
    print(f"compiled {name}  {time.perf_counter() - start:5.2f} s  {entry['registers']} regs  "
          f"{entry['size']} B{unvalidated}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
