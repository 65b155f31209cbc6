#!/usr/bin/python3
"""Bar chart of `wsync-bench compare`'s JSON: usage plot_compare.py COMPARE_JSON OUT_PNG.

One panel per scenario: seconds per sync of every contestant (median bar, min-max whisker, log
scale), and the link limits (ucx_perftest, memcpy) as the time they need for the bytes one rollout
process must receive. Needs Debian's python3-matplotlib. Exit status 0, 1 on error, 2 for usage.
"""

import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (the backend must be chosen first)

_COLORS = {"wsync-shm": "#1f77b4", "wsync-tcp": "#6baed6", "per-param": "#d62728",
           "bucketed": "#ff9896", "perftest-shm": "#7f7f7f", "perftest-tcp": "#c7c7c7",
           "memcpy": "#bcbd22"}


def main(argv):
    if len(argv) != 3:
        print(__doc__.split("\n")[0], file=sys.stderr)
        return 2
    with open(argv[1]) as f:
        report = json.load(f)
    scenarios = report["scenarios"]
    if not scenarios:
        print("no scenarios in %s" % argv[1], file=sys.stderr)
        return 1
    columns = min(2, len(scenarios))
    rows = (len(scenarios) + columns - 1) // columns
    figure, axes = plt.subplots(rows, columns, figsize=(7.5 * columns, 4.2 * rows), squeeze=False)
    for panel, scenario in enumerate(scenarios):
        ax = axes[panel // columns][panel % columns]
        results = scenario["results"]
        names = [r["id"] for r in results]
        medians = [r["seconds_median"] for r in results]
        low = [r["seconds_median"] - r["seconds_min"] for r in results]
        high = [r["seconds_max"] - r["seconds_median"] for r in results]
        colors = [_COLORS.get(r["id"], "#9467bd") for r in results]
        hatches = ["//" if r["limit"] else "" for r in results]
        bars = ax.bar(range(len(results)), medians, yerr=[low, high], capsize=3, color=colors)
        for bar, hatch in zip(bars, hatches):
            bar.set_hatch(hatch)
        for i, r in enumerate(results):
            label = "%.3g s" % r["seconds_median"]
            ax.text(i, r["seconds_max"] * 1.08, label, ha="center", va="bottom", fontsize=7)
        ax.set_yscale("log")
        ax.set_xticks(range(len(results)))
        ax.set_xticklabels(names, rotation=30, ha="right", fontsize=8)
        ax.set_ylabel("seconds per sync (log)")
        ax.set_title("%s  %s -> %s\n%.1f MiB per rollout process; hatched: link limits" %
                     (scenario["model"], scenario["from"], scenario["to"],
                      scenario["rollout_bytes"] / 1048576.0), fontsize=9)
        ax.grid(axis="y", which="both", alpha=0.3)
    for panel in range(len(scenarios), rows * columns):
        axes[panel // columns][panel % columns].axis("off")
    figure.suptitle("wsync-bench compare, %s\n%s" % (report["date"], report["machine"]),
                    fontsize=9)
    figure.tight_layout()
    figure.savefig(argv[2], dpi=110)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
