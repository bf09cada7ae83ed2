"""Compile one kernel variant the way the build does: ``kernel_src.compile_variant`` run in a child process that holds
nothing of its checkout, virtual environment or shell, so that a rebuild is byte-identical from any checkout.

Same command line as ``kernel_src.compile_variant`` (which compiles in its own process)::

    python -m build_tools.reproducible_compile --family ssd_chunk_cumsum \
        --constants '{"chunk_size": 256, "dt_dtype": "bf16"}' --arch sm_90a \
        --cubin build/stage/mamba2_aot_cubins_sm90/cubins/X.cubin --meta build/meta/sm_90a/X.json

Why: ptxas (in the DSL's process) numbers registers by heap address in places, and where the heap puts things depends
on the size of everything the process allocates before, paths and environment included. Compiled in place, one
source gave two cubins, run to run and from checkout to checkout (docs/PERF_NOTES.md, forty-fifth to forty-eighth
sessions). This module lives outside ``kernel_src``: the child runs from a copy of ``kernel_src`` named by its
contents, so an edit here leaves that copy and what the child reads as they are; an edit that changes the child's
command line or environment can still renumber a sensitive cubin.
"""
from __future__ import annotations

import fcntl
import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from kernel_src import compile_variant

KERNEL_SOURCES = Path(__file__).resolve().parent.parent / "kernel_src"

# What a compile keeps of its caller's environment, where set: where this host's Python finds its libraries and its
# user site (the same from build to build on one host).
HOST_VARIABLES = ("LD_LIBRARY_PATH", "PYTHONUSERBASE")


def fixed_addresses_prefix() -> list[str]:
    """The command prefix that runs a process without address-space randomization (util-linux's ``setarch``, the
    machine named: older versions need it), or [] where it is missing or not allowed (a container's seccomp profile
    may refuse the personality). The path is absolute: the compile's own environment has no ``PATH``."""
    setarch = shutil.which("setarch")
    if setarch is None:
        return []
    prefix = [os.path.abspath(setarch), platform.machine(), "-R"]
    try:
        return prefix if subprocess.run(prefix + ["true"], capture_output=True).returncode == 0 else []
    except OSError:
        return []


def _short_digest(data: bytes) -> str:
    """16 hex digits of ``data``'s sha256: the names of what the user directory holds (fixed length, as the child's
    paths must be)."""
    return hashlib.sha256(data).hexdigest()[:16]


def _sources_digest(folder: Path) -> str:
    """The short digest of ``folder``'s Python sources (names and bytes)."""
    files = sorted(folder.glob("*.py"))
    return _short_digest(b"".join(p.name.encode() + b"\0" + p.read_bytes() for p in files))


def _user_directory() -> Path:
    """``$TMPDIR/mamba2_aot-<uid>``, the user's own and no one else's to write (0700): the interpreter link and the
    sources in it are run. RuntimeError when it is not."""
    base = Path(tempfile.gettempdir()) / f"mamba2_aot-{os.getuid()}"
    base.mkdir(mode=0o700, exist_ok=True)
    info = base.lstat()
    if base.is_symlink() or info.st_uid != os.getuid() or info.st_mode & 0o077:
        raise RuntimeError(f"{base} is not this user's own directory, closed to others (0700): remove it")
    return base


def fixed_interpreter() -> str:
    """This interpreter at a path whose length does not depend on where its virtual environment lives: through the
    link ``$TMPDIR/mamba2_aot-<uid>/python-<digest of the environment's real path>``. The environment's path is on
    the child's heap otherwise (its prefix, its ``sys.path``, every module's file name): two virtual environments of
    the same requirements in two places built two cubins. One link per environment, so no build re-points one that
    another compiles through. Outside a virtual environment: ``sys.executable``."""
    if sys.prefix == sys.base_prefix:
        return sys.executable
    environment = Path(sys.prefix).resolve()
    base = _user_directory()
    link = base / f"python-{_short_digest(str(environment).encode())}"
    if link.resolve() != environment:  # (new, or left dangling by a removed environment)
        staging = Path(tempfile.mkdtemp(dir=base, prefix="link-"))
        (staging / "python").symlink_to(environment, target_is_directory=True)
        os.replace(staging / "python", link)
        staging.rmdir()
    return str(link / "bin" / "python")


def fixed_root() -> Path:
    """``$TMPDIR/mamba2_aot-<uid>/<digest>``: a copy of kernel_src at a path named by its contents (one
    per user, 0700), re-staged when missing or not what its name says (a partial copy, an edit, a cleaned temp
    directory, bytecode: whether the child imports kernel_src from source or from bytecode changes its heap, so never
    the latter). Checked and staged under a lock per digest: a build's first compiles start together, and one that
    found the copy missing must not replace the copy another has just made and compiles in. Raises RuntimeError
    when the user's directory is not the user's own."""
    digest = _sources_digest(KERNEL_SOURCES)
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
        for source in KERNEL_SOURCES.glob("*.py"):
            shutil.copy2(source, stage / "kernel_src" / source.name)
        stage.rename(root)
    return root


def child_environment(root: Path) -> dict:
    """The whole environment of a compile in ``root``: little of the caller's (``HOST_VARIABLES``), whose size moves
    the child's heap (a longer ``PWD``, which the shell sets to the checkout, renumbered a cubin's registers)."""
    return {**{name: os.environ[name] for name in HOST_VARIABLES if name in os.environ},
            "PYTHONPATH": str(root), "TMPDIR": tempfile.gettempdir(), "PYTHONHASHSEED": "0",
            "PYTHONDONTWRITEBYTECODE": "1", "CUTE_DSL_DISABLE_FILE_CACHING": "1"}


def main(argv: list[str] | None = None) -> int:
    """The command line's compile (``argv``, ``kernel_src.compile_variant``'s arguments), run in a child process:
    from :func:`fixed_root`, with output and PTX dump names fixed by the variant, this interpreter through a link
    (:func:`fixed_interpreter`), an environment of its own (:func:`child_environment`), pipes for its standard
    streams, and without address-space randomization where the host allows it (:func:`fixed_addresses_prefix`); then
    its outputs moved where ``argv`` asks. The same bytes need the same kernel sources, virtual environment, user and
    ``$TMPDIR`` (two virtual environments of one requirements file gave a few cubins in another register numbering).
    Returns the exit status (the child's; 1, the variant named, when this process fails or the child dies before
    naming it)."""
    args = compile_variant.argument_parser(dump_dir=False).parse_args(argv)  # (the child's PTX folder is named here)
    name = compile_variant.command_line_name(args)
    try:
        root = fixed_root()
        tag = _short_digest(json.dumps([args.family, args.constants, args.arch, args.experiment]).encode())
        cubin, meta, dump = (Path("out") / f"{tag}.{suffix}" for suffix in ("cubin", "json", "dump"))
        command = [*fixed_addresses_prefix(), fixed_interpreter(), "-m", "kernel_src.compile_variant",
                   "--family", args.family, "--constants", args.constants, "--arch", args.arch,
                   "--cubin", str(cubin), "--meta", str(meta), "--dump-dir", str(dump),
                   *(f"--experiment={e}" for e in args.experiment), *(["--ptxas-info"] if args.ptxas_info else [])]
        with open(root / "out" / f"{tag}.lock", "w") as lock:  # (two builds of one variant on this host at once)
            fcntl.flock(lock, fcntl.LOCK_EX)
            shutil.rmtree(root / dump, ignore_errors=True)  # (left by a killed compile; the child makes it anew)
            # Output through pipes, whatever the caller's are (a terminal's buffering sizes the heap as well); the lock
            # passed on, so that a child outliving a killed parent still holds it.
            child = subprocess.run(command, cwd=root, env=child_environment(root), stdin=subprocess.DEVNULL,
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
            made = (root / cubin).read_bytes(), (root / meta).read_bytes()
            (root / cubin).unlink()
            (root / meta).unlink()
    except KeyboardInterrupt:  # (Ctrl-C reaches every compile in flight: one line each, not a traceback)
        print(f"interrupted {name}", file=sys.stderr)
        return 130
    except Exception as exc:  # the build must name the variant whatever went wrong
        print(f"FAILED {name}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    compile_variant.write_atomically(args.cubin, made[0])
    compile_variant.write_atomically(args.meta, made[1])
    return 0


if __name__ == "__main__":
    sys.exit(main())
