"""Write bench/README.md and bench/speedup.png from the results in bench/results/*.json (as bench/run.py writes
them). Runs anywhere (no GPU); the plot needs matplotlib (requirements/bench.txt).

    python bench/report.py
"""
from __future__ import annotations

import json
import math
from pathlib import Path

HERE = Path(__file__).parent


def _us(value) -> str:
    return "–" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.1f}"


def _triton(row: dict) -> dict:
    return row.get("triton") or {}


def _ratio(row: dict) -> str:
    t = _triton(row).get("us")
    return "–" if t is None else f"{t / row['ours']['us']:.2f}x"


def provenance_line(d: dict) -> str:
    p = d["provenance"]
    driver = str(p.get("driver", "?")).split()[0]
    dsl = sorted({f"{t.get('cutlass_dsl')} ({t.get('cuda_flavour')})" for t in p.get("cubins", {}).values()})
    return (f"{p['gpu']}, driver {driver}, CUDA {p['cuda']}, torch {p['torch']}, Triton {p.get('triton', '-')}, "
            f"cubins from CuTe DSL {', '.join(dsl) or '?'}, "
            f"mamba2_aot {p['mamba2_aot']} at {str(p['git_revision'])[:12]}{' (dirty)' if p['git_dirty'] else ''}; "
            f"`{p['command']}`; SM copy bandwidth {d['copy_bandwidth_GBps']:.0f} GB/s."
            + (f" Note: {p['provenance_note']}." if p.get("provenance_note") else ""))


def ssd_fwd_section(rows: list) -> list[str]:
    lines = ["### ssd_fwd vs `mamba_chunk_scan_combined` (forward), bf16, fp32 final states", "",
             "| shape | Triton µs (eager) | ours µs (eager) | speedup | after a GEMM: Triton / ours µs (speedup) | "
             "floor µs | % of roofline | workspace ours / Triton |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        t, o = _triton(r), r["ours"]
        ws_t = t.get("workspace_bytes")
        t_gemm, o_gemm = t.get("after_gemm_us"), o.get("after_gemm_us")
        gemm_ratio = "–" if t_gemm is None or o_gemm is None else f"{t_gemm / o_gemm:.2f}x"
        lines.append(f"| {r['shape']} | {_us(t.get('us'))} ({_us(t.get('eager_us'))}) | {_us(o['us'])} "
                     f"({_us(o['eager_us'])}) | {_ratio(r)} | {_us(t_gemm)} / {_us(o_gemm)} ({gemm_ratio}) | "
                     f"{_us(r['floor_us'])} | "
                     f"{100 * r['roofline_fraction']:.0f}% | {o['workspace_bytes'] / 1e6:.1f} MB / "
                     f"{'–' if ws_t is None else f'{ws_t / 1e6:.1f} MB'} |")
    return lines + [""]


def ssd_bwd_section(rows: list) -> list[str]:
    lines = ["### ssd_fwd + ssd_bwd vs `mamba_chunk_scan_combined` forward + backward, bf16", "",
             "| shape | Triton fwd+bwd µs | ours fwd+bwd µs | speedup | Triton bwd µs | ours bwd µs | bwd floor µs | "
             "workspace ours |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        t, o = _triton(r), r["ours"]
        lines.append(f"| {r['shape']} | {_us(t.get('us'))} | {_us(o['us'])} | {_ratio(r)} | "
                     f"{_us(t.get('backward_us'))} | {_us(o['backward_us'])} | {_us(r['backward_floor_us'])} | "
                     f"{o['workspace_bytes'] / 1e6:.1f} MB |")
    return lines + [""]


def chunk_cumsum_section(rows: list) -> list[str]:
    lines = ["### ssd_chunk_cumsum vs Triton's `_chunk_cumsum_fwd`, bf16 dt, fp32 outputs", "",
             "| shape | Triton µs (eager) | ours µs (eager) | speedup | floor µs | % of roofline |",
             "|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        t, o = _triton(r), r["ours"]
        lines.append(f"| {r['shape']} | {_us(t.get('us'))} ({_us(t.get('eager_us'))}) | {_us(o['us'])} "
                     f"({_us(o['eager_us'])}) | {_ratio(r)} | {_us(r['floor_us'])} | "
                     f"{100 * r['roofline_fraction']:.0f}% |")
    return lines + [""]


def verify_section(v: dict) -> list[str]:
    s = v["shape"]
    lines = [f"### verify: H{s['H']} P{s['P']} N{s['N']} G{s['G']}, bf16 activations, fp32 pool", "",
             "Triton: `selective_state_update` (T calls for T > 1). µs, roofline % in brackets; eager wall time for "
             "T = 1 update.", "",
             "| batch | T | Triton (eager) | update (eager) | snapshot | compact (fold T rows) | compact, no fold | "
             "update vs Triton | snapshot / compact |", "|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]

    def pct(mode):
        return f"{mode['us']:.1f} ({100 * mode['floor_us'] / mode['us']:.0f}%)"

    for r in v["rows"]:
        u, t = r["update"], _triton(r)
        eager = f" ({_us(u.get('eager_us'))})" if r["T"] == 1 else ""
        t_eager = f" ({_us(t.get('eager_us'))})" if r["T"] == 1 and t else ""
        ratio = "–" if not t else f"{t['us'] / u['us']:.2f}x"
        lines.append(f"| {r['batch']} | {r['T']} | {_us(t.get('us'))}{t_eager} | {pct(u)}{eager} | "
                     f"{pct(r['snapshot'])} | {pct(r['compact'])} | {_us(r['compact_no_fold']['us'])} | {ratio} | "
                     f"{r['snapshot']['us'] / r['compact']['us']:.2f}x |")
    return lines + [""]


def conv_section(c: dict) -> list[str]:
    s = c["shape"]
    lines = [f"### fused conv + SSM verify vs the pair: H{s['H']} P{s['P']} N{s['N']} G{s['G']}, conv width {s['K']}, "
             "bf16 activations and conv pool, fp32 SSM pool", "",
             "pair = `conv1d_verify` then `verify` on column views of its output; (conv) = the pair's conv alone; "
             "µs; saving = pair − fused (negative: the fused call is slower).", "",
             "| batch | mode | T | pair | (conv) | fused | saving |", "|---:|---|---:|---:|---:|---:|---:|"]
    for r in c["rows"]:
        lines.append(f"| {r['batch']} | {r['mode']} | {r['T']} | {_us(r['pair_us'])} | {_us(r['conv_us'])} | "
                     f"{_us(r['fused_us'])} | {_us(r['saving_us'])} |")
    return lines + [""]


def scaling_section(sc: dict) -> list[str]:
    lines = ["### Scaling", "", "ssd_fwd (H64 P64 N128 G1 Q256, ours): cost against the work.", "",
             "| shape | µs | µs per 1k tokens | % of roofline |", "|---|---:|---:|---:|"]
    for r in sc["ssd_fwd_by_L"] + sc["ssd_fwd_by_batch"]:
        tokens = r["batch"] * r["L"]
        lines.append(f"| {r['shape']} | {_us(r['ours']['us'])} | {r['ours']['us'] / tokens * 1e3:.2f} | "
                     f"{100 * r['roofline_fraction']:.0f}% |")
    lines += ["", "Decode (verify update, T = 1, H128 P64 N128 G8, fp32 pool):", "",
              "| batch | Triton µs | ours µs | % of roofline | ours vs Triton |", "|---:|---:|---:|---:|---:|"]
    for r in sc["decode_by_batch"]:
        u, t = r["update"], _triton(r)
        ratio = "–" if not t else f"{t['us'] / u['us']:.2f}x"
        lines.append(f"| {r['batch']} | {_us(t.get('us'))} | {u['us']:.1f} | {100 * u['floor_us'] / u['us']:.0f}% | "
                     f"{ratio} |")
    return lines + [""]


def plot(d: dict, path: Path) -> bool:
    """Speedup over Triton and % of roofline per shape (ssd_fwd reference shapes, T = 1 decode)."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed (requirements/bench.txt): no plot")
        return False
    labels, speedups, roofline = [], [], []
    for r in d.get("ssd_fwd", []):
        labels.append("fwd " + r["shape"].split(" (")[0])
        speedups.append(_triton(r).get("us", math.nan) / r["ours"]["us"])
        roofline.append(100 * r["roofline_fraction"])
    for r in d.get("verify", {}).get("rows", []):
        if r["T"] == 1:
            labels.append(f"decode b{r['batch']}")
            speedups.append(_triton(r).get("us", math.nan) / r["update"]["us"])
            roofline.append(100 * r["update"]["floor_us"] / r["update"]["us"])
    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(10, 7), sharex=True)
    ax1.bar(labels, speedups, color="tab:blue")
    ax1.axhline(1.0, color="black", linewidth=0.8)
    ax1.set_ylabel("speedup over Triton (x)")
    ax2.bar(labels, roofline, color="tab:green")
    ax2.set_ylabel("% of HBM roofline")
    ax2.set_ylim(0, 100)
    ax2.tick_params(axis="x", rotation=30)
    for label in ax2.get_xticklabels():
        label.set_horizontalalignment("right")
    fig.suptitle(d["provenance"]["gpu"] + ", CUDA-graph device time")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return True


def main():
    lines = ["# Benchmark results", "",
             "Generated by `python bench/report.py` from `bench/results/*.json` (written by `bench/run.py`). "
             "CUDA-graph device time, median of 20 replays, inputs rotated so nothing stays in L2; roofline = the "
             "minimum bytes a call moves / the SM copy bandwidth measured in the same run. Calls run back to back; "
             "after another large kernel, as in a model, a kernel can start slower: the \"after a GEMM\" column "
             "times ssd_fwd right after a cuBLAS GEMM, where the run measured it (`docs/PERF_NOTES.md`, twenty-second "
             "and twenty-third sessions: once ~9 µs slower at B2 N128 +z, now within 0.5 µs). What "
             "limits each kernel and what was tried: `docs/PERF_NOTES.md`. A full run is a snapshot of the commit its "
             "provenance line names: kernels changed since then were measured side by side with the baseline, "
             "change by change, in `docs/PERF_NOTES.md`, whose latest numbers supersede these.", ""]
    for path in sorted((HERE / "results").glob("*.json")):
        d = json.loads(path.read_text())
        lines += [f"## {path.stem}", "", provenance_line(d), ""]
        if "ssd_fwd" in d:
            lines += ssd_fwd_section(d["ssd_fwd"])
        if "ssd_bwd" in d:
            lines += ssd_bwd_section(d["ssd_bwd"])
        if "ssd_chunk_cumsum" in d:
            lines += chunk_cumsum_section(d["ssd_chunk_cumsum"])
        if "verify" in d:
            lines += verify_section(d["verify"])
        if "conv" in d:
            lines += conv_section(d["conv"])
        if "scaling" in d:
            lines += scaling_section(d["scaling"])
        if "cold_start" in d:
            c = d["cold_start"]
            fmt = lambda v: "–" if v is None else f"{v:.2f} s"  # noqa: E731
            lines += ["### Cold start", "", f"Fresh process to the first completed ssd_fwd (first reference shape): "
                      f"ours {fmt(c.get('ours_s'))}, Triton with an empty compile cache {fmt(c.get('triton_s'))}.",
                      ""]
        if plot(d, HERE / f"speedup_{path.stem}.png"):
            lines += [f"![speedup and roofline](speedup_{path.stem}.png)", ""]
    (HERE / "README.md").write_text("\n".join(lines))


if __name__ == "__main__":
    main()
