"""Find, parse and check the cubin manifests (schema: docs/ARCHITECTURE.md, "Manifest").

Where cubins come from, in order of precedence:

1. ``MAMBA2_AOT_CUBIN_DIR`` (one or more directories, ``os.pathsep``-separated): ``DIR/manifest.json``
   and ``DIR/*/manifest.json`` (so both a build's ``stage/`` directory and one package dir work).
2. Installed cubin wheels: top-level packages named ``mamba2_aot_cubins_sm<NN>`` on ``sys.path``, each
   holding ``manifest.json`` and ``cubins/``. Found with ``pkgutil``/``importlib.util.find_spec``
   (nothing is imported, nothing scans every installed distribution).

A variant provided by several sources is taken from the first; a manifest reached twice (a directory named
twice, or an override that is an installed package's) counts once. Problems (unreadable manifest, version
lock, unknown schema) are recorded, not raised, at discovery, and raised when the affected architecture
is actually needed, so a broken sm_100 package never stops an sm_90 machine.

Variants their manifest marks unvalidated (``"validated": false``: built with a build experiment, or code
that could not be validated on hardware) are not used unless ``MAMBA2_AOT_ALLOW_UNVALIDATED=1`` (read at
discovery, like ``MAMBA2_AOT_CUBIN_DIR``). Lookups pass over them, so "the first source wins" among the
variants that may be used (a validated build of the same constants in a later source serves the call); a call
that only unvalidated builds could serve raises :class:`UnvalidatedVariantError`, saying how to opt in.

Each cubin's size and sha256 are checked against the manifest right before it is loaded (once per
process); ``MAMBA2_AOT_SKIP_SHA256=1`` or ``verify=False`` skips that, explicitly.
"""
from __future__ import annotations

import glob
import hashlib
import importlib.util
import json
import os
import pkgutil
import threading
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from types import MappingProxyType

from . import __version__
from .errors import (CubinNotInstalledError, CubinPackageError, ManifestError, Sha256MismatchError,
                     UnvalidatedVariantError, VariantNotFoundError, VersionLockError)

SCHEMA_VERSION = 1
PACKAGE_PREFIX = "mamba2_aot_cubins_"
ENV_CUBIN_DIR = "MAMBA2_AOT_CUBIN_DIR"
ENV_SKIP_SHA256 = "MAMBA2_AOT_SKIP_SHA256"
ENV_ALLOW_UNVALIDATED = "MAMBA2_AOT_ALLOW_UNVALIDATED"
KIND_SIZES = {"ptr": 8, "i32": 4, "i64": 8, "f32": 4}


def arch_name(cc: tuple[int, int]) -> str:
    """``(9, 0)`` -> ``"sm_90"``."""
    return f"sm_{cc[0]}{cc[1]}"


def package_name(cc: tuple[int, int]) -> str:
    """The cubin wheel for a compute capability: ``(9, 0)`` -> ``"mamba2_aot_cubins_sm90"``."""
    return f"{PACKAGE_PREFIX}sm{cc[0]}{cc[1]}"


# The build's arch= names and the targets they compile for (kernel_src/toolchain.py's ARCH_TARGETS, which the
# runtime does not ship; tests/test_runtime_manifest.py checks that the two agree).
BUILD_TARGETS = {"sm80": "sm_80", "sm90": "sm_90a", "sm100": "sm_100a", "sm103": "sm_103a", "sm120": "sm_120a"}


def target_capability(arch: str) -> tuple[int, int]:
    """``"sm_90a"`` -> ``(9, 0)``."""
    digits = arch.removeprefix("sm_").rstrip("af")
    return int(digits[:-1]), int(digits[-1])


def loads_on(arch: str, built: tuple[int, int], cc: tuple[int, int]) -> bool:
    """Whether cubins compiled for the target ``arch`` (of compute capability ``built``) load on a device of compute
    capability ``cc``: an arch-specific target (``sm_90a``) on its own capability only; a plain one (``sm_80``) or a
    family one (``sm_100f``) on its major's later minors too (CUDA's binary compatibility: sm_80 cubins run on 8.6 and
    8.9, sm_100f's on 10.3)."""
    if arch.endswith("a"):
        return cc == built
    return cc[0] == built[0] and cc[1] >= built[1]


def package_for(cc: tuple[int, int]) -> str | None:
    """The build's arch= name whose cubins load on ``cc`` (its own capability's first), or None when none does."""
    fits = [short for short, arch in BUILD_TARGETS.items() if loads_on(arch, target_capability(arch), cc)]
    return min(fits, key=lambda short: target_capability(BUILD_TARGETS[short]) != cc, default=None)


def install_hint(cc: tuple[int, int]) -> str:
    """How to get cubins for ``cc``: the wheel to install, or a build to point ``MAMBA2_AOT_CUBIN_DIR`` at; or that
    no build target of this version runs there."""
    short = package_for(cc)
    if short is None:
        return (f"none: no build target of mamba2_aot {__version__} runs on compute capability {cc[0]}.{cc[1]} "
                f"(targets: {', '.join(BUILD_TARGETS.values())})")
    return (f"pip install '{PACKAGE_PREFIX}{short}=={__version__}', or build them with `scons arch={short}` and point "
            f"{ENV_CUBIN_DIR} at the build's build/stage directory")


def constants_key(constants) -> tuple:
    """The hashable lookup key of a variant's constants: ``(("chunk_size", 256), ("dt_dtype", "bf16"))``."""
    return tuple(sorted(constants.items()))


def format_constants(constants) -> str:
    return ", ".join(f"{k}={v}" for k, v in sorted(constants.items()))


def env_flag(name: str, environ=os.environ) -> bool:
    """Whether the environment variable ``name`` is set to ``1``, ``true`` or ``yes`` (any case, spaces around
    ignored)."""
    return environ.get(name, "").strip().lower() in ("1", "true", "yes")


@dataclass(frozen=True)
class Param:
    """One kernel parameter as the manifest lays it out: ``kind`` in ptr/i32/i64/f32, byte ``offset``."""

    name: str
    kind: str
    size: int
    offset: int


@dataclass(frozen=True, eq=False)
class Variant:
    """One compiled kernel: what to load (``path``, ``kernel`` symbol) and how to launch it."""

    family: str
    key: str
    constants: MappingProxyType
    path: Path
    sha256: str
    size: int
    kernel: str
    block: tuple[int, int, int]
    cluster: tuple[int, int, int]
    dynamic_smem: int
    static_smem: int
    grid: str
    params: tuple[Param, ...]
    validated: bool
    experiments: tuple[str, ...]  # the build experiments it was compiled with (then not validated); usually none
    manifest: "Manifest" = field(repr=False)


@dataclass(frozen=True, eq=False)
class Manifest:
    """One parsed ``manifest.json``: the cubins of one package for one architecture."""

    path: Path
    package: str
    version: str
    arch: str
    compute_capability: tuple[int, int]
    toolchain: MappingProxyType
    variants: tuple[Variant, ...] = ()
    built_here: bool = False  # found through MAMBA2_AOT_CUBIN_DIR (a build's stage), not an installed package

    def loads_on(self, cc: tuple[int, int]) -> bool:
        """Whether these cubins load on a device of compute capability ``cc`` (:func:`loads_on`)."""
        return loads_on(self.arch, self.compute_capability, cc)


def _get(obj: dict, key: str, kind, where: str):
    try:
        value = obj[key]
    except (KeyError, TypeError):
        raise ManifestError(f"{where}: missing field {key!r}") from None
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise ManifestError(f"{where}: field {key!r} should be {getattr(kind, '__name__', kind)}, got {value!r}")
    return value


def _triple(obj: dict, key: str, where: str) -> tuple[int, int, int]:
    value = _get(obj, key, list, where)
    if len(value) != 3 or not all(isinstance(v, int) and v >= 1 for v in value):
        raise ManifestError(f"{where}: {key!r} should be three positive ints, got {value!r}")
    return tuple(value)


def _names(obj: dict, key: str, where: str) -> tuple[str, ...]:
    """An optional list-of-strings field; absent: ``()``."""
    if key not in obj:
        return ()
    value = _get(obj, key, list, where)
    if not all(isinstance(v, str) for v in value):
        raise ManifestError(f"{where}: {key!r} should be a list of strings, got {value!r}")
    return tuple(value)


def _constants(row: dict, where: str) -> MappingProxyType:
    """The ``constants`` object: names to strings, ints or booleans (the values a variant's lookup key hashes)."""
    value = _get(row, "constants", dict, where)
    bad = {k: v for k, v in value.items() if not isinstance(v, (str, int))}  # (bool is an int)
    if bad:
        raise ManifestError(f"{where}: 'constants' values should be strings, ints or booleans, got {bad!r}")
    return MappingProxyType(dict(value))


def _validation(row: dict, where: str) -> dict:
    """The optional ``experiments`` (absent: none) and ``validated`` (a JSON boolean; absent: True) fields. An entry
    built with experiments must say false: anything else would let an experiment's cubin run without the opt-in."""
    experiments = _names(row, "experiments", where)
    validated = _get(row, "validated", bool, where) if "validated" in row else True
    if validated and experiments:
        raise ManifestError(f"{where}: built with the experiments {list(experiments)} but marked validated")
    return {"validated": validated, "experiments": experiments}


def _parse_params(rows: list, where: str) -> tuple[Param, ...]:
    params, end = [], 0
    for row in rows:
        p = Param(_get(row, "name", str, where), _get(row, "kind", str, where), _get(row, "size", int, where),
                  _get(row, "offset", int, where))
        if KIND_SIZES.get(p.kind) != p.size:
            raise ManifestError(f"{where}: param {p.name!r} has kind {p.kind!r} and size {p.size}; expected one of "
                                f"{KIND_SIZES}")
        if p.offset < end or p.offset % p.size:
            raise ManifestError(f"{where}: param {p.name!r} at offset {p.offset} overlaps or is misaligned")
        end = p.offset + p.size
        params.append(p)
    if len({p.name for p in params}) != len(params):
        raise ManifestError(f"{where}: duplicate param names")
    return tuple(params)


def parse_manifest(data: dict, path: Path, *, expected_version: str = __version__, built_here: bool = False
                   ) -> Manifest:
    """Check and convert one manifest's JSON (``built_here``: see :class:`Manifest`). Raises :class:`ManifestError`
    or :class:`VersionLockError`."""
    where = str(path)
    if not isinstance(data, dict):
        raise ManifestError(f"{where}: not a JSON object")
    schema = data.get("schema")
    if schema != SCHEMA_VERSION:
        raise ManifestError(f"{where}: manifest schema {schema!r} is not supported by mamba2_aot {__version__} "
                            f"(expects schema {SCHEMA_VERSION}); install matching versions of mamba2_aot and its "
                            "cubin packages")
    package = _get(data, "package", str, where)
    version = _get(data, "version", str, where)
    if version != expected_version:
        raise VersionLockError(
            f"{package} {version} (at {path.parent}) does not match mamba2_aot {expected_version}: the runtime and "
            f"its cubin packages are version-locked; fix with: pip install 'mamba2_aot=={version}' or "
            f"pip install '{package}=={expected_version}'"
        )
    cc = _get(data, "compute_capability", list, where)
    if len(cc) != 2 or not all(isinstance(v, int) for v in cc):
        raise ManifestError(f"{where}: 'compute_capability' should be [major, minor], got {cc!r}")
    manifest = Manifest(path, package, version, _get(data, "arch", str, where), tuple(cc),
                        MappingProxyType(dict(_get(data, "toolchain", dict, where))), built_here=built_here)
    root = path.parent
    variants = []
    for i, row in enumerate(_get(data, "variants", list, where)):
        vwhere = f"{where}: variants[{i}]"
        rel = PurePosixPath(_get(row, "file", str, vwhere))
        if rel.is_absolute() or ".." in rel.parts:
            raise ManifestError(f"{vwhere}: cubin path {str(rel)!r} must stay inside the package")
        variants.append(Variant(
            family=_get(row, "family", str, vwhere),
            key=_get(row, "key", str, vwhere),
            constants=_constants(row, vwhere),
            path=root.joinpath(*rel.parts),
            sha256=_get(row, "sha256", str, vwhere),
            size=_get(row, "size", int, vwhere),
            kernel=_get(row, "kernel", str, vwhere),
            block=_triple(row, "block", vwhere),
            cluster=_triple(row, "cluster", vwhere),
            dynamic_smem=_get(row, "dynamic_smem", int, vwhere),
            static_smem=row.get("static_smem", 0),
            grid=_get(row, "grid", str, vwhere),
            params=_parse_params(_get(row, "params", list, vwhere), vwhere),
            **_validation(row, vwhere),
            manifest=manifest,
        ))
    object.__setattr__(manifest, "variants", tuple(variants))
    return manifest


def load_manifest(path: Path, *, expected_version: str = __version__, built_here: bool = False) -> Manifest:
    """Read and parse ``path``. Raises :class:`ManifestError` (unreadable/invalid) or :class:`VersionLockError`."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise ManifestError(f"{path}: cannot read manifest ({exc})") from None
    return parse_manifest(data, Path(path), expected_version=expected_version, built_here=built_here)


def read_cubin(variant: Variant, *, verify: bool | None = None) -> bytes:
    """The cubin's bytes, after checking size and sha256 against the manifest.

    ``verify=None`` checks unless ``MAMBA2_AOT_SKIP_SHA256=1``. Raises :class:`Sha256MismatchError` or
    :class:`ManifestError` (file missing).
    """
    try:
        image = variant.path.read_bytes()
    except OSError as exc:
        m = variant.manifest
        fix = (f"rebuild that directory (scons), or point {ENV_CUBIN_DIR} elsewhere" if m.built_here
               else f"reinstall it: pip install --force-reinstall '{m.package}=={m.version}'")
        raise ManifestError(f"cubin of {variant.key} is missing from {m.package} at {m.path.parent} ({exc}); "
                            f"{fix}") from None
    if verify is None:
        verify = not env_flag(ENV_SKIP_SHA256)
    if verify:
        digest = hashlib.sha256(image).hexdigest()
        if len(image) != variant.size or digest != variant.sha256:
            raise Sha256MismatchError(
                f"{variant.path}: size {len(image)} sha256 {digest} does not match the manifest (size {variant.size} "
                f"sha256 {variant.sha256}); the install is corrupt or altered: pip install --force-reinstall "
                f"'{variant.manifest.package}=={variant.manifest.version}' (or set {ENV_SKIP_SHA256}=1 to skip)"
            )
    return image


@dataclass(frozen=True)
class Problem:
    """A source that could not be used: ``where`` (package or directory) and the error to raise for it."""

    where: str
    error: CubinPackageError
    package: str | None = None  # the package it concerns, when known (matches package_name(cc))


class Catalog:
    """Every usable manifest found (in precedence order) plus the problems met while looking.

    Lookups (:meth:`index`, :meth:`find`, :meth:`require_built`) use only the variants that may run: validated
    ones, and with ``allow_unvalidated`` (``MAMBA2_AOT_ALLOW_UNVALIDATED=1`` at :func:`discover`) the others too."""

    def __init__(self, manifests: list[Manifest], problems: list[Problem], *, allow_unvalidated: bool = False):
        self.manifests = tuple(manifests)
        self.problems = tuple(problems)
        self.allow_unvalidated = allow_unvalidated
        self._index: dict[tuple[int, int], dict] = {}
        self._built: frozenset | None = None  # every (family, constants_key) of every arch that may run

    def usable(self, variant: Variant) -> bool:
        """Whether calls may use ``variant``: it is validated, or unvalidated variants are allowed."""
        return variant.validated or self.allow_unvalidated

    def for_capability(self, cc: tuple[int, int]) -> list[Manifest]:
        """The manifests whose cubins load on ``cc``; raises the recorded problem or
        :class:`CubinNotInstalledError` (naming the wheel to install) when there are none."""
        found = [m for m in self.manifests if m.loads_on(cc)]
        if found:  # (a build for cc itself before one that also loads there: sm_86 cubins before sm_80 ones on 8.6)
            return sorted(found, key=lambda m: m.compute_capability != cc)
        short = package_for(cc)
        wanted = {package_name(cc)} | ({PACKAGE_PREFIX + short} if short else set())
        for problem in self.problems:
            if problem.package is None or problem.package in wanted:
                raise problem.error.with_traceback(None)   # (one stored error: its traceback would grow)
        installed = ", ".join(f"{m.package} ({m.arch})" for m in self.manifests) or "none"
        raise CubinNotInstalledError(
            f"no mamba2_aot cubins for {arch_name(cc)} (compute capability {cc[0]}.{cc[1]}) are installed "
            f"(found: {installed}); fix with: {install_hint(cc)}"
        )

    def index(self, cc: tuple[int, int]) -> dict:
        """``{(family, constants_key): Variant}`` for ``cc``: the variants that may run (:meth:`usable`), the first
        source's where several have the same constants; built once per cc."""
        table = self._index.get(cc)
        if table is None:
            table = {}
            for manifest in self.for_capability(cc):
                for v in manifest.variants:
                    if self.usable(v):
                        table.setdefault((v.family, constants_key(v.constants)), v)
            self._index[cc] = table
        return table

    def find(self, family: str, constants: dict, cc: tuple[int, int]) -> Variant:
        """The variant of ``family`` with exactly ``constants`` for ``cc``; raises :class:`UnvalidatedVariantError`
        when only unvalidated builds (not allowed) have them, else :class:`VariantNotFoundError` listing what was
        built for that family and arch."""
        table = self.index(cc)
        key = constants_key(constants)
        variant = table.get((family, key))
        if variant is not None:
            return variant
        held_back = self.held_back(self.for_capability(cc), family)
        _refuse_unvalidated(family, key, held_back, f"on {arch_name(cc)}")
        listing = _listing(v for (fam, _), v in table.items() if fam == family)
        raise VariantNotFoundError(
            f"{family}: no built variant for {format_constants(constants)} on {arch_name(cc)}. "
            f"Built {family} variants for {arch_name(cc)}: {listing}{_unvalidated_note(held_back)}"
        )

    def require_built(self, family: str, key: tuple) -> None:
        """Raise :class:`VariantNotFoundError`, listing every built variant of ``family`` and its archs, when
        no manifest of any arch has a variant that may run (:meth:`usable`) with constants ``key`` (a
        :func:`constants_key`): such a call cannot run on any device; :class:`UnvalidatedVariantError` when only
        unvalidated builds have them. Needs no driver. Does nothing when no manifest was found or a
        source is broken: then the per-device lookup (:meth:`find`) reports the actual problem."""
        if not self.manifests or self.problems:
            return
        if self._built is None:
            self._built = frozenset((v.family, constants_key(v.constants)) for m in self.manifests for v in m.variants
                                    if self.usable(v))
        if (family, key) in self._built:
            return
        held_back = self.held_back(self.manifests, family)
        _refuse_unvalidated(family, key, held_back, "in the installed cubins")
        archs = ", ".join(sorted({m.arch for m in self.manifests}))
        listing = _listing((v for m in self.manifests for v in m.variants if v.family == family and self.usable(v)),
                           with_arch=True)
        raise VariantNotFoundError(
            f"{family}: no built variant for {format_constants(dict(key))} in the installed cubins (archs: "
            f"{archs}). Built {family} variants: {listing}{_unvalidated_note(held_back, with_arch=True)}"
        )

    def serving(self, variant: Variant) -> Variant | None:
        """The variant that calls with ``variant``'s family and constants use on its arch: itself, or another
        source's build of them (an earlier source's, or a later validated one where ``variant`` is held back);
        ``None`` when no source's build of them may run."""
        return self.index(variant.manifest.compute_capability).get((variant.family, constants_key(variant.constants)))

    def served_if_allowed(self, variant: Variant) -> bool:
        """Whether ``variant`` would serve its calls with unvalidated variants allowed: it is the first source's build
        of its constants (what :meth:`index` keeps when every variant may run)."""
        key = (variant.family, constants_key(variant.constants))
        return next(v for m in self.for_capability(variant.manifest.compute_capability) for v in m.variants
                    if (v.family, constants_key(v.constants)) == key) is variant

    def held_back(self, manifests, family: str | None = None) -> list[Variant]:
        """The variants (of ``family``, when given) in ``manifests`` that may not run: unvalidated, not allowed."""
        return [v for m in manifests for v in m.variants
                if not self.usable(v) and (family is None or v.family == family)]


def _refuse_unvalidated(family: str, key: tuple, held_back: list[Variant], where: str) -> None:
    """Raise :class:`UnvalidatedVariantError` when a variant of ``held_back`` has the constants ``key``."""
    matches = [v for v in held_back if constants_key(v.constants) == key]
    if not matches:
        return
    experiments = sorted({name for v in matches for name in v.experiments})
    built = f"built with the experiment(s) {', '.join(experiments)}" if experiments else "not validated on hardware"
    sources = ", ".join(sorted({f"{v.manifest.package} ({v.manifest.arch})" for v in matches}))
    raise UnvalidatedVariantError(
        f"{family}: the only built variant for {format_constants(dict(key))} {where} is {matches[0].key} in "
        f"{sources}, an unvalidated build ({built}); unvalidated builds are not used by default: set "
        f"{ENV_ALLOW_UNVALIDATED}=1 to use it"
    )


def _unvalidated_note(held_back: list[Variant], *, with_arch: bool = False) -> str:
    """What a listing of usable variants leaves out: `` Unvalidated builds, not used unless ...: [...]``, or ``""``."""
    if not held_back:
        return ""
    return f". Unvalidated builds, not used unless {ENV_ALLOW_UNVALIDATED}=1: {_listing(held_back, with_arch=with_arch)}"


def _listing(variants, *, with_arch: bool = False) -> str:
    """``[chunk_size=64, dt_dtype=bf16]; ...`` (with ``with_arch``: ``[...] (sm_90a, sm_100a); ...``), or ``none``."""
    archs: dict[tuple, set[str]] = {}
    for v in variants:
        archs.setdefault(constants_key(v.constants), set()).add(v.manifest.arch)
    order = sorted(archs, key=lambda key: [(k, isinstance(v, str), v) for k, v in key])  # 64 before 256
    return "; ".join(f"[{format_constants(dict(key))}]" + (f" ({', '.join(sorted(archs[key]))})" if with_arch else "")
                     for key in order) or "none"


def _override_manifest_paths(value: str) -> tuple[list[Path], list[Problem]]:
    paths, problems = [], []
    for directory in filter(None, value.split(os.pathsep)):
        directory = os.path.abspath(directory)  # (a relative one names the directory as it was found, not later)
        found = [Path(directory) / "manifest.json"] if (Path(directory) / "manifest.json").is_file() else []
        found += sorted(Path(p) for p in glob.glob(os.path.join(glob.escape(directory), "*", "manifest.json")))
        if not found:
            problems.append(Problem(directory, CubinNotInstalledError(
                f"{ENV_CUBIN_DIR}={directory} holds no manifest.json (looked for DIR/manifest.json and "
                "DIR/*/manifest.json)")))
        paths += found
    return paths, problems


def _installed_manifest_paths() -> list[Path]:
    paths = []
    names = sorted({m.name for m in pkgutil.iter_modules() if m.name.startswith(PACKAGE_PREFIX)})
    for name in names:
        spec = importlib.util.find_spec(name)
        for location in (spec.submodule_search_locations or []) if spec else []:
            candidate = Path(location) / "manifest.json"
            if candidate.is_file():
                paths.append(candidate)
                break
    return paths


def _package_of(path: Path) -> str | None:
    """The package a broken manifest belongs to: its ``package`` field if readable, else its directory's name."""
    try:
        package = json.loads(path.read_text()).get("package")
    except (OSError, ValueError, AttributeError):
        package = None
    if isinstance(package, str):
        return package
    return path.parent.name if path.parent.name.startswith(PACKAGE_PREFIX) else None


def discover(environ=os.environ) -> Catalog:
    """Look for manifests now (see the module docstring for where), and read whether unvalidated variants may be
    used (``MAMBA2_AOT_ALLOW_UNVALIDATED``). Never raises for a bad source."""
    override_paths, problems = _override_manifest_paths(environ.get(ENV_CUBIN_DIR, ""))
    manifests, seen = [], set()
    for path in override_paths + _installed_manifest_paths():
        if (real := path.resolve()) in seen:  # (a directory named twice, or an override that is an installed package's)
            continue
        seen.add(real)
        try:
            manifests.append(load_manifest(path, built_here=path in override_paths))
        except CubinPackageError as exc:
            problems.append(Problem(str(path.parent), exc, _package_of(path)))
    return Catalog(manifests, problems, allow_unvalidated=env_flag(ENV_ALLOW_UNVALIDATED, environ))


_catalog: Catalog | None = None
_catalog_lock = threading.Lock()


def catalog(*, refresh: bool = False) -> Catalog:
    """The process-wide :class:`Catalog`, discovered on first use (``refresh=True`` looks again)."""
    global _catalog
    if _catalog is not None and not refresh:
        return _catalog
    with _catalog_lock:
        if _catalog is None or refresh:
            _catalog = discover()
        return _catalog
