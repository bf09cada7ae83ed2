"""ssd_fwd_inline: a split ssd_fwd call in one launch, ssd_fwd_paired's CTA with an inline pass (sm_90a; N 64 and 128).

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
be short (its launch and its ring's fill then cost more than these blocks).

The parameters and the grid are ssd_fwd's; the math and the CTA are ssd_fwd_paired's (``kernel_src/ssd_fwd_paired.py``),
which is this class with ``inline_pass`` off. On sm_100a, which has no wgmma, the cubin is ssd_fwd's walk with the same
switch: a segment walks from its row's start with outputs, none stored before its start (correct, but no faster than
the unsplit walk, where the two launches were faster for short passes: estimated, unvalidated there).
"""
from kernel_src.ssd_fwd_paired import SsdForwardPaired


class SsdForwardInline(SsdForwardPaired):
    family = "ssd_fwd_inline"
    inline_pass = True
    z_gates = (True, False)  # (without z at N 128: rings of three, the writers two blocks ahead)
