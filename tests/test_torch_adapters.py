"""mamba2_aot.torch on the CPU: what the drop-ins refuse, before anything reaches the runtime."""
import pytest

torch = pytest.importorskip("torch")

from mamba2_aot import errors  # noqa: E402
from mamba2_aot import torch as adapters  # noqa: E402


def _forward(**over):
    args = dict(x=torch.zeros(1, 8, 4, 64, dtype=torch.bfloat16), dt=torch.zeros(1, 8, 4, dtype=torch.bfloat16),
                A=-torch.ones(4), B=torch.zeros(1, 8, 1, 64, dtype=torch.bfloat16),
                C=torch.zeros(1, 8, 1, 64, dtype=torch.bfloat16), chunk_size=64)
    args.update(over)
    return args


def test_gradients_are_refused_until_the_backward_exists():
    with pytest.raises(NotImplementedError, match="ssd_bwd"):
        adapters.mamba_chunk_scan_combined(**_forward(x=torch.zeros(1, 8, 4, 64, requires_grad=True)))


@pytest.mark.parametrize("over,argument", [
    ({"return_varlen_states": True}, "cu_seqlens"),
    ({"seq_idx": torch.zeros(1, 8, dtype=torch.int32), "return_final_states": True}, "return_final_states"),
    ({"state_dtype": torch.int32}, "state_dtype"),
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
