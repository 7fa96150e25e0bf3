"""Reports of a benchmark run: the floor beside each row, a text table, a plot."""

from __future__ import annotations

from pathlib import Path

from .settings import Setting, counted_work, floor_ms


def with_floor(row: dict, s: Setting) -> dict:
    """``row`` with the counted work, the floor and (when timed) the fraction of the floor reached."""
    work = counted_work(row["B"], row["T"], s)
    row = {**row, **work, "floor_forward_ms": floor_ms(work, False), "floor_forward_backward_ms": floor_ms(work, True)}
    if "forward_backward_ms" in row:
        row["fraction_of_floor"] = row["floor_forward_backward_ms"] / row["forward_backward_ms"]
    return row


def summary_table(rows: list[dict], s: Setting) -> str:
    """Forward+backward (forward) ms of every implementation at every length, and the floor."""
    names = list(dict.fromkeys(r["name"] for r in rows))
    lines = ["fwd+bwd ms (fwd ms)   " + " | ".join(f"T={T}" for T in s.lengths)]
    for name in names:
        cells = []
        for T in s.lengths:
            row = next((r for r in rows if r["name"] == name and r["T"] == T), {})
            if "forward_backward_ms" in row:
                cells.append(f"{row['forward_backward_ms']:.1f} ({row['forward_ms']:.1f})")
            elif "forward_ms" in row:
                cells.append(f"- ({row['forward_ms']:.1f})")
            else:
                cells.append("n/a")
        lines.append(f"{name[:36]:36s} " + " | ".join(cells))
    floors = [floor_ms(counted_work(s.tokens // T, T, s), True) for T in s.lengths]
    lines.append(f"{'floor (counted work)':36s} " + " | ".join(f"{f:.2f}" for f in floors))
    return "\n".join(lines)


def plot(result: dict, path: Path) -> None:
    """Forward+backward ms against T for every implementation, with the floor."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    s = Setting(**{**result["setting"], "lengths": tuple(result["setting"]["lengths"])})
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for name in dict.fromkeys(r["name"] for r in result["rows"]):
        pts = [(r["T"], r["forward_backward_ms"]) for r in result["rows"] if r["name"] == name and "forward_backward_ms" in r]
        if pts:
            ax.plot(*zip(*pts), marker="o", label=name)
    ax.plot(s.lengths, [floor_ms(counted_work(s.tokens // T, T, s), True) for T in s.lengths], "k--", label="floor (counted work)")
    ax.set(xscale="log", yscale="log", xlabel="sequence length T (B·T fixed)", ylabel="forward+backward, median ms",
           title=f"{result['versions'].get('device', 'cpu')}, {s.dtype}, {s.heads} heads, K={s.key}, V={s.value}")
    ax.set_xticks(s.lengths, [f"{T // 1024}K" if T >= 1024 else str(T) for T in s.lengths])
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
