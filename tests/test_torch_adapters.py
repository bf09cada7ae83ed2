"""mamba2_aot.torch on the CPU: what the drop-ins refuse, before anything reaches the runtime."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")

from mamba2_aot import errors, tensors  # noqa: E402
from mamba2_aot import torch as adapters  # noqa: E402
from runtime_fakes import no_driver  # noqa: E402,F401  (fixture)


def _forward(**over):
    args = dict(x=torch.zeros(1, 8, 4, 64, dtype=torch.bfloat16), dt=torch.zeros(1, 8, 4, dtype=torch.bfloat16),
                A=-torch.ones(4), B=torch.zeros(1, 8, 1, 64, dtype=torch.bfloat16),
                C=torch.zeros(1, 8, 1, 64, dtype=torch.bfloat16), chunk_size=64)
    args.update(over)
    return args


@pytest.mark.parametrize("over,argument", [
    ({"return_varlen_states": True}, "cu_seqlens"),
    ({"seq_idx": torch.zeros(1, 8, dtype=torch.int32), "return_final_states": True}, "return_final_states"),
    ({"state_dtype": torch.int32}, "state_dtype"),
    ({"dt_limit": (0.0,)}, "dt_limit"),       # (were a ValueError from unpacking, and a TypeError from int())
    ({"chunk_size": None}, "chunk_size"),
])
def test_chunk_scan_refusals_name_the_argument(over, argument):
    with pytest.raises(errors.InvalidArgumentError) as info:
        adapters.mamba_chunk_scan_combined(**_forward(**over))
    assert info.value.argument == argument


def test_untied_per_dim_A_is_refused():
    A = -torch.rand(4, 64, 16)  # Mamba-1 style: a value per (head, dim, state)
    with pytest.raises(errors.InvalidArgumentError) as info:
        adapters.selective_state_update(torch.zeros(2, 4, 64, 16), torch.zeros(2, 4, 64), torch.zeros(2, 4, 64), A,
                                        torch.zeros(2, 1, 16), torch.zeros(2, 1, 16))
    assert info.value.argument == "A"


class RecordedLaunches:
    """Stands in for runtime.launch (no GPU here): records each family and its keyword arguments."""

    def __init__(self):
        self.calls = []

    def __call__(self, family, **kwargs):
        self.calls.append((family, kwargs))


@pytest.fixture
def launches(monkeypatch):
    recorded = RecordedLaunches()
    monkeypatch.setattr(adapters.runtime, "launch", recorded)
    monkeypatch.setattr(adapters.runtime, "workspace_size", lambda family, **kw: 0)  # (it needs CUDA arrays)
    return recorded


def test_seq_idx_packing_with_several_rows_asks_for_no_states(launches):
    adapters.mamba_chunk_scan_combined(**_forward(x=torch.zeros(2, 8, 4, 64, dtype=torch.bfloat16),
                                                  dt=torch.zeros(2, 8, 4, dtype=torch.bfloat16),
                                                  B=torch.zeros(2, 8, 1, 64, dtype=torch.bfloat16),
                                                  C=torch.zeros(2, 8, 1, 64, dtype=torch.bfloat16),
                                                  seq_idx=torch.zeros(2, 8, dtype=torch.int32)))
    (family, kw), = launches.calls
    assert family == "ssd_fwd" and kw["final_states"] is None and kw["seq_idx"] is not None
    assert kw["cu_seqlens"] is None and kw["initial_states"] is None


def test_cu_seqlens_packs_when_the_varlen_states_or_a_single_seq_idx_row_need_it(launches):
    cu = torch.tensor([0, 3, 8], dtype=torch.int32)
    out, final, varlen = adapters.mamba_chunk_scan_combined(
        **_forward(cu_seqlens=cu, seq_idx=torch.tensor([[0] * 3 + [1] * 5], dtype=torch.int32),
                   initial_states=torch.ones(1, 4, 64, 64, dtype=torch.bfloat16)),
        return_final_states=True, return_varlen_states=True)
    (_, kw), = launches.calls
    assert kw["seq_idx"] is None and kw["cu_seqlens"] is cu
    assert kw["final_states"].shape == (2, 4, 64, 64) and kw["final_states"].dtype == torch.float32
    assert kw["initial_states"].dtype == torch.float32
    assert kw["initial_state_indices"].tolist() == [0, -1]          # the row's state starts sequence 0 only
    assert torch.all(out == 0)                                        # rows outside sequences: zeros
    assert final.shape == (1, 4, 64, 64) and final.dtype == torch.float32
    assert varlen.shape == (2, 4, 64, 64) and varlen.dtype == torch.bfloat16   # C's dtype, as Triton returns


def test_cu_seqlens_alone_is_ignored_as_state_spaces_mamba_does(launches):
    adapters.mamba_chunk_scan_combined(**_forward(cu_seqlens=torch.tensor([0, 3, 8], dtype=torch.int32)))
    (_, kw), = launches.calls
    assert kw["cu_seqlens"] is None and kw["seq_idx"] is None


def test_initial_states_must_be_the_rows_or_one_per_sequence(launches):
    with pytest.raises(errors.ShapeError) as info:
        adapters.mamba_chunk_scan_combined(**_forward(cu_seqlens=torch.tensor([0, 2, 5, 8], dtype=torch.int32),
                                                      initial_states=torch.zeros(2, 4, 64, 64)),
                                           return_varlen_states=True)
    assert info.value.argument == "initial_states" and not launches.calls


def test_decode_takes_model_dtypes_and_int64_indices(launches):
    H, P, N = 4, 64, 16
    adapters.selective_state_update(torch.zeros(3, H, P, N), torch.zeros(2, H, P, dtype=torch.bfloat16),
                                    torch.zeros(2, H, dtype=torch.bfloat16)[..., None].expand(2, H, P),
                                    (-torch.ones(H))[:, None, None].expand(H, P, N),
                                    torch.zeros(2, 1, N, dtype=torch.bfloat16),
                                    torch.zeros(2, 1, N, dtype=torch.bfloat16),
                                    D=torch.ones(H, dtype=torch.bfloat16)[:, None].expand(H, P),
                                    dt_bias=torch.zeros(H, dtype=torch.bfloat16)[:, None].expand(H, P),
                                    state_batch_indices=torch.tensor([2, 0]))
    (family, kw), = launches.calls
    assert family == "verify" and kw["mode"] == "update"
    assert kw["D"].dtype == kw["dt_bias"].dtype == kw["A"].dtype == torch.float32
    assert kw["D"].shape == (H,) and kw["A"].shape == (H,) and kw["dt"].shape == (2, 1, H)
    assert kw["state_indices"].dtype == torch.int32


def test_int64_slots_and_offsets_saturate_and_seq_idx_labels_stay_apart(launches):
    """Slot 2^32 + 1 is past any pool (a padding row), not slot 1; -2^32 is padding, not slot 0; a cu_seqlens entry
    2^33 stays past L. seq_idx labels 3e9 and 3e9 + 1 stay two sequences (clamping would merge them)."""
    big = torch.tensor([2**32 + 1, -2**32])
    saturated = [2**31 - 1, -2**31]
    _decode_with_slots(big)
    adapters.causal_conv1d_update(torch.zeros(2, 16), torch.zeros(3, 16, 3), torch.ones(16, 4),
                                  conv_state_indices=big)
    adapters.mamba_chunk_scan_combined(**_forward(cu_seqlens=torch.tensor([0, 3, 2**33])), return_varlen_states=True)
    labels = torch.tensor([[3 * 10**9] * 3 + [3 * 10**9 + 1] * 5])
    adapters.mamba_chunk_scan_combined(**_forward(seq_idx=labels))
    adapters.causal_conv1d_fn(torch.zeros(1, 16, 8), torch.ones(16, 4), seq_idx=labels)
    (_, ssm), (_, conv), (_, by_cu), (_, scan), (_, conv_fn) = launches.calls
    assert ssm["state_indices"].tolist() == conv["state_indices"].tolist() == saturated
    assert by_cu["cu_seqlens"].tolist() == [0, 3, 2**31 - 1]
    for kw in (scan, conv_fn):
        changes = (kw["seq_idx"][0, 1:] != kw["seq_idx"][0, :-1]).tolist()
        assert kw["seq_idx"].dtype == torch.int32 and changes == [False, False, True] + [False] * 4


@pytest.mark.parametrize("dtype,big", [(torch.uint32, [2**31, 2**32 - 1]), (torch.uint64, [2**32 + 1, 2**63 + 5])])
def test_unsigned_slots_and_offsets_saturate(launches, dtype, big):
    """Unsigned slots past int32 stay past any pool (uint32's would wrap negative, uint64's onto slot 1), and a
    cu_seqlens entry past int32 stays past L."""
    indices = torch.tensor(big, dtype=torch.int64).to(dtype) if dtype == torch.uint32 else _uint64(big)
    _decode_with_slots(indices)
    cu_seqlens = torch.cat([torch.tensor([0, 3], dtype=torch.int64).to(dtype), indices[1:]])
    adapters.mamba_chunk_scan_combined(**_forward(cu_seqlens=cu_seqlens), return_varlen_states=True)
    (_, ssm), (_, by_cu) = launches.calls
    assert ssm["state_indices"].tolist() == [2**31 - 1] * 2
    assert by_cu["cu_seqlens"].tolist() == [0, 3, 2**31 - 1]


def _decode_with_slots(state_batch_indices: torch.Tensor) -> None:
    """A two-row selective_state_update on a three-slot pool, rows sent to ``state_batch_indices``."""
    H, P, N = 4, 64, 16
    bf16 = dict(dtype=torch.bfloat16)
    adapters.selective_state_update(torch.zeros(3, H, P, N), torch.zeros(2, H, P, **bf16), torch.zeros(2, H, **bf16),
                                    -torch.ones(H), torch.zeros(2, N, **bf16), torch.zeros(2, N, **bf16),
                                    state_batch_indices=state_batch_indices)


def _uint64(values: list[int]) -> torch.Tensor:
    """A uint64 tensor of ``values`` (up to 2^64 - 1; torch.tensor takes no Python int beyond int64's range)."""
    return torch.tensor([v - 2**64 if v >= 2**63 else v for v in values], dtype=torch.int64).view(torch.uint64)


def test_causal_conv1d_fn_hands_the_kernel_channel_last_views(launches):
    """causal_conv1d's (batch, dim, L) arrays reach conv1d_fwd as (batch, L, dim) views of the same memory."""
    xBC = torch.zeros(2, 9, 16, dtype=torch.bfloat16)          # Mamba-2's layout: channels contiguous
    out, final = adapters.causal_conv1d_fn(xBC.transpose(1, 2), torch.ones(16, 4, dtype=torch.bfloat16),
                                           torch.zeros(16), activation="swish", return_final_states=True)
    (family, kw), = launches.calls
    assert family == "conv1d_fwd" and kw["activation"] == "silu"
    assert kw["xBC"].data_ptr() == xBC.data_ptr() and kw["xBC"].shape == (2, 9, 16) and kw["xBC"].stride(2) == 1
    assert kw["out"].shape == (2, 9, 16) and kw["conv_weight"].dtype == torch.float32
    assert out.shape == (2, 16, 9) and final.shape == (2, 16, 3) and kw["final_states"] is final


@pytest.mark.parametrize("call,argument", [
    (lambda x, s, w: adapters.causal_conv1d_fn(x, w, activation="relu"), "activation"),
    (lambda x, s, w: adapters.causal_conv1d_fn(x, w, final_states_out=s), "final_states_out"),
    (lambda x, s, w: adapters.causal_conv1d_update(x[..., 0], s, w, cache_seqlens=torch.zeros(2)), "cache_seqlens"),
    (lambda x, s, w: adapters.causal_conv1d_update(x[..., 0], torch.zeros(2, 16, 2), w), "conv_state"),
    # checked before the launch, whose final states are copied into it (a size mismatch raised after the kernel ran)
    (lambda x, s, w: adapters.causal_conv1d_fn(x, w, return_final_states=True, final_states_out=s[..., :2]),
     "final_states_out"),
    (lambda x, s, w: adapters.causal_conv1d_fn(x, w, return_final_states=True, final_states_out=s.double()),
     "final_states_out"),
    (lambda x, s, w: adapters.causal_conv1d_fn(x, w, return_final_states=True, final_states_out=s[..., :1].expand(
        2, 16, 3)), "final_states_out"),   # (overlapping: copy_ raised after the launch)
    (lambda x, s, w: adapters.causal_conv1d_fn(x[0], w), "x"),                  # (an IndexError from transpose)
    (lambda x, s, w: adapters.causal_conv1d_fn(x, w, seq_idx=torch.zeros(2, 9, dtype=torch.int32),
                                               return_final_states=True), "return_final_states"),
    (lambda x, s, w: adapters.causal_conv1d_fn(x, w, seq_idx=torch.zeros(2, 9, dtype=torch.int32),
                                               initial_states=s), "initial_states"),
    (lambda x, s, w: adapters.causal_conv1d_update(x[0, :, 0], s, w), "x"),
    (lambda x, s, w: adapters.causal_conv1d_update(x[..., 0], torch.zeros(2, 15, 4), w), "conv_state"),  # not x's dim
])
def test_causal_conv1d_refusals_name_the_argument(call, argument, launches):
    x, state, weight = torch.zeros(2, 16, 9), torch.zeros(2, 16, 3), torch.ones(16, 4)
    with pytest.raises(errors.InvalidArgumentError) as info:
        call(x, state, weight)
    assert info.value.argument == argument and not launches.calls


def _drop_in_calls():
    """(drop-in, valid keyword arguments, its required tensors, its optional ones) for each of the four."""
    bf16 = dict(dtype=torch.bfloat16)
    state_update = dict(state=torch.zeros(2, 4, 64, 16), x=torch.zeros(2, 4, 64, **bf16), dt=torch.zeros(2, 4, **bf16),
                        A=-torch.ones(4), B=torch.zeros(2, 1, 16, **bf16), C=torch.zeros(2, 1, 16, **bf16))
    conv = dict(x=torch.zeros(2, 16, 9), weight=torch.ones(16, 4))
    conv_update = dict(x=torch.zeros(2, 16), conv_state=torch.zeros(2, 16, 3), weight=torch.ones(16, 4))
    return [(adapters.mamba_chunk_scan_combined, _forward(), ("x", "dt", "A", "B", "C"),
             ("D", "z", "dt_bias", "initial_states", "seq_idx", "cu_seqlens")),
            (adapters.selective_state_update, state_update, ("state", "x", "dt", "A", "B", "C"),
             ("D", "z", "dt_bias", "state_batch_indices")),
            (adapters.causal_conv1d_fn, conv, ("x", "weight"), ("bias", "seq_idx", "initial_states",
                                                                 "final_states_out")),
            (adapters.causal_conv1d_update, conv_update, ("x", "conv_state", "weight"), ("bias", "conv_state_indices"))]


@pytest.mark.parametrize("call", range(4), ids=["scan", "state_update", "conv", "conv_update"])
def test_a_drop_in_refuses_what_is_not_a_tensor_by_name(call, launches):
    """None for a required tensor, and a list or a numpy array for any tensor argument: an ArrayProtocolError naming
    it (not an AttributeError or IndexError from reading its shape), nothing launched."""
    drop_in, kwargs, required, optional = _drop_in_calls()[call]
    for name, value in [(name, None) for name in required] + [(name, [1.0]) for name in required + optional] + [
            (name, np.zeros(3)) for name in required]:
        with pytest.raises(errors.ArrayProtocolError) as info:
            drop_in(**dict(kwargs, **{name: value}))
        assert info.value.argument == name, (name, value)
    assert not launches.calls


@pytest.mark.parametrize("argument,value", [
    ("x", torch.zeros(1, 8, 4, dtype=torch.bfloat16)), ("B", torch.zeros(1, 8, 1, dtype=torch.bfloat16)),
    ("cu_seqlens", torch.tensor(8, dtype=torch.int32)), ("initial_states", torch.tensor(1.0))])
def test_mamba_chunk_scan_combined_refuses_a_wrong_rank_before_reading_dims(argument, value, launches):
    with pytest.raises(errors.ShapeError, match=f"^{argument}: expected \\(") as info:
        adapters.mamba_chunk_scan_combined(**_forward(**{"cu_seqlens": torch.tensor([0, 8], dtype=torch.int32),
                                                          argument: value}), return_varlen_states=True)
    assert info.value.argument == argument and not launches.calls


def test_causal_conv1d_update_one_column_is_a_one_row_update(launches):
    state = torch.zeros(3, 16, 3, dtype=torch.bfloat16)
    out = adapters.causal_conv1d_update(torch.zeros(2, 16, dtype=torch.bfloat16), state, torch.ones(16, 4),
                                        conv_state_indices=torch.tensor([2, -1]))
    (family, kw), = launches.calls
    assert family == "conv1d_verify" and kw["mode"] == "update" and kw["conv_state"] is state
    assert kw["xBC"].shape == (2, 1, 16) and kw["state_indices"].dtype == torch.int32 and kw["activation"] is None
    assert out.shape == (2, 16)


def test_causal_conv1d_update_uses_the_last_columns_of_a_longer_state(launches):
    """state-spaces/mamba's cache keeps d_conv = width columns; the conv reads and writes the last width - 1."""
    state = torch.zeros(2, 16, 4)
    adapters.causal_conv1d_update(torch.zeros(2, 16), state, torch.ones(16, 4))
    (_, kw), = launches.calls
    assert kw["conv_state"].shape == (2, 16, 3) and kw["conv_state"].data_ptr() == state[..., 1:].data_ptr()


def test_backward_launches_ssd_bwd_with_the_forward_arguments(launches, monkeypatch):
    monkeypatch.setattr(adapters.runtime, "workspace_size", lambda family, **kw: 4096)
    leaves = dict(x=torch.zeros(1, 8, 4, 64, dtype=torch.bfloat16, requires_grad=True),
                  D=torch.ones(4, requires_grad=True), initial_states=torch.zeros(1, 4, 64, 64, requires_grad=True))
    out, final = adapters.mamba_chunk_scan_combined(**_forward(**leaves), return_final_states=True)
    (out.float().sum() + final.sum()).backward()
    assert [family for family, _ in launches.calls] == ["ssd_fwd", "ssd_bwd"]
    assert launches.calls[0][1]["workspace"].numel() == 1024  # the forward's, for a split along L
    kw = launches.calls[1][1]
    assert kw["dfinal_states"].shape == (1, 4, 64, 64) and kw["dD"].shape == (4,) and "dz" not in kw
    assert kw["dinitial_states"].shape == (1, 4, 64, 64) and kw["workspace"].numel() == 1024
    assert kw["dout"].is_contiguous() and kw["initial_states"].dtype == torch.float32
    for name, leaf in leaves.items():
        assert leaf.grad is not None and leaf.grad.shape == leaf.shape and leaf.grad.dtype == leaf.dtype, name


def test_backward_maps_per_sequence_gradients_to_the_slot_they_read(launches, monkeypatch):
    """A row's initial state (1, H, P, N) with cu_seqlens starts sequence 0 only: its gradient is that sequence's."""
    monkeypatch.setattr(adapters.runtime, "workspace_size", lambda family, **kw: 4096)

    def launch(family, **kw):
        launches(family, **kw)
        if family == "ssd_bwd":  # as if the kernel wrote them: 1 for sequence 0, 2 for sequence 1
            kw["dinitial_states"].copy_(torch.arange(1.0, 3.0).view(2, 1, 1, 1))
    monkeypatch.setattr(adapters.runtime, "launch", launch)
    state = torch.zeros(1, 4, 64, 64, requires_grad=True)
    out, varlen = adapters.mamba_chunk_scan_combined(**_forward(initial_states=state),
                                                     cu_seqlens=torch.tensor([0, 3, 8], dtype=torch.int32),
                                                     return_varlen_states=True)
    out.float().sum().backward()
    kw = launches.calls[1][1]
    assert kw["initial_state_indices"].tolist() == [0, -1] and kw["dinitial_states"].shape == (2, 4, 64, 64)
    assert torch.equal(state.grad, torch.ones_like(state))


def test_views_the_kernels_cannot_vector_load_are_copied_as_triton_does(launches):
    x = torch.zeros(1, 64, 8, 4, dtype=torch.bfloat16).permute(0, 3, 2, 1)  # (1, 4, 8, 64): last dim strided
    adapters.mamba_chunk_scan_combined(**_forward(x=x, dt=torch.zeros(1, 4, 8, dtype=torch.bfloat16),
                                                  A=-torch.ones(8), B=torch.zeros(1, 4, 1, 64, dtype=torch.bfloat16),
                                                  C=torch.zeros(1, 4, 1, 64, dtype=torch.bfloat16)))
    (_, kw), = launches.calls
    assert kw["x"].is_contiguous() and kw["out"].is_contiguous() and kw["out"].shape == x.shape
    assert kw["B"].data_ptr() != 0


@pytest.mark.parametrize("batch,heads", [(0, 4), (1, 0)])
def test_backward_of_an_empty_call_gives_zero_sums_without_a_launch(launches, monkeypatch, batch, heads):
    # the gradients come back from _ssd_bwd_outputs filled with NaN, so only an explicit zero passes
    allocate = adapters._ssd_bwd_outputs
    monkeypatch.setattr(adapters, "_ssd_bwd_outputs", lambda *a: [g.fill_(float("nan")) for g in allocate(*a)])
    leaves = dict(x=torch.zeros(batch, 8, heads, 64, dtype=torch.bfloat16, requires_grad=True),
                  z=torch.zeros(batch, 8, heads, 64, dtype=torch.bfloat16, requires_grad=True),
                  A=torch.full((heads,), -1.0, requires_grad=True), D=torch.ones(heads, requires_grad=True),
                  dt_bias=torch.zeros(heads, requires_grad=True))
    out = adapters.mamba_chunk_scan_combined(**_forward(**leaves, dt=torch.zeros(batch, 8, heads, dtype=torch.bfloat16),
                                                        B=torch.zeros(batch, 8, 1, 64, dtype=torch.bfloat16),
                                                        C=torch.zeros(batch, 8, 1, 64, dtype=torch.bfloat16)))
    out.float().sum().backward()
    assert [family for family, _ in launches.calls] == ["ssd_fwd"]
    for name in ("A", "D", "dt_bias"):
        assert torch.equal(leaves[name].grad, torch.zeros(heads)), name
    assert leaves["x"].grad.shape == leaves["z"].grad.shape == (batch, 8, heads, 64)


def _decode_args(batch=2, slots=2, H=4, P=64, N=64):
    return (torch.zeros(slots, H, P, N), torch.zeros(batch, H, P, dtype=torch.bfloat16),
            torch.zeros(batch, H, dtype=torch.bfloat16), -torch.ones(H), torch.zeros(batch, 1, N, dtype=torch.bfloat16),
            torch.zeros(batch, 1, N, dtype=torch.bfloat16))


@pytest.mark.parametrize("change,argument", [
    (lambda a: (a[0][:1],) + a[1:], "state"),              # a slot short: row 1 would have been a padding row
    (lambda a: (a[0], a[1][:, :, None]) + a[2:], "x"),
    (lambda a: a[:4] + (a[4][:, :, None],) + a[5:], "B"),
])
def test_decode_refusals_name_the_argument(change, argument, launches):
    with pytest.raises(errors.ShapeError) as info:
        adapters.selective_state_update(*change(_decode_args()))
    assert info.value.argument == argument and not launches.calls


def test_decode_takes_x_z_B_C_without_their_middle_dim_as_state_spaces_mamba_does(launches):
    """One head's x / z or one group's B / C may drop that dim, whatever the state's rank."""
    state, x, dt, A, B, C = _decode_args(H=1)
    out = adapters.selective_state_update(state, x[:, 0], dt, A, B[:, 0], C[:, 0], z=x[:, 0])
    single = adapters.selective_state_update(state[:, 0], x, dt[:, 0, None].expand(2, 64), A, B, C)
    assert out.shape == (2, 1, 64) and single.shape == (2, 64)
    (_, kw), (_, kw_single) = launches.calls
    assert kw["x"].shape == kw["z"].shape == kw_single["x"].shape == (2, 1, 1, 64)
    assert kw["B"].shape == kw_single["C"].shape == (2, 1, 1, 64)


def test_conv_update_refuses_a_pool_short_of_the_batch_without_indices(launches):
    with pytest.raises(errors.ShapeError, match="^conv_state: 1 slots for a batch of 2") as info:
        adapters.causal_conv1d_update(torch.zeros(2, 16), torch.zeros(1, 16, 3), torch.ones(16, 4))
    assert info.value.argument == "conv_state" and not launches.calls


def test_chunk_scan_converts_int64_indices_as_the_conv_does(launches):
    adapters.mamba_chunk_scan_combined(**_forward(seq_idx=torch.zeros(1, 8, dtype=torch.int64)))
    adapters.mamba_chunk_scan_combined(**_forward(cu_seqlens=torch.tensor([0, 3, 8])), return_varlen_states=True)
    (_, packed_by_seq_idx), (_, packed_by_cu) = launches.calls
    assert packed_by_seq_idx["seq_idx"].dtype == packed_by_cu["cu_seqlens"].dtype == torch.int32
    assert packed_by_cu["cu_seqlens"].tolist() == [0, 3, 8]


@pytest.fixture
def cpu_as_cuda(monkeypatch, no_driver):  # noqa: F811
    """CPU tensors read as device 0's, so the runtime's own checks run on them (and nothing may be launched)."""
    names = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32", torch.int32: "int32",
             torch.int64: "int64"}
    monkeypatch.setattr(tensors, "_from_torch", lambda t, name, _: tensors.DeviceArray(
        name, t.data_ptr(), tuple(t.shape), t.stride(), names[t.dtype], 0))


@pytest.mark.parametrize("call,error,argument,message", [
    (lambda x, s, w: adapters.causal_conv1d_fn(x, w[:15]), errors.ShapeError, "weight", "weight: expected shape"),
    (lambda x, s, w: adapters.causal_conv1d_fn(x[..., :0], w), errors.ShapeError, "x",
     "(of x.transpose(1, 2), the (batch, L, dim) view the kernel reads)"),
    (lambda x, s, w: adapters.causal_conv1d_update(x[..., 0], s, w,
                                                   conv_state_indices=torch.zeros(3, dtype=torch.int32)),
     errors.ShapeError, "conv_state_indices", "conv_state_indices: expected shape (2,)"),
    (lambda x, s, w: adapters.selective_state_update(*_decode_args(), state_batch_indices=torch.zeros(3)),
     errors.DTypeError, "state_batch_indices", "state_batch_indices: expected dtype int32"),
    (lambda x, s, w: adapters.causal_conv1d_fn(x, w, seq_idx=torch.zeros(2, 5, dtype=torch.int32)),  # another's
     errors.ShapeError, "seq_idx", "seq_idx: expected shape (2, 9) (batch, seqlen) of x, got (2, 5)"),
])
def test_runtime_refusals_use_the_drop_ins_names(call, error, argument, message, cpu_as_cuda):
    """The runtime's own checks, on the arrays the drop-ins hand it (xBC, conv_weight, state_indices), name the
    caller's arguments."""
    x, state, weight = torch.zeros(2, 16, 9), torch.zeros(2, 16, 3), torch.ones(16, 4)
    with pytest.raises(error) as info:
        call(x, state, weight)
    assert info.value.argument == argument and message in str(info.value)
    assert "xBC" not in str(info.value) and "conv_weight" not in str(info.value)


def test_a_cpu_tensor_is_named_as_the_caller_passed_it():
    with pytest.raises(errors.DeviceError, match="^x: expected a CUDA tensor") as info:
        adapters.causal_conv1d_fn(torch.zeros(2, 16, 9), torch.ones(16, 4))
    assert info.value.argument == "x"


def test_the_checks_trace_whole_under_torch_compile(launches):
    """torch.compile(fullgraph=True) traces each drop-in, its argument checks included (a graph break raises), and the
    compiled calls hand the runtime what the eager ones do."""
    conv_x, conv_state, weight = torch.zeros(2, 16, 9), torch.zeros(2, 16, 4), torch.ones(16, 4)

    def calls():   # (returning the outputs, which the compiled graph would otherwise drop with their ops)
        return (adapters.mamba_chunk_scan_combined(**_forward(dt_limit=(0.0, 10.0),
                                                              seq_idx=torch.zeros(1, 8, dtype=torch.int64))),
                adapters.causal_conv1d_fn(conv_x, weight, return_final_states=True,
                                          final_states_out=torch.empty(2, 16, 3)),
                adapters.causal_conv1d_update(conv_x[..., 0], conv_state, weight,
                                              conv_state_indices=torch.tensor([1, 0])),
                adapters.selective_state_update(*_decode_args(), state_batch_indices=torch.tensor([1, 0])))

    def summary(recorded):
        return sorted(((family, {k: (tuple(v.shape), v.dtype) if isinstance(v, torch.Tensor) else v
                                 for k, v in kw.items()}) for family, kw in recorded),
                      key=lambda call: call[0])   # (the compiled graph may order independent ops otherwise)

    calls()
    eager = summary(launches.calls)
    launches.calls.clear()
    torch.compile(calls, fullgraph=True, backend="aot_eager")()
    assert [family for family, _ in eager] == ["conv1d_fwd", "conv1d_verify", "ssd_fwd", "verify"]
    assert summary(launches.calls) == eager


@pytest.mark.parametrize("call,error,argument", [
    (lambda: adapters.mamba_chunk_scan_combined(**_forward(dt_limit=(1.0, 0.5))), errors.InvalidArgumentError,
     "dt_limit"),
    (lambda: adapters.mamba_chunk_scan_combined(**_forward(chunk_size=0)), errors.InvalidArgumentError, "chunk_size"),
    (lambda: adapters.causal_conv1d_fn(torch.zeros(2, 16, 9), torch.ones(16, 4), return_final_states=True,
                                       seq_idx=torch.zeros(2, 9, dtype=torch.int32)),
     errors.InvalidArgumentError, "return_final_states"),
    (lambda: adapters.causal_conv1d_update(torch.zeros(2, 16), torch.zeros(1, 16, 3), torch.ones(16, 4)),
     errors.ShapeError, "conv_state"),
    (lambda: adapters.selective_state_update(*_decode_args(slots=1)), errors.ShapeError, "state"),
    (lambda: adapters.causal_conv1d_fn(torch.zeros(2, 16, 9), torch.ones(16, 4), return_final_states=True,
                                       final_states_out=torch.empty(2, 16, 2)), errors.ShapeError, "final_states_out"),
    (lambda: adapters.causal_conv1d_update(torch.zeros(2, 16), torch.zeros(2, 16, 3), torch.ones(16, 4),
                                           conv_state_indices=torch.zeros(3, dtype=torch.int32)),
     errors.ShapeError, "conv_state_indices"),
])
def test_refusals_keep_their_type_under_torch_compile_fullgraph(call, error, argument, cpu_as_cuda):
    """Value checks run inside the ops (here the runtime's own, on CPU tensors read as CUDA ones): a refusal raised
    while tracing would reach the caller as the compiler's Unsupported instead."""
    torch._dynamo.reset()
    with pytest.raises(error) as info:
        torch.compile(call, fullgraph=True, backend="aot_eager")()
    assert info.value.argument == argument


def test_final_states_out_is_written_under_dynamic_shapes(monkeypatch):
    """final_states_out goes through the op (a mutated argument): compiled with dynamic shapes, each batch size's
    states land in the caller's tensor (its checks on symbolic sizes failed the trace when they ran outside)."""
    def launch(family, **kw):   # the kernel's writes, as constants
        kw["out"].fill_(1.0)
        kw["final_states"].fill_(2.0)
    monkeypatch.setattr(adapters.runtime, "launch", launch)
    conv = torch.compile(lambda x, states: adapters.causal_conv1d_fn(x, torch.ones(16, 4), return_final_states=True,
                                                                     final_states_out=states),
                         fullgraph=True, backend="aot_eager", dynamic=True)
    for batch in (2, 3, 5):
        states = torch.zeros(batch, 16, 3)
        out, final = conv(torch.zeros(batch, 16, 9), states)
        assert final is states and torch.equal(states, torch.full_like(states, 2.0)) and torch.equal(out, out * 0 + 1)
