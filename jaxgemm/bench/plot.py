"""A benchmark table drawn: for each suite, TFLOP/s of jaxgemm and its baseline per case,
and the baseline/ours time ratio (> 1: jaxgemm faster). Needs matplotlib."""

from __future__ import annotations


def plot(rows_by_suite: dict[str, list[dict]], path: str, title: str) -> None:
    """One row of two panels per suite: rate per case (bars), ratio per case (dots)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    suites = [(name, rows) for name, rows in rows_by_suite.items() if rows]
    fig, axes = plt.subplots(len(suites), 2, figsize=(14, 3.2 + 0.9 * max(len(r) for _, r in suites) ** 0.5 * len(suites)),
                             squeeze=False, gridspec_kw={"width_ratios": [3, 2]})  # fmt: skip
    for (name, rows), (rate, ratio) in zip(suites, axes):
        labels = [f"{r['name']} ({r['baseline']})" if r["baseline"] != "XLA" else r["name"] for r in rows]
        ys = range(len(rows))
        rate.barh([y + 0.2 for y in ys], [r["ours_tflops"] for r in rows], 0.4, label="jaxgemm")
        rate.barh([y - 0.2 for y in ys], [r["xla_tflops"] for r in rows], 0.4, label="baseline (XLA unless named)")
        rate.set_yticks(list(ys), labels, fontsize=8)
        rate.invert_yaxis()
        rate.set_xlabel("TFLOP/s")
        rate.set_title(f"suite {name}")
        rate.legend(fontsize=8, loc="lower right")
        ratio.axvline(1.0, color="gray", lw=1)
        ratio.plot([r["xla_over_ours"] for r in rows], list(ys), "o")
        ratio.set_yticks(list(ys), [""] * len(rows))
        ratio.invert_yaxis()
        ratio.set_xlabel("baseline time / jaxgemm time (> 1: jaxgemm faster)")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
