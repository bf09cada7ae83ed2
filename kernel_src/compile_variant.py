"""Compile one kernel variant to a cubin plus its metadata, and check the result.

Run once per variant, in its own process (``cute.compile`` is not thread-safe)::

    python -m kernel_src.compile_variant --family ssd_chunk_cumsum \
        --constants '{"chunk_size": 256, "dt_dtype": "bf16"}' --arch sm_90a \
        --cubin build/stage/mamba2_aot_cubins_sm90/cubins/X.cubin --meta build/meta/sm_90a/X.json

The metadata JSON holds the variant's manifest entry (everything but the path prefix). Any failure
prints the variant's name and exits non-zero, leaving no output files behind. The command line compiles in a child
process that holds nothing of its checkout, virtual environment or shell, without address-space randomization
(``_compile_in_a_fixed_root``: ptxas' register numbering followed heap addresses); ``main`` compiles in its own
process.

``--experiment NAME`` (repeatable) turns on a build experiment in the kernel classes that declare it (their
``experiments`` class attribute; the kernel code asks ``families.experiment_enabled``). A variant built with one is marked
unvalidated in its entry (``"validated": false``, ``"experiments": [...]``): the runtime uses it only on request.
"""
from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
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
    ``dump_dir``: where the DSL leaves its PTX, emptied and removed (default: a new temporary directory)."""
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
    with _emptied(dump_dir) if dump_dir is not None else tempfile.TemporaryDirectory() as dump:
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
def _emptied(folder: Path):
    """``folder``, created empty (whatever a killed compile left there removed) and removed afterwards."""
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
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


def _write_atomically(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def _sources_digest(folder: Path) -> str:
    """16 hex digits of the sha256 of ``folder``'s Python sources (names and bytes)."""
    files = sorted(folder.glob("*.py"))
    return hashlib.sha256(b"".join(p.name.encode() + b"\0" + p.read_bytes() for p in files)).hexdigest()[:16]


def _user_directory() -> Path:
    """``$TMPDIR/mamba2_aot-<uid>``, the user's own and no one else's to write (0700): the interpreter link and the
    sources in it are run. RuntimeError when it is not."""
    base = Path(tempfile.gettempdir()) / f"mamba2_aot-{os.getuid()}"
    base.mkdir(mode=0o700, exist_ok=True)
    info = base.lstat()
    if base.is_symlink() or info.st_uid != os.getuid() or info.st_mode & 0o077:
        raise RuntimeError(f"{base} is not this user's own directory, closed to others (0700): remove it")
    return base


def _fixed_interpreter() -> str:
    """This interpreter at a path whose length does not depend on where its virtual environment lives: through the
    link ``$TMPDIR/mamba2_aot-<uid>/python-<digest of the environment's real path>``. The environment's path is on
    the child's heap otherwise (its prefix, its ``sys.path``, every module's file name): two virtual environments of
    the same requirements in two places built two cubins. One link per environment, so no build re-points one that
    another compiles through. Outside a virtual environment: ``sys.executable``."""
    if sys.prefix == sys.base_prefix:
        return sys.executable
    environment = Path(sys.prefix).resolve()
    base = _user_directory()
    link = base / f"python-{hashlib.sha256(str(environment).encode()).hexdigest()[:16]}"
    if link.resolve() != environment:  # (new, or left dangling by a removed environment)
        staging = Path(tempfile.mkdtemp(dir=base, prefix="link-"))
        (staging / "python").symlink_to(environment, target_is_directory=True)
        os.replace(staging / "python", link)
        staging.rmdir()
    return str(link / "bin" / "python")


def _fixed_root() -> Path:
    """``$TMPDIR/mamba2_aot-<uid>/<digest>``: a copy of kernel_src at a path named by its sources (one per user, 0700),
    re-staged when missing or not what its name says (a partial copy, an edit, a cleaned temp directory, bytecode:
    whether the child imports kernel_src from source or from bytecode changes its heap, so never the latter). Checked
    and staged under a lock per digest: a build's first compiles start together, and one that found the copy missing
    must not replace the copy another has just made and compiles in. Raises RuntimeError when the user's directory is
    not the user's own."""
    src = Path(__file__).resolve().parent
    digest = _sources_digest(src)
    base = _user_directory()
    root = base / digest
    copy = root / "kernel_src"
    with open(base / f"{digest}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if copy.is_dir() and _sources_digest(copy) == digest and not (copy / "__pycache__").exists():
            return root
        if root.exists():  # (not what its name says: removed)
            shutil.rmtree(root)
        stage = Path(tempfile.mkdtemp(dir=base, prefix="stage-"))
        (stage / "kernel_src").mkdir()
        (stage / "out").mkdir()
        for source in src.glob("*.py"):
            shutil.copy2(source, stage / "kernel_src" / source.name)
        stage.rename(root)
    return root


# What a compile keeps of its caller's environment, where set: where this host's Python finds its libraries and its
# user site (the same from build to build on one host).
_HOST_VARIABLES = ("LD_LIBRARY_PATH", "PYTHONUSERBASE")


def _child_environment(root: Path) -> dict:
    """The whole environment of a compile in ``root``: little of the caller's (``_HOST_VARIABLES``), whose size moves
    the child's heap (a longer ``PWD``, which the shell sets to the checkout, renumbered a cubin's registers)."""
    return {**{name: os.environ[name] for name in _HOST_VARIABLES if name in os.environ},
            "PYTHONPATH": str(root), "TMPDIR": tempfile.gettempdir(), "PYTHONHASHSEED": "0",
            "PYTHONDONTWRITEBYTECODE": "1", "CUTE_DSL_DISABLE_FILE_CACHING": "1"}


def _compile_in_a_fixed_root(argv: list[str]) -> int:
    """The command line's compile (``argv``), run again in a child process that holds nothing of its checkout,
    virtual environment or shell: from :func:`_fixed_root`, with output and dump names fixed by the variant, this
    interpreter through a link (:func:`_fixed_interpreter`), an environment of its own (:func:`_child_environment`),
    pipes for its standard streams, and without address-space randomization where the host allows it
    (``toolchain.fixed_addresses_prefix``); then its outputs moved where ``argv`` asks. ptxas (in the DSL's process)
    numbers registers by heap address in places, and where the heap puts things depends on the size of everything the
    process allocates before, paths and environment included: otherwise one source gave two cubins, run to run and
    from checkout to checkout (docs/PERF_NOTES.md, forty-fifth to forty-seventh sessions). The same bytes still need
    the same sources, Python and packages, user and ``$TMPDIR``. Returns the exit status (the child's; 1, the variant
    named, when the parent fails or the child dies before naming it)."""
    args = _parser().parse_args(argv)
    name = f"{args.arch} {args.family} {args.constants}"
    try:
        name = f"{args.arch} {variant_key(args.family, json.loads(args.constants))}"
        root = _fixed_root()
        tag = hashlib.sha256(json.dumps([args.family, args.constants, args.arch, args.experiment]).encode()
                             ).hexdigest()[:16]
        cubin, meta = root / "out" / f"{tag}.cubin", root / "out" / f"{tag}.json"
        command = [*toolchain.fixed_addresses_prefix(), _fixed_interpreter(), "-m", "kernel_src.compile_variant",
                   "--in-fixed-root", "--family", args.family, "--constants", args.constants, "--arch",
                   args.arch, "--cubin", str(cubin.relative_to(root)), "--meta", str(meta.relative_to(root)),
                   *(f"--experiment={e}" for e in args.experiment), *(["--ptxas-info"] if args.ptxas_info else [])]
        with open(root / "out" / f"{tag}.lock", "w") as lock:  # (two builds of one variant on this host at once)
            fcntl.flock(lock, fcntl.LOCK_EX)
            # Output through pipes, whatever the caller's are (a terminal's buffering sizes the heap as well); the lock
            # passed on, so that a child outliving a killed parent still holds it.
            child = subprocess.run(command, cwd=root, env=_child_environment(root), stdin=subprocess.DEVNULL,
                                   capture_output=True, pass_fds=(lock.fileno(),))
            for stream, text in ((sys.stderr, child.stderr), (sys.stdout, child.stdout)):  # (notes before the result)
                stream.buffer.write(text)
                stream.flush()
            status = child.returncode
            if status < 0:
                raise RuntimeError(f"the compile was killed by signal {-status}")
            if status != 0:
                if b"FAILED " not in child.stderr:  # (it died before it could name the variant)
                    print(f"FAILED {name}: the compile exited with status {status}", file=sys.stderr)
                return status
            made = cubin.read_bytes(), meta.read_bytes()
            cubin.unlink()
            meta.unlink()
    except Exception as exc:  # the build must name the variant whatever went wrong
        print(f"FAILED {name}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    _write_atomically(args.cubin, made[0])
    _write_atomically(args.meta, made[1])
    return 0


def _parser() -> argparse.ArgumentParser:
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
    parser.add_argument("--in-fixed-root", action="store_true", help=argparse.SUPPRESS)  # (the child's mark)
    return parser


def main(argv=None) -> int:
    """The command line's compile, in this process."""
    args = _parser().parse_args(argv)
    constants = json.loads(args.constants)
    name = f"{args.arch} {variant_key(args.family, constants)}"
    start = time.perf_counter()
    try:
        # (in a fixed root, the PTX goes to a folder named by the variant rather than a random one: see
        # _compile_in_a_fixed_root)
        dump_dir = args.cubin.with_suffix(".dump") if args.in_fixed_root else None
        cubin, entry = compile_variant(args.family, constants, args.arch, args.experiment, args.ptxas_info,
                                       dump_dir)
    except Exception as exc:  # the build must name the variant whatever went wrong
        print(f"FAILED {name}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    _write_atomically(args.cubin, cubin)
    _write_atomically(args.meta, (json.dumps(entry, indent=1, sort_keys=True) + "\n").encode())
    unvalidated = f"  unvalidated: experiments {', '.join(entry['experiments'])}" if "experiments" in entry else ""
    print(f"compiled {name}  {time.perf_counter() - start:5.2f} s  {entry['registers']} regs  "
          f"{entry['size']} B{unvalidated}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main() if "--in-fixed-root" in sys.argv else _compile_in_a_fixed_root(sys.argv[1:]))
