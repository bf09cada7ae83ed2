"""The register layouts ssd_fwd_paired's register-operand products (build experiment ``fwd_register_operands``) rely on,
checked without a GPU: ``tests/operand_layouts_probe.py`` evaluates them at trace time and counts."""
import json
import os
import subprocess
import sys

import pytest

from conftest import ROOT

pytest.importorskip("cutlass", reason="the layout probe needs the CuTe DSL (requirements/build.txt)")


@pytest.fixture(scope="module")
def counts():
    proc = subprocess.run([sys.executable, str(ROOT / "tests" / "operand_layouts_probe.py")], cwd=ROOT,
                          capture_output=True, text=True, env={**os.environ, "CUTE_DSL_ARCH": "sm_90a"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_an_a_operands_values_sit_where_the_accumulators_do(counts):
    """Every thread's A operand value e (K 64 and 128) is at the coordinates of the m64nK accumulator's value e."""
    assert counts["index"]["equal"] == counts["index"]["of"] == [128 * 32, 128 * 64]


def test_transposing_ldmatrix_delivers_x_transposed_as_the_a_operand(counts):
    """What each lane receives from ``load_operand``'s ldmatrix (.trans) is the A layout's (p, j); the
    non-transposing delivery of the same addresses is not (so the comparison can fail)."""
    assert counts["ldmatrix"] == [4096, 0]
    assert counts["ldmatrix_control"][1] > 0


def test_transposing_stmatrix_stages_y_transposed_as_y(counts):
    """yᵀ's accumulator stored with stmatrix (.trans) through y's transposed view puts yᵀ[p, i] at y's (i, p); the
    non-transposing placement would not."""
    assert counts["stmatrix"] == [4096, 0]
    assert counts["stmatrix_control"][1] > 0
