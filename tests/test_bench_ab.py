"""bench/ab.py's command line, round order and report (the measuring itself needs a GPU), on made-up results."""
import sys

import pytest

from conftest import ROOT

sys.path.insert(0, str(ROOT / "bench"))
ab = pytest.importorskip("ab", reason="bench/ab.py needs torch")


def test_directories_are_labelled_in_order_and_whole_numbers_are_shape_positions():
    assert ab.builds_and_positions(["gpu/base", "gpu/x", "3", "gpu/y", "0"]) == (
        {"A": "gpu/base", "B": "gpu/x", "C": "gpu/y"}, [3, 0])
    builds, positions = ab.builds_and_positions(["gpu/base", "gpu/x"])
    assert positions == list(range(len(ab.REFERENCE_SHAPES)))
    with pytest.raises(ValueError, match="expected 2 to 26 cubin directories"):
        ab.builds_and_positions(["gpu/base", "1"])
    with pytest.raises(ValueError, match="reference shapes"):
        ab.builds_and_positions(["gpu/base", "gpu/x", str(len(ab.REFERENCE_SHAPES))])


def test_every_build_runs_first_equally_often():
    assert [ab.round_order(["A", "B"], r) for r in range(3)] == [["A", "B"], ["B", "A"], ["A", "B"]]
    firsts = [ab.round_order(["A", "B", "C"], r)[0] for r in range(6)]
    assert sorted(firsts) == ["A", "A", "B", "B", "C", "C"]
    assert all(sorted(ab.round_order(["A", "B", "C"], r)) == ["A", "B", "C"] for r in range(6))


def _result(us, kernel_us, digest):
    return [{"us": us, "kernels": {"ssd_fwd_paired": kernel_us}, "digests": {"out": digest}}]


def test_the_report_gives_each_build_against_the_baseline_and_its_outputs():
    runs = {"A": [_result(100.0, 80.0, "aa"), _result(102.0, 82.0, "aa")],
            "B": [_result(90.0, 70.0, "aa"), _result(92.0, 72.0, "aa")],
            "C": [_result(110.0, 90.0, "bb"), _result(111.0, 91.0, "cc")]}
    text = ab.report("ssd_fwd", [0], runs)
    assert ab.REFERENCE_SHAPES[0].name in text
    assert "ssd_fwd A:    101.0 us  rounds 100.0 / 102.0" in text
    assert "ssd_fwd B:     91.0 us  (-9.9 % against A)  rounds 90.0 / 92.0" in text
    assert "ssd_fwd C:    110.5 us  (+9.4 % against A)  rounds 110.0 / 111.0" in text
    assert "outputs A vs B: bitwise equal" in text
    assert "outputs A vs C: DIFFER" in text
    assert "NOT DETERMINISTIC: build C's outputs differ between rounds" in text
    assert "NOT DETERMINISTIC: build A" not in text and "NOT DETERMINISTIC: build B" not in text
