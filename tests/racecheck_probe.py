"""Four small kernels that show what compute-sanitizer's racecheck (2025.3.1) makes of named-barrier hand-offs.

ssd_fwd_paired hands shared-memory tiles between warpgroups with ``barrier.cta.arrive`` on one side and
``barrier.cta.sync`` on the other, the barriers reused block after block. PTX orders such a hand-off (an arrive
synchronizes with the sync that completes the same barrier instance), yet racecheck reports hazards on it. These
kernels reproduce that with nothing else around: one CTA of three warpgroups, threads 0-127 write 256 floats of
shared memory, threads 320-383 read them (four rounds but in ``handoff``), each reader's sum over the rounds checked on
the host.

- ``handoff``: one round; the writers arrive, the readers sync. Racecheck: clean.
- ``ping_pong``: four rounds; the readers arrive on barrier FREE first and again when done reading each round but the
  last, the writers sync on it before writing, then arrive on barrier STAGED, which the readers sync on
  (ssd_fwd_paired's Y_FREE / Y_STAGED). Racecheck: RAW hazards.
- ``ping_pong_synced``: as ping_pong, every arrive a sync. Racecheck: clean.
- ``ping_pong_synced_plus_arrive``: as ping_pong_synced, plus one arrive per round by the writers on a third barrier
  that the readers sync on (it orders nothing the synced barriers do not). Racecheck: WAR hazards on the data that
  the synced barriers order: an arrive per round on another barrier makes racecheck lose track of them.

Build the cubins where CuTe DSL is installed, then run each under the sanitizer on the GPU (needs torch with CUDA and
the runtime's driver layer; results for compute-sanitizer 2025.3.1 in docs/PERF_NOTES.md, twenty-seventh session)::

    PYTHONPATH=. python tests/racecheck_probe.py build DIR
    PYTHONPATH=runtime compute-sanitizer --tool racecheck python tests/racecheck_probe.py run DIR ping_pong
"""
import sys
from pathlib import Path

MODES = ("handoff", "ping_pong", "ping_pong_synced", "ping_pong_synced_plus_arrive")
WRITERS, READERS, FIRST_READER = 128, 64, 320
VALUES = 2 * WRITERS
ROUNDS = 4
FREE, STAGED, EXTRA = 4, 5, 7   # named barrier ids (0 is __syncthreads)
COUNT = WRITERS + READERS


def round_count(mode):
    return 1 if mode == "handoff" else ROUNDS


def expected_sums(mode):
    """Each reader's sum over the rounds: round k's value i is i + k."""
    per_reader = VALUES // READERS
    return [sum(r * per_reader + i + k for i in range(per_reader) for k in range(round_count(mode)))
            for r in range(READERS)]


def _define_kernel():
    import cutlass
    import cutlass.cute as cute
    from cutlass import Float32

    from kernel_src.abi import bind, ptr
    from kernel_src.ssd_tiles import role_arrive, role_sync

    class RacecheckProbe:
        family = "racecheck_probe"
        grid_rule = "1"

        def __init__(self, mode: str):
            self.mode = mode
            self.block = (384, 1, 1)
            self.cluster = (1, 1, 1)
            self.dynamic_smem = VALUES * 4

        def params(self):
            return [ptr("out", "fp32")]

        @cute.jit
        def __call__(self, args: tuple, stream):
            self.kernel(args).launch(grid=[1, 1, 1], block=list(self.block), smem=self.dynamic_smem, stream=stream)

        def _hand_over(self, barrier):
            """This side's end of a hand-off on ``barrier``: an arrive, or a sync in the synced modes."""
            if self.mode.startswith("ping_pong_synced"):
                role_sync(barrier, COUNT)
            else:
                role_arrive(barrier, COUNT)

        @cute.kernel
        def kernel(self, args: tuple):
            a = bind(self.params(), args)
            values = cutlass.utils.SmemAllocator().allocate_tensor(Float32, cute.make_layout((VALUES,)), 16)
            out = cute.make_tensor(a.out, cute.make_layout((READERS,)))
            rounds = round_count(self.mode)
            tid = cute.arch.thread_idx()[0]
            if tid < WRITERS:
                for k in cutlass.range_constexpr(rounds):
                    if cutlass.const_expr(rounds > 1):
                        role_sync(FREE, COUNT)
                    for i in cutlass.range_constexpr(2):
                        values[2 * tid + i] = Float32(2 * tid + i + k)
                    if cutlass.const_expr(self.mode == "ping_pong_synced_plus_arrive"):
                        role_arrive(EXTRA, COUNT)
                    self._hand_over(STAGED)
            elif tid >= FIRST_READER:
                r = tid - FIRST_READER
                total = Float32(0.0)
                if cutlass.const_expr(rounds > 1):
                    self._hand_over(FREE)
                for k in cutlass.range_constexpr(rounds):
                    if cutlass.const_expr(self.mode == "ping_pong_synced_plus_arrive"):
                        role_sync(EXTRA, COUNT)
                    role_sync(STAGED, COUNT)
                    for i in cutlass.range_constexpr(VALUES // READERS):
                        total = total + values[r * (VALUES // READERS) + i]
                    if cutlass.const_expr(k < rounds - 1):
                        self._hand_over(FREE)
                out[r] = total

    return RacecheckProbe


def build(directory: Path):
    import json

    from kernel_src import families
    from kernel_src.compile_variant import compile_variant
    sys.modules[__name__].RacecheckProbe = _define_kernel()  # (the class needs CuTe DSL: defined only to build)
    families.FAMILIES["racecheck_probe"] = f"{__name__}:RacecheckProbe"
    directory.mkdir(parents=True, exist_ok=True)
    for mode in MODES:
        cubin, entry = compile_variant("racecheck_probe", {"mode": mode}, "sm_90a")
        (directory / f"{mode}.cubin").write_bytes(cubin)
        (directory / f"{mode}.json").write_text(json.dumps(entry))


def run(directory: Path, mode: str):
    import json

    import torch
    from mamba2_aot import driver, manifest
    from mamba2_aot.dispatch import ParamPacker
    entry = json.loads((directory / f"{mode}.json").read_text())
    out = torch.zeros(READERS, device="cuda")
    drv = driver.get()
    torch.cuda.synchronize()
    image = (directory / f"{mode}.cubin").read_bytes()  # (the library keeps a pointer to it: alive until the end)
    kernel = drv.library_get_kernel(drv.library_load_data(image), entry["kernel"])
    packer = ParamPacker(tuple(manifest.Param(**row) for row in entry["params"]))
    attrs, num_attrs = driver.launch_attributes((1, 1, 1))
    drv.launch(drv.kernel_function(kernel), (1, 1, 1), tuple(entry["block"]), entry["dynamic_smem"],
               torch.cuda.current_stream().cuda_stream, attrs, num_attrs,
               packer.load(packer.pack({"out": out.data_ptr()})))
    torch.cuda.synchronize()
    assert out.tolist() == expected_sums(mode), f"{mode}: wrong values"
    print(f"{mode}: values right")


if __name__ == "__main__":
    command, directory = sys.argv[1], Path(sys.argv[2])
    build(directory) if command == "build" else run(directory, sys.argv[3])
