#!/usr/bin/env python3
"""test_bench_llm.py - bench_llm.py's parsers and arithmetic, without a GPU.

weft-llm bench's table and BENCH lines, generate's --print-ids / --stats /
--print-top lines, loadgen's JSON, /metrics and /proc/PID/stat are read back
to the figures they hold, and what each refuses is refused; the bytes and
FLOPs of a model are checked against the counts weft-llm bench prints and
against hand arithmetic; the speculative output's agreement rule (a parting
at a near tie is allowed, any other is not); and a run's data, with figures
chosen to meet some targets and miss others, made into rows that
bench/results.py accepts, each target's verdict the one its figures give,
and every target without its figures listed as NOT MEASURED. Plain python3.
"""
import copy
import math
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)
import bench_llm  # noqa: E402
import llm_figures as lf  # noqa: E402
import results  # noqa: E402

FAILURES = []


def check(cond, what):
    if not cond:
        FAILURES.append(what)
        print("FAILED: " + what)


def raises(fn, what):
    try:
        fn()
    except lf.ParseError:
        return
    check(False, what + ": no ParseError")


# weft-llm bench's output as bench.c prints it (the tiny preset's counts)
BENCH_OUT = """/tmp/tiny: llama, 2 layers, hidden 64, BF16; 0.0003607 GB of weights read a step; copy rate 12.7 GB/s

| prefill tokens | ms | tokens/s |
|---:|---:|---:|
| 16 | 7.799 | 2051 |
| 2048 | 12.178 | 168172 |

| decode batch | ms a step | tokens/s | roofline ms | of roofline | host CPU us a step |
|---:|---:|---:|---:|---:|---:|
| 1 | 1.349 | 741 | 0.039 | 3% | 1557 |
| 32 | 10.060 | 3181 | 9.000 | 89% | 25 |

decode steps as graphs: 68 launches, 2 instantiations, 66 updates (0 on the host backend)

BENCH llm.copy_rate 12.7 GB/s
BENCH llm.decode.graph_launches 68 launches
BENCH llm.prefill.L16.tokens_per_s 2051.4 tokens/s
BENCH llm.prefill.L2048.tokens_per_s 168172.0 tokens/s
BENCH llm.decode.B1.step_ms 1.3491 ms
BENCH llm.decode.B1.tokens_per_s 741.3 tokens/s
BENCH llm.decode.B1.of_roofline 0.029 fraction
BENCH llm.decode.B1.cpu_us_per_step 1557.1 us
BENCH llm.decode.B1.own_cpu_us_per_step 41.0 us
BENCH llm.decode.B32.step_ms 10.0596 ms
BENCH llm.decode.B32.tokens_per_s 3181.0 tokens/s
BENCH llm.decode.B32.of_roofline 0.895 fraction
BENCH llm.decode.B32.cpu_us_per_step 25.0 us
BENCH llm.decode.B32.own_cpu_us_per_step 22.5 us
"""

TINY = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64, "vocab_size": 514,
        "tie_word_embeddings": False, "max_position_embeddings": 4096}
ONE_B = {"hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16,
         "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 64,
         "vocab_size": 128256, "tie_word_embeddings": True}


def test_bench():
    b = lf.parse_bench(BENCH_OUT)
    check(b["copy_gbs"] == 12.7 and b["weights_gb"] == 0.0003607, "bench: header figures")
    check(b["graph_launches"] == 68 and set(b["decode"]) == {1, 32},
          "bench: the graph launches, not a batch")
    check(abs(b["prefill"][2048]["ms"] - 2048 / 168172.0 * 1e3) < 1e-9, "bench: prefill ms")
    d1, d32 = b["decode"][1], b["decode"][32]
    check(d1["step_ms"] == 1.3491 and d1["cpu_us"] == 1557.1 and d1["of_roofline"] == 0.029,
          "bench: batch 1 figures from the BENCH lines")
    check(d1["own_cpu_us"] == 41.0 and d32["own_cpu_us"] == 22.5,
          "bench: the steps' own CPU time, which the 30 us target is taken against")
    older = lf.parse_bench("\n".join(x for x in BENCH_OUT.splitlines() if "own_cpu" not in x))
    check("own_cpu_us" not in older["decode"][1], "bench: an older bench without the own CPU line")
    check(d1["roofline_ms"] == 0.039 and d32["roofline_ms"] == 9.0,
          "bench: the roofline in ms from the table")
    no_table = "\n".join(x for x in BENCH_OUT.splitlines() if not x.startswith("| 32"))
    check(abs(lf.parse_bench(no_table)["decode"][32]["roofline_ms"] - 0.895 * 10.0596) < 1e-9,
          "bench: without its table row, the roofline from the fraction")
    raises(lambda: lf.parse_bench("| 1 | 2 |\n"), "bench: no BENCH lines")
    raises(lambda: lf.parse_bench(BENCH_OUT.replace("BENCH llm.decode.B32.cpu_us_per_step",
                                                    "BENCH llm.other")),
           "bench: a batch without its CPU line")
    raises(lambda: lf.parse_bench(BENCH_OUT.replace("12.7 GB/s\nBENCH", "x GB/s\nBENCH", 1)
                                  .replace("BENCH llm.copy_rate 12.7", "BENCH llm.copy_rate x")),
           "bench: a value that is not a number")
    # the bytes a step reads, as bench.c counts them (its header's figure)
    s = lf.model_shape(TINY)
    check(abs(lf.weight_bytes(s) / 1e9 - b["weights_gb"]) < 1e-7, "weights: bench.c's count")
    one = lf.model_shape(ONE_B)
    check(lf.linear_params(one) == 16 * (2048 * 2048 * 2 + 2 * 2048 * 512 + 3 * 2048 * 8192),
          "weights: the 1b preset's layers")
    check(lf.kv_bytes_per_token(one) == 2 * 16 * 8 * 64 * 2, "KV bytes a token")
    L = 2048
    want = 2 * L * lf.linear_params(one) + 16 * 2 * 32 * 64 * L * L + 2 * 2048 * 128256
    check(lf.prefill_flops(one, L) == want, "prefill FLOPs")
    r = lf.step_roofline_s(one, 4000, 32, 1000)
    check(abs(r - (lf.weight_bytes(one) + 32 * 1000 * 32768) / 4e12) < 1e-15, "step roofline")
    check(lf.roofline_gbs(2597.0, 4185.0) == 4185.0 and lf.roofline_gbs(2597.0, None) == 2597.0
          and math.isnan(lf.roofline_gbs(None, float("nan"))),
          "rooflines at the better copy rate of the run")


GEN_ERR = """prompt ids: 256,296,267
generated ids: 302,13,58,58
speculative: 15 rounds, 48 draft tokens, 47 accepted (97.9%), 4.20 tokens a round
time: first token 222.0 ms; decode 3 tokens in 285.1 ms (221.0 tokens/s)
  step 0: token 302 (top 302) logit 2.56000, next 2.55000, gap 1.00e-02
  step 1: token 13 (top 13) logit -1.28000, next -2.28000, gap 1.00e+00
"""


def test_generate():
    g = lf.parse_generate(GEN_ERR)
    check(g["prompt_ids"] == [256, 296, 267] and g["ids"] == [302, 13, 58, 58],
          "generate: ids")
    check(g["spec"] == {"rounds": 15, "proposed": 48, "accepted": 47, "accepted_pct": 97.9,
                        "per_round": 4.2}, "generate: the speculative line")
    check(g["tokens_per_s"] == 221.0 and g["decode_tokens"] == 3 and g["first_token_ms"] == 222.0,
          "generate: the time line")
    check(g["top"] == {0: (2.56, 2.55), 1: (-1.28, -2.28)}, "generate: --print-top's steps")
    plain = lf.parse_generate("\n".join(x for x in GEN_ERR.splitlines()
                                        if not x.startswith("speculative")))
    check(plain["spec"] is None, "generate: no speculative line, no spec")
    raises(lambda: lf.parse_generate(GEN_ERR.replace("generated ids", "other ids")),
           "generate: no ids")
    raises(lambda: lf.parse_generate(GEN_ERR.replace("time:", "tim:")), "generate: no time")
    # agreement: a gap of 8 bf16 units or less (|top| / 128 each) is a near tie
    check(lf.first_parting([1, 2, 3], [1, 2, 3]) is None, "parting: equal")
    check(lf.first_parting([1, 2, 3], [1, 5, 3]) == 1, "parting: a different id")
    check(lf.first_parting([1, 2, 3], [1, 2]) == 2, "parting: a shorter list")
    a = lf.agreement([1, 2, 3], [1, 2, 3])
    check(a["ok"] and a["identical"] and a["agreed"] == 3, "agreement: identical")
    top = {1: (1.28, 1.28 - 7.5 * 0.01), 2: (1.28, 1.28 - 9 * 0.01)}
    a = lf.agreement([1, 2, 3], [1, 5, 3], top)
    check(a["ok"] and a["near_tie"] and a["parted_at"] == 1 and a["agreed"] == 1 and
          abs(a["gap_units"] - 7.5) < 1e-9, "agreement: parted at a near tie")
    a = lf.agreement([1, 2, 3], [1, 2, 4], top)
    check(not a["ok"] and a["near_tie"] is False, "agreement: parted at a clear gap")
    a = lf.agreement([1, 2, 3], [1, 2, 4], {})
    check(not a["ok"] and a["gap_units"] is None, "agreement: parted, the gap unknown")


def loadgen_doc(ttft=(0.05, 0.1), itl=(0.004, 0.005), ok=10, failed=0, tok_s=1000.0):
    def dist(p50, p99):
        return {"n": ok, "mean": p50, "p50": p50, "p90": p99, "p99": p99, "max": p99}
    reqs = [{"reason": "ok", "error": None, "prompt_tokens": 100 + 10 * i, "prompt_words": 40 + i}
            for i in range(ok)]
    reqs += [{"reason": "http", "error": "too long", "prompt_tokens": None, "prompt_words": 9}
             for _ in range(failed)]
    return {"summary": {"ok": ok, "failed": failed, "failed_by_reason": {"http": failed},
                        "wall_s": 10.0, "output_tokens_per_s": tok_s, "output_tokens": 100 * ok,
                        "prompt_words_mean": 44.5, "prompt_tokens_mean": 145.0,
                        "achieved_rate": 2.0, "ttft_s": dist(*ttft), "itl_s": dist(*itl),
                        "tpot_s": dist(*itl), "e2e_s": dist(1, 2)},
            "requests": reqs}


def test_loadgen_metrics_proc():
    lg = lf.parse_loadgen(loadgen_doc(failed=1))
    check(lg["ok"] == 10 and lg["failed"] == 1 and lg["first_error"] == "too long",
          "loadgen: counts and the first failure")
    check(lg["prompt_tokens"] == [100 + 10 * i for i in range(10)],
          "loadgen: the prompt tokens of the requests that succeeded")
    check(lg["itl_s"]["p99"] == 0.005 and lg["ttft_s"]["p50"] == 0.05, "loadgen: latencies")
    broken = loadgen_doc()
    del broken["summary"]["itl_s"]
    raises(lambda: lf.parse_loadgen(broken), "loadgen: no itl_s")
    m = lf.parse_metrics('# HELP x y\nweft_llm_batch_steps_total 12\n'
                         'weft_llm_requests_total{endpoint="/metrics",status="200"} 3\n'
                         'weft_llm_time_to_first_token_seconds_sum 0.250000\nbad line here\n')
    check(m == {"weft_llm_batch_steps_total": 12.0,
                'weft_llm_requests_total{endpoint="/metrics",status="200"}': 3.0,
                "weft_llm_time_to_first_token_seconds_sum": 0.25}, "metrics: %r" % m)
    stat = "4242 (weft-llm (x) y) S 1 2 3 4 5 6 7 8 9 10 250 150 0 0 20 0 9 0"
    check(lf.proc_cpu_seconds(stat, 100) == 4.0, "proc: utime + stime past a command with "
          "spaces and parentheses")
    check(lf.interpolate({128: 1.0, 512: 3.0, 2048: 15.0}, 320) == 2.0, "interpolate: inside")
    check(abs(lf.interpolate({128: 1.0, 512: 3.0}, 1024) - 17 / 3) < 1e-12,
          "interpolate: past the end")
    check(lf.interpolate({128: 1.0, 512: 3.0}, 64) == 0.6666666666666667,
          "interpolate: before the start")
    check(lf.interpolate({100: 2.0}, 50) == 1.0, "interpolate: one point")
    check(math.isnan(lf.interpolate({}, 5)), "interpolate: no point")
    check(lf.median([3, 1, 2]) == 2 and lf.median([4, 1, 2, 3]) == 2.5, "median")


SELF_DRAFT_SPEC = {"rounds": 10, "proposed": 40, "accepted": 40, "accepted_pct": 100.0,
                   "per_round": 5.0}


def plain_rate(data):
    return data["models"]["1b"]["spec"]["plain"]["tokens_per_s"]


def run_data():
    """A run's data: 1b measured (its batch 1 missing the roofline, its
    batch 32 meeting it), 8b's bench missing, serving at one rate and at
    saturation."""
    bench = lf.parse_bench(BENCH_OUT)
    plain = lf.parse_generate(GEN_ERR.replace("speculative: 15", "x"))
    fast = copy.deepcopy(plain)
    fast["tokens_per_s"] = 400.0
    slow = copy.deepcopy(plain)
    slow["ids"] = [302, 99, 58, 58]
    return {
        "plan": {"models": ["1b", "8b"], "batches": {"1b": [1, 32], "8b": [1, 32]},
                 "spec": {"1b": [4, 8], "8b": [4]},
                 "serve": {"model": "1b", "rates": ["2", "inf"]}},
        "rates": {"copy_gbs": 13.0, "matmul_tflops": 0.05},
        "models": {
            "1b": {"shape": lf.model_shape(TINY), "bench": bench,
                   "hf": {"cases": {"B1": {"tokens_per_s": 20.0, "step_ms_median": 50.0,
                                           "new_tokens": 128, "prefill_ms": 30.0},
                                    "B32": {"error": "compile failed"}}},
                   "spec": {"plain": plain, "plain_top": {1: (1.28, 0.0)},
                            "runs": {4: fast, 8: slow}, "errors": {},
                            "self_draft": dict(copy.deepcopy(plain), k=4,
                                               spec=SELF_DRAFT_SPEC)}},
            "8b": {"bench_error": "weft-llm bench 8b: exit status 1: out of memory"},
        },
        "serve": {"model": "1b", "copy_gbs": 12.7, "prefill_ms": {128: 10.0, 512: 40.0},
                  "exit_rc": 0, "stages": [
                      {"rate": "2", "requests": 10, "lg": lf.parse_loadgen(loadgen_doc()),
                       "cores": 0.3, "mean_batch": 2.0, "max_running": 3, "max_in_flight": 3},
                      {"rate": "inf", "requests": 10,
                       "lg": lf.parse_loadgen(loadgen_doc(itl=(0.004, 0.009), tok_s=5.0)),
                       "cores": 1.5, "mean_batch": 8.0, "max_running": 10,
                       "max_in_flight": 10}]},
    }


def test_report():
    data = run_data()
    rep = lf.build_report(data)
    verdicts = {key: v for v, key, _ in rep.verdicts()}
    want = {
        "1b:b1-roofline": "FAIL",       # 2.9% of the roofline
        "1b:b1-vs-hf": "PASS",          # 741.3 >= 25 × 20
        "1b:b32-roofline": "PASS",      # 10.06 ms <= 1.3 × 9 ms
        "1b:b1-cpu": "FAIL", "1b:b32-cpu": "PASS",
        "1b:prefill2048": "PASS",       # the model's FLOPs at 168172 tokens/s >> 0.03 TFLOP/s
        "1b:spec-k4-speed": "PASS",     # 400 >= 1.5 × 221
        "1b:spec-k4-same": "PASS",
        "1b:spec-k8-speed": "FAIL", "1b:spec-k8-same": "FAIL",  # parted at a clear gap
        "8b:b1-roofline": "NOT MEASURED", "8b:b1-vs-hf": "NOT MEASURED",
        "8b:b32-roofline": "NOT MEASURED", "8b:prefill2048": "NOT MEASURED",
        "8b:b1-cpu": "NOT MEASURED", "8b:b32-cpu": "NOT MEASURED",
        "8b:spec-k4-speed": "NOT MEASURED",
        "8b:spec-k4-same": "NOT MEASURED",
        "serve:itl@2": "PASS",          # 5 ms <= 1.5 × 4 ms
        "serve:ttft@2": "FAIL",         # 50 ms against 2 × the prefill of 145 tokens (~11 ms)
        "serve:itl@inf": "FAIL",        # 9 ms > 6 ms
        "serve:tokens-roofline": "FAIL", "serve:cores": "FAIL",
    }
    for key, v in want.items():
        check(verdicts.get(key) == v, "report: %s is %s, not %s" % (key, verdicts.get(key), v))
    extra = set(verdicts) - set(want)
    check(not extra, "report: targets not expected: %s" % sorted(extra))
    reasons = {key: text for v, key, text in rep.verdicts() if v == "NOT MEASURED"}
    check("out of memory" in reasons.get("8b:b1-roofline", ""),
          "report: a missing target says why: %r" % reasons.get("8b:b1-roofline"))
    common = {"benchmark": "llm", "machine": "test", "commit": "abc", "date": "2026-12-05 10:00 "
              "UTC", "quick": True}
    rows = rep.final_rows(common)
    for i, r in enumerate(rows):
        try:
            results.validate(r, "row %d" % i)
        except results.Bad as e:
            check(False, "report: %s" % e)
    own = [r for r in rows if r["case"].startswith("speculative decoding, the model drafting")]
    check(len(own) == 1 and own[0]["peer_value"] == plain_rate(data) and not own[0].get("targets")
          and "acceptance 100.0%" in own[0]["detail"] and "ids identical" in own[0]["detail"],
          "report: the self-drafting run beside plain decoding, no target: %s" % own)
    b32 = [r for r in rows if r["case"] == "decode step, batch 32" and r.get("config") == "1b"]
    check(len(b32) == 1 and "at 13 GB/s" in b32[0]["detail"] and
          "roofline 8.792 ms" in b32[0]["detail"],
          "report: batch 32's roofline taken again at torch's faster copy (9 ms x 12.7 / 13): %s"
          % (b32[0]["detail"] if b32 else None))
    peers = [r for r in rows if r.get("peer", "").startswith("transformers")]
    check(len(peers) == 1 and peers[0]["peer_value"] == 20.0,
          "report: transformers' batch 1 beside weft's, its failed batch 32 left out")
    # a target whose reference was not measured is NOT MEASURED, not met
    data2 = run_data()
    data2["rates"] = {}
    v2 = {key: v for v, key, _ in lf.build_report(data2).verdicts()}
    check(v2["1b:prefill2048"] == "NOT MEASURED", "report: prefill without the matmul rate")
    # a value that is not finite is a note, never a row
    rep3 = lf.Report()
    rep3.expect("k", "a target")
    rep3.add("case", "m", float("nan"), "ms", targets=[("k", "goal", "<=", 1.0)])
    check(not rep3.rows and rep3.verdicts()[0][0] == "NOT MEASURED" and rep3.notes,
          "report: a NaN value")


def test_options():
    full = bench_llm.parse_args([])
    quick = bench_llm.parse_args(["--quick"])
    check(full.models == ["1b", "8b"] and quick.models == ["1b"], "options: models")
    check(full.hf_compile == "auto" and quick.hf_compile == "off", "options: compile")
    check(full.time_budget > quick.time_budget and full.saturation_requests == 1000,
          "options: budgets")
    check(full.prompt_range == [128, 2048] and full.output_range == [64, 512],
          "options: the serving distributions")
    check(full.rows.endswith("llm.rows.jsonl"), "options: rows")
    plan = bench_llm.plan_of(full)
    check(plan["serve"]["rates"] == ["2", "8", "32", "inf"] and plan["spec"]["8b"] == [4, 8],
          "options: the plan")


def main():
    for t in (test_bench, test_generate, test_loadgen_metrics_proc, test_report, test_options):
        t()
    if FAILURES:
        print("test_bench_llm: %d check(s) failed" % len(FAILURES))
        return 1
    print("test_bench_llm: every check passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
