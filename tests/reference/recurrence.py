"""The one token-stepping mechanism every sequential reference is built on.

A *step* is a small object describing one recurrence (the SSM of BRIEF §2, or the causal conv1d
window) with two methods:

- ``advance(state, row) -> state``: consume one token's inputs ``row`` (a dict of per-token tensors);
- ``output(state_before, state_after, row) -> y``: the token's output.

plus ``window_keys`` (the raw per-row inputs a compact-replay window must keep to replay ``advance``)
and ``out_key`` (the input whose per-token shape the output has). :func:`run_rows` drives a step over
T rows; :func:`scan_sequences` drives it over packed sequences (prefill). The verify family
(``reference.verify``) drives the same steps over state-pool slots, so prefill, decode, snapshot and
compact replay all share one definition of a token.
"""
from __future__ import annotations

from typing import Callable, Protocol

import torch

from ._common import SequenceLayout


class Step(Protocol):
    window_keys: tuple[str, ...]
    out_key: str

    def advance(self, state: torch.Tensor, row: dict[str, torch.Tensor]) -> torch.Tensor: ...

    def output(self, state_before: torch.Tensor, state_after: torch.Tensor,
               row: dict[str, torch.Tensor]) -> torch.Tensor: ...


def run_rows(step: Step, state: torch.Tensor, rows: dict[str, torch.Tensor], *, emit: bool = True,
             on_state: Callable[[int, torch.Tensor], None] | None = None):
    """Advance `state` through rows ``t = 0..T-1`` (``rows[k]`` has shape (T, ...)).

    Returns ``(outputs, state)``: the list of T per-token outputs (empty when ``emit`` is False) and
    the state after the last row. ``on_state(t, state_after_t)`` is called after every row.
    """
    num_rows = next(iter(rows.values())).shape[0]
    outputs = []
    for t in range(num_rows):
        row = {k: v[t] for k, v in rows.items()}
        new_state = step.advance(state, row)
        if emit:
            outputs.append(step.output(state, new_state, row))
        if on_state is not None:
            on_state(t, new_state)
        state = new_state
    return outputs, state


def scan_sequences(step: Step, layout: SequenceLayout, rows: dict[str, torch.Tensor],
                   initial_states: torch.Tensor, keep_positions=()):
    """Run `step` over every sequence of `layout`; each sequence starts from its own initial state.

    rows: name -> (B, L, ...) per-token inputs. initial_states: (num_seqs, *state_shape).
    keep_positions: (row, position) pairs whose post-token state is returned.

    Returns ``(out, final_states, kept)``: out (B, L, ...) stacked outputs, final_states
    (num_seqs, *state_shape) (an empty sequence keeps its initial state), kept {(row, pos): state}.
    """
    keep = set(keep_positions)
    kept = {}
    per_row = [[] for _ in range(layout.batch)]
    finals = []
    for seg in layout.segments:
        seg_rows = {k: v[seg.row, seg.start:seg.end] for k, v in rows.items()}

        def on_state(t, state, seg=seg):
            if (seg.row, seg.start + t) in keep:
                kept[(seg.row, seg.start + t)] = state

        outputs, final = run_rows(step, initial_states[seg.seq], seg_rows, on_state=on_state)
        per_row[seg.row].extend(outputs)
        finals.append(final)
    out = torch.stack([torch.stack(r) for r in per_row]) if layout.seqlen else \
        rows[step.out_key].new_zeros(rows[step.out_key].shape)
    return out, torch.stack(finals), kept
