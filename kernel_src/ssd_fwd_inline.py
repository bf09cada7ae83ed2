"""ssd_fwd_inline: a split ssd_fwd call in one launch, and the other paired launches (sm_90a; N 64 and 128).

A call with few CTAs for the GPU is split along L into segments run at once (``runtime/mamba2_aot/plans/ssd_fwd.py``).
In ssd_fwd's way, a states-only pass (``ssd_fwd_pass``) first leaves the state entering each later segment in a
workspace. Here, in one launch and without one, segment s > 0 walks the state recurrence alone from its row's
start up to its own start (``_states_block``: ssd_fwd_pass's operations in its order, so the state, and the outputs
after it, are bitwise the two-launch split's and the unsplit call's), then its outputs as ssd_fwd_paired does. A block
of the state alone costs a fraction of a block with outputs, so the plan makes the first segments longer than the
last (``plan_inline``), and the last runs to the row's end. Blocks of the state alone load no C and no z and stage no
y: they skip the Y_FREE / Y_STAGED hand-offs with the writers (which tied each to the writers' previous iteration),
and the writers learn from TILES_FREE, in which they take part, when the products are done with a block's x. The
plan sends it the split calls without workspace room for the entering states, and those whose states-only pass would
be short (its launch and its ring's fill then cost more than these blocks); such a call is bound with ``nchunks`` 0.
A launch with chunk states to enter from (``nchunks`` > 0: the segments after a states-only pass, a handover's) walks
no prefix, as ssd_fwd_paired's do, nor does an unsplit one: the plan sends this family every launch of two heads per
CTA but those with z at N 128, on which its CTA is 1-8 % faster than ssd_fwd_paired's (its loaders' order; without z at
N 128 its variant without z slots; docs/PERF_NOTES.md, forty-sixth session).

The parameters and the grid are ssd_fwd's; the math and the CTA are ssd_fwd_paired's (``kernel_src/ssd_fwd_paired.py``),
which is this class with ``inline_pass`` off. On sm_100a, which has no wgmma, the cubin is ssd_fwd's walk with the same
switch: a segment of an inline split walks from its row's start with outputs, none stored before its start (correct,
but no faster than the unsplit walk, where the two launches were faster for short passes: estimated, unvalidated
there); other launches walk as ssd_fwd's.
"""
from kernel_src.families import expect_constants
from kernel_src.ssd_fwd_paired import SsdForwardPaired


class SsdForwardInline(SsdForwardPaired):
    family = "ssd_fwd_inline"
    d_states = (64, 128)
    inline_pass = True
    z_gates = (True, False)

    def __init__(self, headdim: int, d_state: int, io_dtype: str, state_dtype: str, z_gate: bool = True):
        """``z_gate`` False: the N 128 variant for calls without z (no z slots, so B, C and x on rings of three and the
        writers two blocks ahead)."""
        super().__init__(headdim, d_state, io_dtype, state_dtype)
        expect_constants(self, d_state=d_state, z_gate=z_gate)
        self.z_gate = z_gate

    @staticmethod
    def combination_error(d_state: int, z_gate: bool = True, **_) -> str | None:
        """Variants without z (``z_gate`` False) exist at N 128 only: at N 64 the z slots fit beside rings of three."""
        if not z_gate and d_state != 128:
            return f"z_gate False is an N 128 variant (d_state {d_state} has rings of three with z)"
        return None
