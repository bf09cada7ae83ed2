"""CPU tests of manifest parsing, discovery, sha256 checks and the version lock."""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

import mamba2_aot
from mamba2_aot import (CubinNotInstalledError, ManifestError, Sha256MismatchError,
                        UnvalidatedVariantError, VariantNotFoundError, VersionLockError, manifest)
from runtime_fakes import mark_unvalidated, write_cubin_dir

REPO = Path(__file__).resolve().parents[1]


def _edit(pkg: Path, change):
    data = json.loads((pkg / "manifest.json").read_text())
    change(data)
    (pkg / "manifest.json").write_text(json.dumps(data))


def test_parse_good_manifest(tmp_path):
    pkg = write_cubin_dir(tmp_path)
    m = manifest.load_manifest(pkg / "manifest.json")
    assert (m.package, m.arch, m.compute_capability) == ("mamba2_aot_cubins_sm90", "sm_90a", (9, 0))
    assert len(m.variants) == 4
    v = m.variants[0]
    assert v.path.parent == pkg / "cubins" and v.block == (256, 1, 1) and v.cluster == (1, 1, 1)
    assert [p.name for p in v.params][:3] == ["dt", "A", "dt_bias"] and v.params[-1].offset == 172
    assert v.validated is True and v.experiments == ()
    assert manifest.read_cubin(v) == v.path.read_bytes()


def test_parse_unvalidated_variant_and_its_experiments(tmp_path):
    pkg = write_cubin_dir(tmp_path, chunk_sizes=(64,), dtypes=("bf16",))
    mark_unvalidated(pkg, 64, experiments=("b_exp", "a_exp"))
    v = manifest.load_manifest(pkg / "manifest.json").variants[0]
    assert v.validated is False and v.experiments == ("b_exp", "a_exp")


@pytest.mark.parametrize("stage", sorted((REPO / "build" / "stage").glob("*/manifest.json")) or [None])
def test_real_build_manifests_parse(stage):
    if stage is None:
        pytest.skip("no build/stage manifests (run scons first)")
    m = manifest.load_manifest(stage)
    for v in m.variants:
        assert manifest.read_cubin(v) == v.path.read_bytes()


def test_version_lock_names_both_versions_and_fix(tmp_path):
    pkg = write_cubin_dir(tmp_path, version="9.9.9")
    with pytest.raises(VersionLockError) as info:
        manifest.load_manifest(pkg / "manifest.json")
    text = str(info.value)
    assert "9.9.9" in text and mamba2_aot.__version__ in text
    assert f"pip install 'mamba2_aot_cubins_sm90=={mamba2_aot.__version__}'" in text


def test_unknown_schema(tmp_path):
    pkg = write_cubin_dir(tmp_path, schema=2)
    with pytest.raises(ManifestError, match="schema 2 is not supported"):
        manifest.load_manifest(pkg / "manifest.json")


@pytest.mark.parametrize("change,message", [
    (lambda d: d["variants"][0].pop("kernel"), "missing field 'kernel'"),
    (lambda d: d["variants"][0].update(block=[256, 1]), "'block' should be three positive ints"),
    (lambda d: d["variants"][0].update(file="../../etc/passwd"), "must stay inside the package"),
    (lambda d: d["variants"][0]["params"][1].update(offset=4), "overlaps or is misaligned"),
    (lambda d: d["variants"][0]["params"][0].update(kind="u8"), "has kind 'u8'"),
    (lambda d: d.update(compute_capability="9.0"), "'compute_capability' should be list"),
    (lambda d: d["variants"][0].update(experiments="bwd_products_ahead"), "'experiments' should be list"),
    (lambda d: d["variants"][0].update(experiments=[1]), "'experiments' should be a list of strings"),
    (lambda d: d["variants"][0].update(validated="false"), "'validated' should be bool"),
    (lambda d: d["variants"][0]["constants"].update(chunk_size=[64]), "'constants' values should be strings, ints or "
                                                                      "booleans, got {'chunk_size': \\[64\\]}"),
    (lambda d: d["variants"][0].update(experiments=["bwd_products_ahead"]), "built with the experiments .* but marked "
                                                                            "validated"),
])
def test_schema_errors(tmp_path, change, message):
    pkg = write_cubin_dir(tmp_path)
    _edit(pkg, change)
    with pytest.raises(ManifestError, match=message):
        manifest.load_manifest(pkg / "manifest.json")


def test_unreadable_manifest(tmp_path):
    (tmp_path / "manifest.json").write_text("{not json")
    with pytest.raises(ManifestError, match="cannot read manifest"):
        manifest.load_manifest(tmp_path / "manifest.json")


def test_sha256_mismatch_detected_and_skippable(tmp_path, monkeypatch):
    pkg = write_cubin_dir(tmp_path)
    v = manifest.load_manifest(pkg / "manifest.json").variants[0]
    v.path.write_bytes(b"X" * v.size)  # same size, different bytes
    monkeypatch.delenv(manifest.ENV_SKIP_SHA256, raising=False)
    with pytest.raises(Sha256MismatchError, match="pip install --force-reinstall 'mamba2_aot_cubins_sm90=="):
        manifest.read_cubin(v)
    assert manifest.read_cubin(v, verify=False) == b"X" * v.size
    monkeypatch.setenv(manifest.ENV_SKIP_SHA256, "1")
    assert manifest.read_cubin(v) == b"X" * v.size


@pytest.mark.parametrize("override, fix", [(False, "reinstall it: pip install --force-reinstall "
                                                   "'mamba2_aot_cubins_sm90=="),
                                           (True, "rebuild that directory \\(scons\\)")])
def test_missing_cubin_file(tmp_path, override, fix):
    pkg = write_cubin_dir(tmp_path)
    found = manifest.discover({manifest.ENV_CUBIN_DIR: str(pkg)}) if override else None
    v = (found.manifests[0] if override else manifest.load_manifest(pkg / "manifest.json")).variants[0]
    v.path.unlink()
    with pytest.raises(ManifestError, match=f"is missing from mamba2_aot_cubins_sm90 at .*; {fix}"):
        manifest.read_cubin(v)


def test_a_relative_override_names_the_directory_it_was_found_in(tmp_path, monkeypatch):
    write_cubin_dir(tmp_path / "stage")
    monkeypatch.chdir(tmp_path)
    found = manifest.discover({manifest.ENV_CUBIN_DIR: "stage"})
    monkeypatch.chdir("/")
    v = found.manifests[0].variants[0]   # (it was looked for under / when the cubin was read)
    assert found.manifests[0].built_here and v.path.is_relative_to(tmp_path)
    assert manifest.read_cubin(v) == v.path.read_bytes()


def test_discover_override_dir_forms(tmp_path):
    write_cubin_dir(tmp_path / "stage", cc=(9, 0))
    write_cubin_dir(tmp_path / "stage", cc=(10, 0))
    single = write_cubin_dir(tmp_path / "single", cc=(12, 0))
    env = {manifest.ENV_CUBIN_DIR: f"{tmp_path / 'stage'}{':'}{single}"}
    catalog = manifest.discover(env)
    assert sorted(m.compute_capability for m in catalog.manifests) == [(9, 0), (10, 0), (12, 0)]
    assert not catalog.problems


def test_discover_empty_override_is_a_problem(tmp_path):
    catalog = manifest.discover({manifest.ENV_CUBIN_DIR: str(tmp_path)})
    assert not catalog.manifests
    with pytest.raises(CubinNotInstalledError, match="holds no manifest.json"):
        catalog.for_capability((9, 0))


def test_discover_installed_package_and_override_precedence(tmp_path, monkeypatch):
    site = tmp_path / "site"
    pkg = write_cubin_dir(site, cc=(9, 0))
    (pkg / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(site))
    catalog = manifest.discover({})
    assert [m.path for m in catalog.manifests] == [pkg / "manifest.json"]
    assert "mamba2_aot_cubins_sm90" not in sys.modules  # found, not imported

    override = write_cubin_dir(tmp_path / "override", cc=(9, 0), chunk_sizes=(128,))
    catalog = manifest.discover({manifest.ENV_CUBIN_DIR: str(override)})
    assert catalog.find("ssd_chunk_cumsum", {"chunk_size": 128, "dt_dtype": "bf16"}, (9, 0)).path.is_relative_to(
        override)
    # the installed package still serves variants the override does not have
    assert catalog.find("ssd_chunk_cumsum", {"chunk_size": 64, "dt_dtype": "bf16"}, (9, 0)).path.is_relative_to(pkg)


def test_missing_arch_names_the_wheel(tmp_path):
    catalog = manifest.discover({manifest.ENV_CUBIN_DIR: str(write_cubin_dir(tmp_path, cc=(10, 0)))})
    with pytest.raises(CubinNotInstalledError) as info:
        catalog.for_capability((9, 0))
    text = str(info.value)
    assert "sm_90" in text and f"pip install 'mamba2_aot_cubins_sm90=={mamba2_aot.__version__}'" in text
    assert "mamba2_aot_cubins_sm100 (sm_100a)" in text
    assert "or build them with `scons arch=sm90` and point MAMBA2_AOT_CUBIN_DIR at the build's build/stage" in text


def test_sm80_cubins_serve_every_later_8x_device_and_arch_specific_ones_only_their_own(tmp_path):
    """A plain sm_80 build loads on 8.6 and 8.9 (CUDA's binary compatibility within a major), where the runtime
    looked for a package of the device's own capability, which no build makes; sm_90a's loads on 9.0 alone. With no
    loadable build, the hint names a build target that loads there, or says that none does."""
    write_cubin_dir(tmp_path, cc=(8, 0))
    write_cubin_dir(tmp_path, cc=(9, 0), chunk_sizes=(64,))
    catalog = manifest.discover({manifest.ENV_CUBIN_DIR: str(tmp_path)})
    for cc in ((8, 0), (8, 6), (8, 9)):
        assert [m.arch for m in catalog.for_capability(cc)] == ["sm_80"]
        assert catalog.find("ssd_chunk_cumsum", {"chunk_size": 256, "dt_dtype": "bf16"}, cc).manifest.arch == "sm_80"
    for cc in ((7, 5), (9, 1), (10, 0)):
        with pytest.raises(CubinNotInstalledError):
            catalog.for_capability(cc)
    assert manifest.install_hint((8, 9)).startswith(f"pip install 'mamba2_aot_cubins_sm80=={mamba2_aot.__version__}', "
                                                    "or build them with `scons arch=sm80`")
    assert manifest.install_hint((10, 3)).startswith("pip install 'mamba2_aot_cubins_sm103==")
    assert manifest.install_hint((12, 1)).startswith("none: no build target of mamba2_aot")


@pytest.mark.parametrize("arch,cc,loads", [
    ("sm_80", (8, 6), True), ("sm_80", (9, 0), False), ("sm_90a", (9, 0), True), ("sm_100a", (10, 3), False),
    ("sm_100f", (10, 3), True), ("sm_103f", (10, 0), False), ("sm_120f", (12, 1), True), ("sm_120a", (12, 1), False),
])
def test_which_targets_load_on_which_devices(arch, cc, loads):
    assert manifest.loads_on(arch, manifest.target_capability(arch), cc) is loads


def test_the_runtimes_build_targets_are_the_builds():
    from kernel_src import toolchain
    assert manifest.BUILD_TARGETS == toolchain.ARCH_TARGETS
    assert all(manifest.target_capability(arch) == tuple(toolchain.compute_capability(arch))
               for arch in toolchain.ARCH_TARGETS.values())


def test_require_built_across_archs(tmp_path):
    write_cubin_dir(tmp_path, cc=(9, 0), chunk_sizes=(64,))
    write_cubin_dir(tmp_path, cc=(10, 0), chunk_sizes=(256,))
    catalog = manifest.discover({manifest.ENV_CUBIN_DIR: str(tmp_path)})
    for q in (64, 256):  # built for some arch: the per-device lookup decides
        catalog.require_built("ssd_chunk_cumsum", manifest.constants_key({"chunk_size": q, "dt_dtype": "bf16"}))
    with pytest.raises(VariantNotFoundError, match=r"chunk_size=128, dt_dtype=bf16 in the installed cubins \(archs: "
                       r"sm_100a, sm_90a\)\. .*\[chunk_size=64, dt_dtype=bf16\] \(sm_90a\); .*"
                       r"\[chunk_size=256, dt_dtype=fp32\] \(sm_100a\)$"):
        catalog.require_built("ssd_chunk_cumsum", manifest.constants_key({"chunk_size": 128, "dt_dtype": "bf16"}))
    with pytest.raises(VariantNotFoundError, match="Built nope variants: none$"):
        catalog.require_built("nope", ())


def test_require_built_defers_to_the_device_lookup_when_unsure(tmp_path):
    empty = manifest.Catalog([], [])
    write_cubin_dir(tmp_path, cc=(9, 0), version="0.0.1")  # a broken sm_90 package: its error must surface
    write_cubin_dir(tmp_path, cc=(10, 0))
    broken = manifest.discover({manifest.ENV_CUBIN_DIR: str(tmp_path)})
    for catalog in (empty, broken):
        catalog.require_built("ssd_chunk_cumsum", manifest.constants_key({"chunk_size": 100, "dt_dtype": "bf16"}))


def test_version_locked_package_raised_only_for_its_arch(tmp_path):
    write_cubin_dir(tmp_path, cc=(9, 0), version="0.0.1")
    write_cubin_dir(tmp_path, cc=(10, 0))
    catalog = manifest.discover({manifest.ENV_CUBIN_DIR: str(tmp_path)})
    assert catalog.for_capability((10, 0))  # the good package is usable
    with pytest.raises(VersionLockError):
        catalog.for_capability((9, 0))


def test_find_lists_built_variants(tmp_path):
    catalog = manifest.discover({manifest.ENV_CUBIN_DIR: str(write_cubin_dir(tmp_path))})
    with pytest.raises(VariantNotFoundError) as info:
        catalog.find("ssd_chunk_cumsum", {"chunk_size": 128, "dt_dtype": "bf16"}, (9, 0))
    text = str(info.value)
    assert "chunk_size=128, dt_dtype=bf16 on sm_90" in text
    assert "[chunk_size=256, dt_dtype=fp32]" in text and "[chunk_size=64, dt_dtype=bf16]" in text


def test_naming_helpers():
    assert manifest.package_name((10, 0)) == "mamba2_aot_cubins_sm100"
    assert manifest.arch_name((9, 0)) == "sm_90"
    assert manifest.constants_key({"b": 1, "a": "x"}) == (("a", "x"), ("b", 1))


# -- unvalidated variants (a build experiment's): used only with MAMBA2_AOT_ALLOW_UNVALIDATED ---------------------
Q256_BF16 = {"chunk_size": 256, "dt_dtype": "bf16"}


def _catalog(cubin_dir, allow=None) -> manifest.Catalog:
    environ = {manifest.ENV_CUBIN_DIR: str(cubin_dir)}
    if allow is not None:
        environ[manifest.ENV_ALLOW_UNVALIDATED] = allow
    return manifest.discover(environ)


def test_unvalidated_variant_is_refused_by_default(tmp_path):
    mark_unvalidated(write_cubin_dir(tmp_path), 256)
    catalog = _catalog(tmp_path)
    assert not catalog.allow_unvalidated
    for lookup, where in ((lambda: catalog.find("ssd_chunk_cumsum", Q256_BF16, (9, 0)), "on sm_90"),
                          (lambda: catalog.require_built("ssd_chunk_cumsum", manifest.constants_key(Q256_BF16)),
                           "in the installed cubins")):
        with pytest.raises(UnvalidatedVariantError) as info:
            lookup()
        assert isinstance(info.value, VariantNotFoundError)
        assert str(info.value) == (
            f"ssd_chunk_cumsum: the only built variant for chunk_size=256, dt_dtype=bf16 {where} is "
            "ssd_chunk_cumsum[chunk_size=256,dt_dtype=bf16] in mamba2_aot_cubins_sm90 (sm_90a), an unvalidated build "
            "(built with the experiment(s) bwd_products_ahead); unvalidated builds are not used by default: set "
            "MAMBA2_AOT_ALLOW_UNVALIDATED=1 to use it")
    assert {dict(key)["chunk_size"] for _, key in catalog.index((9, 0))} == {64}
    assert catalog.find("ssd_chunk_cumsum", {"chunk_size": 64, "dt_dtype": "bf16"}, (9, 0)).validated


def test_unvalidated_variant_without_experiments_says_so(tmp_path):
    mark_unvalidated(write_cubin_dir(tmp_path), 256, experiments=())
    with pytest.raises(UnvalidatedVariantError, match=r"an unvalidated build \(not validated on hardware\); "):
        _catalog(tmp_path).find("ssd_chunk_cumsum", Q256_BF16, (9, 0))


def test_listings_keep_unvalidated_variants_apart(tmp_path):
    mark_unvalidated(write_cubin_dir(tmp_path), 256)
    catalog = _catalog(tmp_path)
    with pytest.raises(VariantNotFoundError) as info:
        catalog.find("ssd_chunk_cumsum", {"chunk_size": 128, "dt_dtype": "bf16"}, (9, 0))
    assert not isinstance(info.value, UnvalidatedVariantError)
    assert str(info.value).endswith(
        "Built ssd_chunk_cumsum variants for sm_90: [chunk_size=64, dt_dtype=bf16]; [chunk_size=64, dt_dtype=fp32]. "
        "Unvalidated builds, not used unless MAMBA2_AOT_ALLOW_UNVALIDATED=1: [chunk_size=256, dt_dtype=bf16]; "
        "[chunk_size=256, dt_dtype=fp32]")
    with pytest.raises(VariantNotFoundError) as info:
        catalog.require_built("ssd_chunk_cumsum", manifest.constants_key({"chunk_size": 128, "dt_dtype": "bf16"}))
    assert str(info.value).endswith(
        "Built ssd_chunk_cumsum variants: [chunk_size=64, dt_dtype=bf16] (sm_90a); [chunk_size=64, dt_dtype=fp32] "
        "(sm_90a). Unvalidated builds, not used unless MAMBA2_AOT_ALLOW_UNVALIDATED=1: [chunk_size=256, dt_dtype=bf16] "
        "(sm_90a); [chunk_size=256, dt_dtype=fp32] (sm_90a)")


@pytest.mark.parametrize("allow,allowed", [("1", True), ("true", True), ("yes", True), ("TRUE", True), (" 1 ", True),
                                           ("0", False), ("", False), ("on", False)])
def test_unvalidated_variant_is_used_when_allowed(tmp_path, allow, allowed):
    mark_unvalidated(write_cubin_dir(tmp_path), 256)
    catalog = _catalog(tmp_path, allow)
    assert catalog.allow_unvalidated is allowed
    if not allowed:
        with pytest.raises(UnvalidatedVariantError):
            catalog.find("ssd_chunk_cumsum", Q256_BF16, (9, 0))
        return
    catalog.require_built("ssd_chunk_cumsum", manifest.constants_key(Q256_BF16))
    v = catalog.find("ssd_chunk_cumsum", Q256_BF16, (9, 0))
    assert v.validated is False and v.experiments == ("bwd_products_ahead",)


@pytest.mark.parametrize("allow", [None, "1"])
def test_first_source_wins_among_the_variants_that_may_run(tmp_path, allow):
    """An unvalidated build in the first source (e.g. an experiment's build/stage in MAMBA2_AOT_CUBIN_DIR) shadows a
    validated one in a later source only when unvalidated variants are allowed; otherwise the validated one serves."""
    mark_unvalidated(write_cubin_dir(tmp_path / "experiment"), 256)
    write_cubin_dir(tmp_path / "shipped")
    catalog = _catalog(f"{tmp_path / 'experiment'}:{tmp_path / 'shipped'}", allow)
    v = catalog.find("ssd_chunk_cumsum", Q256_BF16, (9, 0))
    assert v.path.is_relative_to(tmp_path / ("experiment" if allow else "shipped"))
    assert v.validated is (not allow)
    catalog.require_built("ssd_chunk_cumsum", manifest.constants_key(Q256_BF16))


def test_validated_on_another_arch_defers_to_the_device_lookup(tmp_path):
    mark_unvalidated(write_cubin_dir(tmp_path, cc=(9, 0)), 256)
    write_cubin_dir(tmp_path, cc=(10, 0))
    catalog = _catalog(tmp_path)
    catalog.require_built("ssd_chunk_cumsum", manifest.constants_key(Q256_BF16))  # may run on an sm_100 device
    assert catalog.find("ssd_chunk_cumsum", Q256_BF16, (10, 0)).validated
    with pytest.raises(UnvalidatedVariantError, match="on sm_90 is ssd_chunk_cumsum"):
        catalog.find("ssd_chunk_cumsum", Q256_BF16, (9, 0))


def test_serving_names_the_build_calls_use(tmp_path, monkeypatch):
    """Catalog.serving: the variant itself, an earlier source's copy, a later validated copy where the variant is held
    back, or None where no build of its constants may run; served_if_allowed: whether the opt-in would make it serve."""
    first, second = write_cubin_dir(tmp_path / "first"), write_cubin_dir(tmp_path / "second")
    mark_unvalidated(first, 64)
    mark_unvalidated(second, 256)
    monkeypatch.setenv(manifest.ENV_CUBIN_DIR, os.pathsep.join(str(p) for p in (first, second)))

    def variants():
        cat = manifest.discover()
        return cat, [{v.constants["chunk_size"]: v for v in m.variants if v.constants["dt_dtype"] == "bf16"}
                     for m in cat.manifests]

    monkeypatch.setenv(manifest.ENV_ALLOW_UNVALIDATED, "0")
    cat, (a, b) = variants()
    assert cat.serving(a[256]) is a[256]     # the first source's, validated
    assert cat.serving(b[256]) is a[256]     # an earlier source's copy
    assert cat.serving(a[64]) is b[64]       # held back: the later source's validated copy
    assert cat.served_if_allowed(a[64]) and not cat.served_if_allowed(b[256])
    monkeypatch.setenv(manifest.ENV_ALLOW_UNVALIDATED, "1")
    cat, (a, b) = variants()
    assert cat.serving(a[64]) is a[64] and cat.serving(b[256]) is a[256]
    mark_unvalidated(second, 64)
    monkeypatch.setenv(manifest.ENV_ALLOW_UNVALIDATED, "0")
    cat, (a, b) = variants()
    assert cat.serving(a[64]) is None and cat.serving(b[64]) is None
