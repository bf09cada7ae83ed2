"""Launch plan of ``conv1d_fwd``: the causal depthwise conv1d over (packed) sequences before ``ssd_fwd``.

Call::

    launch("conv1d_fwd", xBC=xBC, conv_weight=w, out=out, conv_bias=None, activation="silu",
           initial_states=None, initial_state_indices=None, final_states=None, final_state_indices=None,
           seq_idx=None, cu_seqlens=None, stream=None)

=====================  ===========================  ===============  ======================================
argument               shape                        dtype            notes
=====================  ===========================  ===============  ======================================
xBC, out               (batch, L, channels)         bf16/fp16/fp32   ``io`` dtype; any strides
conv_weight            (channels, K)                fp32             K in 2..4; weight[:, K-1] multiplies the
                                                                     current row
conv_bias              (channels,) or None          fp32
activation             "silu" or None
initial_states         (num_seqs, channels, K-1),   io dtype / fp32  each sequence's previous K-1 inputs,
                       or a conv pool (num_slots,                    oldest first (zeros if None)
                       channels, K-1) with indices
initial_state_indices  (num_seqs,) or None          int32            slot per sequence; < 0 or >= num_slots:
                                                                     zeros
final_states           as initial_states            as initial       written: each sequence's last K-1
final_state_indices    (num_seqs,) or None          int32            inputs (slot < 0 or out of range: not
                                                                     written)
seq_idx                (batch, L) or None           int32            packed sequences: a new one where the
                                                                     value changes (no per-sequence states)
cu_seqlens             (num_seqs + 1,) or None      int32            packed sequences along L, batch == 1
=====================  ===========================  ===============  ======================================

``out[b, t, c] = act(conv_bias[c] + Σ_k conv_weight[c, k] · u[t-K+1+k])`` where positions before a sequence's
first token read its initial window. Sequences are those of ``ssd_fwd`` (row b, or cu_seqlens, or seq_idx);
per-sequence states with ``seq_idx`` are refused (pass cu_seqlens). The final states are a conv pool the
verify families read without conversion, so prefill → verify needs no glue: slice x, B and C out of ``out``
(column views) for ``ssd_fwd``, and pass the same pool and slots to ``conv1d_verify`` or the fused verify.
Reading and writing one pool (initial_states is final_states) is allowed; slots written must be distinct and
not read by another sequence of the call. With cu_seqlens, rows outside every sequence (a padded packing)
are written as zeros, so ``out`` can feed ``ssd_fwd`` as is (it reads every row of a 64-token block, weighted
by zero outside the sequence, which a stale NaN or Inf would survive).

No workspace. One CTA per (128 channels, 64 tokens, row): grid rule ``channels/128,seqlen/64,batch``.
"""
from __future__ import annotations

from ..errors import InvalidArgumentError
from ..validation import (GRID_YZ_MAX, BoundCall, expect_complete, expect_dim, expect_dtype, expect_given,
                          expect_shape, null_absent, record_strides, stride_names)
from .base import LaunchPlan
from .conv_inputs import CONV_STRIDES, bind_conv_rows, bind_conv_weights
from .sequence_states import bind_cu_seqlens, bind_sequence_states, state_dtype

IO_DTYPES = ("bf16", "fp16", "fp32")
CHANNELS_PER_CTA = 128
TOKENS_PER_CTA = 64
STATE_ARRAYS = ("initial_states", "initial_state_indices", "final_states", "final_state_indices")


class Conv1dForwardPlan(LaunchPlan):
    family = "conv1d_fwd"
    grid_rule = "channels/128,seqlen/64,batch"
    param_names = (
        ("xBC", "conv_weight", "conv_bias", "out", "initial_states", "initial_state_indices", "final_states",
         "final_state_indices", "seq_idx", "cu_seqlens",
         "batch", "seqlen", "channels", "width", "num_seqs", "num_initial_slots", "num_final_slots")
        + stride_names("xBC", "batch", "seqlen", "channel") + CONV_STRIDES
        + stride_names("out", "batch", "seqlen", "channel")
        + stride_names("initial_states", "slot", "channel", "tap") + stride_names("initial_state_indices", "seq")
        + stride_names("final_states", "slot", "channel", "tap") + stride_names("final_state_indices", "seq")
        + stride_names("seq_idx", "batch", "seqlen") + stride_names("cu_seqlens", "seq")
        + ("has_conv_bias", "silu", "has_initial_states", "has_initial_state_indices", "has_final_states",
           "has_final_state_indices", "has_seq_idx", "has_cu_seqlens")
    )
    arrays = ("xBC", "conv_weight", "conv_bias", "out", "seq_idx", "cu_seqlens") + STATE_ARRAYS

    def bind(self, *, xBC, conv_weight, out, conv_bias=None, activation="silu", initial_states=None,
             initial_state_indices=None, final_states=None, final_state_indices=None, seq_idx=None,
             cu_seqlens=None) -> BoundCall:
        """Validate a call (see the module docstring). Raises the InvalidArgumentError subclasses."""
        expect_given(xBC=xBC, conv_weight=conv_weight, out=out)
        params = {}
        batch, seqlen, channels = bind_conv_rows(params, xBC, out, IO_DTYPES, "seqlen", 1)
        expect_dim("xBC", "seqlen / 64 (grid y)", -(-seqlen // TOKENS_PER_CTA), maximum=GRID_YZ_MAX)
        inputs = [xBC] + bind_conv_weights(params, conv_weight=conv_weight, conv_bias=conv_bias,
                                           activation=activation, channels=channels)
        outputs = [out]

        if seq_idx is not None and cu_seqlens is not None:
            raise InvalidArgumentError("seq_idx", "seq_idx: pass seq_idx or cu_seqlens, not both")
        num_seqs = batch
        if cu_seqlens is not None:
            num_seqs = bind_cu_seqlens(params, cu_seqlens, batch, "xBC")
            inputs.append(cu_seqlens)
        if seq_idx is not None:
            expect_dtype(seq_idx, ("int32",))
            expect_shape(seq_idx, (batch, seqlen), "(batch, seqlen) of xBC")
            for name, arr in (("initial_states", initial_states), ("final_states", final_states)):
                if arr is not None:
                    raise InvalidArgumentError(name, f"{name}: per-sequence conv states with seq_idx are not "
                                               "supported; pack with cu_seqlens instead")
            record_strides(params, seq_idx, ("batch", "seqlen"))
            inputs.append(seq_idx)
        params["num_seqs"] = num_seqs

        pool_dtype = state_dtype(initial_states, final_states, tuple(dict.fromkeys((xBC.dtype, "fp32"))),
                                 default=xBC.dtype)
        width = params["width"]
        read, written = bind_sequence_states(
            params, initial_states=initial_states, initial_state_indices=initial_state_indices,
            final_states=final_states, final_state_indices=final_state_indices, num_seqs=num_seqs,
            block=(channels, width - 1), block_dims="channels, width - 1", stride_dims=("slot", "channel", "tap"))
        inputs += read
        outputs += written

        optional = {"seq_idx": seq_idx, "cu_seqlens": cu_seqlens}
        for name, arr in optional.items():
            params[name] = arr.ptr if arr is not None else 0
            params[f"has_{name}"] = int(arr is not None)
        null_absent(params, self.param_names, (*optional, *STATE_ARRAYS))
        expect_complete(params, self.param_names, self.family)
        return BoundCall(
            constants={"io_dtype": xBC.dtype, "pool_dtype": pool_dtype},
            grid=(-(-channels // CHANNELS_PER_CTA), -(-seqlen // TOKENS_PER_CTA), batch),
            params=params,
            inputs=tuple(inputs),
            outputs=tuple(outputs),
        )
