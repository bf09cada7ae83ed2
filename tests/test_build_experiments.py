"""CPU tests of build experiments (``scons experiment=NAME``, ``compile_variant --experiment NAME``): which kernels
get them and the manifest entries they produce. Nothing is compiled: fake kernel classes stand in for the families,
and the DSL's compile and the cubin checks are stubbed out."""
import json
import sys

import pytest

from conftest import ROOT

# (a GPU machine set up for the runtime alone has no build tools: these tests skip there, as test_build's do)
pytest.importorskip("elftools", reason="the build tests need pyelftools (requirements/build.txt)")

sys.path.insert(0, str(ROOT))
from kernel_src import compile_variant, cubin_checks, families, toolchain  # noqa: E402

# The fields of a manifest entry before experiments existed: a default build's entries must keep exactly these.
DEFAULT_FIELDS = {"family", "key", "constants", "file", "sha256", "size", "kernel", "block", "cluster", "dynamic_smem",
                  "static_smem", "registers", "grid", "params", "ptx_isa", "validated"}


class Plain:
    """A kernel class that declares no experiments."""

    block, cluster, dynamic_smem, grid_rule = (128, 1, 1), (1, 1, 1), 0, "chunks"

    def __init__(self, size):
        self.size = size

    def params(self):
        return []


class Experimental(Plain):
    experiments = ("ahead", "wide")


class Untested(Plain):
    validated = False  # a kernel class may mark itself unvalidated without any experiment


class Spilling(Experimental):
    min_ctas_per_sm, min_ctas_floor = 2, 1


class Narrow(Experimental):
    """Takes its experiments only where they change its code: at size 64."""

    def experiment_applies(self, name):
        return self.size == 64


@pytest.fixture
def fake_build(monkeypatch):
    """The fake families above, compiled by stand-ins; returns the kernels ``_compile`` was given."""
    classes = {"plain": Plain, "experimental": Experimental, "untested": Untested, "spilling": Spilling,
               "narrow": Narrow}
    monkeypatch.setattr(families, "FAMILIES", {name: f"fake:{cls.__name__}" for name, cls in classes.items()})
    monkeypatch.setattr(families, "kernel_class", classes.__getitem__)
    compiled = []

    def fake_compile(kernel, params, arch, ptxas_info=False, dump_dir=None):
        compiled.append(kernel)
        return b"cubin of " + repr(sorted(kernel.enabled_experiments)).encode(), "kernel_fake", "8.8"

    def fake_resources(cubin, symbol, cuobjdump):  # Spilling spills at its first occupancy target only
        spills = isinstance(compiled[-1], Spilling) and compiled[-1].min_ctas_per_sm == 2
        return cubin_checks.Resources(registers=24, stack=16 if spills else 0, local=0, static_smem=0)

    monkeypatch.setattr(compile_variant, "_compile", fake_compile)
    monkeypatch.setattr(cubin_checks, "resources", fake_resources)
    for check in ("check_arch", "check_symbols", "check_params", "check_resources"):
        monkeypatch.setattr(cubin_checks, check, lambda *args: None)
    monkeypatch.setattr(toolchain, "cuobjdump", lambda: "cuobjdump")
    return compiled


def _entry(family, experiments=(), size=64):
    return compile_variant.compile_variant(family, {"size": size}, "sm_100a", experiments)[1]


def test_an_experiment_applies_only_to_the_classes_that_declare_it(fake_build):
    entry = _entry("experimental", ["wide", "elsewhere"])
    assert fake_build[-1].enabled_experiments == frozenset({"wide"})
    assert entry["validated"] is False and entry["experiments"] == ["wide"]
    assert _entry("experimental", ["wide", "ahead"])["experiments"] == ["ahead", "wide"]  # sorted

    entry = _entry("plain", ["wide", "ahead"])
    assert fake_build[-1].enabled_experiments == frozenset()
    assert set(entry) == DEFAULT_FIELDS and entry["validated"] is True


def test_without_experiments_the_entry_is_the_default_one(fake_build):
    entry = _entry("experimental")
    assert fake_build[-1].enabled_experiments == frozenset()  # a frozenset, set on every kernel the build makes
    assert set(entry) == DEFAULT_FIELDS and entry["validated"] is True
    untested = _entry("untested", ["ahead"])
    assert set(untested) == DEFAULT_FIELDS and untested["validated"] is False


def test_the_rebuild_after_a_spill_keeps_the_experiments(fake_build):
    entry = _entry("spilling", ["ahead"])
    assert [(k.min_ctas_per_sm, k.enabled_experiments) for k in fake_build] == [(2, {"ahead"}), (1, {"ahead"})]
    assert entry["experiments"] == ["ahead"] and entry["validated"] is False


def test_the_command_line_takes_repeated_experiments(fake_build, tmp_path, capsys):
    meta = tmp_path / "x.json"
    argv = ["--family", "experimental", "--constants", '{"size": 64}', "--arch", "sm_100a", "--cubin",
            str(tmp_path / "x.cubin"), "--meta", str(meta)]
    assert compile_variant.main(argv + ["--experiment", "wide", "--experiment", "ahead"]) == 0
    assert json.loads(meta.read_text())["experiments"] == ["ahead", "wide"]
    assert "unvalidated: experiments ahead, wide" in capsys.readouterr().out
    assert compile_variant.main(argv) == 0
    assert "experiments" not in json.loads(meta.read_text())
    assert "unvalidated" not in capsys.readouterr().out


def test_known_and_applied_experiments(fake_build):
    assert families.known_experiments() == ["ahead", "wide"]
    assert families.applied_experiments("spilling", ["wide", "nope"]) == frozenset({"wide"})
    assert families.applied_experiments("plain", ["wide"]) == frozenset()


def test_a_variant_the_experiment_leaves_as_it_is_stays_validated(fake_build):
    entry = _entry("narrow", ["wide"])
    assert fake_build[-1].enabled_experiments == frozenset({"wide"}) and entry["experiments"] == ["wide"]
    entry = _entry("narrow", ["wide"], size=128)
    assert fake_build[-1].enabled_experiments == frozenset()
    assert set(entry) == DEFAULT_FIELDS and entry["validated"] is True
