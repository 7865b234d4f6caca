#!/usr/bin/env python3
"""bench_llm.py - weft-llm against its targets and peers, in one run on one GPU.

Stages, each within the run's time budget (one that cannot finish in what
is left is skipped and says so; its targets are reported NOT MEASURED).
The order: models and rates; the first model's bench, spec and peer while
the others are written; the others' bench; serve; the others' spec and
peer.
  models   weft-llm random-model DIR --preset 1b and 8b (Llama 3.2 1B and
           Llama 3.1 8B shapes, bf16; Hugging Face layout, which
           transformers loads as it is), written once under --models-dir
           and reused while complete; 8b is written in the background
           while the 1b stages run (--models 1b leaves it out)
  rates    torch's device copy rate and bf16 matmul rate (hf_peer.py rates)
  bench    weft-llm bench MODEL --backend cuda: the copy rate, prefill,
           decode steps at batches 1..128 with their rooflines (BENCH lines)
  spec     weft-llm generate on a phrase repeated 20 times, plain and with
           --speculate K: decode tokens/s, acceptance, and the ids compared
           (a parting is checked for a near tie with --print-top); and with
           the model as its own draft (--draft), the cost of a draft model
  serve    weft-llm serve on the 1b model; weft-llm loadgen at rising
           Poisson rates and then all at once (saturation), prompts of
           128-2048 tokens (the loadgen's words scaled by the tokens a word
           makes, measured first), outputs of 64-512; /metrics polled for
           the batch reached and requests in flight, the server's CPU time
           from /proc; SIGTERM at the end, and exit status 0 checked
  peer     transformers' generate on the same folders (hf_peer.py
           generate): batch 1 (dynamic cache) and batch 32 (static cache)
Every subprocess's stdout and stderr is kept under OUT/logs/. At the end:
the targets of issues 41 and 42, each PASS, FAIL or NOT MEASURED with the
figures it was computed from, the rows (bench/results.py) in --rows, and
OUT/summary.md and OUT/data.json (every figure gathered). Exit status 0
when every stage ran, 1 when one failed or was skipped (the rest are
still reported), 77 without a GPU, 2 for bad usage. A missed target is
reported, not an error.
"""
import argparse
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)
import bench_common  # noqa: E402
import llm_figures as lf  # noqa: E402
import results  # noqa: E402

ROOT = bench_common.ROOT
# bytes each preset's folder takes (README's table), for the disk check
MODEL_BYTES = {"tiny": 1 << 20, "1b": int(2.5e9), "8b": int(16.1e9)}


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="\n".join(__doc__.split("\n")[2:]))
    ap.add_argument("--weft-llm", default=os.path.join(ROOT, "build-release", "apps", "weft-llm",
                                                       "weft-llm"), help="the program")
    ap.add_argument("--out", default=os.path.join(ROOT, "build-release", "bench", "llm"),
                    help="where the logs, summary.md and data.json go (default %(default)s)")
    ap.add_argument("--rows", help="the rows (JSON lines; default OUT/llm.rows.jsonl)")
    ap.add_argument("--no-rows", action="store_true")
    ap.add_argument("--quick", action="store_true",
                    help="a smoke run: 1b only, fewer steps and requests, no torch.compile; "
                    "rows marked quick (never recorded)")
    ap.add_argument("--time-budget", type=float, help="seconds for the whole run (default 530; "
                    "quick 240); stages that would pass it are skipped")
    ap.add_argument("--models", help="presets, in order (default 1b,8b; quick 1b)")
    ap.add_argument("--models-dir", default="/tmp/weft-llm-bench",
                    help="where the models are written and kept between runs (16 GB for 8b; "
                    "never under --out) (default %(default)s)")
    ap.add_argument("--backend", default="cuda", help="weft-llm's backend (host: a dry run)")
    ap.add_argument("--no-torch", action="store_true",
                    help="no PyTorch peers (torch rates, transformers): their targets NOT "
                    "MEASURED")
    ap.add_argument("--hf-compile", choices=("auto", "off"),
                    help="transformers' static cache compiles its forward (auto, its default; "
                    "quick: off)")
    ap.add_argument("--hf-new-tokens", type=int, help="transformers' new tokens (default 128; "
                    "quick 32) after a 128-token prompt")
    ap.add_argument("--bench-batches", default="1,8,32,128")
    ap.add_argument("--bench-prompt-lens", help="default 128,512,2048, and 1024,4096 for the "
                    "served model (its prompts' prefill alone); cut to the model's context")
    ap.add_argument("--bench-steps", type=int, help="default 32; quick 16")
    ap.add_argument("--spec-k", help="draft lengths (default 4,8; quick 4)")
    ap.add_argument("--spec-max-tokens", type=int, help="default 256; quick 128")
    ap.add_argument("--spec-phrase", default="The old woman read her book by the window.")
    ap.add_argument("--spec-repeats", type=int, default=20)
    ap.add_argument("--serve-model", default="1b", help="the model served ('' for none)")
    ap.add_argument("--serve-rates", help="Poisson rates, requests/s, rising (default 2,8,32; "
                    "quick 4); then all at once")
    ap.add_argument("--serve-seconds", type=float,
                    help="arrivals of each Poisson rate last this long (default 15; quick 6)")
    ap.add_argument("--saturation-requests", type=int,
                    help="requests sent at once at the end (default 1000; quick 128)")
    ap.add_argument("--serve-budget", type=float, help="seconds for the serving stage "
                    "(default 170; quick 80)")
    ap.add_argument("--max-seqs", type=int, default=64, help="the server's batch places")
    ap.add_argument("--step-prompt-tokens", type=int, default=0,
                    help="the server's prompt tokens a step beside decodes (0: its default)")
    ap.add_argument("--prompt-tokens", default="128-2048")
    ap.add_argument("--output-tokens", default="64-512")
    ap.add_argument("--seed", type=int, default=1, help="random-model's seed")
    args = ap.parse_args(argv)
    q = args.quick
    defaults = {"time_budget": 240 if q else 530, "models": "1b" if q else "1b,8b",
                "hf_compile": "off" if q else "auto", "hf_new_tokens": 32 if q else 128,
                "bench_steps": 16 if q else 32, "spec_k": "4" if q else "4,8",
                "spec_max_tokens": 128 if q else 256, "serve_rates": "4" if q else "2,8,32",
                "serve_seconds": 6 if q else 15, "saturation_requests": 128 if q else 1000,
                "serve_budget": 80 if q else 170}
    for k, v in defaults.items():
        if getattr(args, k) is None:
            setattr(args, k, v)
    try:
        args.models = [m for m in args.models.split(",") if m]
        args.bench_batches = [int(x) for x in args.bench_batches.split(",") if x]
        args.spec_k = [int(x) for x in args.spec_k.split(",") if x]
        args.serve_rates = [float(x) for x in args.serve_rates.split(",") if x]
        args.prompt_range = [int(x) for x in args.prompt_tokens.split("-")]
        args.output_range = [int(x) for x in args.output_tokens.split("-")]
        if args.bench_prompt_lens:
            args.bench_prompt_lens = [int(x) for x in args.bench_prompt_lens.split(",") if x]
    except ValueError as e:
        ap.error("a list of numbers expected: %s" % e)
    for m in args.models:
        if m not in MODEL_BYTES:
            ap.error("--models: %s is not one of %s" % (m, ", ".join(MODEL_BYTES)))
    if args.serve_model and args.serve_model not in args.models:
        ap.error("--serve-model %s is not among --models" % args.serve_model)
    if len(args.prompt_range) not in (1, 2) or len(args.output_range) not in (1, 2):
        ap.error("--prompt-tokens and --output-tokens take A or A-B")
    args.rows = args.rows or os.path.join(args.out, "llm.rows.jsonl")
    return args


# ---- running things -----------------------------------------------------------

class Run:
    """The run's clock, its log and its subprocesses (each logged to
    OUT/logs/NN-name.out and .err)."""

    def __init__(self, args):
        self.args, self.t0 = args, time.monotonic()
        self.deadline = self.t0 + args.time_budget - 8  # room for the report
        self.logs = os.path.join(args.out, "logs")
        os.makedirs(self.logs, exist_ok=True)
        self.n, self.errors, self.live = 0, [], set()
        self.logf = open(os.path.join(args.out, "bench_llm.log"), "w")

    def left(self):
        return self.deadline - time.monotonic()

    def say(self, msg):
        line = "bench_llm [%5.1f s]: %s" % (time.monotonic() - self.t0, msg)
        print(line, flush=True)
        self.logf.write(line + "\n")
        self.logf.flush()

    def fail(self, msg):
        self.errors.append(msg)
        self.say("FAILED: " + msg)

    def log_path(self, name):
        self.n += 1
        return os.path.join(self.logs, "%02d-%s" % (self.n, name))

    def start(self, name, cmd):
        """cmd started in a session of its own, its output logged; returns
        (Popen, log base)."""
        base = self.log_path(name)
        shown = " ".join(a if len(a) <= 60 else "'%s...' (%d characters)" % (a[:40], len(a))
                         for a in cmd)
        self.say("%s: %s (logs %s.out/.err)" % (name, shown, base))
        out, err = open(base + ".out", "w"), open(base + ".err", "w")
        try:
            p = subprocess.Popen(cmd, stdout=out, stderr=err, stdin=subprocess.DEVNULL,
                                 start_new_session=True)
        finally:
            out.close()
            err.close()
        self.live.add(p)
        return p, base

    def kill(self, p):
        """p and what it started (its session), at once."""
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except OSError:
            pass
        p.wait()
        self.live.discard(p)

    def cleanup(self):
        """Every process still running (the run was cut short) killed."""
        for p in list(self.live):
            if p.poll() is None:
                self.say("killing %s (pid %d), still running" % (p.args[1] if len(p.args) > 1
                                                                 else p.args[0], p.pid))
                self.kill(p)

    def call(self, name, cmd, timeout):
        """cmd run to its end, at most timeout seconds (and never past the
        deadline): {"rc" (None: killed at the limit), "out", "err", "wall",
        "log"}."""
        limit = max(1.0, min(timeout, self.left()))
        t = time.monotonic()
        p, base = self.start(name, cmd)
        try:
            rc = p.wait(limit)
            self.live.discard(p)
        except subprocess.TimeoutExpired:
            self.kill(p)
            rc = None
            self.say("%s: killed after %.0f s (its time limit)" % (name, limit))
        with open(base + ".out", errors="replace") as f:
            out = f.read()
        with open(base + ".err", errors="replace") as f:
            err = f.read()
        return {"rc": rc, "out": out, "err": err, "wall": time.monotonic() - t, "log": base}


def tail(text, n=3):
    lines = [x for x in text.strip().splitlines() if x.strip()]
    return " | ".join(lines[-n:])[-400:] if lines else "(no output)"


def why_failed(name, res):
    if res["rc"] is None:
        return "%s: killed at its time limit after %.0f s (log %s)" % (name, res["wall"],
                                                                       res["log"])
    return "%s: exit status %d: %s (log %s)" % (name, res["rc"], tail(res["err"] or res["out"]),
                                               res["log"])


def skip(run, what, needs):
    """A stage left out for want of time: said, counted as a failure of the
    run, and its reason returned for the targets it would have measured."""
    msg = "%s skipped: %.0f s of the time budget left, it needs about %.0f" % (
        what, run.left(), needs)
    run.fail(msg)
    return msg


# ---- the models -----------------------------------------------------------------

def model_dir(args, preset):
    return os.path.join(args.models_dir, "%s-seed%d" % (preset, args.seed))


def model_ready(path):
    return os.path.exists(os.path.join(path, ".complete")) and \
        os.path.exists(os.path.join(path, "config.json"))


def start_writing(run, preset, pending=0):
    """(a writer for the model, None) ; (None, None) when it is already
    there; (None, why) when it cannot be written (pending: bytes the
    writers already started will take of the same disk)."""
    args = run.args
    path = model_dir(args, preset)
    if model_ready(path):
        run.say("%s: %s is complete from an earlier run; reused" % (preset, path))
        return None, None
    shutil.rmtree(path, ignore_errors=True)
    os.makedirs(args.models_dir, exist_ok=True)
    free = shutil.disk_usage(args.models_dir).free
    if free < pending + MODEL_BYTES[preset] + (1 << 30):
        return None, "%s needs %.1f GB and %s has %.1f GB free" % (
            preset, MODEL_BYTES[preset] / 1e9, args.models_dir, free / 1e9)
    cmd = [args.weft_llm, "random-model", path, "--preset", preset, "--seed", str(args.seed)]
    p, base = run.start("write-" + preset, cmd)
    return (p, base, time.monotonic()), None


def finish_writing(run, preset, writer, timeout):
    """Waits for a writer; True when the model is there."""
    path = model_dir(run.args, preset)
    if writer is None:
        return model_ready(path)
    p, base, t = writer
    try:
        rc = p.wait(max(1.0, timeout))
    except subprocess.TimeoutExpired:
        run.kill(p)
        shutil.rmtree(path, ignore_errors=True)
        run.fail("%s: not written within the time budget (%.0f s); removed" % (
            preset, time.monotonic() - t))
        return False
    run.live.discard(p)
    if rc != 0:
        with open(base + ".err", errors="replace") as f:
            run.fail("%s: weft-llm random-model exit status %d: %s" % (preset, rc, tail(f.read())))
        shutil.rmtree(path, ignore_errors=True)
        return False
    with open(os.path.join(path, ".complete"), "w") as f:
        f.write("weft-llm random-model --preset %s --seed %d\n" % (preset, run.args.seed))
    run.say("%s: written in %.0f s (%s)" % (preset, time.monotonic() - t, path))
    return True


def model_config(path):
    with open(os.path.join(path, "config.json")) as f:
        return json.load(f)


# ---- the stages -------------------------------------------------------------------

def stage_rates(run, data):
    out = os.path.join(run.logs, "rates.json")
    res = run.call("torch-rates", [sys.executable, os.path.join(HERE, "hf_peer.py"), "rates",
                                   "--out", out], 150)
    if os.path.exists(out):
        with open(out) as f:
            data["rates"] = json.load(f)
    if res["rc"] != 0:
        data["rates_error"] = why_failed("torch rates", res)
        run.fail(data["rates_error"])


def stage_bench(run, data, preset, path):
    args, m = run.args, data["models"][preset]
    ctx = m["shape_config"].get("max_position_embeddings", 1 << 30)
    lens = args.bench_prompt_lens or ([128, 512, 1024, 2048, 4096] if preset == args.serve_model
                                      else [128, 512, 2048])
    lens = [L for L in lens if L <= ctx - 8] or [min(128, ctx // 2)]
    cmd = [args.weft_llm, "bench", path, "--backend", args.backend,
           "--prompt-lens", ",".join(map(str, lens)),
           "--batches", ",".join(map(str, args.bench_batches)),
           "--steps", str(args.bench_steps), "--repeats", "2" if args.quick else "3"]
    res = run.call("bench-" + preset, cmd, 240)
    if res["rc"] != 0:
        m["bench_error"] = why_failed("weft-llm bench " + preset, res)
        run.fail(m["bench_error"])
        return
    try:
        m["bench"] = lf.parse_bench(res["out"])
    except lf.ParseError as e:
        m["bench_error"] = "weft-llm bench %s: %s (log %s)" % (preset, e, res["log"])
        run.fail(m["bench_error"])
        return
    b = m["bench"]
    run.say("%s: copy %.0f GB/s; %s" % (preset, b["copy_gbs"], "; ".join(
        "B%d %.3f ms (%.0f%% of roofline)" % (B, d["step_ms"], 100 * d["of_roofline"])
        for B, d in sorted(b["decode"].items()))))


def generate(run, name, path, extra):
    args = run.args
    prompt = " ".join([args.spec_phrase.strip()] * args.spec_repeats)
    cmd = [args.weft_llm, "generate", path, "--prompt", prompt, "--max-tokens",
           str(args.spec_max_tokens), "--backend", args.backend, "--print-ids",
           "--stats"] + extra
    res = run.call(name, cmd, 120)
    if res["rc"] != 0:
        return None, why_failed(name, res)
    try:
        return lf.parse_generate(res["err"]), None
    except lf.ParseError as e:
        return None, "%s: %s (log %s)" % (name, e, res["log"])


def stage_spec(run, data, preset, path):
    m = data["models"][preset]
    spec = m["spec"] = {"runs": {}, "errors": {}, "plain_top": None}
    plain, err = generate(run, "generate-%s-plain" % preset, path, [])
    if err:
        m["spec_error"] = err
        run.fail(err)
        return
    spec["plain"] = plain
    parted = False
    for K in run.args.spec_k:
        got, err = generate(run, "generate-%s-k%d" % (preset, K), path, ["--speculate", str(K)])
        if err:
            spec["errors"][K] = err
            run.fail(err)
            continue
        spec["runs"][K] = got
        parted |= lf.first_parting(plain["ids"], got["ids"]) is not None
        run.say("%s: speculate %d: %.1f tokens/s against %.1f plain; %s" % (
            preset, K, got["tokens_per_s"], plain["tokens_per_s"],
            "same ids" if lf.first_parting(plain["ids"], got["ids"]) is None else
            "ids part at %d" % lf.first_parting(plain["ids"], got["ids"])))
    # the model drafting for itself (its files opened a second time): every
    # draft accepted, each round K draft steps and one verify pass for K + 1
    # tokens, so its rate against plain decoding's is the cost of the draft
    # model's machinery (1.0 would be none)
    K = run.args.spec_k[0]
    got, err = generate(run, "generate-%s-self-draft" % preset, path,
                        ["--speculate", str(K), "--draft", path])
    if err:
        spec["self_draft_error"] = err
        run.fail(err)
    else:
        spec["self_draft"] = dict(got, k=K)
        parted |= lf.first_parting(plain["ids"], got["ids"]) is not None
        run.say("%s: drafting for itself, %d a round: %.1f tokens/s against %.1f plain" % (
            preset, K, got["tokens_per_s"], plain["tokens_per_s"]))
    if parted:  # the plain run again, with each step's top two logits
        top, err = generate(run, "generate-%s-plain-top" % preset, path, ["--print-top"])
        if err:
            spec["top_error"] = err
            run.fail(err)
        else:
            spec["plain_top"] = top["top"]
            if top["ids"] != plain["ids"]:
                run.say("%s: note: plain greedy decoding gave other ids the second time "
                        "(from token %s)" % (preset, lf.first_parting(plain["ids"], top["ids"])))


def stage_hf(run, data, preset, path):
    args, m = run.args, data["models"][preset]
    out = os.path.join(run.logs, "transformers-%s.json" % preset)
    deadline = time.time() + run.left() - 5
    cmd = [sys.executable, os.path.join(HERE, "hf_peer.py"), "generate", path, "--out", out,
           "--batches", "1,32", "--prompt", "128", "--new-tokens", str(args.hf_new_tokens),
           "--compile", args.hf_compile, "--deadline", "%.0f" % deadline]
    res = run.call("transformers-" + preset, cmd, 420)
    if os.path.exists(out):
        with open(out) as f:
            m["hf"] = json.load(f)
    if res["rc"] != 0:
        m["hf_error"] = why_failed("transformers on " + preset, res)
        run.fail(m["hf_error"])
    for case, c in ((m.get("hf") or {}).get("cases") or {}).items():
        if "tokens_per_s" not in c:
            run.fail("transformers %s %s: %s" % (preset, case, c))


# ---- serving -------------------------------------------------------------------------

def http_get(url, timeout=5.0):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.status, r.read().decode("utf-8", "replace")


class MetricsPoller(threading.Thread):
    """Scrapes /metrics every half second while a load runs, keeping each
    gauge's largest value."""

    GAUGES = ("weft_llm_requests_in_flight", "weft_llm_sequences_running",
              "weft_llm_sequences_queued", "weft_llm_kv_pages_used")

    def __init__(self, url):
        super().__init__(daemon=True)
        self.url, self.stop, self.peak = url, threading.Event(), {}

    def run(self):
        while not self.stop.is_set():
            try:
                m = lf.parse_metrics(http_get(self.url, 2.0)[1])
                for g in self.GAUGES:
                    if g in m:
                        self.peak[g] = max(self.peak.get(g, 0), m[g])
            except (OSError, ValueError):
                pass
            self.stop.wait(0.5)


def proc_cpu(pid):
    try:
        with open("/proc/%d/stat" % pid) as f:
            return lf.proc_cpu_seconds(f.read(), os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return float("nan")


def stage_serve(run, data, preset, path):
    args = run.args
    budget_end = time.monotonic() + min(args.serve_budget, run.left())
    m = data["models"][preset]
    b = m.get("bench") or {}
    sv = data["serve"] = {"model": preset, "stages": [], "exit_rc": None,
                          "copy_gbs": b.get("copy_gbs"),
                          "prefill_ms": {L: p["ms"] for L, p in (b.get("prefill") or {}).items()}}
    lo_p, hi_p = args.prompt_range[0], args.prompt_range[-1]
    lo_o, hi_o = args.output_range[0], args.output_range[-1]
    ctx = m["shape_config"].get("max_position_embeddings", 1 << 30)
    need = (int(hi_p * 1.3) + hi_o + 15) // 16 * 16
    max_len = min(ctx, max(need, 256))
    pages = args.max_seqs * ((max_len + 15) // 16)
    port_file = os.path.join(run.logs, "serve.port")
    if os.path.exists(port_file):
        os.remove(port_file)
    cmd = [args.weft_llm, "serve", path, "--backend", args.backend, "--port", "0",
           "--port-file", port_file, "--max-seqs", str(args.max_seqs), "--max-model-len",
           str(max_len), "--kv-pages", str(pages), "--drain-seconds", "10",
           "--step-prompt-tokens", str(args.step_prompt_tokens)]
    server, base = run.start("serve-" + preset, cmd)
    sv["log"] = base
    try:
        serve_loads(run, sv, server, port_file, budget_end, (lo_p, hi_p), (lo_o, hi_o))
    finally:
        if server.poll() is None:
            server.send_signal(signal.SIGTERM)
            try:
                sv["exit_rc"] = server.wait(45)
                run.live.discard(server)
            except subprocess.TimeoutExpired:
                run.kill(server)
                sv["exit_rc"] = None
        else:
            sv["exit_rc"] = server.returncode
            run.fail("serve %s: the server had already exited (status %s) before SIGTERM" % (
                preset, server.returncode))
        with open(base + ".err", errors="replace") as f:
            sv["stderr_tail"] = tail(f.read(), 4)
        if sv["exit_rc"] == 0:
            run.say("serve: exited 0 after SIGTERM")
        else:
            run.fail("serve %s: exit status %s after SIGTERM: %s" % (preset, sv["exit_rc"],
                                                                     sv["stderr_tail"]))


def serve_loads(run, sv, server, port_file, budget_end, prompt, output):
    args = run.args
    t = time.monotonic()
    while not (os.path.exists(port_file) and open(port_file).read().strip()):
        if server.poll() is not None:
            sv["error"] = "weft-llm serve exited with status %s before listening" % (
                server.returncode)
            run.fail(sv["error"])
            return
        if time.monotonic() - t > 240 or time.monotonic() > budget_end:
            sv["error"] = "weft-llm serve did not write its port within %.0f s" % (
                time.monotonic() - t)
            run.fail(sv["error"])
            return
        time.sleep(0.2)
    port = int(open(port_file).read().strip())
    base_url = "http://127.0.0.1:%d" % port
    run.say("serve: listening on %s after %.1f s" % (base_url, time.monotonic() - t))
    # the tokens a loadgen word makes with this model's tokenizer (a probe,
    # which also warms the server up)
    probe = os.path.join(run.logs, "loadgen-probe.json")
    res = run.call("loadgen-probe", [args.weft_llm, "loadgen", base_url, "--requests", "4",
                                     "--rate", "inf", "--prompt-tokens", "200",
                                     "--output-tokens", "4", "--json", probe], 120)
    ratio = 1.0
    try:
        with open(probe) as f:
            lg = lf.parse_loadgen(json.load(f))
        if lg["ok"] and lf.finite(lg["prompt_tokens_mean"]) and lg["prompt_words_mean"]:
            ratio = lg["prompt_tokens_mean"] / lg["prompt_words_mean"]
    except (OSError, ValueError, lf.ParseError) as e:
        run.fail("serve: the probe's report: %s (%s)" % (e, why_failed("loadgen probe", res)))
    words = "%d-%d" % (max(1, round(prompt[0] / ratio)), max(1, round(prompt[1] / ratio)))
    sv.update(words_to_tokens=ratio, prompt_words=words)
    run.say("serve: a loadgen word is %.2f tokens here: prompts of %s words for %d-%d tokens" % (
        ratio, words, prompt[0], prompt[1]))
    rates = [("%g" % r) for r in args.serve_rates] + ["inf"]
    for i, rate in enumerate(rates):
        left = budget_end - time.monotonic()
        if rate == "inf":
            n, limit = args.saturation_requests, left
        else:
            n = max(8, int(round(float(rate) * args.serve_seconds)))
            limit = min(left, args.serve_seconds + 40)
        st = {"rate": rate, "requests": n}
        sv["stages"].append(st)
        if limit < (25 if rate == "inf" else args.serve_seconds + 10):
            st["error"] = skip(run, "loadgen at rate %s" % rate, 25 if rate == "inf"
                               else args.serve_seconds + 10)
            continue
        one_load(run, st, server, base_url, n, rate, limit, words, output, i)


def one_load(run, st, server, base_url, n, rate, limit, words, output, seed):
    args = run.args
    report = os.path.join(run.logs, "loadgen-%s.json" % rate)
    metrics_url = base_url + "/metrics"
    try:
        before = lf.parse_metrics(http_get(metrics_url)[1])
    except OSError as e:
        st["error"] = "serve: /metrics: %s" % e
        run.fail(st["error"])
        return
    cpu0, t0 = proc_cpu(server.pid), time.monotonic()
    poller = MetricsPoller(metrics_url)
    poller.start()
    cmd = [args.weft_llm, "loadgen", base_url, "--rate", rate, "--requests", str(n),
           "--prompt-tokens", words, "--output-tokens", "%d-%d" % output, "--seed", str(seed),
           "--timeout", "%d" % max(10, limit - 5), "--json", report]
    res = run.call("loadgen-%s" % rate, cmd, limit + 10)
    poller.stop.set()
    poller.join(5)
    cpu1, t1 = proc_cpu(server.pid), time.monotonic()
    try:
        after = lf.parse_metrics(http_get(metrics_url)[1])
    except OSError:
        after = {}
    st["cores"] = (cpu1 - cpu0) / (t1 - t0)
    st["wall_s"] = t1 - t0

    def delta(name):
        return after.get(name, float("nan")) - before.get(name, float("nan"))
    steps, rows = delta("weft_llm_batch_steps_total"), delta("weft_llm_batch_rows_total")
    st["batch_steps"], st["batch_rows"] = steps, rows
    st["generated_tokens"] = delta("weft_llm_generation_tokens_total")
    st["mean_batch"] = rows / steps if steps and steps > 0 else float("nan")
    st["max_running"] = int(poller.peak.get("weft_llm_sequences_running", -1))
    st["max_in_flight"] = int(poller.peak.get("weft_llm_requests_in_flight", -1))
    st["max_queued"] = int(poller.peak.get("weft_llm_sequences_queued", -1))
    try:
        with open(report) as f:
            st["lg"] = lf.parse_loadgen(json.load(f))
    except (OSError, ValueError, lf.ParseError) as e:
        st["error"] = "loadgen at rate %s: no report (%s); %s" % (rate, e, why_failed(
            "loadgen", res))
        run.fail(st["error"])
        return
    lg = st["lg"]
    if res["rc"] not in (0, 1):  # 1: some requests failed, reported as such
        run.fail(why_failed("loadgen at rate %s" % rate, res))
    run.say("serve at %s: %d ok, %d failed; %.0f output tokens/s; TTFT p50 %.1f ms; ITL p50 "
            "%.2f p99 %.2f ms; mean batch %.1f (at most %d running, %d in flight); server %.2f "
            "cores" % (rate, lg["ok"], lg["failed"], lg["output_tokens_per_s"] or 0,
                       lf.ms(lg["ttft_s"]["p50"]), lf.ms(lg["itl_s"]["p50"]),
                       lf.ms(lg["itl_s"]["p99"]), st["mean_batch"], st["max_running"],
                       st["max_in_flight"], st["cores"]))


# where each stage's failure is kept in data["models"][preset]
ERROR_KEY = {"bench": "bench_error", "spec": "spec_error", "transformers": "hf_error"}


# ---- the run --------------------------------------------------------------------------

def preflight(run):
    args = run.args
    if not (os.path.isfile(args.weft_llm) and os.access(args.weft_llm, os.X_OK)):
        print("bench_llm: %s is missing: build it first (make gpu-bench-llm builds "
              "build-release/)" % args.weft_llm, file=sys.stderr)
        sys.exit(1)
    if args.backend == "cuda":
        try:
            gpus = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True,
                                  timeout=30).stdout
        except (OSError, subprocess.SubprocessError):
            gpus = ""
        if "GPU" not in gpus:
            print("bench_llm: SKIPPED: no GPU (nvidia-smi -L lists none)")
            sys.exit(77)
        run.say("GPU: " + gpus.strip().splitlines()[0])
    if args.serve_model:
        probe = subprocess.run([args.weft_llm, "loadgen", "--help"], capture_output=True,
                               text=True)
        if "not built" in probe.stdout + probe.stderr:
            run.fail("weft-llm was built without loadgen (libcurl): no serving stage")
            args.serve_model = ""
        probe = subprocess.run([args.weft_llm, "serve"], capture_output=True, text=True)
        if "without serve" in probe.stdout + probe.stderr:
            run.fail("weft-llm was built without serve (libmicrohttpd): no serving stage")
            args.serve_model = ""
    # a connection a request: 1,000 requests at once need the descriptors
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = hard if hard != resource.RLIM_INFINITY else 65536
    if soft < want:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
        except (ValueError, OSError):
            pass


def plan_of(args):
    return {"models": list(args.models),
            "batches": {p: list(args.bench_batches) for p in args.models},
            "spec": {p: list(args.spec_k) for p in args.models},
            "serve": {"model": args.serve_model, "rates": [("%g" % r) for r in args.serve_rates]
                      + ["inf"]} if args.serve_model else None}


def machine_line(data):
    rates = data.get("rates") or {}
    if rates.get("machine"):
        return rates["machine"], rates["commit"]
    try:
        gpu = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20).stdout.strip()
        gpu = gpu.splitlines()[0] if gpu else "unknown GPU"
    except (OSError, subprocess.SubprocessError):
        gpu = "unknown GPU"
    return "%s, driver %s; PyTorch not measured" % (gpu, bench_common.gpu_driver()), \
        bench_common.commit_measured()


def conditions(args, data):
    text = ("weft-llm %s backend; random bf16 models (weft-llm random-model, seed %d); "
            "weft-llm bench's medians; transformers' generate timed step by step with "
            "torch.cuda.synchronize (compile: %s); loadgen against weft-llm serve on "
            "loopback, prompts %s tokens, outputs %s, %d batch places" % (
                args.backend, args.seed, args.hf_compile, args.prompt_tokens,
                args.output_tokens, args.max_seqs))
    if data.get("background_write"):
        text += "; %s was written in the background (one core) during the earlier stages" % (
            data["background_write"])
    return text


def stages(run, data):
    args = run.args
    writers, order = {}, list(args.models)
    first = order[0]
    pending = 0
    for p in order:  # every writer at once: 1b is ready first
        w, err = start_writing(run, p, pending)
        pending += MODEL_BYTES[p] if w else 0
        if err:
            data["models"][p]["write_error"] = err
            run.fail(err)
        writers[p] = w
    if any(writers.get(p) for p in order[1:]):
        data["background_write"] = ", ".join(p for p in order[1:] if writers.get(p))
    if not args.no_torch:
        stage_rates(run, data)
    ready = {}

    def ensure(p, keep_after):
        if p not in ready:
            ready[p] = not data["models"][p].get("write_error") and finish_writing(
                run, p, writers.get(p), run.left() - keep_after)
            if ready[p]:
                data["models"][p]["shape_config"] = model_config(model_dir(args, p))
                data["models"][p]["shape"] = lf.model_shape(data["models"][p]["shape_config"])
            elif not data["models"][p].get("write_error"):
                data["models"][p]["write_error"] = "the model was not written"
        return ready[p]

    # (what, model, the seconds it needs at least, the function): the first
    # model's stages while the others are written, transformers' compile
    # among them
    todo = [("bench", first, 20, stage_bench), ("spec", first, 20, stage_spec)]
    if not args.no_torch:
        todo.append(("transformers", first, 40, stage_hf))
    todo += [("bench", p, 45, stage_bench) for p in order[1:]]
    if args.serve_model:
        todo.append(("serve", args.serve_model, 60, stage_serve))
    todo += [("spec", p, 45, stage_spec) for p in order[1:]]
    if not args.no_torch:
        todo += [("transformers", p, 60, stage_hf) for p in order[1:]]
    queue = list(todo)
    while queue:
        # the first stage whose model is written; while a writer runs, the
        # stages of models that are there go first
        at = next((i for i, t in enumerate(queue) if t[1] in ready or not writers.get(t[1]) or
                   writers[t[1]][0].poll() is not None), 0)
        what, p, needs, fn = queue.pop(at)
        why = None
        if not ensure(p, needs):
            why = "no model: %s" % data["models"][p]["write_error"]
        elif run.left() < needs:
            why = skip(run, "%s on %s" % (what, p), needs)
        if why:  # where build_report looks for the reason
            if what == "serve":
                data["serve"] = {"model": p, "stages": [], "error": why}
            else:
                data["models"][p].setdefault(ERROR_KEY[what], why)
            continue
        run.say("---- %s on %s (%.0f s left)" % (what, p, run.left()))
        fn(run, data, p, model_dir(args, p))
    for p, w in writers.items():  # a writer no stage waited for
        if w and w[0].poll() is None:
            run.kill(w[0])
            shutil.rmtree(model_dir(args, p), ignore_errors=True)


def report(run, data):
    args = run.args
    rep = lf.build_report(data)
    mach, commit = machine_line(data)
    common = bench_common.run_fields("llm", mach, commit, conditions(args, data), args.quick)
    rows = rep.final_rows(common)
    good = []
    for i, r in enumerate(rows):
        try:
            results.validate(r, "row %d" % (i + 1))
            good.append(r)
        except results.Bad as e:
            run.fail("a row is not well formed (not written): %s" % e)
    lines = []
    if good:  # results.py's section of the record, without the record's preamble
        text = results.render(good, os.path.relpath(args.rows, ROOT))
        lines.append(text[text.index("\n## "):].strip() + "\n")
    lines.append("## Targets (%s)" % ("quick run: not figures to record" if args.quick else
                                       "issues 41 and 42"))
    lines.append("")
    verdicts = rep.verdicts()
    for verdict, _, text in verdicts:
        lines.append("- **%s** %s" % (verdict, text))
    counts = {v: sum(1 for x in verdicts if x[0] == v) for v in ("PASS", "FAIL", "NOT MEASURED")}
    lines.append("")
    lines.append("%d PASS, %d FAIL, %d NOT MEASURED" % (counts["PASS"], counts["FAIL"],
                                                        counts["NOT MEASURED"]))
    for note in rep.notes:
        lines.append("- note: " + note)
    if run.errors:
        lines += ["", "## What went wrong", ""] + ["- " + e for e in run.errors]
    text = "\n".join(lines) + "\n"
    print("\n" + text)
    with open(os.path.join(args.out, "summary.md"), "w") as f:
        f.write(text)
    with open(os.path.join(args.out, "data.json"), "w") as f:
        json.dump(data, f, indent=1, default=str)
    if not args.no_rows:
        os.makedirs(os.path.dirname(os.path.abspath(args.rows)), exist_ok=True)
        with open(args.rows, "w", encoding="utf-8") as f:
            for r in good:
                f.write(json.dumps(r, ensure_ascii=False) + "\n")
        run.say("%d rows in %s; summary in %s; logs in %s" % (
            len(good), args.rows, os.path.join(args.out, "summary.md"), run.logs))


def main(argv=None):
    args = parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    if os.path.commonpath([os.path.abspath(args.models_dir), os.path.abspath(args.out)]) == \
            os.path.abspath(args.out):
        print("bench_llm: --models-dir must not be under --out (the models are gigabytes)",
              file=sys.stderr)
        return 2
    run = Run(args)
    preflight(run)
    data = {"plan": plan_of(args), "quick": args.quick, "backend": args.backend,
            "models": {p: {} for p in args.models}}
    run.say("time budget %.0f s; models %s in %s; output in %s" % (
        args.time_budget, ",".join(args.models), args.models_dir, args.out))

    def stop(signum, frame):
        raise KeyboardInterrupt("signal %d" % signum)
    signal.signal(signal.SIGTERM, stop)
    try:
        stages(run, data)
    except KeyboardInterrupt as e:
        run.fail("interrupted (%s)" % (e or "SIGINT"))
    except Exception as e:  # the report is written whatever a stage raised
        import traceback
        traceback.print_exc()
        run.fail("bench_llm itself: %s: %s" % (type(e).__name__, e))
    finally:
        run.cleanup()
    report(run, data)
    return 1 if run.errors else 0


if __name__ == "__main__":
    sys.exit(main())
