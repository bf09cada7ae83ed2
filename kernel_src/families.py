"""The kernel families the build knows, by name, and how a variant is named.

A variant is one family plus one value for each of its compile-time constants (chunk size, dtypes, ...).
"""
from __future__ import annotations

import importlib
import itertools

# family name -> "module:Class" in kernel_src (imported lazily: importing the DSL takes ~0.6 s)
FAMILIES = {
    "conv1d_fwd": "kernel_src.conv1d_fwd:Conv1dForward",
    "conv1d_verify": "kernel_src.conv1d_verify:Conv1dVerify",
    "ssd_bwd_chunk": "kernel_src.ssd_bwd_chunk:SsdBackwardChunk",
    "ssd_bwd_dstates": "kernel_src.ssd_bwd_dstates:SsdBackwardStates",
    "ssd_bwd_reduce": "kernel_src.ssd_bwd_reduce:SsdBackwardReduce",
    "ssd_bwd_walks": "kernel_src.ssd_bwd_walks:SsdBackwardWalks",
    "ssd_chunk_cumsum": "kernel_src.ssd_chunk_cumsum:ChunkCumsum",
    "ssd_fwd": "kernel_src.ssd_fwd:SsdForward",
    "ssd_fwd_inline": "kernel_src.ssd_fwd_inline:SsdForwardInline",
    "ssd_fwd_paired": "kernel_src.ssd_fwd_paired:SsdForwardPaired",
    "ssd_fwd_pass": "kernel_src.ssd_fwd_pass:SsdForwardPass",
    "ssd_fwd_states": "kernel_src.ssd_fwd_states:SsdForwardStates",
    "verify": "kernel_src.verify:Verify",
}


def expect_constants(kernel, **constants) -> None:
    """A kernel class's constructor check: each constant among the class's ``<name>s`` values (``headdims``,
    ``io_dtypes``, ...), and the combination allowed by its optional ``combination_error``. Raises ValueError."""
    for name, value in constants.items():
        allowed = getattr(kernel, f"{name}s")
        if value not in allowed:
            raise ValueError(f"{name} {value!r} not in {allowed}")
    check = getattr(kernel, "combination_error", None)
    error = check(**constants) if check is not None else None
    if error:
        raise ValueError(error)


def _family_entry(family: str) -> tuple[str, str]:
    """(module, class) of ``family``; ValueError naming the known families when it is not one."""
    if family not in FAMILIES:
        raise ValueError(f"unknown kernel family {family!r} (known: {', '.join(FAMILIES)})")
    module, cls = FAMILIES[family].split(":")
    return module, cls


def kernel_module_path(family: str) -> str:
    """The source file of a family, relative to the repository root."""
    return _family_entry(family)[0].replace(".", "/") + ".py"


def kernel_sources(family: str) -> list[str]:
    """The family's source file and every kernel_src module it imports, directly or not (the build's
    dependencies: a change to a shared device helper rebuilds every family that uses it)."""
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    found, pending = [], [kernel_module_path(family)]
    while pending:
        path = pending.pop()
        if path in found:
            continue
        found.append(path)
        for node in ast.walk(ast.parse((root / path).read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("kernel_src."):
                pending.append(node.module.replace(".", "/") + ".py")
    return sorted(found)


def kernel_class(family: str):
    module, cls = _family_entry(family)
    return getattr(importlib.import_module(module), cls)


def applied_experiments(family: str, requested) -> frozenset[str]:
    """The build experiments among ``requested`` that the family's kernel class implements (the names in its
    optional class attribute ``experiments``); the others leave the family as it is."""
    return frozenset(requested) & frozenset(getattr(kernel_class(family), "experiments", ()))


def known_experiments() -> list[str]:
    """Every experiment name some family's kernel class declares, sorted."""
    return sorted({name for family in FAMILIES for name in getattr(kernel_class(family), "experiments", ())})


def new_kernel(family: str, constants: dict, arch: str, experiments=()):
    """The family's kernel for ``constants`` as the build compiles it for ``arch``: with ``target_arch`` (a kernel may
    specialise on it: ssd_fwd's warpgroup MMAs on sm_90a, its scan slots) and ``enabled_experiments``, the
    requested experiments the class implements and, when the class has ``experiment_applies(name)``, that change
    this variant's code (an empty frozenset when none: kernel code asks :func:`experiment_enabled`; a variant an
    experiment leaves as it is stays validated)."""
    kernel = kernel_class(family)(**constants)
    kernel.target_arch = arch
    kernel.enabled_experiments = frozenset(name for name in applied_experiments(family, experiments)
                                           if _changes(kernel, name))
    return kernel


def experiment_enabled(kernel, name: str) -> bool:
    """Whether build experiment ``name`` is on in ``kernel`` (kernel code's test): requested by the build
    (``enabled_experiments``, set by :func:`new_kernel`; none on a kernel made elsewhere) and changing this variant."""
    return name in getattr(kernel, "enabled_experiments", ()) and _changes(kernel, name)


def _changes(kernel, name: str) -> bool:
    """The kernel's optional ``experiment_applies(name)``: whether experiment ``name`` changes this variant (default
    yes)."""
    return getattr(kernel, "experiment_applies", lambda _: True)(name)


def unsupported(family: str, constants: dict, arch: str, experiments=()) -> str | None:
    """Why a variant (with the requested ``experiments``) cannot be built for ``arch`` (its shared memory, with the
    DSL's static kilobyte the cubin check counts too, exceeds the arch's per-CTA limit), or None. The build skips
    such variants for that arch; the runtime then reports them as not built there."""
    from kernel_src.cubin_checks import DSL_STATIC_SMEM, SMEM_LIMIT

    kernel = new_kernel(family, constants, arch, experiments)
    dynamic = kernel.dynamic_smem
    static = DSL_STATIC_SMEM if dynamic else 0
    if dynamic + static > SMEM_LIMIT[arch]:
        return (f"needs {dynamic + static} B of shared memory per CTA ({dynamic} dynamic + {static} static), {arch} "
                f"allows {SMEM_LIMIT[arch]} B")
    return None


def variant_key(family: str, constants: dict) -> str:
    """``family[a=1,b=x]``: the manifest's variant key (constants in name order)."""
    return f"{family}[" + ",".join(f"{k}={constants[k]}" for k in sorted(constants)) + "]"


def variant_stem(family: str, constants: dict) -> str:
    """``family.a-1.b-x``: the file name stem of a variant's cubin and metadata."""
    return ".".join([family] + [f"{k}-{constants[k]}" for k in sorted(constants)])


def expand(config: dict) -> list[tuple[str, dict]]:
    """All variants of a build config ``{family: {constant: [values]}}``, in a stable order.

    The config's axes form a product; combinations a family's class declares meaningless (its optional
    ``combination_error``, e.g. a conv pool dtype that is neither the I/O dtype nor fp32) are not variants."""
    variants = []
    for family in sorted(config):
        if family not in FAMILIES:
            raise ValueError(f"build config names unknown family {family!r}; known: {sorted(FAMILIES)}")
        axes = config[family]
        names = sorted(axes)
        check = getattr(kernel_class(family), "combination_error", None)
        for values in itertools.product(*(axes[n] for n in names)):
            constants = dict(zip(names, values))
            if check is None or check(**constants) is None:
                variants.append((family, constants))
    return variants
