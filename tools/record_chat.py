"""Record reference chat-template renderings as tests/fixtures/chat/<name>.json, or --check them.

    python tools/record_chat.py            # (re)write every record
    python tools/record_chat.py --check    # re-render with the reference and compare

The reference renderer is llama-cpp-python's `llama_cpp.llama_chat_format.Jinja2ChatFormatter`
(what `Llama.create_chat_completion` uses for a GGUF's template). Each record holds the template
text itself (tests never read the llama.cpp source tree), its origin and sha256, the BOS/EOS text,
and per conversation the inputs plus the rendered `prompt`, or the `error` the template raised.
Templates come from the llama-cpp-python sdist's vendor/llama.cpp/models/templates (pass
--templates DIR), the published gemma-3 template, and llama.cpp's ChatML fallback, which is what
`ChatTemplate.from_metadata` gives the embedded gemma-3-270m GGUF (it carries no template).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import sys
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "tests" / "fixtures" / "chat"
TEMPLATES = Path("/work/tmp/sdist/llama_cpp_python-0.3.36/vendor/llama.cpp/models/templates")
FORMAT = 1

# google/gemma-3-*-it tokenizer_config.json "chat_template" (JSON-escaped, as published).
GEMMA3_JSON = (
    r"""{{ bos_token }}\n{%- if messages[0]['role'] == 'system' -%}\n"""
    r"""    {%- if messages[0]['content'] is string -%}\n"""
    r"""        {%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}\n    {%- else -%}\n"""
    r"""        {%- set first_user_prefix = messages[0]['content'][0]['text'] + '\n\n' -%}\n    {%- endif -%}\n"""
    r"""    {%- set loop_messages = messages[1:] -%}\n{%- else -%}\n    {%- set first_user_prefix = \"\" -%}\n"""
    r"""    {%- set loop_messages = messages -%}\n{%- endif -%}\n{%- for message in loop_messages -%}\n"""
    r"""    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}\n"""
    r"""        {{ raise_exception(\"Conversation roles must alternate user/assistant/user/assistant/...\") }}\n"""
    r"""    {%- endif -%}\n    {%- if (message['role'] == 'assistant') -%}\n        {%- set role = \"model\" -%}\n"""
    r"""    {%- else -%}\n        {%- set role = message['role'] -%}\n    {%- endif -%}\n"""
    r"""    {{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else \"\") }}\n"""
    r"""    {%- if message['content'] is string -%}\n        {{ message['content'] | trim }}\n"""
    r"""    {%- elif message['content'] is iterable -%}\n        {%- for item in message['content'] -%}\n"""
    r"""            {%- if item['type'] == 'image' -%}\n                {{ '<start_of_image>' }}\n"""
    r"""            {%- elif item['type'] == 'text' -%}\n                {{ item['text'] | trim }}\n"""
    r"""            {%- endif -%}\n        {%- endfor -%}\n    {%- else -%}\n"""
    r"""        {{ raise_exception(\"Invalid content type\") }}\n    {%- endif -%}\n    {{ '<end_of_turn>\n' }}\n"""
    r"""{%- endfor -%}\n{%- if add_generation_prompt -%}\n    {{'<start_of_turn>model\n'}}\n{%- endif -%}\n"""
)

SYS = {"role": "system", "content": "You are a concise assistant."}
U1 = {"role": "user", "content": "Why is the sky blue?"}
A1 = {"role": "assistant", "content": "Rayleigh scattering: shorter wavelengths scatter more."}
U2 = {"role": "user", "content": "And sunsets?"}
UNI = {"role": "user",
       "content": "Grüße, 世界! 🙂 — «quotes» \"dq\" 'sq' \\ back\nnew line\ttab <b>tag</b> {{ not jinja }} "}
A_THINK = {"role": "assistant", "content": "<think>\nShort wavelengths scatter.\n</think>\n\nRayleigh scattering."}
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Current weather for a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "City, e.g. Zürich"}},
                   "required": ["city"]}}}]
TOOL_TURNS = [
    {"role": "user", "content": "Weather in Zürich?"},
    {"role": "assistant", "content": "", "tool_calls": [{"id": "call12345", "type": "function", "function": {
        "name": "get_weather", "arguments": {"city": "Zürich"}}}]},
    {"role": "tool", "name": "get_weather", "tool_call_id": "call12345",
     "content": "{\"temp_c\": 21, \"sky\": \"clear\"}"},
]


def case(name, messages, add_generation_prompt=True, tools=None, **kwargs):
    return dict(name=name, messages=messages, add_generation_prompt=add_generation_prompt, tools=tools, kwargs=kwargs)


BASIC = [case("user_only", [U1]), case("system_user", [SYS, U1]), case("multi_turn", [SYS, U1, A1, U2]),
         case("no_generation_prompt", [U1, A1], add_generation_prompt=False), case("unicode", [UNI])]
WITH_TOOLS = [case("tools", TOOL_TURNS, tools=TOOLS)]
QWEN3 = [case("thinking_default", [SYS, U1]), case("thinking_off", [SYS, U1], enable_thinking=False),
         case("thinking_on", [SYS, U1], enable_thinking=True),
         case("reasoning_history", [U1, A_THINK, U2], enable_thinking=True)]
DATE = {"date_string": "26 Jul 2024"}
# gpt-oss's harmony template: the reasoning effort, earlier turns' reasoning (dropped unless the turn
# calls a tool), a developer message; its date comes from strftime_now, pinned to NOW while recording
A_HARMONY = {"role": "assistant", "content": "Rayleigh scattering.", "thinking": "Short wavelengths scatter."}
HARMONY = [case("reasoning_high", [SYS, U1], reasoning_effort="high"),
           case("reasoning_history", [U1, A_HARMONY, U2], reasoning_effort="low"),
           case("developer", [{"role": "developer", "content": "Answer in French."}, U1]),
           case("identity", [U1], model_identity="You are a test model.")]
NOW = "2025-08-05"       # strftime_now("%Y-%m-%d") for records that store "now"

# record name -> (template file or special source, bos, eos, cases)
SPECS = {
    "gemma3": ("@gemma3", "<bos>", "<eos>", BASIC + [case("roles_must_alternate", [U1, U2])]),
    "chatml-fallback": ("@chatml", "<bos>", "<eos>", BASIC),
    "qwen2.5-7b-instruct": ("Qwen-Qwen2.5-7B-Instruct.jinja", "<|endoftext|>", "<|im_end|>", BASIC + WITH_TOOLS),
    "qwen3-0.6b": ("Qwen-Qwen3-0.6B.jinja", "<|endoftext|>", "<|im_end|>", BASIC + QWEN3 + [
        case("tools_thinking_off", TOOL_TURNS, tools=TOOLS, enable_thinking=False)]),
    "llama-3.1-8b-instruct": ("meta-llama-Llama-3.1-8B-Instruct.jinja", "<|begin_of_text|>", "<|eot_id|>",
                              BASIC + WITH_TOOLS),
    "llama-3.2-3b-instruct": ("meta-llama-Llama-3.2-3B-Instruct.jinja", "<|begin_of_text|>", "<|eot_id|>",
                              [dict(c, kwargs={**c["kwargs"], **DATE}) for c in BASIC]),
    "mistral-nemo-instruct-2407": ("mistralai-Mistral-Nemo-Instruct-2407.jinja", "<s>", "</s>", BASIC + WITH_TOOLS + [
        case("roles_must_alternate", [U1, U2])]),
    "deepseek-r1-distill-qwen-32b": ("deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja", "<｜begin▁of▁sentence｜>",
                                     "<｜end▁of▁sentence｜>",
                                     BASIC + [case("reasoning_history", [U1, A_THINK, U2])]),
    "gemma-2-2b-it": ("google-gemma-2-2b-it.jinja", "<bos>", "<eos>", BASIC),  # system role -> raise_exception
    "phi-3.5-mini-instruct": ("microsoft-Phi-3.5-mini-instruct.jinja", "<s>", "<|endoftext|>", BASIC),
    "gpt-oss": ("openai-gpt-oss-120b.jinja", "<|startoftext|>", "<|return|>", BASIC + HARMONY + WITH_TOOLS),
}
PINNED_NOW = {"gpt-oss"}


def template_text(src: str, templates: Path) -> tuple[str, str]:
    if src == "@gemma3":
        return json.loads('"' + GEMMA3_JSON + '"'), "google/gemma-3-*-it tokenizer_config.json chat_template"
    if src == "@chatml":
        sys.path.insert(0, str(ROOT))
        from ramforge.generation.chat import CHATML_TEMPLATE
        return CHATML_TEMPLATE, "llama.cpp common/chat.cpp CHATML_TEMPLATE_SRC (fallback when a GGUF has no template)"
    origin = f"llama-cpp-python 0.3.36 sdist vendor/llama.cpp/models/templates/{src}"
    return (templates / src).read_text(encoding="utf-8"), origin


def reference(text, bos, eos, c, now: str | None = None) -> dict:
    from llama_cpp.llama_chat_format import Jinja2ChatFormatter
    fmt = Jinja2ChatFormatter(template=text, eos_token=eos, bos_token=bos,
                              add_generation_prompt=c["add_generation_prompt"])
    if now is not None:        # the template's date, pinned
        fmt.strftime_now = lambda f: datetime.strptime(now, "%Y-%m-%d").strftime(f)
    try:
        return {"prompt": fmt(messages=json.loads(json.dumps(c["messages"])), tools=c["tools"], **c["kwargs"]).prompt}
    except Exception as e:  # noqa: BLE001 - the template's own raise_exception
        return {"error": f"{type(e).__name__}: {e}"}


def record(name: str, templates: Path) -> dict:
    src, bos, eos, cases = SPECS[name]
    text, origin = template_text(src, templates)
    import jinja2
    import llama_cpp
    return {"format": FORMAT, "name": name, "template_origin": origin,
            "template_sha256": hashlib.sha256(text.encode()).hexdigest(), "template": text,
            "bos_token": bos, "eos_token": eos,
            "reference": f"llama_cpp.llama_chat_format.Jinja2ChatFormatter (llama-cpp-python {llama_cpp.__version__}, "
                         f"jinja2 {jinja2.__version__})",
            **({"now": NOW} if name in PINNED_NOW else {}),
            "cases": [dict(c, **reference(text, bos, eos, c, NOW if name in PINNED_NOW else None)) for c in cases]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="compare committed records with a fresh rendering")
    ap.add_argument("--templates", type=Path, default=TEMPLATES)
    ap.add_argument("names", nargs="*", default=list(SPECS))
    a = ap.parse_args(argv)
    OUT.mkdir(parents=True, exist_ok=True)
    bad = 0
    for name in a.names:
        rec, path = record(name, a.templates), OUT / f"{name}.json"
        if a.check:
            old = json.loads(path.read_text(encoding="utf-8"))
            ok = old["template"] == rec["template"] and old["cases"] == rec["cases"]
            bad += not ok
            print(f"{name}: {'ok' if ok else 'DIFFERS'}")
        else:
            path.write_text(json.dumps(rec, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
            errs = sum("error" in c for c in rec["cases"])
            print(f"{path.relative_to(ROOT)}: {len(rec['cases'])} cases ({errs} template errors)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
