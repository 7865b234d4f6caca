#!/usr/bin/env python3
"""Greedy tokens of a weft-llm random model through transformers, to compare with weft-llm.

    weft-llm random-model /tmp/tiny --preset tiny --seed 1
    weft-llm generate /tmp/tiny --prompt "The old woman" --max-tokens 16 --print-ids
    python3 tests/apps/llm_reference.py /tmp/tiny --prompt "The old woman" --max-tokens 16

The same for the mixture-of-experts presets (--preset moe, a Mixtral; --preset
qwen2moe, a Qwen2-MoE with a shared expert and a dense middle layer).

Loads the folder with the class its config names (AutoModelForCausalLM: Llama,
Mixtral, Qwen2-MoE, ...) in bf16 (as weft-llm runs it; --dtype
float32 for a check without bf16 rounding), encodes the prompt with the
folder's tokenizer.json through transformers (or takes --prompt-ids), and
prints the prompt ids and the greedy ids in weft-llm's --print-ids format,
then, per step, the top two logits and their gap. A random model's logits
are close together: where the gap is below bf16's resolution (about 1/128 of
the logits' size) the two programs may take different tokens and differ from
there on, without either being wrong. A mixture of experts adds another such
place: a token whose router logits for its k-th and (k+1)-th experts are
within bf16's resolution may be routed differently by the two. Needs torch and
transformers.
"""
import argparse

import torch
from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--prompt")
    ap.add_argument("--prompt-ids")
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    a = ap.parse_args()
    dtype = getattr(torch, a.dtype)
    model = AutoModelForCausalLM.from_pretrained(a.model, torch_dtype=dtype,
                                             attn_implementation="eager").to(a.device).eval()
    if a.prompt_ids:
        ids = [int(x) for x in a.prompt_ids.split(",")]
    else:
        tok = PreTrainedTokenizerFast(tokenizer_file=f"{a.model}/tokenizer.json")
        ids = tok(a.prompt, add_special_tokens=True).input_ids
    eos = model.config.eos_token_id
    eos = set(eos if isinstance(eos, list) else [eos])
    x = torch.tensor([ids], device=a.device)
    out, gaps = [], []
    with torch.no_grad():
        past = None
        for _ in range(a.max_tokens):
            r = model(input_ids=x, past_key_values=past, use_cache=True)
            past = r.past_key_values
            logits = r.logits[0, -1].float()
            top = torch.topk(logits, 2)
            nxt = int(top.indices[0])
            gaps.append((nxt, float(top.values[0]), float(top.values[1])))
            out.append(nxt)
            if nxt in eos:
                break
            x = torch.tensor([[nxt]], device=a.device)
    print("prompt ids:", ",".join(map(str, ids)))
    print("generated ids:", ",".join(map(str, out)))
    for i, (t, v0, v1) in enumerate(gaps):
        print(f"  step {i}: token {t} logit {v0:.5f}, next {v1:.5f}, gap {v0 - v1:.2e}")


if __name__ == "__main__":
    main()
