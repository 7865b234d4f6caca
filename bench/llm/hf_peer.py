#!/usr/bin/env python3
"""hf_peer.py - bench_llm.py's peers on PyTorch, each in a process of its own.

  hf_peer.py rates --out FILE
      the device's copy rate as torch measures it (copy_ of 256 MiB; bytes
      read plus bytes written per second) and torch.matmul's bf16 rate at
      8192^3 (TFLOP/s), timed with CUDA events (bench_common.time_per_call);
      the machine line and commit for the rows
  hf_peer.py generate MODEL_DIR --out FILE [--batches 1,32] [--prompt 128]
                      [--new-tokens 128] [--compile auto|off] [--deadline EPOCH_S]
      transformers' generate on the model folder, bf16 on cuda, greedy, a
      random prompt of --prompt ids a sequence, exactly --new-tokens new
      tokens (min_new_tokens = max_new_tokens: an end-of-sequence token
      cannot stop it). Batch 1 runs generate's default (dynamic) cache,
      larger batches the static cache (cache_implementation="static"),
      where transformers compiles the forward pass unless --compile off.
      Each case runs once to warm up (the static cache: with the same
      shapes, so that the compiled graph is the one timed), then once timed:
      a logits processor stamps the time after torch.cuda.synchronize() at
      every step, so the prefill (start to the first stamp) and each decode
      step (stamp to stamp) are told apart; tokens/s = batch / the median
      step.
FILE (JSON) is rewritten after each figure, so a run cut short keeps what
it measured. Exit status 0, or 1 with the reason on stderr.
"""
import argparse
import copy
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import bench_common  # noqa: E402


def die(msg):
    print("hf_peer: " + msg, file=sys.stderr)
    sys.exit(1)


def save(path, doc):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(doc, f, indent=1)
    os.replace(tmp, path)


def rates(args):
    import torch
    if not torch.cuda.is_available():
        die("torch sees no GPU")
    doc = {"torch": torch.__version__}
    doc["machine"], doc["commit"] = bench_common.machine(torch)
    save(args.out, doc)
    src = torch.empty(256 << 20, device="cuda", dtype=torch.uint8)
    dst = torch.empty_like(src)
    t = bench_common.time_per_call(torch, lambda: dst.copy_(src), reps=5, min_ms=20.0)
    doc["copy_gbs"] = 2 * src.numel() / t / 1e9
    doc["copy_bytes"] = src.numel()
    save(args.out, doc)
    print("hf_peer: torch copy_ of 256 MiB: %.1f GB/s (read + write)" % doc["copy_gbs"])
    del src, dst
    torch.cuda.empty_cache()
    n = 8192
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    t = bench_common.time_per_call(torch, lambda: torch.matmul(a, b), reps=5, min_ms=20.0)
    doc["matmul_tflops"] = 2.0 * n ** 3 / t / 1e12
    doc["matmul_n"] = n
    save(args.out, doc)
    print("hf_peer: torch.matmul bf16 %d^3: %.1f TFLOP/s" % (n, doc["matmul_tflops"]))


def load_model(path, doc):
    import torch
    import transformers
    from transformers import AutoModelForCausalLM
    version = tuple(int(x) for x in transformers.__version__.split(".")[:2] if x.isdigit())
    # the dtype argument's name since transformers 4.56; torch_dtype before
    key = "dtype" if version >= (4, 56) else "torch_dtype"
    t0 = time.perf_counter()
    try:
        model = AutoModelForCausalLM.from_pretrained(path, device_map="cuda",
                                                     **{key: torch.bfloat16})
    except (ImportError, ValueError, TypeError, RuntimeError) as e:
        doc.setdefault("notes", []).append("device_map='cuda' refused (%s): loaded on the "
                                           "host, then moved" % str(e).splitlines()[0][:200])
        model = AutoModelForCausalLM.from_pretrained(path, **{key: torch.bfloat16}).to("cuda")
    if model.dtype != torch.bfloat16:
        doc.setdefault("notes", []).append("loaded as %s; converted to bf16" % model.dtype)
        model = model.to(torch.bfloat16)
    model.eval()
    torch.cuda.synchronize()
    doc["load_s"] = time.perf_counter() - t0
    doc["attention"] = getattr(model.config, "_attn_implementation", None)
    return model


def dynamo_graphs():
    try:
        from torch._dynamo.utils import counters
        return int(counters["stats"]["unique_graphs"])
    except Exception:  # a private counter: absent is not an error
        return None


def one_case(model, batch, prompt, new_tokens, static, compile_, generator):
    import torch
    from transformers import LogitsProcessor, LogitsProcessorList

    stamps = []

    class Stamp(LogitsProcessor):
        def __call__(self, input_ids, scores):
            torch.cuda.synchronize()
            stamps.append(time.perf_counter())
            return scores

    vocab = model.config.vocab_size
    ids = torch.randint(0, vocab, (batch, prompt), generator=generator).to("cuda")
    mask = torch.ones_like(ids)
    eos = model.generation_config.eos_token_id
    gc = copy.deepcopy(model.generation_config)
    gc.do_sample = False
    gc.pad_token_id = eos[0] if isinstance(eos, (list, tuple)) else eos
    if static:
        gc.cache_implementation = "static"
    if not compile_:
        gc.disable_compile = True  # an attribute older versions ignore

    def run(n):
        gc.max_new_tokens = gc.min_new_tokens = n
        stamps.clear()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        out = model.generate(ids, attention_mask=mask, generation_config=gc,
                             logits_processor=LogitsProcessorList([Stamp()]))
        torch.cuda.synchronize()
        return t0, time.perf_counter(), out.shape[1] - prompt

    graphs0 = dynamo_graphs()
    w0, w1, _ = run(new_tokens if static else min(new_tokens, 16))
    t0, t1, made = run(new_tokens)
    if made != new_tokens or len(stamps) != new_tokens:
        raise RuntimeError("generate made %d tokens (%d steps stamped), not %d" %
                           (made, len(stamps), new_tokens))
    steps = [b - a for a, b in zip(stamps, stamps[1:])]
    step = statistics.median(steps)
    graphs1 = dynamo_graphs()
    return {"batch": batch, "prompt": prompt, "new_tokens": made,
            "cache": "static" if static else "dynamic",
            "compile": "transformers' default" if compile_ else "off",
            "compiled_graphs": None if graphs0 is None or graphs1 is None else graphs1 - graphs0,
            "warmup_s": w1 - w0, "total_s": t1 - t0, "prefill_ms": (stamps[0] - t0) * 1e3,
            "step_ms_median": step * 1e3, "step_ms_mean": statistics.mean(steps) * 1e3,
            "step_ms_min": min(steps) * 1e3, "step_ms_max": max(steps) * 1e3,
            "tokens_per_s": batch / step}


def generate(args):
    import torch
    import transformers
    if not torch.cuda.is_available():
        die("torch sees no GPU")
    doc = {"model": args.model, "transformers": transformers.__version__,
           "torch": torch.__version__, "cases": {}}
    save(args.out, doc)
    model = load_model(args.model, doc)
    save(args.out, doc)
    print("hf_peer: %s loaded in %.1f s (%s attention)" % (args.model, doc["load_s"],
                                                          doc["attention"]))
    generator = torch.Generator().manual_seed(0)
    for batch in args.batches:
        static = batch > 1
        compile_ = static and args.compile == "auto"
        left = args.deadline - time.time() if args.deadline else float("inf")
        if left < 15:
            doc["cases"]["B%d" % batch] = {"skipped": "%.0f s left" % left}
            save(args.out, doc)
            continue
        if compile_ and left < 120:
            compile_ = False
            doc.setdefault("notes", []).append(
                "batch %d: %.0f s left, too little to compile; run without" % (batch, left))
        try:
            res = one_case(model, batch, args.prompt, args.new_tokens, static, compile_,
                           generator)
        except Exception as e:  # transformers' and torch.compile's errors are many
            msg = "%s: %s" % (type(e).__name__, str(e).splitlines()[0][:300] if str(e) else "")
            print("hf_peer: batch %d failed: %s" % (batch, msg), file=sys.stderr)
            doc["cases"]["B%d" % batch] = {"error": msg}
            save(args.out, doc)
            if not compile_:
                continue
            print("hf_peer: batch %d again, without compiling" % batch, file=sys.stderr)
            try:
                res = one_case(model, batch, args.prompt, args.new_tokens, static, False,
                               generator)
                res["compile_error"] = msg
            except Exception as e2:
                doc["cases"]["B%d" % batch]["error_uncompiled"] = "%s: %s" % (
                    type(e2).__name__, str(e2).splitlines()[0][:300] if str(e2) else "")
                save(args.out, doc)
                continue
        doc["cases"]["B%d" % batch] = res
        save(args.out, doc)
        print("hf_peer: batch %d (%s cache, compile %s): %.2f ms a step (median), %.1f "
              "tokens/s; prefill %.1f ms" % (batch, res["cache"], res["compile"],
                                             res["step_ms_median"], res["tokens_per_s"],
                                             res["prefill_ms"]))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="what", required=True)
    r = sub.add_parser("rates", help="torch's copy and bf16 matmul rates")
    r.add_argument("--out", required=True)
    g = sub.add_parser("generate", help="transformers' generate on a model folder")
    g.add_argument("model")
    g.add_argument("--out", required=True)
    g.add_argument("--batches", default="1,32",
                   type=lambda s: [int(x) for x in s.split(",") if x])
    g.add_argument("--prompt", type=int, default=128)
    g.add_argument("--new-tokens", type=int, default=128)
    g.add_argument("--compile", choices=("auto", "off"), default="auto")
    g.add_argument("--deadline", type=float, default=0.0,
                   help="wall-clock time (epoch seconds) past which no case starts")
    args = ap.parse_args()
    try:
        import torch  # noqa: F401
    except ImportError as e:
        die("PyTorch is not importable here: %s" % e)
    if args.what == "rates":
        rates(args)
    else:
        try:
            import transformers  # noqa: F401
        except ImportError as e:
            die("transformers is not importable here: %s" % e)
        generate(args)


if __name__ == "__main__":
    main()
