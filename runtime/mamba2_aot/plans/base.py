"""The interface every family's launch plan implements (one small module per family).

A plan turns a call's keyword arguments into a :class:`~mamba2_aot.validation.BoundCall`: it validates
everything family-specific and computes the variant constants, the grid and the value of every kernel
parameter. The dispatcher has already turned the arguments named in ``arrays`` into
:class:`~mamba2_aot.tensors.DeviceArray` records (``None`` stays ``None``), and does the rest itself
(generic checks, variant lookup, device checks, loading, packing by the manifest's offsets, launching).
A plan never touches the driver, and ``bind`` must be a pure function of its arguments: the
dispatcher reuses its result for a repeated identical call.
"""
from __future__ import annotations

from ..errors import InvalidArgumentError
from ..validation import BoundCall


class LaunchPlan:
    """Base class. Subclasses set the four class attributes and implement :meth:`bind`."""

    #: the family name, as in ``launch(family, ...)`` and the manifest
    family: str = ""
    #: the manifest's ``grid`` rule this plan implements (checked when a variant is loaded)
    grid_rule: str = ""
    #: the kernel's parameters in order (checked against the manifest's param list when loading)
    param_names: tuple[str, ...] = ()
    #: the keyword arguments that are arrays (adapted to DeviceArray before :meth:`bind`)
    arrays: tuple[str, ...] = ()

    def bind(self, **kwargs) -> BoundCall:
        """Validate a call and compute its variant constants, grid and parameter values."""
        raise NotImplementedError

    def workspace_size(self, **kwargs) -> int:
        """Bytes of caller-owned workspace the call needs (families without workspace: 0)."""
        return 0


class StepPlan(LaunchPlan):
    """A kernel that only runs as a step of the composite family ``step_of`` (registered so that preload and the
    manifest checks see it); launching it on its own is refused."""

    #: the composite family whose launches this kernel runs
    step_of: str = ""

    def bind(self, **kwargs) -> BoundCall:
        raise InvalidArgumentError("family", f"{self.family} is a step of {self.step_of}: call "
                                   f"launch({self.step_of!r}, ...)")


class CompositePlan(LaunchPlan):
    """A family whose call is several kernel launches on one stream, in order (each launch's kernel has its own
    step plan in ``PLANS``). The dispatcher validates every step, and loads every step's kernel on the one device
    of all its arrays, before it launches the first."""

    #: the families of the steps, in launch order (what ``preload`` and ``list_variants`` load / list for it)
    step_families: tuple[str, ...] = ()

    def steps(self, **kwargs) -> list[tuple[str, BoundCall]]:
        """Validate a call; return its launches as (step family, bound call), in launch order."""
        raise NotImplementedError
