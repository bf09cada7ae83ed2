"""Build-time checks on a compiled cubin: target architecture, kernel symbol, parameter table, resources, and
warpgroup MMAs left asynchronous.

Each check raises :class:`CubinCheckError` with a message that says what was expected. The parameter
table is read from the cubin's own ``.nv.info.<kernel>`` section (EIATTR_KPARAM_INFO records), register,
stack, local and shared memory use from ``cuobjdump -res-usage``, the instructions from ``cuobjdump -sass`` (the
``nvidia-cuda-cuobjdump`` package).
"""
from __future__ import annotations

import io
import re
import struct
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from elftools.elf.elffile import ELFFile

# ELF e_flags of an sm_XYa cubin (arch-specific targets, as cute.compile --gpu-arch emits them).
ARCH_E_FLAGS = {
    "sm_80": 0x00500550,
    "sm_90a": 0x005A0D5A,
    "sm_100a": 0x0600640A,
    "sm_103a": 0x0600670A,
    "sm_120a": 0x0600780A,
}

# Shared memory one CTA may use (static + dynamic, bytes), by target.
SMEM_LIMIT = {"sm_80": 166912, "sm_90a": 232448, "sm_100a": 232448, "sm_103a": 232448, "sm_120a": 101376}

# The static shared memory the DSL gives every kernel that has dynamic shared memory (the cubin's .nv.shared.<kernel>
# section, at nvidia-cutlass-dsl 4.8.1), which check_resources counts against SMEM_LIMIT. (ncu's occupancy on sm_90a
# charged a CTA this kilobyte once, not on top of the driver's 1 KB reservation: the limit may be 1 KB conservative.)
DSL_STATIC_SMEM = 1024

# Undefined symbols the driver resolves at load time; anything else would fail to load.
DRIVER_SYMBOLS = {"vprintf", "__assertfail"}

_EIFMT_NVAL, _EIFMT_BVAL, _EIFMT_HVAL, _EIFMT_SVAL = 1, 2, 3, 4
_EIATTR_KPARAM_INFO = 0x17


class CubinCheckError(Exception):
    """A compiled cubin does not match what the build asked for."""


@dataclass(frozen=True)
class Resources:
    registers: int
    stack: int
    local: int
    static_smem: int


def _elf(cubin: bytes) -> ELFFile:
    return ELFFile(io.BytesIO(cubin))


def check_arch(cubin: bytes, arch: str) -> None:
    """The ELF header's e_flags must be those of ``arch`` (e.g. ``sm_90a``)."""
    if arch not in ARCH_E_FLAGS:
        raise CubinCheckError(f"no known ELF flags for arch {arch!r}; known: {sorted(ARCH_E_FLAGS)}")
    flags = _elf(cubin).header.e_flags
    if flags != ARCH_E_FLAGS[arch]:
        found = [a for a, f in ARCH_E_FLAGS.items() if f == flags]
        raise CubinCheckError(
            f"cubin ELF flags {flags:#010x} ({found[0] if found else 'unknown arch'}) do not match the "
            f"requested arch {arch} ({ARCH_E_FLAGS[arch]:#010x})")


def check_symbols(cubin: bytes, kernel: str) -> None:
    """``kernel`` must be a defined global function; undefined symbols only the driver's own."""
    symtab = _elf(cubin).get_section_by_name(".symtab")
    entries = [] if symtab is None else list(symtab.iter_symbols())
    defined = {s.name for s in entries if s["st_info"]["type"] == "STT_FUNC" and s["st_shndx"] != "SHN_UNDEF"}
    if kernel not in defined:
        raise CubinCheckError(f"kernel symbol {kernel!r} is not defined in the cubin (defined: {sorted(defined)})")
    # The .nv.reservedSmem.* objects are placeholders the driver fills in; functions must all be defined.
    undefined = {s.name for s in entries if s.name and s["st_shndx"] == "SHN_UNDEF"
                 and s["st_info"]["type"] != "STT_OBJECT"} - DRIVER_SYMBOLS
    if undefined:
        raise CubinCheckError(f"cubin has undefined functions {sorted(undefined)}; only {sorted(DRIVER_SYMBOLS)} "
                              "are resolved by the driver")


def kernel_params(cubin: bytes, kernel: str) -> list[tuple[int, int, int]]:
    """The cubin's parameter table for ``kernel``: ``[(ordinal, offset, size)]`` sorted by ordinal."""
    section = _elf(cubin).get_section_by_name(f".nv.info.{kernel}")
    if section is None:
        raise CubinCheckError(f"cubin has no .nv.info.{kernel} section")
    data, pos, params = section.data(), 0, []
    while pos < len(data):
        fmt, attr = data[pos], data[pos + 1]
        pos += 2
        if fmt == _EIFMT_SVAL:
            (size,) = struct.unpack_from("<H", data, pos)
            payload = data[pos + 2:pos + 2 + size]
            pos += 2 + size
            if attr == _EIATTR_KPARAM_INFO:
                _index, ordinal, offset, packed = struct.unpack_from("<IHHI", payload)
                params.append((ordinal, offset, (packed >> 18) & 0x3FFF))
        elif fmt in (_EIFMT_NVAL, _EIFMT_BVAL, _EIFMT_HVAL):  # records are 4-byte units: value or padding
            pos += 2
        else:
            raise CubinCheckError(f"unknown .nv.info record format {fmt} in {section.name}")
    return sorted(params)


def check_params(cubin: bytes, kernel: str, expected: list[dict]) -> None:
    """The manifest's param rows (``name``, ``kind``, ``size``, ``offset``) must equal the cubin's table."""
    actual = [(offset, size) for _ordinal, offset, size in kernel_params(cubin, kernel)]
    wanted = [(row["offset"], row["size"]) for row in expected]
    if actual != wanted:
        lines = [f"  {i}: manifest {row['name']} ({row['kind']}) offset {row['offset']} size {row['size']}"
                 for i, row in enumerate(expected)]
        raise CubinCheckError("manifest param list does not match the cubin's parameter table\n"
                              f"  cubin (offset, size): {actual}\n" + "\n".join(lines))


def _cuobjdump(cubin: bytes, cuobjdump: str, option: str) -> str:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "kernel.cubin"
        path.write_bytes(cubin)
        done = subprocess.run([cuobjdump, option, str(path)], capture_output=True, text=True)
    if done.returncode:  # (-sass needs nvdisasm beside it: the nvidia-cuda-nvdisasm wheel of requirements/build.txt)
        raise RuntimeError(f"cuobjdump {option} failed: {done.stderr.strip()}")
    return done.stdout


def sass(cubin: bytes, cuobjdump: str) -> str:
    """The cubin's instructions, as ``cuobjdump -sass`` lists them."""
    return _cuobjdump(cubin, cuobjdump, "-sass")


def resources(cubin: bytes, kernel: str, cuobjdump: str) -> Resources:
    """Registers, stack frame, local memory and static shared memory of ``kernel``, from cuobjdump."""
    report = _cuobjdump(cubin, cuobjdump, "-res-usage")
    block = report.split(f"Function {kernel}:", 1)
    if len(block) != 2:
        raise CubinCheckError(f"cuobjdump -res-usage reports no function {kernel!r}")
    values = dict(re.findall(r"(REG|STACK|SHARED|LOCAL):(\d+)", block[1].split("Function ", 1)[0]))
    return Resources(int(values["REG"]), int(values["STACK"]), int(values["LOCAL"]), int(values["SHARED"]))


def check_resources(res: Resources, arch: str, dynamic_smem: int) -> None:
    """No spills or local memory; static + dynamic shared memory within the arch's per-CTA limit."""
    if res.stack or res.local:
        raise CubinCheckError(f"kernel spills or uses local memory (stack {res.stack} B, local {res.local} B)")
    if res.static_smem + dynamic_smem > SMEM_LIMIT[arch]:
        raise CubinCheckError(f"shared memory {res.static_smem} static + {dynamic_smem} dynamic bytes exceeds "
                              f"the {SMEM_LIMIT[arch]} B limit of {arch}")


def check_register_budget(res: Resources, needed: int) -> None:
    """A warp-specialized kernel's ``setmaxnreg`` shares fit the registers its launch gets (``needed`` per thread:
    the shares' average). setmaxnreg only moves registers among the CTA's own warps, and an increase waits until
    decreases have freed enough: with fewer, the warps asking for more would wait forever (a hang, not an error)."""
    if res.registers < needed:
        raise CubinCheckError(f"the launch gives {res.registers} registers per thread, the warps' setmaxnreg shares "
                              f"need {needed} on average: the increasing warps would wait forever")


def check_wgmma_pipelined(instructions: str) -> None:
    """ptxas kept the warpgroup MMAs asynchronous (``instructions``: the SASS). When it cannot prove an in-flight
    wgmma's accumulators untouched until its wait (accumulator registers written while another product runs, or a
    product issued under a branch whose wait is after it), ptxas waits after every wgmma of the kernel (its advisory
    C7515, which the DSL's in-process assembler does not show): a ``WARPGROUP.DEPBAR`` per ``HGMMA``, ~7 % of
    ssd_bwd_chunk's time when it happened. Its narrower fallback, one wait injected at one spot (C7517 / C7519), is
    not caught here."""
    mmas = len(re.findall(r"\bHGMMA\.", instructions))
    waits = len(re.findall(r"\bWARPGROUP\.DEPBAR\b", instructions))
    if mmas and waits >= mmas:
        raise CubinCheckError(f"ptxas serialized the warpgroup MMAs ({mmas} HGMMA, {waits} WARPGROUP.DEPBAR): an "
                              "accumulator is written or a product issued conditionally while another one runs")
