"""PNG charts of benchmark results (matplotlib, the ``bench`` extra; optional)."""
import numpy as np


def _plt():
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        return plt
    except Exception:
        return None


def speedup_chart(path, labels, series, title, ylabel="speed-up of cyback (x, log scale)"):
    """Grouped bars: ``series`` maps a peer to one speed-up per label; 1.0 is parity.
    Returns the path, or None when matplotlib is missing or there is nothing to draw."""
    plt = _plt()
    if plt is None or not series or not labels:
        return None
    fig, ax = plt.subplots(figsize=(max(6, 0.9 * len(labels) + 2), 4.2))
    width = 0.8 / len(series)
    xs = np.arange(len(labels))
    for i, (peer, vals) in enumerate(series.items()):
        v = [np.nan if x is None else x for x in vals]
        ax.bar(xs + (i - (len(series) - 1) / 2) * width, v, width, label=peer)
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set_yscale("log")
    ax.set_xticks(xs)
    ax.set_xticklabels(labels, rotation=30, ha="right", fontsize=8)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def roofline_label(gflops):
    """The legend of the roofline line: its value with its unit, three
    significant digits (a quick run's small sgemm reaches well under 1 GFLOPS)."""
    return "sgemm roofline (%s GFLOPS)" % ("%.3g" % gflops)


def gflops_chart(path, labels, gflops, roofline, title):
    """Bars of achieved GFLOPS per case and engine against the sgemm roofline."""
    plt = _plt()
    if plt is None or not labels:
        return None
    fig, ax = plt.subplots(figsize=(max(6, 0.9 * len(labels) + 2), 4.2))
    width = 0.8 / max(1, len(gflops))
    xs = np.arange(len(labels))
    for i, (engine, vals) in enumerate(gflops.items()):
        v = [np.nan if x is None else x for x in vals]
        ax.bar(xs + (i - (len(gflops) - 1) / 2) * width, v, width, label=engine)
    if roofline:
        ax.axhline(roofline, color="r", ls="--", lw=1, label=roofline_label(roofline))
    ax.set_xticks(xs)
    ax.set_xticklabels(labels, rotation=30, ha="right", fontsize=8)
    ax.set_ylabel("GFLOPS")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def latency_chart(path, groups, title):
    """Box plots of single-call latencies (µs): ``groups`` maps a case to {engine: [µs]}."""
    plt = _plt()
    if plt is None or not groups:
        return None
    n = len(groups)
    fig, axes = plt.subplots(1, n, figsize=(2.6 * n + 1, 3.8), squeeze=False)
    for ax, (case, by_engine) in zip(axes[0], groups.items()):
        names = list(by_engine)
        ax.boxplot([by_engine[e] for e in names], showfliers=False)
        ax.set_xticks(range(1, len(names) + 1))
        ax.set_xticklabels(names, rotation=45, ha="right", fontsize=7)
        ax.set_yscale("log")
        ax.set_title(case, fontsize=8)
    axes[0][0].set_ylabel("µs per call (batch 1)")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
