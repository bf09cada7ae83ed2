"""ssd_bwd_walks: ssd_bwd's two walks along L side by side in one launch (its recompute and its reverse pass).

ssd_bwd needs the forward's state after every 64-token block (the walk of kernel_src/ssd_fwd_states.py) and the state
gradient after every block (the reverse walk of kernel_src/ssd_bwd_dstates.py). Neither reads what the other writes,
and each is one CTA per (64-row slice of P, head, row or sequence) whose time goes to its chain of barriers and
latencies, not to the SM's throughput: with batch × heads about the SM count, each walk alone leaves every SM with one
CTA of four warps. Here they are one grid, a CTA of each sharing an SM: grid z holds both walks, its first half the
recompute's rows or sequences and its second half the reverse pass's, each with the same (64-row slice of P, head) in
x and y as in its own launch. The recompute's CTAs come first in the grid's order, so that when the two together fill
one wave the SMs' second CTAs are the reverse pass's. Math and code: those two modules (this one only places them).

The parameters are the recompute's, then the reverse pass's prefixed with ``REVERSE_PREFIX``: the runtime binds each
walk as for its own launch. Both walks run the recompute's CTA shape (the reverse pass's warps follow it where the
two differ, off sm_90a), and shared memory holds the larger of their two layouts.
"""
# (no "from __future__ import annotations": the DSL reads annotations as live objects)
import dataclasses

import cutlass
import cutlass.cute as cute

from kernel_src.abi import bind
from kernel_src.families import expect_constants
from kernel_src.ssd_bwd_dstates import SsdBackwardStates
from kernel_src.ssd_fwd import P_TILE
from kernel_src.ssd_fwd_states import SsdForwardStates
from kernel_src.ssd_tiles import SMEM_ALIGN

REVERSE_PREFIX = "reverse_"


class SsdBackwardWalks:
    family = "ssd_bwd_walks"
    grid_rule = "headdim/64,heads,2*sequences"
    headdims = SsdForwardStates.headdims
    d_states = (64, 128)
    io_dtypes = SsdForwardStates.io_dtypes
    state_dtypes = SsdForwardStates.state_dtypes

    def __init__(self, headdim: int, d_state: int, io_dtype: str, state_dtype: str):
        expect_constants(self, headdim=headdim, d_state=d_state, io_dtype=io_dtype, state_dtype=state_dtype)
        self.headdim = headdim
        self.recompute = SsdForwardStates(headdim, d_state, io_dtype, state_dtype)
        self.reverse = SsdBackwardStates(headdim, d_state, io_dtype)
        self.cluster = (1, 1, 1)

    @property
    def target_arch(self):
        return self.recompute.target_arch

    @target_arch.setter
    def target_arch(self, arch):
        """Both walks follow the target; the reverse pass takes the recompute's warps (one CTA shape)."""
        self.recompute.target_arch = arch
        self.reverse.target_arch = arch
        if arch is not None:
            self.reverse.warps = self.recompute.warps
            self.reverse.threads = self.recompute.threads
            self.reverse.block = self.recompute.block

    @property
    def block(self):
        return self.recompute.block

    @property
    def dynamic_smem(self):
        return max(self.recompute.dynamic_smem, self.reverse.dynamic_smem)

    @property
    def min_ctas_per_sm(self):
        """At most two: the runtime takes this launch only for calls whose CTAs fit one wave at two per SM
        (plans.ssd_bwd.walks_side_by_side), and a third would only cost registers (measured 1-4 % slower)."""
        return min(self.recompute.min_ctas_per_sm, self.reverse.min_ctas_per_sm, 2)

    def params(self):
        return self.recompute.params() + [dataclasses.replace(p, name=REVERSE_PREFIX + p.name)
                                          for p in self.reverse.params()]

    def _bind_walks(self, args):
        """The flat arguments as (the recompute's, the reverse pass's), each named as for its own kernel."""
        recompute_params = self.recompute.params()
        return (bind(recompute_params, args[:len(recompute_params)]),
                bind(self.reverse.params(), args[len(recompute_params):]))

    @cute.jit
    def __call__(self, args: tuple, stream):
        a, _ = self._bind_walks(args)
        self.kernel(args).launch(grid=[self.headdim // P_TILE, a.nheads, 2 * a.batch], block=list(self.block),
                                 smem=self.dynamic_smem, stream=stream, min_blocks_per_mp=self.min_ctas_per_sm,
                                 preferred_smem_carveout=0)

    @cute.kernel
    def kernel(self, args: tuple):
        recompute_args, reverse_args = self._bind_walks(args)
        ptile, h, source = cute.arch.block_idx()
        sources = cute.arch.grid_dim()[2] // 2
        # one allocation for both: each walk lays its own storage over it
        smem = cutlass.utils.SmemAllocator().allocate(self.dynamic_smem, SMEM_ALIGN)
        if source < sources:
            self.recompute.walk(recompute_args, (ptile, h, source), smem)
        else:
            self.reverse.walk(reverse_args, (ptile, h, source - sources), smem)
