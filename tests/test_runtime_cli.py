"""CPU tests of ``python -m mamba2_aot {list,doctor,verify}`` (no GPU, no driver, or a fake one)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from mamba2_aot import DriverNotFoundError, driver, manifest
from mamba2_aot.__main__ import main
from runtime_fakes import FakeDriver, mark_unvalidated, reset_runtime_state, write_cubin_dir

RUNTIME = Path(__file__).resolve().parents[1] / "runtime"


@pytest.fixture
def cubins(tmp_path, monkeypatch):
    """Fake sm_90 cubins in MAMBA2_AOT_CUBIN_DIR, and no CUDA driver."""
    reset_runtime_state(monkeypatch)
    pkg = write_cubin_dir(tmp_path)
    monkeypatch.setenv(manifest.ENV_CUBIN_DIR, str(tmp_path))

    def missing():
        raise DriverNotFoundError("libcuda.so.1: cannot open shared object file")

    monkeypatch.setattr(driver, "_load_library", missing)
    return pkg


def test_list_without_driver(cubins, capsys):
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    assert "mamba2_aot_cubins_sm90 0.1.0 (sm_90a" in out
    assert "ssd_chunk_cumsum[chunk_size=64,dt_dtype=bf16]: unknown (no CUDA here)" in out
    assert "CUDA: unavailable here:" in out and "libcuda.so.1" in out


def test_list_with_fake_device(cubins, monkeypatch, capsys):
    monkeypatch.setattr(driver, "_driver", FakeDriver(capabilities=[(10, 0)]))
    assert main(["list"]) == 0
    assert "no device of this arch here" in capsys.readouterr().out


def test_list_says_sm80_cubins_run_on_a_later_8x_device(tmp_path, monkeypatch, capsys):
    reset_runtime_state(monkeypatch)
    write_cubin_dir(tmp_path, cc=(8, 0))
    monkeypatch.setenv(manifest.ENV_CUBIN_DIR, str(tmp_path))
    monkeypatch.setattr(driver, "_driver", FakeDriver(capabilities=[(8, 9)]))
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    assert "(sm_80, compute capability 8.0)" in out
    assert "ssd_chunk_cumsum[chunk_size=64,dt_dtype=bf16]: runs here" in out


def test_list_marks_unvalidated_variants(cubins, monkeypatch, capsys):
    mark_unvalidated(cubins, 64)
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    assert ("ssd_chunk_cumsum[chunk_size=64,dt_dtype=bf16]: not used [not validated on hardware; "
            "experiments: bwd_products_ahead; not used unless MAMBA2_AOT_ALLOW_UNVALIDATED=1]\n") in out
    assert "ssd_chunk_cumsum[chunk_size=256,dt_dtype=bf16]: unknown (no CUDA here)\n" in out
    monkeypatch.setenv(manifest.ENV_ALLOW_UNVALIDATED, "1")
    manifest.catalog(refresh=True)
    assert main(["list"]) == 0
    assert ("ssd_chunk_cumsum[chunk_size=64,dt_dtype=bf16]: unknown (no CUDA here) [not validated on hardware; "
            "experiments: bwd_products_ahead]\n") in capsys.readouterr().out


def test_doctor_without_driver_exits_2(cubins, capsys):
    assert main(["doctor"]) == 2
    out = capsys.readouterr().out
    assert "CUDA: unavailable" in out and "mamba2_aot_cubins_sm90 0.1.0 sm_90a (4 variants)" in out


def test_doctor_with_fake_device(cubins, monkeypatch, capsys):
    monkeypatch.setattr(driver, "_driver", FakeDriver(capabilities=[(9, 0), (8, 0)]))
    assert main(["doctor"]) == 1  # cuda:1 (sm_80) has no cubins
    out = capsys.readouterr().out
    assert "ssd_chunk_cumsum[chunk_size=256,dt_dtype=fp32]: loads\n" in out
    assert "cuda:1 Fake GPU (sm_80)" in out and "pip install 'mamba2_aot_cubins_sm80==" in out


def test_doctor_does_not_load_unvalidated_variants(cubins, monkeypatch, capsys):
    mark_unvalidated(cubins, 64, experiments=())
    fake = FakeDriver()
    monkeypatch.setattr(driver, "_driver", fake)
    assert main(["doctor"]) == 0
    out = capsys.readouterr().out
    assert ("ssd_chunk_cumsum[chunk_size=64,dt_dtype=fp32]: not loaded [not validated on hardware; not used unless "
            "MAMBA2_AOT_ALLOW_UNVALIDATED=1]") in out
    assert "ssd_chunk_cumsum[chunk_size=256,dt_dtype=fp32]: loads\n" in out
    assert sorted(call[1] for call in fake.calls if call[0] == "load") == [
        b"fake cubin mamba2_aot_cubins_sm90 256 bf16", b"fake cubin mamba2_aot_cubins_sm90 256 fp32"]


def test_list_reports_a_missing_cubin_file(cubins, capsys):
    gone = next(path for path in (cubins / "cubins").iterdir() if "256" in path.name)
    gone.unlink()
    assert main(["list"]) == 1
    out = capsys.readouterr().out
    missing = [line for line in out.splitlines() if "CUBIN MISSING" in line]
    assert len(missing) == 1 and str(gone) in missing[0] and "chunk_size=256" in missing[0]


def test_verify(cubins, capsys):
    assert main(["verify"]) == 0
    assert capsys.readouterr().out.count("ok ") == 4
    next((cubins / "cubins").iterdir()).write_bytes(b"tampered")
    assert main(["verify"]) == 1
    assert "MISMATCH" in capsys.readouterr().out


def test_verify_nothing_installed(tmp_path, monkeypatch, capsys):
    reset_runtime_state(monkeypatch)
    monkeypatch.setenv(manifest.ENV_CUBIN_DIR, str(tmp_path))
    assert main(["verify"]) == 1
    assert "nothing to verify" in capsys.readouterr().out


def test_module_entry_point_runs(tmp_path):
    write_cubin_dir(tmp_path)
    env = dict(os.environ, PYTHONPATH=str(RUNTIME), **{manifest.ENV_CUBIN_DIR: str(tmp_path)})
    result = subprocess.run([sys.executable, "-m", "mamba2_aot", "verify"], env=env, capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stderr
    assert "ok       mamba2_aot_cubins_sm90" in result.stdout


def test_import_needs_only_the_standard_library(tmp_path):
    code = ("import sys, mamba2_aot; from mamba2_aot import runtime; "
            "bad = [m for m in ('torch', 'numpy', 'cutlass', 'cuda') if m in sys.modules]; "
            "assert not bad, bad; assert 'mamba2_aot.driver' in sys.modules")
    result = subprocess.run([sys.executable, "-c", code], env=dict(os.environ, PYTHONPATH=str(RUNTIME)),
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr


def test_list_and_doctor_say_which_source_serves_a_variant_two_sources_hold(tmp_path, monkeypatch, capsys):
    """Two cubin dirs with the same variants, the earlier one's chunk size 64 unvalidated: ``list`` and ``doctor``
    name the source whose build calls use, for every line of a key that appears twice."""
    reset_runtime_state(monkeypatch)
    first, second = write_cubin_dir(tmp_path / "first"), write_cubin_dir(tmp_path / "second")
    mark_unvalidated(first, 64)
    monkeypatch.setenv(manifest.ENV_CUBIN_DIR, os.pathsep.join(str(p) for p in (tmp_path / "first", tmp_path / "second")))
    monkeypatch.setattr(driver, "_driver", FakeDriver())
    key = "ssd_chunk_cumsum[chunk_size={},dt_dtype=bf16]"
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    assert (f"  {key.format(64)}: not used; calls use mamba2_aot_cubins_sm90 at {second} [not validated on hardware; "
            "experiments: bwd_products_ahead; not used unless MAMBA2_AOT_ALLOW_UNVALIDATED=1]\n") in out
    assert f"  {key.format(256)}: not used; calls use mamba2_aot_cubins_sm90 at {first}\n" in out
    assert out.count(f"  {key.format(64)}: runs here\n") == 1 and out.count(f"  {key.format(256)}: runs here\n") == 1
    assert main(["doctor"]) == 0
    out = capsys.readouterr().out
    assert (f"  {key.format(64)}: not loaded; calls use mamba2_aot_cubins_sm90 at {second} [not validated") in out
    assert f"  {key.format(64)}: loads (mamba2_aot_cubins_sm90 at {second})\n" in out
    assert f"  {key.format(256)}: loads (mamba2_aot_cubins_sm90 at {first})\n" in out


def test_the_opt_in_is_named_only_where_it_would_change_which_build_serves(tmp_path, monkeypatch, capsys):
    """An unvalidated build behind a validated one of an earlier source stays unused with the opt-in too (the first
    source wins): ``list`` names the source calls use and not the opt-in. A directory named twice is one source."""
    reset_runtime_state(monkeypatch)
    first, second = write_cubin_dir(tmp_path / "first"), write_cubin_dir(tmp_path / "second")
    mark_unvalidated(second, 64)
    dirs = [tmp_path / "first", tmp_path / "second", tmp_path / "first"]
    monkeypatch.setenv(manifest.ENV_CUBIN_DIR, os.pathsep.join(str(p) for p in dirs))
    assert [m.path.parent for m in manifest.catalog().manifests] == [first, second]
    assert main(["list"]) == 0
    assert (f"  ssd_chunk_cumsum[chunk_size=64,dt_dtype=bf16]: not used; calls use mamba2_aot_cubins_sm90 at {first} "
            "[not validated on hardware; experiments: bwd_products_ahead]\n") in capsys.readouterr().out
