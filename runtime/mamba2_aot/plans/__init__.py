"""Registry of launch plans: ``PLANS[family]`` is the plan of each family the runtime can launch."""
from __future__ import annotations

from .base import CompositePlan, LaunchPlan, StepPlan
from .conv1d_fwd import Conv1dForwardPlan
from .conv1d_verify import Conv1dVerifyPlan
from .ssd_bwd import (SsdBackwardChunkPlan, SsdBackwardPlan, SsdBackwardReducePlan, SsdBackwardStatesPlan,
                      SsdBackwardWalksPlan, SsdForwardStatesPlan)
from .ssd_chunk_cumsum import ChunkCumsumPlan
from .ssd_fwd import SsdForwardInlinePlan, SsdForwardPairedPlan, SsdForwardPassPlan, SsdForwardPlan
from .verify import VerifyPlan

PLANS: dict[str, LaunchPlan] = {plan.family: plan for plan in (
    Conv1dForwardPlan(), Conv1dVerifyPlan(), ChunkCumsumPlan(), SsdForwardPlan(), SsdForwardPassPlan(),
    SsdForwardPairedPlan(), SsdForwardInlinePlan(), SsdForwardStatesPlan(), SsdBackwardPlan(),
    SsdBackwardStatesPlan(), SsdBackwardWalksPlan(), SsdBackwardChunkPlan(), SsdBackwardReducePlan(), VerifyPlan())}

__all__ = ["PLANS", "CompositePlan", "LaunchPlan", "StepPlan"]
