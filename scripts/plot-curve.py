#!/usr/bin/env python3
"""Plots memory curves (EDGEPOOL_CURVE=PATH, or scripts/sample-rss.py for any allocator):

    scripts/plot-curve.py OUT.png RUN.csv [RUN2.csv ...]

One CSV: its curves overlaid (RSS, bytes in use, bytes held from the OS, available memory if given),
load phases shaded, the RSS peak marked. Several CSVs: one RSS curve each on one figure (one per
allocator, say), each peak marked, with the first CSV's load phases shaded. A CSV's label is its
`# label=...` first line, or its file name. matplotlib is installed into target/plot-venv when missing.
"""
import csv
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def ensure_matplotlib():
    try:
        import matplotlib  # noqa: F401
        return
    except ImportError:
        pass
    venv = os.path.join(ROOT, "target", "plot-venv")
    py = os.path.join(venv, "bin", "python")
    if os.path.abspath(sys.executable) == os.path.abspath(py):
        sys.exit("matplotlib is still missing in " + venv)
    if not os.path.exists(py):
        subprocess.check_call([sys.executable, "-m", "venv", venv])
    subprocess.check_call([py, "-m", "pip", "install", "-q", "--disable-pip-version-check", "matplotlib"])
    os.execv(py, [py] + sys.argv)


def read(path):
    label = os.path.splitext(os.path.basename(path))[0]
    with open(path) as f:
        lines = f.read().splitlines()
    if lines and lines[0].startswith("# label="):
        label = lines[0][len("# label="):]
        lines = lines[1:]
    rows = list(csv.DictReader(lines))
    if not rows:
        sys.exit(f"{path}: no samples")
    cols = {k: [float(r[k]) for r in rows if r.get(k) not in (None, "")] for k in rows[0]}
    return label, cols


def phases(cols):
    """(start_s, end_s) of each run of samples with phase == 1."""
    t, ph = cols.get("t_ms", []), cols.get("phase", [])
    out, start = [], None
    for ti, p in zip(t, ph):
        if p and start is None:
            start = ti
        elif not p and start is not None:
            out.append((start / 1000, ti / 1000))
            start = None
    if start is not None:
        out.append((start / 1000, t[-1] / 1000))
    return out


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    ensure_matplotlib()
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out, paths = sys.argv[1], sys.argv[2:]
    runs = [read(p) for p in paths]
    mib = 1 << 20
    fig, ax = plt.subplots(figsize=(9, 4.8))
    for i, (a, b) in enumerate(phases(runs[0][1])):
        ax.axvspan(a, b, color="tab:orange", alpha=0.15, label="load phase" if i == 0 else None)
    if len(runs) == 1:
        label, c = runs[0]
        t = [x / 1000 for x in c["t_ms"]]
        for key, name in [("rss_bytes", "RSS"), ("os_bytes", "held from the OS"), ("in_use_bytes", "in use"),
                          ("available_bytes", "system available")]:
            if c.get(key) and len(c[key]) == len(t):
                ax.plot(t, [v / mib for v in c[key]], label=name, linewidth=1.4)
        series = [(label, t, c["rss_bytes"])]
        ax.set_title(f"memory over time: {label}")
    else:
        series = []
        for label, c in runs:
            t = [x / 1000 for x in c["t_ms"]]
            ax.plot(t, [v / mib for v in c["rss_bytes"]], label=f"{label} (RSS)", linewidth=1.4)
            series.append((label, t, c["rss_bytes"]))
        ax.set_title("resident memory over time")
    for label, t, rss in series:
        i = max(range(len(rss)), key=rss.__getitem__)
        ax.annotate(f"peak {rss[i] / mib:.0f} MiB", (t[i], rss[i] / mib), textcoords="offset points",
                    xytext=(4, 6), fontsize=8)
        ax.plot([t[i]], [rss[i] / mib], "o", color="black", markersize=3)
    ax.set_xlabel("seconds")
    ax.set_ylabel("MiB")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper right")
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
