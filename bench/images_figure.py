#!/usr/bin/env python3
"""The scaling figure of weft-images against its thread pools, as SVG.

    images_figure.py [--rows bench/results.jsonl] [--out docs/images-scaling.svg]
    images_figure.py --self-test     draw two made-up runs, check the newest is drawn

Reads the newest images-bench run in the record (the rows of its date and
commit) and draws images/s against workers (threads for the pools): weft-images,
the pool spinning in cudaStreamSynchronize, the pool with blocking syncs.
Plain SVG written by hand: the standard library only, like results.py.
"""
import argparse
import json
import math
import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))

SERIES = [  # (label, case pattern, colour)
    ("weft-images, a task per image", r"^weft-images, (\d+) workers, a task per image$", "#d62728"),
    ("threads, spinning sync", r"^(\d+) threads, a stream each, cudaStreamSynchronize \(spin\)$",
     "#1f77b4"),
    ("threads, blocking sync",
     r"^(\d+) threads, a stream each, cudaStreamSynchronize \(blocking sync\)$", "#7f7f7f"),
]


def newest_run(rows_path):
    rows = [json.loads(line) for line in open(rows_path) if line.strip()]
    rows = [r for r in rows if r.get("benchmark") == "images" and not r.get("quick")]
    if not rows:
        sys.exit("images_figure.py: no images-bench rows in %s" % rows_path)
    last = max(rows, key=lambda r: r["date"])
    return [r for r in rows if r["date"] == last["date"] and r["commit"] == last["commit"]]


def series(rows):
    out = []
    for label, pattern, colour in SERIES:
        points = sorted((int(m.group(1)), r["value"]) for r in rows
                        for m in [re.match(pattern, r["case"])] if m)
        if points:
            out.append((label, colour, points))
    return out


def svg(run, lines):
    w, h, left, right, top, bottom = 640, 400, 70, 200, 40, 50
    xs = sorted({x for _, _, pts in lines for x, _ in pts})
    ymax = max(v for _, _, pts in lines for _, v in pts)
    step = 10 ** math.floor(math.log10(ymax))
    ymax = math.ceil(ymax / step) * step
    lo, hi = math.log2(xs[0]), math.log2(xs[-1]) if xs[-1] > xs[0] else math.log2(xs[0]) + 1

    def px(x):
        return left + (math.log2(x) - lo) / (hi - lo) * (w - left - right)

    def py(y):
        return h - bottom - y / ymax * (h - top - bottom)

    e = ['<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" '
         'font-family="sans-serif" font-size="12">' % (w, h),
         '<rect width="100%" height="100%" fill="white"/>',
         '<text x="%d" y="20" font-size="14">weft-images on %s, %s (commit %s)</text>'
         % (left, "12,000 images", run["date"], run["commit"])]
    for k in range(int(ymax / step) + 1):
        y = k * step
        e.append('<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#ddd"/>'
                 % (left, py(y), w - right, py(y)))
        e.append('<text x="%d" y="%.1f" text-anchor="end">%d</text>' % (left - 6, py(y) + 4, y))
    for x in xs:
        e.append('<text x="%.1f" y="%d" text-anchor="middle">%d</text>' % (px(x), h - bottom + 18, x))
    e.append('<text x="%.1f" y="%d" text-anchor="middle">workers (threads)</text>'
             % ((left + w - right) / 2, h - 10))
    e.append('<text x="16" y="%.1f" transform="rotate(-90 16 %.1f)" text-anchor="middle">'
             'images/s</text>' % ((top + h - bottom) / 2, (top + h - bottom) / 2))
    for i, (label, colour, pts) in enumerate(lines):
        path = " ".join("%.1f,%.1f" % (px(x), py(v)) for x, v in pts)
        e.append('<polyline points="%s" fill="none" stroke="%s" stroke-width="2"/>' % (path, colour))
        for x, v in pts:
            e.append('<circle cx="%.1f" cy="%.1f" r="3" fill="%s"/>' % (px(x), py(v), colour))
        ly = top + 20 + 20 * i
        e.append('<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="%s" stroke-width="2"/>'
                 % (w - right + 12, ly, w - right + 32, ly, colour))
        e.append('<text x="%d" y="%d">%s</text>' % (w - right + 38, ly + 4, label))
    e.append('<text x="%d" y="%d" fill="#555">%s</text>'
             % (left, h - bottom + 34, run["machine"].split(";")[0]))
    e.append("</svg>")
    return "\n".join(e) + "\n"


def self_test():
    """Two made-up runs: the figure must draw the newer one's three series, each
    point where its workers and images/s put it, and nothing of the older."""
    import tempfile
    rows = []
    for date, commit, scale in (("2026-01-01 00:00 UTC", "old", 1), ("2026-02-01 00:00 UTC", "new", 2)):
        for n in (1, 2, 4, 8, 16):
            cases = [("weft-images, %d workers, a task per image" % n, 1000 * n * scale),
                     ("%d threads, a stream each, cudaStreamSynchronize (spin)" % n, 900 * n)]
            if n >= 4:
                cases.append(("%d threads, a stream each, cudaStreamSynchronize (blocking sync)"
                              % n, 800 * n))
            rows += [{"benchmark": "images", "date": date, "commit": commit, "machine": "m; c",
                      "case": c, "value": float(v)} for c, v in cases]
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "rows.jsonl")
        with open(path, "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows)
        run = newest_run(path)
        lines = series(run)
        text = svg(run[0], lines)
    problems = []
    if {r["commit"] for r in run} != {"new"}:
        problems.append("drew rows of another run than the newest")
    if [len(p) for _, _, p in lines] != [5, 5, 3]:
        problems.append("series of %s points, not 5, 5, 3" % [len(p) for _, _, p in lines])
    if lines and lines[0][2][-1] != (16, 32000.0):
        problems.append("weft's last point is %r, not (16, 32000)" % (lines[0][2][-1],))
    if text.count("<polyline") != 3 or "commit new" not in text:
        problems.append("the SVG lacks its three lines or its run's commit")
    for p in problems:
        print("images_figure.py: self-test: " + p, file=sys.stderr)
    print("images_figure.py: self-test %s" % ("FAILED" if problems else "passed"))
    return 1 if problems else 0


def main():
    if sys.argv[1:] == ["--self-test"]:
        return self_test()
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", default=os.path.join(HERE, "results.jsonl"))
    ap.add_argument("--out", default=os.path.join(HERE, "..", "docs", "images-scaling.svg"))
    a = ap.parse_args()
    run = newest_run(a.rows)
    lines = series(run)
    if not lines:
        sys.exit("images_figure.py: the newest run has no scaling rows")
    with open(a.out, "w") as f:
        f.write(svg(run[0], lines))
    print("images_figure.py: wrote %s (%s, %s)" % (a.out, run[0]["date"], run[0]["commit"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
