"""llm_figures.py - bench_llm.py's arithmetic and parsers, which need no GPU.

What weft-llm prints is read here: `weft-llm bench`'s table and BENCH
lines, `generate --print-ids --stats [--print-top]`'s lines on stderr,
loadgen's --json report, the server's /metrics and the kernel's
/proc/PID/stat; and what a target is measured against is worked out here
from the model's config.json: the bytes a decode step reads, a prompt's
FLOPs, the roofline of a step. Report gathers the run's rows
(bench/results.py's format) and says PASS, FAIL or NOT MEASURED for every
target the run set out to check. test_bench_llm.py tests all of it with
plain python3.
"""
import math
import re


class ParseError(Exception):
    pass


# ---- weft-llm bench --------------------------------------------------------

BENCH_LINE = re.compile(r"^BENCH (\S+) (\S+) (.+)$")
HEADER = re.compile(r"([0-9.eE+-]+) GB of weights read a step; copy rate ([0-9.eE+-]+) GB/s")
PREFILL_NAME = re.compile(r"^llm\.prefill\.L(\d+)\.tokens_per_s$")
DECODE_NAME = re.compile(r"^llm\.decode\.B(\d+)\."
                         r"(step_ms|tokens_per_s|of_roofline|cpu_us_per_step|own_cpu_us_per_step)$")


def parse_bench(text):
    """weft-llm bench's stdout as {"copy_gbs", "weights_gb", "prefill": {L:
    {"tokens_per_s", "ms"}}, "decode": {B: {"step_ms", "tokens_per_s",
    "of_roofline", "cpu_us", "own_cpu_us" (where bench gives it), "roofline_ms"}},
    "figures": {name: (value,
    unit)}}. The BENCH lines are the figures; the decode table adds each
    step's roofline in ms (its BENCH line gives only the fraction)."""
    figures = {}
    for line in text.splitlines():
        m = BENCH_LINE.match(line.strip())
        if m:
            try:
                figures[m.group(1)] = (float(m.group(2)), m.group(3).strip())
            except ValueError:
                raise ParseError("BENCH line with a value that is not a number: %r" % line)
    if "llm.copy_rate" not in figures:
        raise ParseError("no `BENCH llm.copy_rate` line: not weft-llm bench's output")
    out = {"copy_gbs": figures["llm.copy_rate"][0], "weights_gb": None, "prefill": {},
           "decode": {}, "figures": figures,
           # graph launches over every decode step of the run (where bench says)
           "graph_launches": figures.get("llm.decode.graph_launches", (None,))[0]}
    m = HEADER.search(text)
    if m:
        out["weights_gb"] = float(m.group(1))
    for name, (value, _) in figures.items():
        m = PREFILL_NAME.match(name)
        if m:
            L = int(m.group(1))
            out["prefill"][L] = {"tokens_per_s": value, "ms": L / value * 1e3 if value > 0 else
                                 math.inf}
            continue
        m = DECODE_NAME.match(name)
        if m:
            key = {"cpu_us_per_step": "cpu_us",
                   "own_cpu_us_per_step": "own_cpu_us"}.get(m.group(2), m.group(2))
            out["decode"].setdefault(int(m.group(1)), {})[key] = value
    # the decode table: | B | ms a step | tokens/s | roofline ms | of roofline | cpu |
    in_decode = False
    for line in text.splitlines():
        if line.startswith("| decode batch"):
            in_decode = True
            continue
        if in_decode and line.startswith("|"):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if len(cells) >= 4 and cells[0].isdigit():
                B = int(cells[0])
                if B in out["decode"]:
                    try:
                        out["decode"][B]["roofline_ms"] = float(cells[3])
                    except ValueError:
                        pass
        elif in_decode and line.strip() and not line.startswith("|"):
            in_decode = False
    for B, d in out["decode"].items():
        missing = {"step_ms", "tokens_per_s", "of_roofline", "cpu_us"} - set(d)
        if missing:
            raise ParseError("decode batch %d: no BENCH line for %s" % (B, ", ".join(
                sorted(missing))))
        if "roofline_ms" not in d:  # the fraction, three decimals, times the step
            d["roofline_ms"] = d["of_roofline"] * d["step_ms"]
    return out


# ---- weft-llm generate --print-ids --stats ------------------------------------

IDS = re.compile(r"^(?:\[\d+\] )?(prompt|generated) ids:\s*([0-9,]*)\s*$")
SPEC = re.compile(r"^speculative: (\d+) rounds, (\d+) draft tokens, (\d+) accepted "
                  r"\(([0-9.]+)%\), ([0-9.]+) tokens a round$")
TIME = re.compile(r"^(?:\[\d+\] )?time: first token ([0-9.]+) ms; decode (\d+) tokens in "
                  r"([0-9.]+) ms \(([0-9.]+) tokens/s\)$")
TOP = re.compile(r"^\s*(?:\[\d+\])?\s*step (\d+): token (-?\d+) \(top (-?\d+)\) logit "
                 r"(\S+), next (\S+), gap (\S+)$")


def parse_generate(stderr):
    """generate's stderr (one sequence) as {"prompt_ids", "ids",
    "first_token_ms", "decode_tokens", "decode_ms", "tokens_per_s", "spec"
    (None, or {"rounds", "proposed", "accepted", "accepted_pct",
    "per_round"}), "top" ({step: (logit, next)}, from --print-top)}."""
    out = {"prompt_ids": None, "ids": None, "spec": None, "top": {}}
    for line in stderr.splitlines():
        m = IDS.match(line)
        if m:
            ids = [int(x) for x in m.group(2).split(",") if x]
            out["prompt_ids" if m.group(1) == "prompt" else "ids"] = ids
            continue
        m = SPEC.match(line.strip())
        if m:
            out["spec"] = {"rounds": int(m.group(1)), "proposed": int(m.group(2)),
                           "accepted": int(m.group(3)), "accepted_pct": float(m.group(4)),
                           "per_round": float(m.group(5))}
            continue
        m = TIME.match(line.strip())
        if m:
            out.update(first_token_ms=float(m.group(1)), decode_tokens=int(m.group(2)),
                       decode_ms=float(m.group(3)), tokens_per_s=float(m.group(4)))
            continue
        m = TOP.match(line)
        if m:
            out["top"][int(m.group(1))] = (float(m.group(4)), float(m.group(5)))
    if out["ids"] is None:
        raise ParseError("no `generated ids:` line (was --print-ids given?)")
    if "tokens_per_s" not in out:
        raise ParseError("no `time: ... tokens/s` line (was --stats given, and more than one "
                         "token generated?)")
    return out


def first_parting(a, b):
    """The first index where the id lists differ (a shorter list differs
    where it ends), or None when they are equal."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


# Within how many bf16 units (the top logit's magnitude / 128) the top two
# logits of a step count as a near tie, where two correct runs may pick
# different tokens (tests/apps/test_llm_gpu.c's rule, with the top logit's
# magnitude standing in for the largest one's).
NEAR_TIE_UNITS = 8


def tie_gap_units(top, step):
    """The gap between the top two logits at step in bf16 units, or None
    when --print-top did not show that step."""
    if step not in top:
        return None
    logit, nxt = top[step]
    unit = abs(logit) / 128 or 1e-30
    return (logit - nxt) / unit


def agreement(plain_ids, spec_ids, plain_top=None):
    """How speculative greedy output agrees with plain greedy output:
    {"identical", "parted_at" (None), "gap_units" (the plain run's top-two
    gap there, None unknown), "near_tie" (None unknown), "agreed" (tokens
    equal before the parting), "ok" (identical, or parted at a near tie)}."""
    at = first_parting(plain_ids, spec_ids)
    if at is None:
        return {"identical": True, "parted_at": None, "gap_units": None, "near_tie": None,
                "agreed": len(plain_ids), "ok": True}
    gap = tie_gap_units(plain_top or {}, at)
    near = None if gap is None else gap <= NEAR_TIE_UNITS
    return {"identical": False, "parted_at": at, "gap_units": gap, "near_tie": near,
            "agreed": at, "ok": bool(near)}


# ---- loadgen, /metrics, /proc ---------------------------------------------

def parse_loadgen(doc):
    """The figures of a loadgen --json report (already json.load-ed)."""
    try:
        s = doc["summary"]
        out = {"ok": s["ok"], "failed": s["failed"], "failed_by_reason": s["failed_by_reason"],
               "wall_s": s["wall_s"], "output_tokens_per_s": s["output_tokens_per_s"],
               "output_tokens": s["output_tokens"], "prompt_words_mean": s["prompt_words_mean"],
               "prompt_tokens_mean": s["prompt_tokens_mean"], "achieved_rate": s["achieved_rate"]}
        for k in ("ttft_s", "itl_s", "tpot_s", "e2e_s"):
            out[k] = {q: s[k][q] for q in ("n", "mean", "p50", "p90", "p99", "max")}
        reqs = doc["requests"]
        out["prompt_tokens"] = sorted(r["prompt_tokens"] for r in reqs
                                      if r["reason"] == "ok" and r["prompt_tokens"] is not None)
        out["prompt_words"] = sorted(r["prompt_words"] for r in reqs)
        out["first_error"] = next((r["error"] for r in reqs if r["reason"] != "ok"), None)
    except (KeyError, TypeError) as e:
        raise ParseError("loadgen report without %s" % e)
    return out


METRIC = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*(?:\{[^}]*\})?)\s+(\S+)$")


def parse_metrics(text):
    """Prometheus text as {name or name{labels}: value}."""
    out = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = METRIC.match(line.strip())
        if m:
            try:
                out[m.group(1)] = float(m.group(2))
            except ValueError:
                pass
    return out


def proc_cpu_seconds(stat, ticks_per_s):
    """User plus system CPU seconds of every thread of a process, from the
    text of /proc/PID/stat (fields 14 and 15, counted after the command
    name in parentheses, which may itself hold spaces)."""
    rest = stat[stat.rindex(")") + 2:].split()
    return (int(rest[11]) + int(rest[12])) / ticks_per_s


def ms(seconds):
    """Seconds (None where loadgen had no value) in milliseconds (NaN)."""
    return seconds * 1e3 if finite(seconds) else math.nan


def median(v):
    v = sorted(v)
    n = len(v)
    if not n:
        return math.nan
    return v[n // 2] if n % 2 else (v[n // 2 - 1] + v[n // 2]) / 2


# ---- the model's arithmetic ------------------------------------------------

def model_shape(config):
    """The shapes a Llama-style config.json gives (head_dim where given)."""
    H, heads = config["hidden_size"], config["num_attention_heads"]
    return {"hidden": H, "intermediate": config["intermediate_size"],
            "layers": config["num_hidden_layers"], "heads": heads,
            "kv_heads": config.get("num_key_value_heads", heads),
            "head_dim": config.get("head_dim") or H // heads, "vocab": config["vocab_size"],
            "tied": bool(config.get("tie_word_embeddings", False))}


def linear_params(s):
    """Weights a token's pass multiplies by in the layers (no lm_head)."""
    H, q, kv = s["hidden"], s["heads"] * s["head_dim"], s["kv_heads"] * s["head_dim"]
    return s["layers"] * (H * q + 2 * H * kv + q * H + 3 * H * s["intermediate"])


def weight_bytes(s, dtype_bytes=2):
    """Bytes a decode step reads of the weights, as weft-llm bench counts
    them: every layer's matrices and the lm_head (the embedding table is
    the lm_head when tied; the rows a step gathers from an untied one are
    not counted)."""
    return (linear_params(s) + s["vocab"] * s["hidden"]) * dtype_bytes


def kv_bytes_per_token(s, dtype_bytes=2):
    return 2 * s["layers"] * s["kv_heads"] * s["head_dim"] * dtype_bytes


def prefill_flops(s, L):
    """FLOPs of a fresh prompt of L tokens: every layer's matmuls for every
    token, causal attention (QK^T and PV over the L^2 / 2 pairs a query
    sees), and the lm_head for the last token alone, as wl_forward does."""
    attention = s["layers"] * 2 * s["heads"] * s["head_dim"] * L * L
    return 2.0 * L * linear_params(s) + attention + 2.0 * s["hidden"] * s["vocab"]


def roofline_gbs(weft_copy, torch_copy):
    """The copy rate every roofline is taken at: the better of weft's device
    copy and torch's in the same run. The bandwidth the device gives is
    the better one; a slower copy of weft's own would flatter every share
    of the roofline."""
    rates = [r for r in (weft_copy, torch_copy) if finite(r) and r > 0]
    return max(rates) if rates else math.nan


def step_roofline_s(s, copy_gbs, batch, context):
    """Seconds a decode step of batch sequences of context tokens each
    takes at the copy rate: the weights read once, each sequence's keys and
    values once."""
    return (weight_bytes(s) + batch * context * kv_bytes_per_token(s)) / (copy_gbs * 1e9)


def interpolate(points, x):
    """Piecewise-linear through {x: y} points, extended past the ends by
    the nearest segment (a single point: y in proportion to x)."""
    xs = sorted(points)
    if not xs:
        return math.nan
    if len(xs) == 1:
        return points[xs[0]] * x / xs[0]
    i = 0
    while i < len(xs) - 2 and x > xs[i + 1]:
        i += 1
    a, b = xs[i], xs[i + 1]
    return points[a] + (points[b] - points[a]) * (x - a) / (b - a)


# ---- the report -----------------------------------------------------------

def finite(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


class Report:
    """The run's rows and its targets. expect() names each target the run
    means to check before it is measured, so that one never measured is
    listed as NOT MEASURED with the reason (miss()), never dropped."""

    def __init__(self):
        self.rows, self.expected, self.reasons, self.notes = [], {}, {}, []

    def expect(self, key, text):
        self.expected.setdefault(key, text)

    def miss(self, key, reason):
        self.reasons.setdefault(key, reason)

    def note(self, text):
        self.notes.append(text)

    def add(self, case, metric, value, unit, config=None, detail=None, peer=None,
            peer_value=None, targets=()):
        """A row; targets are (key, goal, op, needed). A value that is not
        a finite number is a note, not a row."""
        if not finite(value):
            self.note("%s (%s): no finite value (%r); not a row" % (case, metric, value))
            for key, _, _, _ in targets:
                self.miss(key, "%s: no finite value" % case)
            return None
        row = {"case": case, "metric": metric, "value": round(float(value), 4), "unit": unit}
        if config:
            row["config"] = config
        if detail:
            row["detail"] = detail
        if peer and finite(peer_value):
            row.update(peer=peer, peer_value=round(float(peer_value), 4))
        kept = []
        for key, goal, op, needed in targets:
            if not finite(needed):
                self.miss(key, "%s: what it is measured against was not measured" % case)
                continue
            needed = round(float(needed), 4)
            kept.append({"goal": goal, "op": op, "needed": needed,
                         "met": row["value"] <= needed if op == "<=" else row["value"] >= needed,
                         "_key": key})
        if kept:
            row["targets"] = kept
        self.rows.append(row)
        return row

    def verdicts(self):
        """(verdict, key, text) for every target: PASS and FAIL from the
        rows, NOT MEASURED for an expected target no row checked."""
        out, seen = [], set()
        for r in self.rows:
            for t in r.get("targets", []):
                seen.add(t["_key"])
                what = r["case"] + (" [%s]" % r["config"] if "config" in r else "")
                out.append(("PASS" if t["met"] else "FAIL", t["_key"],
                            "%s: %s %s %s %s %s (%s)" % (what, fmt(r["value"]), r["unit"],
                                                         "<=" if t["op"] == "<=" else ">=",
                                                         fmt(t["needed"]), r["unit"],
                                                         t["goal"])))
        for key, text in self.expected.items():
            if key not in seen:
                out.append(("NOT MEASURED", key, "%s: %s" % (
                    text, self.reasons.get(key, "its stage did not run"))))
        return out

    def final_rows(self, common):
        """The rows with the run's shared fields, ready for results.py."""
        out = []
        for r in self.rows:
            row = dict(common)
            row.update({k: v for k, v in r.items() if k != "targets"})
            if "targets" in r:
                row["targets"] = [{k: t[k] for k in ("goal", "op", "needed", "met")}
                                  for t in r["targets"]]
            out.append(row)
        return out


def fmt(v):
    """A figure for the summary: four significant digits."""
    return "%.4g" % v if finite(v) else str(v)


# ---- from the run's data to rows and targets --------------------------------
#
# data (bench_llm.py gathers it; each part None or absent where its stage
# failed or was skipped, with a "<part>_error" text saying why):
#   plan: {"models": [preset], "batches": {preset: [B]}, "spec": {preset: [K]},
#          "serve": {"model": preset, "rates": [R, ..., "inf"]} or None}
#   rates: hf_peer.py rates' document (copy_gbs, matmul_tflops)
#   models: {preset: {"shape": model_shape(), "bench": parse_bench(),
#            "hf": hf_peer.py generate's document, "spec": {"plain":
#            parse_generate(), "plain_top": {step: (logit, next)} or None,
#            "runs": {K: parse_generate()}, "errors": {K: text}}}}
#   serve: {"model", "stages": [{"rate", "requests", "lg": parse_loadgen(),
#           "cores", "mean_batch", "max_running", "max_in_flight", "error"}],
#           "exit_rc", "copy_gbs", "prefill_ms": {L: ms}}

HF_B1 = "transformers generate, bf16, batch 1, dynamic cache"


def _hf_case(m, batch):
    c = ((m.get("hf") or {}).get("cases") or {}).get("B%d" % batch) or {}
    return c if "tokens_per_s" in c else None


def _model_rows(rep, p, m, plan, rates):
    bench, shape = m.get("bench"), m.get("shape")
    why = m.get("bench_error") or "weft-llm bench did not run"
    copy_torch = (rates or {}).get("copy_gbs")
    matmul = (rates or {}).get("matmul_tflops")
    if not bench or not shape:
        for B in plan["batches"].get(p, []):
            for key in ("roofline", "cpu", "vs-hf"):
                rep.miss("%s:b%d-%s" % (p, B, key), why)
        rep.miss("%s:prefill2048" % p, why)
        return
    roof_gbs = roofline_gbs(bench["copy_gbs"], copy_torch)
    rep.add("device copy (weft_memcpy_async)", "bandwidth", bench["copy_gbs"], "GB/s", config=p,
            detail="read + write; the rooflines here are taken at the better of the two "
            "(%.0f GB/s)" % roof_gbs, peer="torch copy_ of 256 MiB", peer_value=copy_torch)
    for L, pf in sorted(bench["prefill"].items()):
        tflops = prefill_flops(shape, L) / (pf["ms"] * 1e-3) / 1e12
        rep.add("prefill %d tokens" % L, "tokens/s", pf["tokens_per_s"], "tokens/s", config=p,
                detail="%.2f ms; %.3g TFLOP/s of the model's FLOPs" % (pf["ms"], tflops))
        if L == 2048:
            rep.add("prefill 2048 tokens: model FLOP rate", "throughput", tflops, "TFLOP/s",
                    config=p, detail="matmuls of every token, causal attention, the last "
                    "token's lm_head (bench/llm/llm_figures.py prefill_flops)",
                    peer="torch.matmul bf16 8192^3", peer_value=matmul,
                    targets=[("%s:prefill2048" % p,
                              "60% of torch.matmul's bf16 rate, same run", ">=",
                              0.6 * matmul if finite(matmul) else math.nan)])
    if 2048 not in bench["prefill"]:
        rep.miss("%s:prefill2048" % p, "no 2048-token prefill in weft-llm bench's output")
    hf1, hf32 = _hf_case(m, 1), _hf_case(m, 32)
    for B, d in sorted(bench["decode"].items()):
        # weft-llm bench's roofline is at its own copy rate: taken again at roof_gbs
        d = dict(d, roofline_ms=d["roofline_ms"] * bench["copy_gbs"] / roof_gbs)
        d["of_roofline"] = d["roofline_ms"] / d["step_ms"]
        detail = ("roofline %.3f ms (weights + KV at %.0f GB/s), %.0f%% of it; %.0f tokens/s; "
                  "host CPU %.1f us a step" % (d["roofline_ms"], roof_gbs,
                                              100 * d["of_roofline"], d["tokens_per_s"],
                                              d["cpu_us"]))
        targets = []
        if B >= 32:
            targets.append(("%s:b%d-roofline" % (p, B), "1.3 × the roofline of its weight and "
                            "KV bytes at the copy rate, same run", "<=", 1.3 * d["roofline_ms"]))
        rep.add("decode step, batch %d" % B, "time a step", d["step_ms"], "ms", config=p,
                detail=detail, targets=targets)
        if B == 1:
            rep.add("decode batch 1: share of the roofline", "of roofline",
                    100 * d["of_roofline"], "%", config=p,
                    detail="weights + KV read once at the copy rate / the step's time",
                    targets=[("%s:b1-roofline" % p, "80% of the weight-read roofline, same "
                              "run", ">=", 80)])
            hv = hf1["tokens_per_s"] if hf1 else math.nan
            if not hf1:
                rep.miss("%s:b1-vs-hf" % p, (m.get("hf_error") or "transformers' batch 1 "
                                              "was not measured"))
            rep.add("decode batch 1", "tokens/s", d["tokens_per_s"], "tokens/s", config=p,
                    detail=("transformers: %.2f ms a step (median of %d), prefill %.1f ms" %
                            (hf1["step_ms_median"], hf1["new_tokens"] - 1, hf1["prefill_ms"])
                            if hf1 else None),
                    peer=HF_B1, peer_value=hv,
                    targets=[("%s:b1-vs-hf" % p, "25 × transformers' batch-1 tokens/s, same "
                              "run", ">=", 25 * hv)])
        if B == 32 and hf32:
            rep.add("decode batch 32", "tokens/s", d["tokens_per_s"], "tokens/s", config=p,
                    detail="transformers: %.2f ms a step, static cache, compile %s" % (
                        hf32["step_ms_median"], hf32["compile"]),
                    peer="transformers generate, bf16, batch 32, static cache",
                    peer_value=hf32["tokens_per_s"])
        graphs = bench.get("graph_launches")
        rep.add("host CPU per decode step, batch %d" % B, "CPU time", d["cpu_us"], "us",
                config=p, detail="the process's, every thread (the runtime's waiting ones "
                "too)" + ("" if graphs is None else
                          "; %d graph launches over all the run's decode steps" % graphs))
        if "own_cpu_us" in d:
            rep.add("host CPU of a decode step's own work, batch %d" % B, "CPU time",
                    d["own_cpu_us"], "us", config=p,
                    detail="the step's thread before and after its await: checks, staging, "
                    "the launch, the results",
                    targets=[("%s:b%d-cpu" % (p, B), "30 us of host CPU a step (issue 41)",
                              "<=", 30)])
        else:
            rep.miss("%s:b%d-cpu" % (p, B), "weft-llm bench gave no step's own CPU time")
    for B in plan["batches"].get(p, []):
        if B not in bench["decode"]:
            for key in ("roofline", "cpu"):
                rep.miss("%s:b%d-%s" % (p, B, key), "no batch %d in weft-llm bench's output" % B)


def _spec_rows(rep, p, m, plan):
    spec = m.get("spec") or {}
    plain = spec.get("plain")
    for K in plan["spec"].get(p, []):
        keys = ("%s:spec-k%d-speed" % (p, K), "%s:spec-k%d-same" % (p, K))
        run = (spec.get("runs") or {}).get(K)
        if not plain or not run:
            why = (spec.get("errors") or {}).get(K) or m.get("spec_error") or \
                "the speculative runs did not complete"
            for key in keys:
                rep.miss(key, why)
            continue
        ag = agreement(plain["ids"], run["ids"], spec.get("plain_top"))
        if ag["identical"]:
            same = "ids identical to plain greedy decoding (%d tokens)" % len(plain["ids"])
        elif ag["gap_units"] is None:
            same = "parts from plain greedy decoding at token %d (its top-two gap unknown)" % (
                ag["parted_at"])
        else:
            same = "parts from plain greedy decoding at token %d, %s (top-two gap %.2f bf16 " \
                "units)" % (ag["parted_at"], "a near tie" if ag["near_tie"] else
                            "NOT a near tie", ag["gap_units"])
        sp = run.get("spec") or {}
        rep.add("speculative decoding, n-gram drafts of %d" % K, "decode tokens/s",
                run["tokens_per_s"], "tokens/s", config=p,
                detail="acceptance %.1f%% (%s of %s drafted), %.2f tokens a round; %s" % (
                    sp.get("accepted_pct", math.nan), sp.get("accepted"), sp.get("proposed"),
                    sp.get("per_round", math.nan), same),
                peer="plain greedy decode (batch 1), same prompt", peer_value=plain["tokens_per_s"],
                targets=[(keys[0], "1.5 × plain greedy decoding's tokens/s, same run", ">=",
                          1.5 * plain["tokens_per_s"])])
        needed = ag["parted_at"] if ag["ok"] and not ag["identical"] else len(plain["ids"])
        rep.add("speculative decoding, n-gram drafts of %d: same ids" % K, "tokens agreeing",
                ag["agreed"], "tokens", config=p, detail=same,
                targets=[(keys[1], "every id of plain greedy decoding, up to a near tie", ">=",
                          needed)])
    own = spec.get("self_draft")
    if plain and own:
        sp = own.get("spec") or {}
        ag = agreement(plain["ids"], own["ids"], spec.get("plain_top"))
        rep.add("speculative decoding, the model drafting for itself, drafts of %d" % own["k"],
                "decode tokens/s", own["tokens_per_s"], "tokens/s", config=p,
                detail="acceptance %.1f%% (%s of %s drafted), %.2f tokens a round; each round "
                "%d draft steps and one verify pass, so against plain decoding this is the draft "
                "machinery's cost (1.0x: none); ids %s" % (
                    sp.get("accepted_pct", math.nan), sp.get("accepted"), sp.get("proposed"),
                    sp.get("per_round", math.nan), own["k"],
                    "identical" if ag["identical"] else "part at token %s" % ag["parted_at"]),
                peer="plain greedy decode (batch 1), same prompt", peer_value=plain["tokens_per_s"])


def _serve_rows(rep, sv, plan, shapes, torch_copy):
    sp = plan.get("serve")
    if not sp:
        return
    p = sp["model"]
    shape = shapes.get(p)
    stages = {str(s["rate"]): s for s in (sv or {}).get("stages", [])}
    why_all = (sv or {}).get("error") or "the serving stage did not run"
    for rate in sp["rates"]:
        st = stages.get(str(rate))
        keys = {"itl": "serve:itl@%s" % rate}
        if rate == "inf":
            keys.update(tokens="serve:tokens-roofline", cores="serve:cores")
        else:
            keys["ttft"] = "serve:ttft@%s" % rate
        lg = (st or {}).get("lg")
        if not lg:
            for key in keys.values():
                rep.miss(key, (st or {}).get("error") or why_all)
            continue
        label = "all at once" if rate == "inf" else "%s/s Poisson" % rate
        config = "%s, %d requests %s" % (p, st["requests"], label)
        cores = st.get("cores")
        mean_batch = st.get("mean_batch")
        ptoks = lg["prompt_tokens"]
        med_prompt = median(ptoks) if ptoks else lg["prompt_tokens_mean"]
        common = ("%d ok, %d failed; prompts %.0f tokens on average; mean batch %s, at most %s "
                  "running, %s in flight; server %.2f host cores" % (
                      lg["ok"], lg["failed"], lg["prompt_tokens_mean"] if
                      finite(lg["prompt_tokens_mean"]) else math.nan,
                      "%.1f" % mean_batch if finite(mean_batch) else "?",
                      st.get("max_running", "?"), st.get("max_in_flight", "?"),
                      cores if finite(cores) else math.nan))
        if lg["failed"]:
            common += "; first failure: %s" % (lg["first_error"] or "?")[:120]
        targets = []
        if rate == "inf":
            ctx = (lg["prompt_tokens_mean"] if finite(lg["prompt_tokens_mean"]) else 0) + \
                lg["output_tokens"] / max(lg["ok"], 1) / 2
            roof = math.nan
            roof_gbs = roofline_gbs(sv.get("copy_gbs"), torch_copy)
            if shape and finite(mean_batch) and mean_batch > 0 and finite(roof_gbs):
                roof = mean_batch / step_roofline_s(shape, roof_gbs, mean_batch, ctx)
            else:
                rep.miss(keys["tokens"], "no batch size or copy rate to take the roofline at")
            targets.append((keys["tokens"], "70%% of the roofline of a step at the batch "
                            "reached (%s, %.0f tokens of context), same run" % (
                                "%.1f" % mean_batch if finite(mean_batch) else "?", ctx), ">=",
                            0.7 * roof))
        rep.add("serve: output tokens/s", "throughput", lg["output_tokens_per_s"], "tokens/s",
                config=config, detail=common, targets=targets)
        itl = lg["itl_s"]
        rep.add("serve: inter-token latency p99", "p99", ms(itl["p99"]), "ms", config=config,
                detail="median %.2f ms, p90 %.2f ms, over %d gaps" % (
                    ms(itl["p50"]), ms(itl["p90"]), itl["n"]),
                targets=[(keys["itl"], "1.5 × the median inter-token latency of the same load",
                          "<=", 1.5 * ms(itl["p50"]))])
        ttft = lg["ttft_s"]
        targets = []
        if "ttft" in keys:
            alone = interpolate((sv or {}).get("prefill_ms") or {}, med_prompt) \
                if finite(med_prompt) else math.nan
            targets.append((keys["ttft"], "2 × the prefill of the median prompt (%.0f tokens) "
                            "alone, weft-llm bench, same run" % (med_prompt or 0), "<=",
                            2 * alone))
        rep.add("serve: time to first token p50", "p50", ms(ttft["p50"]), "ms", config=config,
                detail="p90 %.1f ms, p99 %.1f ms" % (ms(ttft["p90"]), ms(ttft["p99"])),
                targets=targets)
        targets = []
        if "cores" in keys:
            targets.append((keys["cores"], "1 host core at high load (%s requests in flight at "
                            "most)" % st.get("max_in_flight", "?"), "<=", 1))
        rep.add("serve: server's host CPU", "cores", cores, "cores", config=config,
                detail="the server process's user + system CPU time over the load's wall time "
                "(/proc/PID/stat)", targets=targets)


def build_report(data):
    """The run's Report from data (the layout above)."""
    rep = Report()
    plan = data["plan"]
    for p in plan["models"]:
        for B in plan["batches"].get(p, []):
            rep.expect("%s:b%d-cpu" % (p, B), "%s: host CPU per decode step, batch %d" % (p, B))
            if B == 1:
                rep.expect("%s:b1-roofline" % p, "%s: batch-1 decode >= 80%% of the roofline" % p)
                rep.expect("%s:b1-vs-hf" % p, "%s: batch-1 decode >= 25 × transformers'" % p)
            if B >= 32:
                rep.expect("%s:b%d-roofline" % (p, B), "%s: batch-%d step within 1.3 × the "
                           "roofline" % (p, B))
        rep.expect("%s:prefill2048" % p, "%s: prefill of 2048 tokens >= 60%% of the bf16 "
                   "matmul rate" % p)
        for K in plan["spec"].get(p, []):
            rep.expect("%s:spec-k%d-speed" % (p, K), "%s: speculative (K=%d) >= 1.5 × batch-1 "
                       "tokens/s" % (p, K))
            rep.expect("%s:spec-k%d-same" % (p, K), "%s: speculative (K=%d) greedy ids as "
                       "plain's" % (p, K))
    if plan.get("serve"):
        for rate in plan["serve"]["rates"]:
            rep.expect("serve:itl@%s" % rate, "serve at rate %s: ITL p99 <= 1.5 × median" % rate)
            if rate == "inf":
                rep.expect("serve:tokens-roofline", "serve at saturation: output tokens/s >= "
                           "70% of the step's roofline")
                rep.expect("serve:cores", "serve at saturation: server <= 1 host core")
            else:
                rep.expect("serve:ttft@%s" % rate, "serve at rate %s: TTFT p50 <= 2 × the "
                           "prompt's prefill alone" % rate)
    rates = data.get("rates") or {}
    if finite(rates.get("matmul_tflops")):
        rep.add("bf16 matmul 8192^3 (torch.matmul)", "throughput", rates["matmul_tflops"],
                "TFLOP/s", detail="the rate prefill's target is taken against")
    else:
        rep.note("torch.matmul's rate not measured: %s" % (data.get("rates_error") or "?"))
    models = data.get("models") or {}
    for p in plan["models"]:
        m = models.get(p) or {}
        _model_rows(rep, p, m, plan, rates)
        _spec_rows(rep, p, m, plan)
    shapes = {p: (models.get(p) or {}).get("shape") for p in plan["models"]}
    _serve_rows(rep, data.get("serve"), plan, shapes, rates.get("copy_gbs"))
    return rep
