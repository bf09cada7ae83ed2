"""The AOT build: cubin checks that must fail on a wrong arch or param list, and reproducible, incremental builds."""
import hashlib
import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

from conftest import ROOT

pytest.importorskip("cutlass", reason="the build tests need the CuTe DSL (requirements/build.txt)")
pytest.importorskip("SCons", reason="the build tests need SCons (requirements/build.txt)")

sys.path.insert(0, str(ROOT))
from build_tools import reproducible_compile  # noqa: E402
from kernel_src import cubin_checks, families, toolchain  # noqa: E402

FAMILY, CONSTANTS = "ssd_chunk_cumsum", {"chunk_size": 64, "dt_dtype": "bf16"}
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def _arguments(tmp_path, family, constants, *more):
    """A compile's command line (``compile_variant``'s arguments) for sm_90a, its outputs in ``tmp_path``."""
    return ["--family", family, "--constants", constants, "--arch", "sm_90a",
            "--cubin", str(tmp_path / "x.cubin"), "--meta", str(tmp_path / "x.json"), *more]


def _compile(tmp_path, arch, family=FAMILY, constants=CONSTANTS, experiments=()):
    """Compile one variant the way the build does (a child of its own); return (cubin bytes, manifest entry)."""
    stem = "-".join([arch, family, *experiments])
    cubin, meta = tmp_path / f"{stem}.cubin", tmp_path / f"{stem}.json"
    subprocess.run([sys.executable, "-m", "build_tools.reproducible_compile", "--family", family,
                    "--constants", json.dumps(constants), "--arch", arch, "--cubin", str(cubin), "--meta", str(meta),
                    *[arg for name in experiments for arg in ("--experiment", name)]],
                   cwd=ROOT, check=True, capture_output=True, env={**os.environ, "CUTE_DSL_DISABLE_FILE_CACHING": "1"})
    return cubin.read_bytes(), json.loads(meta.read_text())


@pytest.fixture(scope="module")
def sm90(tmp_path_factory):
    return _compile(tmp_path_factory.mktemp("sm90"), "sm_90a")


def test_arch_flags_checked(sm90):
    cubin, _ = sm90
    cubin_checks.check_arch(cubin, "sm_90a")
    with pytest.raises(cubin_checks.CubinCheckError, match="do not match the requested arch sm_100a"):
        cubin_checks.check_arch(cubin, "sm_100a")


def test_a_compile_holds_nothing_of_its_callers_environment(sm90, tmp_path, monkeypatch):
    """The build compiles in a child with an environment of its own: a caller's variable, or a longer ``PWD`` (the
    shell sets it to the checkout), would size the child's heap, by which ptxas numbers registers in places (a ``PWD``
    of 90 characters renumbered a cubin). The same variant compiled for such a caller is the same cubin."""
    mine = reproducible_compile.child_environment(tmp_path)
    monkeypatch.setenv("PWD", "/elsewhere" * 20)
    monkeypatch.setenv("MAMBA2_AOT_TEST_PADDING", "x" * 3000)
    assert reproducible_compile.child_environment(tmp_path) == mine
    assert not {"PWD", "MAMBA2_AOT_TEST_PADDING", "HOME", "PATH"} & set(mine)
    assert _compile(tmp_path, "sm_90a")[0] == sm90[0]


@pytest.mark.skipif(sys.prefix == sys.base_prefix, reason="runs from a virtual environment")
def test_a_compile_runs_one_interpreter_path_wherever_the_environment_is_reached_from(tmp_path):
    """The compile child runs this virtual environment's Python through a link named by the environment's real path:
    reached from another place (here a link to it), the child's interpreter path is the same one, of a length that
    does not depend on where the environment lives (which would be on the child's heap otherwise)."""
    elsewhere = tmp_path / "the_same_environment_elsewhere"
    elsewhere.symlink_to(sys.prefix, target_is_directory=True)
    script = "from build_tools import reproducible_compile as rc; print(rc.fixed_interpreter())"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TMPDIR": str(tmp_path)}
    paths = {subprocess.run([python, "-c", script], env=env, capture_output=True, text=True, check=True).stdout
             for python in (sys.executable, str(elsewhere / "bin" / "python"))}
    assert len(paths) == 1
    path = paths.pop().strip()
    assert path.startswith(str(tmp_path / f"mamba2_aot-{os.getuid()}" / "python-")) and os.access(path, os.X_OK)


def test_the_compile_child_is_started_with_its_own_environment_interpreter_and_pipes(tmp_path, monkeypatch):
    """Where the build starts its compile child: with exactly :func:`child_environment`, the interpreter through its
    link, no standard input and its output piped (the cubin comparison above cannot see a leak there: the cumsum's
    register numbering does not move with the environment, an inline N 64 variant's did)."""
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(reproducible_compile.tempfile, "tempdir", None)
    monkeypatch.setenv("MAMBA2_AOT_TEST_PADDING", "x" * 3000)
    started = []

    def run(command, **kwargs):
        started.append((command, kwargs))
        return subprocess.CompletedProcess(command, 3, b"", b"")

    monkeypatch.setattr(reproducible_compile.subprocess, "run", run)
    monkeypatch.setattr(reproducible_compile, "fixed_addresses_prefix", lambda: ["setarch-stand-in"])
    status = reproducible_compile.main(["--family", FAMILY, "--constants", json.dumps(CONSTANTS),
                                        "--arch", "sm_90a", "--cubin", "x.cubin", "--meta", "x.json"])
    assert status == 3 and len(started) == 1
    command, kwargs = started[0]
    root = reproducible_compile.fixed_root()
    assert command[:2] == ["setarch-stand-in", reproducible_compile.fixed_interpreter()]
    # the rest names nothing of the caller's (its paths would size the heap too): outputs and PTX under the root's
    # out/, named by the variant
    tag = Path(command[command.index("--cubin") + 1]).stem
    assert re.fullmatch("[0-9a-f]{16}", tag)
    assert command[2:] == ["-m", "kernel_src.compile_variant", "--family", FAMILY, "--constants", json.dumps(CONSTANTS),
                           "--arch", "sm_90a", "--cubin", f"out/{tag}.cubin", "--meta", f"out/{tag}.json",
                           "--dump-dir", f"out/{tag}.dump"]
    assert kwargs["env"] == reproducible_compile.child_environment(root) and kwargs["cwd"] == root
    assert kwargs["stdin"] == subprocess.DEVNULL and kwargs["capture_output"]


def test_an_interrupted_compile_says_so_in_one_line(tmp_path, monkeypatch, capsys):
    """Ctrl-C reaches every compile in flight: each reports its variant in one line and exits 130, no traceback."""
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(reproducible_compile.tempfile, "tempdir", None)

    def interrupted(command, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(reproducible_compile.subprocess, "run", interrupted)
    monkeypatch.setattr(reproducible_compile, "fixed_addresses_prefix", lambda: [])
    status = reproducible_compile.main(["--family", FAMILY, "--constants", json.dumps(CONSTANTS),
                                        "--arch", "sm_90a", "--cubin", "x.cubin", "--meta", "x.json"])
    assert status == 130
    assert capsys.readouterr().err.startswith("interrupted sm_90a ssd_chunk_cumsum[")


def test_a_dump_folder_that_is_there_already_is_refused_and_kept(tmp_path, capsys):
    """``--dump-dir`` takes a folder the compile makes and removes: one that is there already is not emptied (it may
    be anything of the caller's); the compile fails, naming the variant, and writes nothing."""
    from kernel_src import compile_variant

    kept = tmp_path / "mine"
    kept.mkdir()
    (kept / "notes.txt").write_text("the caller's")
    status = compile_variant.main(_arguments(tmp_path, FAMILY, json.dumps(CONSTANTS), "--dump-dir", str(kept)))
    assert status == 1 and "FAILED sm_90a ssd_chunk_cumsum[" in capsys.readouterr().err
    assert (kept / "notes.txt").read_text() == "the caller's"
    assert not (tmp_path / "x.cubin").exists() and not (tmp_path / "x.json").exists()


def test_compiles_starting_together_share_one_fixed_root(tmp_path):
    """A build's first compiles find the fixed root missing at once: each gets the same copy of kernel_src, and none
    removes one that another already compiles in (a file each leaves in it survives them all)."""
    script = ("import os, sys; from build_tools import reproducible_compile as rc; root = rc.fixed_root(); "
              "(root / 'out' / str(os.getpid())).touch(); print(root)")
    env = {**os.environ, "TMPDIR": str(tmp_path), "PYTHONPATH": str(ROOT), "PYTHONDONTWRITEBYTECODE": "1"}
    procs = [subprocess.Popen([sys.executable, "-c", script], env=env, stdout=subprocess.PIPE, text=True)
             for _ in range(8)]
    roots = {proc.communicate()[0].strip() for proc in procs}
    assert all(proc.returncode == 0 for proc in procs) and len(roots) == 1, roots
    root = Path(roots.pop())
    assert sorted(int(f.name) for f in (root / "out").iterdir()) == sorted(proc.pid for proc in procs)
    assert sorted(f.name for f in (root / "kernel_src").iterdir()) == sorted(
        f.name for f in (ROOT / "kernel_src").glob("*.py"))


def test_ptxas_info_prints_ptxas_report_and_builds_the_same_cubin(sm90, tmp_path):
    """``--ptxas-info`` (a developer's view of a failed check) prints what ptxas says of the variant, spills included,
    and the cubin is the one built without it (for this variant: an inline N 64 one may be renumbered)."""
    cubin, meta = tmp_path / "info.cubin", tmp_path / "info.json"
    proc = subprocess.run([sys.executable, "-m", "build_tools.reproducible_compile", "--family", FAMILY,
                           "--constants", json.dumps(CONSTANTS), "--arch", "sm_90a", "--cubin", str(cubin),
                           "--meta", str(meta), "--ptxas-info"], cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, "CUTE_DSL_DISABLE_FILE_CACHING": "1"})
    assert proc.returncode == 0, proc.stderr
    assert "bytes spill stores" in proc.stdout + proc.stderr
    assert cubin.read_bytes() == sm90[0]


def test_param_table_matches_declared_params(sm90):
    cubin, entry = sm90
    params = entry["params"]
    cubin_checks.check_params(cubin, entry["kernel"], params)
    assert [p["name"] for p in params] == [p.name for p in families.kernel_class(FAMILY)(**CONSTANTS).params()]
    missing = params[:-1]
    with pytest.raises(cubin_checks.CubinCheckError, match="does not match the cubin's parameter table"):
        cubin_checks.check_params(cubin, entry["kernel"], missing)
    resized = [dict(p, size=8) if p["name"] == "batch" else p for p in params]
    with pytest.raises(cubin_checks.CubinCheckError, match="does not match"):
        cubin_checks.check_params(cubin, entry["kernel"], resized)


def test_symbol_and_resources_checked(sm90):
    cubin, entry = sm90
    cubin_checks.check_symbols(cubin, entry["kernel"])
    with pytest.raises(cubin_checks.CubinCheckError, match="is not defined"):
        cubin_checks.check_symbols(cubin, entry["kernel"] + "_typo")
    res = cubin_checks.resources(cubin, entry["kernel"], toolchain.cuobjdump())
    assert res.registers == entry["registers"] > 0 and res.stack == 0 and res.local == 0
    with pytest.raises(cubin_checks.CubinCheckError, match="spills"):
        cubin_checks.check_resources(cubin_checks.Resources(32, 16, 0, 0), "sm_90a", 0)
    with pytest.raises(cubin_checks.CubinCheckError, match="exceeds"):
        cubin_checks.check_resources(res, "sm_90a", cubin_checks.SMEM_LIMIT["sm_90a"] + 1)


def test_serialized_warpgroup_mmas_are_refused():
    """ptxas' fallback, a wait after every wgmma, fails the build; products waited once per group, and warp MMAs,
    pass."""
    group = ("HGMMA.64x32x16.F32.BF16 R24, gdesc[UR4], R24 ;\n" * 3
             + "HGMMA.64x32x16.F32.BF16 R24, gdesc[UR8], R24, gsb0 ;\nWARPGROUP.DEPBAR.LE gsb0, 0x0 ;\n")
    cubin_checks.check_wgmma_pipelined(group * 2)
    cubin_checks.check_wgmma_pipelined("HMMA.16816.F32.BF16 R4, R8, R12, R4 ;\n")
    serialized = ("WARPGROUP.ARRIVE ;\nHGMMA.64x32x16.F32.BF16 R24, gdesc[UR4], R24, gsb0 ;\n"
                  "WARPGROUP.DEPBAR.LE gsb0, 0x0 ;\n") * 4
    with pytest.raises(cubin_checks.CubinCheckError, match="serialized the warpgroup MMAs"):
        cubin_checks.check_wgmma_pipelined(serialized)


def test_the_build_requirements_hold_every_tool_the_checks_run(tmp_path):
    """The README's build command installs requirements/build.txt alone: cuobjdump and the nvdisasm that its -sass
    (the wgmma check) runs must be pinned there, and a failing cuobjdump says why."""
    pinned = (Path(__file__).parent.parent / "requirements" / "build.txt").read_text()
    for tool in ("nvidia-cuda-cuobjdump==", "nvidia-cuda-nvdisasm=="):
        assert re.search(rf"^{re.escape(tool)}\S+$", pinned, re.M), tool
    with pytest.raises(RuntimeError, match="cuobjdump -sass failed: .+"):
        cubin_checks.sass(b"not a cubin", toolchain.cuobjdump())


def test_setmaxnreg_shares_beyond_the_launch_registers_are_refused():
    """A cubin whose launch gives fewer registers than its warps' setmaxnreg shares average (the product warps
    would wait forever at their increase) fails the build; the chunk kernel's shares are what ptxas gives it."""
    cubin_checks.check_register_budget(cubin_checks.Resources(168, 0, 0, 0), 168)
    with pytest.raises(cubin_checks.CubinCheckError, match="wait forever"):
        cubin_checks.check_register_budget(cubin_checks.Resources(160, 0, 0, 0), 168)
    from kernel_src.ssd_bwd_chunk import SsdBackwardChunk
    kernel = SsdBackwardChunk(headdim=64, d_state=128, io_dtype="bf16", state_dtype="fp32")
    kernel.target_arch = "sm_90a"
    assert kernel.setmaxnreg_budget == 168 and kernel.threads == 384
    kernel.target_arch = "sm_100a"
    assert kernel.setmaxnreg_budget is None and kernel.threads == 256


def test_variants_that_cannot_fit_an_arch_are_named_and_skipped():
    from kernel_src.families import unsupported
    big = {"headdim": 64, "d_state": 256, "io_dtype": "bf16", "state_dtype": "fp32"}
    assert unsupported("ssd_fwd", big, "sm_90a") is None
    assert "sm_120a allows 101376 B" in unsupported("ssd_fwd", big, "sm_120a")
    # 100736 B dynamic fits sm_120a's 101376, not with the static kilobyte the cubin check counts
    n128 = unsupported("ssd_fwd", {**big, "d_state": 128}, "sm_120a")
    assert "(100736 dynamic + 1024 static), sm_120a allows" in n128
    assert unsupported("ssd_fwd", {**big, "d_state": 64}, "sm_120a") is None


def test_a_head_too_large_for_the_chunk_kernel_is_walked_in_slices_of_P_and_parts_of_N():
    """ssd_bwd_chunk holds P64 N128's tiles at most: N 256 is split into two parts of 128 columns (two CTAs), a head
    of more than 64 × 128 of a part walked as two 64-column slices of P (so the variants are built on sm_90a and
    sm_100a); smaller heads whole."""
    from kernel_src.families import kernel_class, unsupported
    for (P, N), (slices, parts) in {(64, 64): (1, 1), (64, 128): (1, 1), (128, 64): (1, 1), (128, 128): (2, 1),
                                    (64, 256): (1, 2), (128, 256): (2, 2)}.items():
        kernel = kernel_class("ssd_bwd_chunk")(P, N, "bf16", "fp32")
        assert (kernel.head_slices, kernel.columns) == (slices, P // slices)
        assert (kernel.d_state_splits, kernel.state_columns) == (parts, N // parts)
    for P, N in ((128, 128), (64, 256), (128, 256)):
        split = {"headdim": P, "d_state": N, "io_dtype": "bf16", "state_dtype": "fp32"}
        for arch in ("sm_90a", "sm_100a"):
            assert unsupported("ssd_bwd_chunk", split, arch) is None
        assert "allows" in unsupported("ssd_bwd_chunk", split, "sm_120a")


def test_a_dump_folder_in_a_missing_folder_is_refused(tmp_path, capsys):
    """``--dump-dir`` is made in a folder that is there: a missing parent would be made and outlive the compile."""
    from kernel_src import compile_variant

    status = compile_variant.main(_arguments(tmp_path, FAMILY, json.dumps(CONSTANTS),
                                             "--dump-dir", str(tmp_path / "missing" / "dump")))
    assert status == 1 and "FileNotFoundError" in capsys.readouterr().err
    assert not (tmp_path / "missing").exists() and not (tmp_path / "x.cubin").exists()


def test_the_isolated_compile_has_no_dump_folder_option(tmp_path, capsys):
    """The isolated compile names its child's PTX folder itself: its command line has no ``--dump-dir`` to take (a
    folder of the caller's would be the child's to make and remove) and its help lists none."""
    from build_tools import reproducible_compile

    with pytest.raises(SystemExit) as refused:
        reproducible_compile.main(_arguments(tmp_path, FAMILY, json.dumps(CONSTANTS), "--dump-dir", "mine"))
    assert refused.value.code == 2 and "unrecognized arguments: --dump-dir" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        reproducible_compile.main(["--help"])
    assert "--dump-dir" not in capsys.readouterr().out


def test_an_unknown_family_fails_naming_the_known_ones(tmp_path, capsys):
    from kernel_src import compile_variant

    status = compile_variant.main(_arguments(tmp_path, "ssd_fwdd", "{}"))
    assert status == 1
    err = capsys.readouterr().err
    assert "FAILED sm_90a ssd_fwdd[]: ValueError: unknown kernel family 'ssd_fwdd' (known: conv1d_fwd," in err
    assert "ssd_fwd, " in err


def test_failed_compile_names_the_variant(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "build_tools.reproducible_compile",
                           *_arguments(tmp_path, FAMILY, json.dumps({"chunk_size": 96, "dt_dtype": "bf16"}))],
                          cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode != 0
    assert "FAILED sm_90a ssd_chunk_cumsum[chunk_size=96,dt_dtype=bf16]" in proc.stderr
    assert not (tmp_path / "x.cubin").exists() and not (tmp_path / "x.json").exists()


def test_constants_that_do_not_parse_fail_naming_the_variant_as_given(tmp_path, capsys):
    from kernel_src import compile_variant

    status = compile_variant.main(_arguments(tmp_path, FAMILY, "{chunk_size: 64"))
    assert status == 1
    assert "FAILED sm_90a ssd_chunk_cumsum {chunk_size: 64: JSONDecodeError" in capsys.readouterr().err


_SPILLING_VERIFY = """
import dataclasses, json, sys
from kernel_src import compile_variant, cubin_checks

real, calls = cubin_checks.resources, []
def resources(*args):   # the first int(sys.argv[2]) compiles report a spill
    calls.append(1)
    res = real(*args)
    return dataclasses.replace(res, stack=16) if len(calls) <= int(sys.argv[2]) else res
cubin_checks.resources = resources
cubin, entry = compile_variant.compile_variant("verify", json.loads(sys.argv[1]), "sm_90a")
print(entry["registers"])
"""


@pytest.mark.parametrize("spills", [1, 2])
def test_a_variant_that_spills_at_its_occupancy_target_is_built_at_a_lower_one(spills):
    """The build falls back from an occupancy target that spills, one CTA per SM at a time, down to the kernel's
    floor (verify: from 3 to 2), and says so; a spill at the floor fails the variant. (The spills are reported by
    a stand-in for cuobjdump's count; the compiles are real.)"""
    constants = {"mode": "update", "headdim": 64, "d_state": 128, "io_dtype": "bf16", "pool_dtype": "fp32",
                 "conv_dtype": "none"}
    proc = subprocess.run([sys.executable, "-c", _SPILLING_VERIFY, json.dumps(constants), str(spills)], cwd=ROOT,
                          capture_output=True, text=True, env={**os.environ, "CUTE_DSL_DISABLE_FILE_CACHING": "1"})
    notes = [line for line in proc.stderr.splitlines() if line.startswith("note: sm_90a verify[")]
    assert [note.rsplit(" at ", 1)[1] for note in notes] == ["2 CTAs per SM"]
    if spills == 1:
        assert proc.returncode == 0 and int(proc.stdout.split()[-1]) > 0
    else:
        assert proc.returncode != 0 and "spills or uses local memory" in proc.stderr


def _checkout(dest: Path) -> Path:
    """A copy of the tracked and untracked-not-ignored source files, as a fresh clone would have them."""
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, check=True,
                           capture_output=True).stdout.decode().split("\0")
    for name in filter(None, files):
        if (ROOT / name).is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, dest / name)
    return dest


def _scons(tree: Path, *args) -> subprocess.CompletedProcess:
    """scons in ``tree`` with ``args``, and arch=sm90,sm100 config=ci where ``args`` do not give them."""
    given = {arg.partition("=")[0] for arg in args}
    defaults = [option for option in ("arch=sm90,sm100", "config=ci") if option.partition("=")[0] not in given]
    return subprocess.run([sys.executable, "-m", "SCons", "-Q", *defaults, "-j", "2", *args], cwd=tree,
                          capture_output=True, text=True)


def _digests(tree: Path) -> dict:
    shipped = sorted(tree.glob("dist/*.whl")) + sorted(tree.glob("build/stage/**/*.*"))
    return {str(p.relative_to(tree)): hashlib.sha256(p.read_bytes()).hexdigest() for p in shipped}


@pytest.fixture(scope="module")
def two_clean_builds(tmp_path_factory):
    trees = [_checkout(tmp_path_factory.mktemp(name)) for name in ("first", "second_elsewhere")]
    for tree in trees:
        proc = _scons(tree)
        assert proc.returncode == 0, proc.stdout + proc.stderr
    return trees


def test_clean_rebuild_is_byte_identical(two_clean_builds):
    first, second = two_clean_builds
    digests = _digests(first)
    assert {Path(k).name for k in digests if k.startswith("dist/")} == {
        "mamba2_aot-0.1.0-py3-none-any.whl", "mamba2_aot_cubins_sm90-0.1.0-py3-none-any.whl",
        "mamba2_aot_cubins_sm100-0.1.0-py3-none-any.whl"}
    assert digests == _digests(second)


def test_shipped_files_hold_no_paths_or_timestamps(two_clean_builds):
    tree = two_clean_builds[0]
    for wheel in tree.glob("dist/*.whl"):
        with zipfile.ZipFile(wheel) as zf:
            for info in zf.infolist():
                data = zf.read(info)
                for local in (str(tree), str(ROOT), sys.prefix, "/home/", "/root/"):
                    assert local.encode() not in data, f"{wheel.name}:{info.filename} mentions {local}"
                assert info.date_time == (1985, 10, 26, 8, 21, 0), info.date_time  # enscons' fixed epoch


def test_manifest_describes_every_cubin(two_clean_builds):
    tree = two_clean_builds[0]
    manifest = json.loads((tree / "build/stage/mamba2_aot_cubins_sm90/manifest.json").read_text())
    assert manifest["arch"] == "sm_90a" and manifest["compute_capability"] == [9, 0]
    assert manifest["toolchain"]["cutlass_dsl"] == "4.8.1" and manifest["toolchain"]["cuda_flavour"] == "cu12"
    assert manifest["toolchain"]["options"] == "--gpu-arch sm_90a --keep-cubin" and manifest["toolchain"]["ptx_isa"]
    assert "cutlass-dsl-libs-cu12" in manifest["toolchain"]["ptxas"]
    ci_matrix = tomllib.loads((ROOT / "build_configs" / "ci.toml").read_text())
    assert sorted(v["key"] for v in manifest["variants"]) == sorted(
        families.variant_key(family, constants) for family, constants in families.expand(ci_matrix)
        if not families.unsupported(family, constants, "sm_90a"))  # e.g. shared memory over the limit: skipped
    for v in manifest["variants"]:
        data = (tree / "build/stage/mamba2_aot_cubins_sm90" / v["file"]).read_bytes()
        assert hashlib.sha256(data).hexdigest() == v["sha256"] and len(data) == v["size"]


def test_the_wheels_install_into_a_clean_environment_and_verify(two_clean_builds, tmp_path):
    """The three wheels of a clean build install into a fresh virtual environment with no package index (they
    depend on nothing but each other), and the installed ``python -m mamba2_aot verify``, run away from the source
    tree, finds every cubin of both arch packages intact against its manifest."""
    dist = sorted((two_clean_builds[0] / "dist").glob("*.whl"))
    venv = tmp_path / "clean"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = venv / "bin" / "python"
    subprocess.run([python, "-m", "pip", "install", "-q", "--no-index", *dist], check=True)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "MAMBA2_AOT_CUBIN_DIR")}
    proc = subprocess.run([python, "-m", "mamba2_aot", "verify"], cwd=tmp_path, env=env, capture_output=True,
                          text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    verified = [line.split()[1] for line in proc.stdout.splitlines() if line.startswith("ok ")]
    packages = ("mamba2_aot_cubins_sm90", "mamba2_aot_cubins_sm100")
    for package in packages:
        manifest = json.loads((two_clean_builds[0] / "build/stage" / package / "manifest.json").read_text())
        assert verified.count(package) == len(manifest["variants"]) > 0, package
    listed = subprocess.run([python, "-m", "mamba2_aot", "list"], cwd=tmp_path, env=env, capture_output=True,
                            text=True)
    assert listed.returncode == 0, listed.stdout + listed.stderr
    assert all(f"{package} 0.1.0 (sm_" in listed.stdout for package in packages), listed.stdout


def test_incremental_rebuild(two_clean_builds):
    tree = two_clean_builds[1]
    assert _scons(tree, "-q").returncode == 0, "a second build with nothing changed must have nothing to do"
    module = tree / families.kernel_module_path(FAMILY)
    module.write_text(module.read_text() + "\n# touched\n")
    dry = _scons(tree, "-n")
    would = [line.split("/")[-1] for line in dry.stdout.splitlines() if line.startswith("would compile ")]
    proc = _scons(tree)
    assert proc.returncode == 0, proc.stderr
    compiled = [line for line in proc.stdout.splitlines() if line.startswith("compiled ")]
    ci_matrix = tomllib.loads((ROOT / "build_configs" / "ci.toml").read_text())
    its_variants = [c for f, c in families.expand(ci_matrix) if f == FAMILY]
    assert len(compiled) == 2 * len(its_variants) > 0, proc.stdout  # its ci variants x 2 archs, nothing else
    # scons -n names what the build then compiled (each compile prints its own line, which a dry run does not run)
    assert len(would) == len(compiled) and all(name.startswith(FAMILY + ".") for name in would), dry.stdout

    writer = tree / "kernel_src" / "manifest.py"  # what the manifests' action calls is a source of theirs
    writer.write_text(writer.read_text() + "\n# touched\n")
    assert _scons(tree, "-q").returncode == 1, "the manifests must be rebuilt when their writer changes"


def test_stale_wheels_are_removed_and_clean_removes_the_wheels(two_clean_builds):
    """A build removes this project's wheels of another version from dist/ (the runtime's version lock refuses their
    cubins, and `pip install dist/*.whl` fails on two versions of one package), leaving other files alone; ``scons
    -c`` removes this project's wheels too (enscons keeps its own under -c). Only a whole build or clean touches
    dist/: not -n, -q, or one with targets named."""
    tree = two_clean_builds[1]
    dist = tree / "dist"
    stale = [dist / "mamba2_aot-0.0.9-py3-none-any.whl", dist / "mamba2_aot_cubins_sm90-0.0.9-py3-none-any.whl"]
    other = dist / "someone_else-0.0.9-py3-none-any.whl"
    for wheel in stale + [other]:
        wheel.write_bytes(b"old")
    version = PYPROJECT["project"]["version"]
    current = sorted(p.name for p in dist.glob(f"mamba2_aot*-{version}-*.whl"))
    runtime_wheel = f"dist/mamba2_aot-{version}-py3-none-any.whl"  # (built from no cubin: its clean leaves them)
    for untouching in (("-n",), ("-q",), ("-n", "-c"), ("-c", runtime_wheel)):  # dry runs, questions, named targets
        _scons(tree, *untouching)
        assert all(p.exists() for p in stale), untouching
    proc = _scons(tree)
    assert proc.returncode == 0, proc.stderr
    assert "compiled " not in proc.stdout  # (cleaning build/wheel cleaned the cubins it copies: CI recompiled them)
    assert not any(p.exists() for p in stale) and other.exists()
    assert all(f"removed dist/{p.name}" in proc.stdout for p in stale), proc.stdout
    assert sorted(p.name for p in dist.glob("mamba2_aot*.whl")) == current
    assert _scons(tree, "-c").returncode == 0
    assert not list(dist.glob("mamba2_aot*.whl")) and other.exists()


def test_a_build_through_paths_with_spaces(tmp_path):
    """The checkout and the virtual environment's interpreter in folders whose names have spaces: the compile's
    command line quotes the interpreter (every compile failed with 'sh: /tmp/a: not found')."""
    tree = _checkout(tmp_path / "a checkout")
    spaced_venv = tmp_path / "a venv"
    spaced_venv.symlink_to(Path(sys.prefix), target_is_directory=True)
    python = spaced_venv / "bin" / Path(sys.executable).name
    cubin = f"build/stage/mamba2_aot_cubins_sm90/cubins/{families.variant_stem(FAMILY, CONSTANTS)}.cubin"
    proc = subprocess.run([str(python), "-m", "SCons", "-Q", "arch=sm90", "config=ci", cubin], cwd=tree,
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (tree / cubin).stat().st_size > 0


def test_pip_builds_the_runtime_wheel_from_a_checkout(tmp_path):
    """`pip install .` or a git URL (pip's PEP 517 build, setuptools) gives the runtime that scons packages: the same
    modules, no build or test code (pip failed on the checkout's flat layout)."""
    from packaging.requirements import Requirement
    tree = _checkout(tmp_path / "checkout")
    backend, = map(Requirement, PYPROJECT["build-system"]["requires"])
    try:  # (the installed setuptools where it meets the requirement: no download)
        installed = importlib.metadata.version("setuptools")
    except importlib.metadata.PackageNotFoundError:
        installed = "0"
    isolation = ["--no-build-isolation"] if backend.specifier.contains(installed) else []
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", *isolation, str(tree), "-w",
                    str(tmp_path / "wheels")], check=True, capture_output=True)
    wheel, = (tmp_path / "wheels").glob(f"mamba2_aot-{PYPROJECT['project']['version']}-py3-none-any.whl")
    with zipfile.ZipFile(wheel) as zf:
        modules = {name for name in zf.namelist() if name.endswith(".py")}
    assert modules == {str(p.relative_to(ROOT / "runtime")) for p in (ROOT / "runtime" / "mamba2_aot").rglob("*.py")}


def test_a_toolchain_other_than_the_pinned_one_stops_the_build(tmp_path):
    """Another version of a pinned build package compiles other cubins than the validated ones: the build stops
    before anything is compiled, naming the package, both versions and the fix."""
    tree = _checkout(tmp_path)
    pins = tree / "requirements" / "build.txt"
    pinned = pins.read_text()
    # other spellings of the same pins (spaces, a marker, a trailing comment) are the same pins
    pins.write_text(pinned.replace("pyelftools==0.33", "pyelftools == 0.33  # spaced")
                    .replace("scons==4.11.1", 'scons==4.11.1 ; python_version >= "3.10"'))
    assert _scons(tree, "-n").returncode == 0
    pins.write_text(pinned.replace("pyelftools==0.33", "pyelftools==0.1"))
    proc = _scons(tree, "-n")
    assert proc.returncode != 0
    assert "pyelftools: installed 0.33, pinned ==0.1" in proc.stdout + proc.stderr
    assert "pip install -r requirements/build.txt" in proc.stdout + proc.stderr


@pytest.mark.parametrize("config", ["ci", "full"])
@pytest.mark.parametrize("step", ["ssd_fwd_paired", "ssd_fwd_pass", "ssd_fwd_inline"])
def test_every_ssd_fwd_variant_the_plan_may_send_to_a_step_is_built_there(config, step):
    """ssd_fwd's plan may send any of its launches at N 128 to ssd_fwd_paired, any split call's states-only pass to
    ssd_fwd_pass, and any launch up to N 128 to ssd_fwd_inline (a split call in one launch, or a launch of two heads
    per CTA), with the same constants (and ssd_fwd_inline's ``z_gate``: True, and at N 128 False too,
    ``plans.ssd_fwd.with_family_constants``): each config builds those families for exactly ssd_fwd's variants they
    can run (the family's d_states)."""
    matrix = tomllib.loads((ROOT / "build_configs" / f"{config}.toml").read_text())
    variants = families.expand(matrix)
    runnable = families.kernel_class(step).d_states
    built = {families.variant_key(step, c) for f, c in variants if f == step}
    z_gates = lambda c: (True, False) if c["d_state"] == 128 else (True,)  # noqa: E731
    asked = [{**c, "z_gate": g} for c in (c for f, c in variants if f == "ssd_fwd" and c["d_state"] in runnable)
             for g in (z_gates(c) if step == "ssd_fwd_inline" else (None,))]
    assert built == {families.variant_key(step, {k: v for k, v in c.items() if v is not None}) for c in asked}


@pytest.mark.parametrize("config", ["ci", "full"])
def test_every_ssd_bwd_chunk_variant_has_the_other_steps_of_its_backward_built(config):
    """A backward launches the recompute (ssd_fwd_states) and ssd_bwd_dstates, or both side by side (ssd_bwd_walks,
    for the d_states it has), then ssd_bwd_chunk and ssd_bwd_reduce: each config builds, for every ssd_bwd_chunk
    variant, the other steps' variants with its constants (those the step's family has), so that every chunk cubin
    built can run."""
    matrix = tomllib.loads((ROOT / "build_configs" / f"{config}.toml").read_text())
    variants = families.expand(matrix)
    built = {families.variant_key(f, c) for f, c in variants}
    missing = []
    for c in (c for f, c in variants if f == "ssd_bwd_chunk"):
        for step in ("ssd_fwd_states", "ssd_bwd_dstates", "ssd_bwd_walks", "ssd_bwd_reduce"):
            if c["d_state"] in getattr(families.kernel_class(step), "d_states", (c["d_state"],)):
                key = families.variant_key(step, {k: c[k] for k in matrix[step]})
                if key not in built:
                    missing.append(key)
    assert not missing, f"{config}: ssd_bwd_chunk variants built without the rest of their backward: {missing}"


def test_ssd_fwd_takes_warpgroup_mma_only_on_sm90a(two_clean_builds):
    """sm_90a ssd_fwd (its paired and inline kernels, its pass, and the states-only walks) with wgmma per head (N <=
    128) multiplies with wgmma (HGMMA in the SASS, no warp MMA); sm_100a, which has no wgmma, and N = 256 keep the warp
    MMA (HMMA)."""
    tree = two_clean_builds[0]
    seen = set()
    for package, arch in (("mamba2_aot_cubins_sm90", "sm_90a"), ("mamba2_aot_cubins_sm100", "sm_100a")):
        manifest = json.loads((tree / "build/stage" / package / "manifest.json").read_text())
        for v in manifest["variants"]:
            if v["family"] not in ("ssd_fwd", "ssd_fwd_paired", "ssd_fwd_inline", "ssd_fwd_pass", "ssd_fwd_states",
                                   "ssd_bwd_walks"):
                continue
            sass = subprocess.run([toolchain.cuobjdump(), "-sass", str(tree / "build/stage" / package / v["file"])],
                                  check=True, capture_output=True, text=True).stdout
            warpgroup = arch == "sm_90a" and v["constants"]["d_state"] <= 128
            assert ("HGMMA" in sass) == warpgroup and ("HMMA" in sass.replace("HGMMA", "")) != warpgroup, v["key"]
            seen.add(warpgroup)
    assert seen == {True, False}


def test_the_chunk_kernels_products_ahead_experiment_builds_unvalidated_with_fewer_waits(tmp_path):
    """``experiment=bwd_products_ahead`` (ssd_bwd_chunk's products issued ahead; measured slower, not adopted) keeps
    compiling through every cubin check, is marked unvalidated, and issues the same products with fewer waits; the
    default build of the same variant is untouched by it."""
    constants = {"headdim": 64, "d_state": 64, "io_dtype": "bf16", "state_dtype": "fp32"}
    built = {}
    for experiments in ((), ("bwd_products_ahead",)):
        cubin, entry = _compile(tmp_path, "sm_90a", "ssd_bwd_chunk", constants, experiments)
        sass = cubin_checks.sass(cubin, toolchain.cuobjdump())
        built[bool(experiments)] = (entry, len(re.findall(r"\bHGMMA\.", sass)),
                                    len(re.findall(r"\bWARPGROUP\.DEPBAR\b", sass)))
    (default, mmas, waits), (ahead, ahead_mmas, ahead_waits) = built[False], built[True]
    assert default["validated"] is True and "experiments" not in default
    assert ahead["validated"] is False and ahead["experiments"] == ["bwd_products_ahead"]
    assert ahead_mmas == mmas and ahead_waits < waits
    # where it would change nothing (warp MMAs, N 256's parts), the variant is built as by default, and validated
    for arch, d_state in (("sm_100a", 64), ("sm_90a", 256)):
        kernel = families.new_kernel("ssd_bwd_chunk", {**constants, "d_state": d_state}, arch, ["bwd_products_ahead"])
        assert kernel.enabled_experiments == frozenset() and not kernel.products_ahead


def test_the_cumsum_loads_its_tile_before_its_barrier_and_stores_after(tmp_path):
    """ssd_chunk_cumsum's dt loads wait behind no store (a load behind a store that might alias dt waits for it, one
    latency per row in the old kernel, docs/PERF_NOTES.md, ssd_chunk_cumsum): in its SASS at chunk sizes 64 and 256,
    every dt load comes before the CTA's one barrier and every global store after it. (ptxas still places some of
    Δ's math between the loads.)"""
    for chunk_size in (64, 256):
        cubin, entry = _compile(tmp_path, "sm_90a", "ssd_chunk_cumsum", {"chunk_size": chunk_size, "dt_dtype": "bf16"})
        sass = cubin_checks.sass(cubin, toolchain.cuobjdump())
        barrier = sass.index("BAR.SYNC")
        dt_loads = [m.start() for m in re.finditer(r"\bLDG\.E\.U16\b", sass)]
        assert len(dt_loads) == chunk_size // 16 and max(dt_loads) < barrier
        assert sass.count("BAR.SYNC") == 1 and barrier < sass.index("STG.")
        assert entry["validated"] is True and "experiments" not in entry


def test_the_fused_verify_arrives_before_its_passes_and_acquires_before_its_barrier(tmp_path):
    """The fused conv + SSM verify's tickets (kernel_src/conv_window.py; docs/PERF_NOTES.md, the pre-conv path,
    fifty-seventh session), in the SASS of the compact variant, which takes both tickets:
    - a head arrives at its group's ticket (the first atomic whose old value is kept) before its passes store the
      state, with the one fence of thread 0's release before it: no thread fences its own stores first;
    - each acquire (the fence's ``CCTL.IVALL``) is followed by the barrier that passes "last" on, with nothing
      between them but the ticket's reset: every thread's loads and writes of what the last CTA rewrites follow
      it."""
    constants = {"mode": "compact", "headdim": 64, "d_state": 128, "io_dtype": "bf16", "pool_dtype": "fp32",
                 "conv_dtype": "bf16"}
    cubin, _ = _compile(tmp_path, "sm_90a", "verify", constants)
    sass = cubin_checks.sass(cubin, toolchain.cuobjdump())
    arrivals = [m.start() for m in re.finditer(r"\bATOMG\.E\.ADD\.STRONG\.GPU PT, R\d+", sass)]
    assert len(arrivals) == 2   # the group's ticket, then the groups' (compact)
    assert arrivals[0] < sass.index("STG.E.128")   # (the fp32 state's stores)
    assert sass[:arrivals[0]].count("MEMBAR") == 1
    acquires = [m.start() for m in re.finditer(r"\bCCTL\.IVALL\b", sass)]
    assert len(acquires) == 2
    for at in acquires:
        until_barrier = sass[at:sass.index("BAR.SYNC", at)]
        assert "LDG." not in until_barrier and until_barrier.count("STG.") == 1


@pytest.mark.parametrize("option,says", [
    ("experiments=bwd_products_ahead", "known: arch, config, experiment"),
    ("archs=sm90", "known: arch, config, experiment"),
    ("experiment=no_such_experiment", "known experiments: "),
    ("arch=sm999", "arch=sm999: unknown ['sm999']; choose from ["),
    ("arch=", "arch=: names no architecture; choose from ["),
    ("arch=sm90 arch=sm100", "build options given more than once: ['arch']; give each once"),  # (SCons kept the last)
])
def test_a_misspelt_build_option_stops_the_build(option, says):
    """A misspelt option (SCons would ignore it and build the defaults), an unknown experiment name or architecture,
    none, or an option given twice, stops the build before anything is compiled, naming what it knows."""
    proc = _scons(ROOT, "-n", *option.split())
    assert proc.returncode != 0
    assert says in proc.stdout + proc.stderr


def test_a_dry_run_of_a_fresh_checkout_names_each_compile_once(tmp_path):
    """``scons -n`` lists one ``would compile`` line per cubin of the build, and nothing else as a compile (it listed
    the copies of the cubins into build/wheel as compiles too)."""
    proc = _scons(_checkout(tmp_path), "-n", "arch=sm90")
    assert proc.returncode == 0, proc.stderr
    would = sorted(line.removeprefix("would compile ") for line in proc.stdout.splitlines()
                   if line.startswith("would compile "))
    ci_matrix = tomllib.loads((ROOT / "build_configs" / "ci.toml").read_text())
    assert would == sorted(f"build/stage/mamba2_aot_cubins_sm90/cubins/{families.variant_stem(family, constants)}.cubin"
                           for family, constants in families.expand(ci_matrix)
                           if not families.unsupported(family, constants, "sm_90a"))


def test_help_lists_the_options_without_expanding_the_variants():
    """``scons -h`` prints the build options and stops: it expanded (and imported) every variant first, about a
    minute for config=full, which sm_120a's skipped-variant lines show."""
    proc = _scons(ROOT, "-h", "arch=sm120")
    assert proc.returncode == 0
    assert all(f"\n{option}: " in proc.stdout for option in ("arch", "config", "experiment"))
    assert "skipped" not in proc.stdout


@pytest.fixture(scope="module")
def compile_once(tmp_path_factory):
    """:func:`_compile`, each (arch, family, constants) compiled once for the module's tests that read the same
    default cubin."""
    folder = tmp_path_factory.mktemp("variants")
    compiled = {}

    def compile_variant(arch, family, constants):
        key = (arch, family, json.dumps(constants, sort_keys=True))
        if key not in compiled:
            compiled[key] = _compile(folder, arch, family, constants)
        return compiled[key]

    return compile_variant


def test_an_inline_pass_on_rings_of_three_keeps_two_blocks_of_x_in_flight(compile_once):
    """ssd_fwd_inline at N 64 and at N 128 without z (rings of three): the writers issue block k + 2's x before
    publishing block k + 1, so neither they nor the loaders ever wait for every copy (``cp.async.wait_group 0``,
    ``DEPBAR.LE SB0, 0x0``); at N 128 with z (rings of two) both do (the first publication, the loaders' every one)."""
    constants = {"headdim": 64, "io_dtype": "bf16", "state_dtype": "fp32"}
    for d_state, z_gate, two_ahead in ((64, True, True), (128, False, True), (128, True, False)):
        cubin, _ = compile_once("sm_90a", "ssd_fwd_inline", {**constants, "d_state": d_state, "z_gate": z_gate})
        assert ("DEPBAR.LE SB0, 0x0" in cubin_checks.sass(cubin, toolchain.cuobjdump())) != two_ahead


BF16_P64_N128 = {"headdim": 64, "d_state": 128, "io_dtype": "bf16"}


def _copies_and_barriers(sass: str) -> str:
    """The cubin's cp.async copies (a run of N as ``LDGSTSxN``), their commits (``COMMIT``) and waits (``WAIT(n)``:
    all but the thread's newest n groups landed), memory barriers (``MEMBAR``) and named-barrier operations
    (``SYNC(id)``, ``ARV(id)``; n and id as written, a constant or a register), in program order, space-separated."""
    tokens = []
    pattern = r"\b(LDGSTS|LDGDEPBAR|DEPBAR\.LE SB0|MEMBAR|BAR\.ARV|BAR\.SYNC)[.A-Z_0-9]*([^;]*);"
    for op, operands in re.findall(pattern, sass):
        operands = [operand.strip() for operand in operands.split(",")]
        if op == "LDGSTS":
            count = int(tokens.pop()[7:]) if tokens and tokens[-1].startswith("LDGSTSx") else 0
            tokens.append(f"LDGSTSx{count + 1}")
        elif op == "DEPBAR.LE SB0":
            tokens.append(f"WAIT({operands[1]})")
        elif op.startswith("BAR."):
            tokens.append(f"{op[4:8]}({operands[0]})")
        else:
            tokens.append({"LDGDEPBAR": "COMMIT", "MEMBAR": "MEMBAR"}[op])
    return " ".join(tokens)


@pytest.mark.parametrize("family", ["ssd_fwd_paired", "ssd_fwd_inline"])
def test_rings_of_two_publish_x_alone_and_wait_for_z_before_y_free(compile_once, family):
    """Rings of two (N 128, ``z_with_y_free``): in the writers' loop each block's x (16 copies) and z (16) are two
    commit groups, and its publication (two arrivals on TR, register ids) waits for all but the newest, z's, not for
    one group of both; and every copy has landed before head 0's Y_STAGED wait and Y_FREE arrival. (The other
    half, the products' gate reading z only after their Y_FREE wait, is the order of ``_products_block``'s source,
    not checked here.)"""
    from kernel_src.ssd_fwd_paired import Y_FREE, Y_STAGED, head_barrier
    cubin, _ = compile_once("sm_90a", family, {**BF16_P64_N128, "state_dtype": "fp32"})
    order = _copies_and_barriers(cubin_checks.sass(cubin, toolchain.cuobjdump()))
    # after head 1's Y_FREE arrival (and, with an inline pass, the TILES_FREE wait): the writers' copies, publication
    publication = rf"ARV\({head_barrier(1, Y_FREE):#x}\)( SYNC\(R\d+\))? {{}} MEMBAR ARV\(R\d+\) ARV\(R\d+\)"
    one_group, two_groups = r"LDGSTSx32 COMMIT WAIT\(0x0\)", r"LDGSTSx16 COMMIT LDGSTSx16 COMMIT WAIT\(0x1\)"
    assert re.search(publication.format(two_groups), order) and not re.search(publication.format(one_group), order)
    handover = rf"WAIT\(0x0\) SYNC\({head_barrier(0, Y_STAGED):#x}\) ARV\({head_barrier(0, Y_FREE):#x}\)"
    assert re.search(handover, order)


def test_the_n128_inline_variant_without_z_has_rings_of_three_and_no_gate(compile_once):
    """ssd_fwd_inline at N 128 with ``z_gate`` False (the runtime's variant for calls without z): no z slots, B, C and x
    on rings of three (+48 KB - 32 KB of shared memory), no gate (silu's tanh.approx, MUFU.TANH, only in the variant
    with z); N 64 (rings of three with z) has no such variant, nor has ssd_fwd_paired (whose cubin of it ptxas did not
    build reproducibly in the forty-fifth session's builds)."""
    constants = {**BF16_P64_N128, "state_dtype": "fp32"}
    gated, gated_entry = compile_once("sm_90a", "ssd_fwd_inline", {**constants, "z_gate": True})
    ungated, entry = compile_once("sm_90a", "ssd_fwd_inline", {**constants, "z_gate": False})
    assert entry["dynamic_smem"] == gated_entry["dynamic_smem"] + 16 * 1024
    assert families.new_kernel("ssd_fwd_inline", {**constants, "z_gate": False}, "sm_90a").ring == 3
    tanh = [cubin_checks.sass(c, toolchain.cuobjdump()).count("MUFU.TANH") for c in (gated, ungated)]
    assert tanh[0] > 0 and tanh[1] == 0
    with pytest.raises(ValueError, match="z_gate"):
        families.kernel_class("ssd_fwd_inline")(**{**constants, "d_state": 64, "z_gate": False})
    with pytest.raises(TypeError, match="z_gate"):  # (not a constant of ssd_fwd_paired's)
        families.kernel_class("ssd_fwd_paired")(**{**constants, "z_gate": False})


@pytest.mark.parametrize("family, constants, most_permutes", [
    # (measured with cuobjdump 13: the shift and the mask / the conversion's lowering)
    ("ssd_fwd_paired", {**BF16_P64_N128, "state_dtype": "fp32"}, 75),  # 69 / 101: the skip's and gate's 2 × 16 pairs
    ("ssd_fwd", {**BF16_P64_N128, "state_dtype": "fp32"}, 300),        # 290 / 434: the walk's skip and gate vectors
    ("ssd_bwd_chunk", {**BF16_P64_N128, "state_dtype": "fp32"}, 165),  # 159 / 250: runs', _finish's, gate's, dots'
    ("ssd_bwd_dstates", BF16_P64_N128, 10),                            # 4 / 36: dout's and z's vectors
])
def test_bf16_tiles_are_widened_without_byte_permutes(compile_once, family, constants, most_permutes):
    """bf16 tiles are widened to fp32 by a shift and a mask (``ssd_tiles.widen``), not by the conversion, whose
    lowering takes a byte permute (PRMT) and two shifts per pair: the P64 N128 bf16 cubins keep at most the permutes
    they have without a single conversion of a tile's pair or vector (one call site put back exceeds each bound)."""
    cubin, _ = compile_once("sm_90a", family, constants)
    assert cubin_checks.sass(cubin, toolchain.cuobjdump()).count("PRMT") <= most_permutes


def test_an_experiment_that_changes_no_variant_is_reported():
    """``experiment=bwd_products_ahead`` on sm_100a (which declines it: its backward has no warp-specialized CTA)
    builds the default cubins; the build says so instead of passing the request over in silence. On sm_90a it
    changes variants, and nothing is reported."""
    proc = subprocess.run([sys.executable, "-m", "SCons", "-Q", "-n", "arch=sm100", "config=ci",
                           "experiment=bwd_products_ahead"], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert ("experiment=bwd_products_ahead changes no variant of this build (config=ci, arch=sm100): its cubins are "
            "the default build's") in proc.stdout
    proc = subprocess.run([sys.executable, "-m", "SCons", "-Q", "-n", "arch=sm90", "config=ci",
                           "experiment=bwd_products_ahead"], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert "changes no variant" not in proc.stdout
