#!/usr/bin/env python3
"""results.py - the benchmark record: bench/RESULTS.md made from rows.

Every benchmark writes what it measured as JSON lines, one object per
figure (a row). bench/results.jsonl holds the recorded rows, appended to
and never rewritten; bench/RESULTS.md is generated from it and shows, for
each benchmark, its latest recorded run: every figure beside the peer
measured in the same run, and every target with what it was compared
against and the figure it needed. The notebook the record replaced, and
the prose of the runs, are under bench/history/.

A row:
  benchmark  "cpu", "gpu", "images", "ops", "matmul", "moe", "conv", "attention",
             "decode", "sample", "wake" or "llm" (BENCHMARKS below)
  case       what was measured, e.g. "fiber switch (one way)"
  metric     which figure of the case, e.g. "median", "jobs/s"
  value      a number; unit: its unit
  machine    the machine, in words; date: "YYYY-MM-DD HH:MM UTC";
  commit     the commit measured (a " (modified)" or "-dirty" mark kept)
  optional:  config (the case's setting), detail (what else a reader needs:
             min and max, cores), peer and peer_value (the same figure of the
             peer, same run, same unit), targets (a list of {goal, op,
             needed, met}: goal says against what, needed is the figure the
             value had to reach, in the row's unit, op "<=" or ">="), conditions
             (how the run was taken), quick (a smoke run: never recorded)

The rows of one run share benchmark, date, commit and machine. Invariants
the check keeps: every row is well formed and a target's met is what its
value against needed says; RESULTS.md is exactly what generate writes.

Usage:
  results.py check [--rows FILE] [--record FILE]   the record matches its rows
  results.py generate [--rows FILE] [--record FILE]  rewrite the record
  results.py record NEW.jsonl...   append a run's rows to the recorded ones
                                   and regenerate the record
  results.py show NEW.jsonl...     print the record those rows alone make
  results.py row KEY=VALUE...      print one row, validated (for writers in
                                   shell): value and peer_value are numbers;
                                   target="OP NEEDED GOAL", repeatable, its
                                   met worked out here
Python 3 standard library only (it runs on CI's machine).
"""
import json
import math
import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROWS = os.path.join(HERE, "results.jsonl")
RECORD = os.path.join(HERE, "RESULTS.md")

# benchmark -> (heading, the program that writes it, what a reader needs to
# know to read its figures); the order is the record's
BENCHMARKS = {
    "cpu": ("CPU runtime: bench_core", "`make bench` (bench/bench_core.c)",
            "median of the repetitions, [min, max] in detail; what the rows measure: "
            "bench/bench_core.c's opening comment"),
    "gpu": ("GPU runtime: gpu-bench", "`make gpu-bench` (scripts/gpu-bench)",
            "raw-CUDA peers in the same run; what the rows mean: bench/gpu/README.md"),
    "images": ("weft-images: images-bench", "`make images-bench` (scripts/images-bench)",
               "weft-images against thread pools on the same images; "
               "apps/weft-images/README.md"),
    "ops": ("Operators: bench_ops headline", "`make gpu-bench-ops` (bench/ops/bench_ops.py)",
            "weft's kernels against torch.compile on the same tensors; the tuning "
            "variants: bench/ops/README.md"),
    "matmul": ("Matrix multiply: bench_matmul", "`make gpu-bench-matmul` "
               "(bench/matmul/bench_matmul.py)",
               "weft_matmul (cuBLASLt) against torch.matmul and torch eager on the same "
               "tensors and stream; what the rows measure: bench/matmul/bench_matmul.py's "
               "opening comment"),
    "moe": ("Mixture of experts: bench_moe", "`make gpu-bench-moe` (bench/moe/bench_moe.py)",
            "weft's router and grouped matmul against torch eager, torch._grouped_mm and a "
            "loop of torch.matmul on the same tensors and stream; what the rows measure: "
            "bench/moe/bench_moe.py's opening comment"),
    "conv": ("Convolution: bench_conv", "`make gpu-bench-conv` (bench/conv/bench_conv.py)",
             "weft_conv2d (BatchNorm folded; bias+ReLU fused: a matmul epilogue for 1x1, one "
             "cuDNN operation graph for the rest) against PyTorch eager conv->bn->relu and "
             "torch with the BatchNorm folded by hand, on the same tensors and stream; what "
             "the rows measure: bench/conv/bench_conv.py's opening comment"),
    "attention": ("Attention: bench_attention", "`make gpu-bench-attention` "
                  "(bench/attention/bench_attention.py)",
                  "weft_attention (weft's own kernel) against torch's "
                  "scaled_dot_product_attention with its flash, cuDNN and efficient backends "
                  "on the same tensors and stream; what the rows measure: "
                  "bench/attention/bench_attention.py's opening comment"),
    "decode": ("Decode attention: bench_decode", "`make gpu-bench-decode` "
               "(bench/attention/bench_decode.py)",
               "weft_attention_decode over a shuffled paged KV cache against torch's "
               "scaled_dot_product_attention on the same K/V laid out contiguously, and a "
               "device-to-device copy's ceiling, in the same run; what the rows measure: "
               "bench/attention/bench_decode.py's opening comment"),
    "sample": ("Sampling: bench_sample", "`make gpu-bench-sample` (bench/sample/bench_sample.py)",
               "weft_sample and weft_penalize against PyTorch's per-step sampling (argmax; "
               "sort, softmax, cumulative sum and top-p mask; top-k; multinomial; the "
               "repetition penalty's gather and scatter) on the same logits in the same run; "
               "what the rows measure: bench/sample/bench_sample.py's opening comment"),
    "wake": ("Waking a task: bench_wake", "`make bench-wake` (bench/mpi/bench_wake.c)",
             "how late a task awaiting a message resumes (the watcher's polling, which GPU "
             "waits share) against a thread spinning in MPI_Wait, two ranks on one machine, "
             "in the same run; what the rows measure: bench/mpi/bench_wake.c's opening comment"),
    "llm": ("weft-llm: bench_llm", "`make gpu-bench-llm` (bench/llm/bench_llm.py)",
            "weft-llm's bench, speculative generate and serve (under weft-llm loadgen) on "
            "random Llama-shaped bf16 models, against transformers' generate, torch.matmul and "
            "torch's copy on the same GPU in the same run; what the rows measure: "
            "bench/llm/README.md"),
}
REQUIRED = {"benchmark": str, "case": str, "metric": str, "value": (int, float), "unit": str,
            "machine": str, "date": str, "commit": str}
OPTIONAL = {"config": str, "detail": str, "peer": str, "peer_value": (int, float),
            "targets": list, "conditions": str, "quick": bool}
DATE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d UTC$")


class Bad(Exception):
    pass


def met(value, op, needed):
    return value <= needed if op == "<=" else value >= needed


def validate(row, where):
    """Raise Bad naming where when row is not a well-formed row."""
    if not isinstance(row, dict):
        raise Bad("%s: not a JSON object" % where)
    for key, kind in REQUIRED.items():
        if key not in row:
            raise Bad("%s: no %s" % (where, key))
    for key, val in row.items():
        kind = REQUIRED.get(key) or OPTIONAL.get(key)
        if kind is None:
            raise Bad("%s: unknown key %r" % (where, key))
        if not isinstance(val, kind) or (kind != bool and isinstance(val, bool)):
            raise Bad("%s: %s is not a %s" % (where, key, getattr(kind, "__name__", "number")))
        if isinstance(val, str) and not val.strip():
            raise Bad("%s: %s is empty" % (where, key))
        if isinstance(val, float) and not math.isfinite(val):
            raise Bad("%s: %s is not finite" % (where, key))
    if row["benchmark"] not in BENCHMARKS:
        raise Bad("%s: unknown benchmark %r (know %s)" % (where, row["benchmark"],
                                                         ", ".join(BENCHMARKS)))
    if not DATE.match(row["date"]):
        raise Bad("%s: date %r is not YYYY-MM-DD HH:MM UTC" % (where, row["date"]))
    if ("peer" in row) != ("peer_value" in row):
        raise Bad("%s: peer and peer_value go together" % where)
    for i, t in enumerate(row.get("targets", [])):
        tw = "%s: target %d" % (where, i + 1)
        if not isinstance(t, dict) or set(t) != {"goal", "op", "needed", "met"}:
            raise Bad("%s: not an object of goal, op, needed, met" % tw)
        if t["op"] not in ("<=", ">=") or not isinstance(t["goal"], str) or not t["goal"]:
            raise Bad("%s: op must be <= or >= and goal a text" % tw)
        if not isinstance(t["needed"], (int, float)) or isinstance(t["needed"], bool):
            raise Bad("%s: needed is not a number" % tw)
        if t["met"] is not met(row["value"], t["op"], t["needed"]):
            raise Bad("%s: met is %s but %g %s %g says otherwise" %
                      (tw, t["met"], row["value"], t["op"], t["needed"]))


def load(path):
    """The rows of a JSON-lines file, validated, in order."""
    rows = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            where = "%s:%d" % (os.path.relpath(path), n)
            try:
                row = json.loads(line)
            except ValueError as e:
                raise Bad("%s: not JSON: %s" % (where, e))
            validate(row, where)
            rows.append(row)
    return rows


def num(v):
    """A figure as a reader wants it: three significant digits, no more."""
    a = abs(v)
    if a >= 100 or v == int(v) and a >= 10:
        return "%.0f" % v
    if a >= 10:
        return "%.1f" % v
    if a >= 1:
        return "%.2f" % v
    if a == 0:
        return "0"
    return "%.3g" % v


def cell(s):
    return s.replace("|", "\\|")


def latest_runs(rows):
    """benchmark -> the rows of its latest run (by date; the last recorded
    of runs with the same date)."""
    runs = {}
    for r in rows:
        key = (r["date"], r["commit"], r["machine"])
        b = runs.setdefault(r["benchmark"], {})
        b.setdefault(key, []).append(r)
    out = {}
    for bench, by_run in runs.items():
        last = max(by_run, key=lambda k: (k[0], list(by_run).index(k)))
        out[bench] = by_run[last]
    return out


def render(rows, source="bench/results.jsonl"):
    out = ["# weft benchmark record", "",
           "Generated by `bench/results.py` from the rows in `%s`: do not edit it by hand." %
           source,
           "Each section is the latest recorded run of one benchmark: every figure beside its "
           "peer measured in",
           "the same run, and every target with what it was compared against and the figure "
           "it needed.",
           "A benchmark writes its rows under `build-release/`; `RECORD=1` (e.g. "
           "`make bench RECORD=1`) appends",
           "them to the recorded rows and regenerates this file. Earlier runs, and the prose "
           "about them: `bench/history/`.",
           ""]
    runs = latest_runs(rows)
    out.append("| benchmark | date | commit | machine |")
    out.append("| --- | --- | --- | --- |")
    for bench, (head, _, _) in BENCHMARKS.items():
        if bench in runs:
            r = runs[bench][0]
            anchor = re.sub(r"[^a-z0-9 _-]", "", head.lower()).replace(" ", "-")
            out.append("| [%s](#%s) | %s | %s | %s |" % (head, anchor, r["date"], r["commit"],
                                                         cell(r["machine"])))
    out.append("")
    for bench, (head, program, about) in BENCHMARKS.items():
        if bench not in runs:
            continue
        run = runs[bench]
        first = run[0]
        out += ["## " + head, "",
                "- run: %s, commit %s, written by %s" % (first["date"], first["commit"], program),
                "- machine: " + first["machine"]]
        conditions = []
        for r in run:
            if "conditions" in r and r["conditions"] not in conditions:
                conditions.append(r["conditions"])
        out += ["- " + c for c in conditions]
        out += ["- " + about, ""]
        out.append("| case | value | peer, same run | × peer | target: needed, against what |")
        out.append("| --- | ---: | --- | ---: | --- |")
        for r in run:
            what = r["case"] + (", " + r["config"] if "config" in r else "")
            if r["metric"] not in ("median", "value", r["unit"]):
                what += " (%s)" % r["metric"]
            value = "%s %s" % (num(r["value"]), r["unit"])
            if "detail" in r:
                value += " (%s)" % r["detail"]
            peer = ratio = ""
            if "peer" in r:
                peer = "%s: %s %s" % (r["peer"], num(r["peer_value"]), r["unit"])
                if r["peer_value"]:
                    ratio = num(r["value"] / r["peer_value"])
            targets = "; ".join("%s %s %s, %s: **%s**" % (
                "≤" if t["op"] == "<=" else "≥", num(t["needed"]), r["unit"], t["goal"],
                "met" if t["met"] else "MISSED") for t in r.get("targets", []))
            out.append("| %s | %s | %s | %s | %s |" % (cell(what), cell(value), cell(peer),
                                                       ratio, cell(targets)))
        out.append("")
    return "\n".join(out)


def make_row(args):
    """One row from KEY=VALUE arguments (see the usage)."""
    row = {}
    for a in args:
        key, eq, val = a.partition("=")
        if not eq:
            raise Bad("row: %r is not KEY=VALUE" % a)
        if val == "":
            continue  # an absent figure: shell callers pass it empty
        if key in ("value", "peer_value"):
            try:
                row[key] = float(val)
            except ValueError:
                raise Bad("row: %s=%r is not a number" % (key, val))
        elif key == "quick":
            row[key] = val not in ("0", "false", "")
        elif key == "target":
            parts = val.split(None, 2)
            if len(parts) != 3:
                raise Bad("row: target=%r is not OP NEEDED GOAL" % val)
            try:
                needed = float(parts[1])
            except ValueError:
                raise Bad("row: target=%r: %r is not a number" % (val, parts[1]))
            row.setdefault("targets", []).append({"goal": parts[2], "op": parts[0],
                                                  "needed": needed, "met": None})
        else:
            row[key] = val
    if "value" not in row:
        raise Bad("row: no value")
    for t in row.get("targets", []):
        t["met"] = met(row["value"], t["op"], t["needed"])
    validate(row, "row")
    return row


def main(argv):
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if argv else 2
    cmd, rest = argv[0], argv[1:]
    rows_path, record_path = ROWS, RECORD
    files = []
    while rest:
        a = rest.pop(0)
        if a == "--rows" and rest:
            rows_path = rest.pop(0)
        elif a == "--record" and rest:
            record_path = rest.pop(0)
        elif a.startswith("-"):
            print("results.py: unknown option %s" % a, file=sys.stderr)
            return 2
        else:
            files.append(a)
    try:
        if cmd == "row":
            print(json.dumps(make_row(argv[1:]), ensure_ascii=False))
            return 0
        if cmd == "check":
            want = render(load(rows_path))
            try:
                with open(record_path, encoding="utf-8") as f:
                    got = f.read()
            except OSError as e:
                raise Bad("cannot read %s: %s" % (record_path, e))
            if got != want:
                import difflib
                diff = difflib.unified_diff(got.splitlines(), want.splitlines(), record_path,
                                            "generated", lineterm="", n=1)
                print("\n".join(list(diff)[:40]))
                raise Bad("%s is not what its rows generate: run bench/results.py generate" %
                          record_path)
            print("results.py: %s matches its %d rows" % (os.path.relpath(record_path),
                                                          len(load(rows_path))))
        elif cmd == "generate":
            with open(record_path, "w", encoding="utf-8") as f:
                f.write(render(load(rows_path)))
        elif cmd in ("record", "show"):
            if not files:
                raise Bad("%s: which rows? (the JSON-lines files a benchmark wrote)" % cmd)
            new = []
            for path in files:
                new += load(path)
            if not new:
                raise Bad("%s: no rows in %s" % (cmd, ", ".join(files)))
            quick = [r for r in new if r.get("quick")]
            if cmd == "show":
                print(render(new, ", ".join(files)))
                return 0
            if quick:
                raise Bad("record: %d rows come from a --quick run: not figures to record" %
                          len(quick))
            old = load(rows_path) if os.path.exists(rows_path) else []
            with open(rows_path, "a", encoding="utf-8") as f:
                for r in new:
                    f.write(json.dumps(r, ensure_ascii=False) + "\n")
            with open(record_path, "w", encoding="utf-8") as f:
                f.write(render(old + new))
            print("results.py: %d rows recorded in %s; %s regenerated" %
                  (len(new), os.path.relpath(rows_path), os.path.relpath(record_path)))
        else:
            print("results.py: unknown command %s (check, generate, record, show)" % cmd,
                  file=sys.stderr)
            return 2
    except Bad as e:
        print("results.py: %s" % e, file=sys.stderr)
        return 1
    except OSError as e:
        print("results.py: %s" % e, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
