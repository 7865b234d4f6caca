#!/usr/bin/env python3
"""Write tests/apps/data/chat_cases.json: chat templates in the shape of the
families weft-llm recognises, conversations, and what Jinja renders for each.

    python3 tests/apps/chat_cases.py            # rewrites the data file
    python3 tests/apps/chat_cases.py --check    # exits 1 if it is out of date

The templates are written for these tests (each keeps the markers and the
structure of its family's published templates). They are rendered with
jinja2 as transformers' apply_chat_template renders them: trim_blocks and
lstrip_blocks, raise_exception, strftime_now, a tojson that keeps non-ASCII,
the special tokens passed by name. test_llm_chat renders every case with
weft-llm's own code (which runs no Jinja) and compares.

Before rendering, messages get what weft-llm's renderer does to an OpenAI
request: a "developer" message becomes a system one, content parts are
joined. Where weft-llm refuses a conversation that the template would render
(the [INST] formats take an optional system message first, then user and
assistant alternating, no tool role), the case expects an error. Needs
jinja2 (Debian's python3-jinja2).
"""
import datetime
import json
import os
import sys

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

TEMPLATES = {
    # ChatML as the random models write it.
    "chatml": {
        "template": (
            "{%- for message in messages %}"
            "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
            "{%- endfor %}"
            "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"),
        "eos_token": "<|im_end|>",
    },
    # Qwen2.5's shape: a default system message, tool results in a user turn.
    "qwen2": {
        "template": """{%- if messages[0].role == 'system' %}
    {{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}
{%- else %}
    {{- '<|im_start|>system\\nYou are a small test model. Keep answers short.<|im_end|>\\n' }}
{%- endif %}
{%- for message in messages %}
    {%- if message.role == 'tool' %}
        {%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\\n<tool_response>\\n' + message.content + '\\n</tool_response>' }}
        {%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}
            {{- '<|im_end|>\\n' }}
        {%- endif %}
    {%- elif not (message.role == 'system' and loop.first) %}
        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
{%- endif %}
""",
        "eos_token": "<|im_end|>",
    },
    # Qwen3's shape: no default system message; reasoning kept only after
    # the last user query.
    "qwen3": {
        "template": """{%- if messages[0].role == 'system' %}
    {{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}
{%- endif %}
{%- set ns = namespace(seeking=true, last_query_index=messages|length - 1) %}
{%- for message in messages[::-1] %}
    {%- set at = messages|length - 1 - loop.index0 %}
    {%- if ns.seeking and message.role == 'user' and not (message.content.startswith('<tool_response>') and message.content.endswith('</tool_response>')) %}
        {%- set ns.seeking = false %}
        {%- set ns.last_query_index = at %}
    {%- endif %}
{%- endfor %}
{%- for message in messages %}
    {%- set content = message.content %}
    {%- if message.role == 'user' or (message.role == 'system' and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\\n' + content + '<|im_end|>\\n' }}
    {%- elif message.role == 'assistant' %}
        {%- set thought = '' %}
        {%- if '</think>' in content %}
            {%- set thought = content.split('</think>')[0].rstrip('\\n').split('<think>')[-1].lstrip('\\n') %}
            {%- set content = content.split('</think>')[-1].lstrip('\\n') %}
        {%- endif %}
        {%- if loop.index0 > ns.last_query_index and (loop.last or thought) %}
            {{- '<|im_start|>assistant\\n<think>\\n' + thought.strip('\\n') + '\\n</think>\\n\\n' + content.lstrip('\\n') }}
        {%- else %}
            {{- '<|im_start|>assistant\\n' + content }}
        {%- endif %}
        {{- '<|im_end|>\\n' }}
    {%- elif message.role == 'tool' %}
        {%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\\n<tool_response>\\n' + content + '\\n</tool_response>' }}
        {%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}
            {{- '<|im_end|>\\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
{%- endif %}
""",
        "eos_token": "<|im_end|>",
    },
    # ChatML that opens with the BOS.
    "chatml_bos": {
        "template": (
            "{{- bos_token }}{%- for message in messages %}"
            "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
            "{%- endfor %}"
            "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"),
        "bos_token": "<s>",
        "eos_token": "<|im_end|>",
    },
    # Llama 3.0's shape.
    "llama3": {
        "template": (
            "{% for message in messages %}"
            "{% set turn = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + "
            "message['content'] | trim + '<|eot_id|>' %}"
            "{% if loop.first %}{% set turn = bos_token + turn %}{% endif %}{{ turn }}"
            "{% endfor %}"
            "{% if add_generation_prompt %}"
            "{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}"),
        "bos_token": "<|begin_of_text|>",
        "eos_token": "<|eot_id|>",
    },
    # Llama 3.1's shape: the dated system header, tool results as ipython.
    "llama31": {
        "template": """{{- bos_token }}
{%- if date_string is not defined %}
    {%- set date_string = "14 Mar 2025" %}
{%- endif %}
{%- if messages[0].role == 'system' %}
    {%- set system_message = messages[0].content | trim %}
    {%- set messages = messages[1:] %}
{%- else %}
    {%- set system_message = "" %}
{%- endif %}
{{- "<|start_header_id|>system<|end_header_id|>\\n\\n" }}
{{- "Cutting Knowledge Date: June 2024\\n" }}
{{- "Today Date: " + date_string + "\\n\\n" }}
{{- system_message }}
{{- "<|eot_id|>" }}
{%- for message in messages %}
    {%- if message.role == 'tool' or message.role == 'ipython' %}
        {{- "<|start_header_id|>ipython<|end_header_id|>\\n\\n" }}
        {%- if message.content is mapping or message.content is iterable %}
            {{- message.content | tojson }}
        {%- else %}
            {{- message.content }}
        {%- endif %}
        {{- "<|eot_id|>" }}
    {%- else %}
        {{- '<|start_header_id|>' + message.role + '<|end_header_id|>\\n\\n' + message.content | trim + '<|eot_id|>' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}
{%- endif %}
""",
        "bos_token": "<|begin_of_text|>",
        "eos_token": "<|eot_id|>",
    },
    # Llama 2's shape: <<SYS>> in the first user turn, a BOS before every one.
    "llama2": {
        "template": """{%- if messages[0]['role'] == 'system' %}
    {%- set turns = messages[1:] %}
    {%- set sys = messages[0]['content'] %}
{%- else %}
    {%- set turns = messages %}
    {%- set sys = none %}
{%- endif %}
{%- for message in turns %}
    {%- if (message['role'] == 'user') != loop.index0 is even %}
        {{- raise_exception('roles must alternate user and assistant') }}
    {%- endif %}
    {%- set text = message['content'] %}
    {%- if loop.first and sys is not none %}
        {%- set text = '<<SYS>>\\n' + sys + '\\n<</SYS>>\\n\\n' + text %}
    {%- endif %}
    {%- if message['role'] == 'user' %}
        {{- bos_token + '[INST] ' + text.strip() + ' [/INST]' }}
    {%- elif message['role'] == 'assistant' %}
        {{- ' ' + text.strip() + ' ' + eos_token }}
    {%- endif %}
{%- endfor %}
""",
        "bos_token": "<s>",
        "eos_token": "</s>",
    },
    # Mistral's first form: spaces around [INST], the system prompt in the
    # first user turn.
    "mistral_v1": {
        "template": """{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content'] %}
    {%- set turns = messages[1:] %}
{%- else %}
    {%- set turns = messages %}
{%- endif %}
{{- bos_token }}
{%- for message in turns %}
    {%- if (message['role'] == 'user') != loop.index0 is even %}
        {{- raise_exception('roles must alternate user and assistant') }}
    {%- endif %}
    {%- if message['role'] == 'user' %}
        {%- if loop.first and system_message is defined %}
            {{- ' [INST] ' + system_message + '\\n\\n' + message['content'] + ' [/INST]' }}
        {%- else %}
            {{- ' [INST] ' + message['content'] + ' [/INST]' }}
        {%- endif %}
    {%- else %}
        {{- ' ' + message['content'] + eos_token }}
    {%- endif %}
{%- endfor %}
""",
        "bos_token": "<s>",
        "eos_token": "</s>",
    },
    # Mistral v0.3's form: "[INST] ...[/INST]", the system prompt in the
    # last user turn, the answer trimmed.
    "mistral_v3": {
        "template": """{%- if messages[0]["role"] == "system" %}
    {%- set system_message = messages[0]["content"] %}
    {%- set turns = messages[1:] %}
{%- else %}
    {%- set turns = messages %}
{%- endif %}
{{- bos_token }}
{%- for message in turns %}
    {%- if (message["role"] == "user") != loop.index0 is even %}
        {{- raise_exception("roles must alternate user and assistant") }}
    {%- endif %}
    {%- if message["role"] == "user" %}
        {%- if loop.last and system_message is defined %}
            {{- "[INST] " + system_message + "\\n\\n" + message["content"] + "[/INST]" }}
        {%- else %}
            {{- "[INST] " + message["content"] + "[/INST]" }}
        {%- endif %}
    {%- else %}
        {{- " " + message["content"]|trim + eos_token }}
    {%- endif %}
{%- endfor %}
""",
        "bos_token": "<s>",
        "eos_token": "</s>",
    },
    # Mistral Nemo's form: no spaces at all, the answer as it is.
    "mistral_nemo": {
        "template": """{%- if messages[0]["role"] == "system" %}
    {%- set system_message = messages[0]["content"] %}
    {%- set turns = messages[1:] %}
{%- else %}
    {%- set turns = messages %}
{%- endif %}
{{- bos_token }}
{%- for message in turns %}
    {%- if message["role"] == "user" %}
        {%- if loop.last and system_message is defined %}
            {{- "[INST]" + system_message + "\\n\\n" + message["content"] + "[/INST]" }}
        {%- else %}
            {{- "[INST]" + message["content"] + "[/INST]" }}
        {%- endif %}
    {%- else %}
        {{- message["content"] + eos_token }}
    {%- endif %}
{%- endfor %}
""",
        "bos_token": "<s>",
        "eos_token": "</s>",
    },
}

PARTS = [{"type": "text", "text": "Hel"}, {"type": "text", "text": "lo, "},
         {"type": "text", "text": "world."}]

CONVERSATIONS = {
    "user": [["user", "Hello there."]],
    "system_user": [["system", "You are terse."], ["user", "Hello there."]],
    "four_turns": [["system", "You are terse."], ["user", "What is 2+2?"],
                   ["assistant", "4."], ["user", "And 3+3?"]],
    "no_system": [["user", "What is 2+2?"], ["assistant", "4."], ["user", "And 3+3?"]],
    "developer": [["developer", "Answer in French."], ["user", "Hello."]],
    "parts": [["system", "Be kind."], ["user", PARTS]],
    "padded": [["system", "  Be brief.\n"], ["user", " \t What is 2+2? \n"],
               ["assistant", "\u3000 4. \u00a0"], ["user", "\nAnd 3+3?  "]],
    "answer_last": [["system", "You are terse."], ["user", "What is 2+2?"],
                    ["assistant", "4."]],
    "tools": [["user", "Weather in Paris?"], ["assistant", "Looking it up."],
              ["tool", "{\"temp\": 21}"], ["tool", "sunny \"and\" calm\n\u00e9t\u00e9\t\u0001"],
              ["user", "Thanks."]],
    "thinking": [["user", "What is 2+2?"], ["assistant", "<think>\nAdd them.\n</think>\n\n4."],
                 ["user", "And 3+3?"], ["assistant", "<think>Add again.</think>6."]],
    "thinking_plain_last": [["user", "Hi"], ["assistant", "\nHello!"]],
    "system_later": [["user", "Hi"], ["system", "Be brief."], ["user", "Bye"]],
    "unicode": [["user", "Emoji \U0001F600, CJK \u4e16\u754c, caf\u00e9"]],
}


def normalise(conversation):
    """What weft-llm's renderer makes of an OpenAI message list."""
    out = []
    for role, content in conversation:
        if role == "developer":
            role = "system"
        if isinstance(content, list):
            content = "".join(p["text"] for p in content)
        out.append({"role": role, "content": content})
    return out


def refused(name, messages):
    """weft-llm's rules for the [INST] formats (see chat_format.c)."""
    if not name.startswith(("llama2", "mistral")):
        return False
    first = 1 if messages[0]["role"] == "system" else 0
    if first == len(messages):
        return True
    for i, m in enumerate(messages[first:]):
        if m["role"] != ("user" if i % 2 == 0 else "assistant"):
            return True
    return False


def environment():
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    def strftime_now(fmt):
        return datetime.datetime.now().strftime(fmt)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def build():
    env = environment()
    cases = []
    for name, t in TEMPLATES.items():
        template = env.from_string(t["template"])
        tokens = {k: t[k] for k in ("bos_token", "eos_token") if k in t}
        for conv, messages in CONVERSATIONS.items():
            normal = normalise(messages)
            for gen in (True, False):
                case = {"template": name, "conversation": conv, "add_generation_prompt": gen}
                if refused(name, normal):
                    case["error"] = True
                else:
                    text = template.render(messages=normal, add_generation_prompt=gen, **tokens)
                    bos = t.get("bos_token")
                    case["text"] = text
                    case["add_special"] = 0 if bos and text.startswith(bos) else 1
                cases.append(case)
    return {
        "about": "written by tests/apps/chat_cases.py; see its docstring",
        "templates": TEMPLATES,
        "conversations": CONVERSATIONS,
        "cases": cases,
    }


def main():
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "chat_cases.json")
    text = json.dumps(build(), indent=1, ensure_ascii=False) + "\n"
    if sys.argv[1:] == ["--check"]:
        with open(path, encoding="utf-8") as f:
            if f.read() != text:
                print(f"{path} is out of date: run {sys.argv[0]}")
                return 1
        print(f"{path} is up to date")
        return 0
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    print(f"wrote {path}: {len(text)} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
