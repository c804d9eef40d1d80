"""PNG charts: restore, backup and check time per scenario and tool, and the concurrency sweep."""
import os

import matplotlib
matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402

from .scenarios import CHECKS, IMG_BACKUP, INITIAL, REBACKUP, SWEEP_FETCH  # noqa: E402

BACKUPS = (INITIAL, REBACKUP, IMG_BACKUP)


def _bars(records, wanted, title, path):
    records = [r for r in records if wanted(r["scenario"]) and r["min_s"] is not None]
    # One colour per tool across all panels and charts.
    palette = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    colors = {t: palette[i % len(palette)] for i, t in enumerate(dict.fromkeys(r["tool"] for r in records))}
    datasets = list(dict.fromkeys(r["dataset"] for r in records))
    if not datasets:
        return None
    fig, axes = plt.subplots(len(datasets), 1, figsize=(11, 3.6 * len(datasets)), squeeze=False)
    for ax, ds in zip(axes[:, 0], datasets):
        recs = [r for r in records if r["dataset"] == ds]
        scenarios = list(dict.fromkeys(r["scenario"] for r in recs))
        tools = list(dict.fromkeys(r["tool"] for r in recs))
        width = 0.8 / len(tools)
        for i, tool in enumerate(tools):
            xs, ys, bad = [], [], []
            for j, sc in enumerate(scenarios):
                r = next((r for r in recs if r["scenario"] == sc and r["tool"] == tool), None)
                if r:
                    xs.append(j + (i - (len(tools) - 1) / 2) * width)
                    ys.append(r["min_s"])
                    bad.append(r["check"] not in ("ok", ""))
            bars = ax.bar(xs, ys, width, label=tool, color=colors[tool])
            for b, is_bad in zip(bars, bad):
                if is_bad:  # a wrong or failed result: drawn, but marked
                    b.set_hatch("xx")
                    ax.annotate("wrong", (b.get_x() + b.get_width() / 2, b.get_height()), ha="center",
                                va="bottom", fontsize=7, color="red")
        ax.set_xticks(range(len(scenarios)))
        ax.set_xticklabels(scenarios, fontsize=8)
        ax.set_ylabel("min wall time (s)")
        ax.set_title(f"{ds}: {title}")
        ax.legend(fontsize=7, ncol=3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def restore_chart(records, out):
    return _bars(records, lambda s: "restore" in s, "restore time (hatched: failed its check)",
                 os.path.join(out, "restore.png"))


def backup_chart(records, out):
    return _bars(records, lambda s: s in BACKUPS, "backup time", os.path.join(out, "backup.png"))


def check_chart(records, out):
    return _bars(records, lambda s: s in CHECKS, "check time (cat packs: reading Cairn's pack files)",
                 os.path.join(out, "check.png"))


def sweep_chart(sweep, out):
    datasets = list(dict.fromkeys(s["dataset"] for s in sweep))
    if not datasets:
        return None
    fig, axes = plt.subplots(1, len(datasets), figsize=(6 * len(datasets), 4), squeeze=False)
    for ax, ds in zip(axes[0], datasets):
        cpu_ax = ax.twinx()
        for dt, color in ((1, "tab:blue"), (2, "tab:orange")):
            pts = [s for s in sweep if s["dataset"] == ds and s["decode_threads"] == dt and s["mb_per_s"]]
            xs = [s["fetch_concurrency"] for s in pts]
            ax.plot(xs, [s["mb_per_s"] for s in pts], "o-", color=color, label=f"{dt} decode thread(s): MB/s")
            cpu_ax.plot(xs, [s["cpu_use"] for s in pts], "x--", color=color, alpha=0.6, label=f"{dt}: CPU cores used")
        ax.set_xscale("log", base=2)
        ax.set_xticks(SWEEP_FETCH)
        ax.set_xticklabels([str(f) for f in SWEEP_FETCH])
        ax.set_xlabel("fetch concurrency")
        ax.set_ylabel("restore throughput (MB/s)")
        cpu_ax.set_ylabel("CPU cores used (dashed)")
        ax.set_ylim(bottom=0)
        cpu_ax.set_ylim(bottom=0)
        ax.set_title(f"{ds}: Cairn restore concurrency sweep")
        ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    path = os.path.join(out, "sweep.png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
