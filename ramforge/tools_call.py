"""A model's tool calls, parsed back from its output: OpenAI `tool_calls` (whole, or streamed as
deltas) and Ollama `message.tool_calls`.

The format follows the chat template, by the markers llama.cpp's chat code keys on (`detect`):
  hermes   `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, any number (Hermes 2 Pro / 3,
           Qwen 2.5, Qwen 3)
  llama3   `{"name": ..., "parameters": {...}}` (optionally `"type": "function"` first), one or more
           separated by `;`, or after `<|python_tag|>` (Llama 3.1 / 3.2 / 3.3: the `ipython` role)
  mistral  `[TOOL_CALLS][{"name": ..., "arguments": {...}, "id": "..."}, ...]` (Mistral Nemo)
  generic  a template that does not take tools: the tools are described in a system message
           (`generic_messages`) and the answer is one JSON object, `{"tool_calls": [...]}`,
           `{"tool_call": {...}}` or `{"response": "..."}` (llama.cpp's generic format)
Text outside the calls is content. Arguments are the JSON text the model wrote (for a streamed
call, its characters as they arrive, so the deltas concatenate to the final arguments); an id the
model gives is kept (Mistral), otherwise one is made. Control tokens such as `[TOOL_CALLS]` and
`<|python_tag|>` print as nothing unless the detokenizer keeps them, so their JSON is recognised
without them too. llama.cpp now derives its parsers from a template by a differential analysis
(common/chat-auto-parser); these are the formats it produces for the templates above.

tool_choice "required" or a named function is enforced by a grammar (`call_grammar`): the answer is
one call in the template's format, its name one of the tools (or the named one) and its arguments
valid for the tool's parameters, as llama.cpp's chat code forces a call with a non-lazy grammar.
"""
from __future__ import annotations

import json
import re
import secrets
import string
from dataclasses import dataclass

from .errors import InvalidArgument

HERMES, LLAMA3, MISTRAL, GENERIC = "hermes", "llama3", "mistral", "generic"
_ALNUM = string.ascii_letters + string.digits


@dataclass
class ToolCall:
    name: str
    arguments: str          # JSON text
    id: str = ""
    complete: bool = True


def detect(template: str | None) -> str:
    """The tool-call format of a chat template (see the module doc)."""
    t = template or ""
    if "<tool_call>" in t:
        return HERMES
    if "[TOOL_CALLS]" in t:
        return MISTRAL
    if "<|start_header_id|>" in t and ("ipython" in t or "<|python_tag|>" in t):
        return LLAMA3
    return GENERIC


def new_id(fmt: str = "") -> str:
    """A call id: Mistral's 9 alphanumerics, else OpenAI-like `call_` + 24."""
    n = 9 if fmt == MISTRAL else 24
    s = "".join(secrets.choice(_ALNUM) for _ in range(n))
    return s if fmt == MISTRAL else f"call_{s}"


# ---- validation --------------------------------------------------------------------------------

def tool_names(tools) -> list[str]:
    """The function names of OpenAI/Ollama `tools`; InvalidArgument (400) for a tool without one."""
    if tools is None:
        return []
    if not isinstance(tools, list):
        raise InvalidArgument("tools must be a list")
    names = []
    for i, t in enumerate(tools):
        fn = t.get("function") if isinstance(t, dict) else None
        if not isinstance(t, dict) or t.get("type", "function") != "function" or not isinstance(fn, dict):
            raise InvalidArgument(f"tools[{i}] must be {{'type': 'function', 'function': {{'name': ...}}}}")
        name = fn.get("name")
        if not isinstance(name, str) or not name.strip():
            raise InvalidArgument(f"tools[{i}].function.name is missing: every tool needs a name")
        params = fn.get("parameters")
        if params is not None and not isinstance(params, dict):
            raise InvalidArgument(f"tools[{i}].function.parameters must be a JSON schema object")
        names.append(name)
    return names


def check_choice(tool_choice, tools) -> str | None:
    """"none", "auto", "required" or the named function; InvalidArgument (400) when it names no tool."""
    names = tool_names(tools)
    if tool_choice is None:
        return "auto"
    if tool_choice in ("none", "auto", "required"):
        if tool_choice == "required" and not names:
            raise InvalidArgument("tool_choice 'required' needs tools")
        return tool_choice
    fn = tool_choice.get("function") if isinstance(tool_choice, dict) else None
    name = fn.get("name") if isinstance(fn, dict) else None
    if not isinstance(name, str):
        raise InvalidArgument("tool_choice must be 'none', 'auto', 'required' or "
                              "{'type': 'function', 'function': {'name': ...}}")
    if name not in names:
        raise InvalidArgument(f"tool_choice names the function {name!r}, which is not among the tools "
                              f"({', '.join(names) or 'none given'})")
    return name


def call_constraint(fmt: str, tools, choice: str) -> dict | None:
    """For tool_choice "required" / a named function: the JSON schema of the call a grammar must force
    from the start of the answer (after the format's opening `start`), or None for "auto" / "none"."""
    if choice in (None, "auto", "none"):
        return None
    args = "parameters" if fmt == LLAMA3 else "arguments"
    fns = [t["function"] for t in tools if choice == "required" or t["function"]["name"] == choice]
    one = [{"type": "object", "properties": {"name": {"const": f["name"]},
                                             args: f.get("parameters") or {"type": "object"}},
            "required": ["name", args]} for f in fns]
    schema = {"anyOf": one} if len(one) > 1 else one[0]
    if fmt == GENERIC:                       # llama.cpp's generic format: {"tool_call": {...}}
        schema = {"type": "object", "properties": {"tool_call": schema}, "required": ["tool_call"]}
    start = {HERMES: "<tool_call>", MISTRAL: "[TOOL_CALLS]", LLAMA3: "", GENERIC: ""}[fmt]
    return {"format": fmt, "start": start, "schema": schema}


# the answer around the call's JSON (`{call}`), by format; `space` is the converter's JSON whitespace
_WRAP = {HERMES: 'root ::= "<tool_call>" space {call} space "</tool_call>"',
         MISTRAL: 'root ::= "[TOOL_CALLS]" "[" space {call} space "]"',
         LLAMA3: "root ::= {call}", GENERIC: "root ::= {call}"}


def call_grammar(fmt: str, tools, choice: str) -> str | None:
    """GBNF forcing one call (call_constraint) for tool_choice "required" / a named function; None
    otherwise. The call's JSON is the grammar llama.cpp's json_schema_to_grammar writes for it."""
    c = call_constraint(fmt, tools, choice)
    if c is None:
        return None
    from .structured import json_schema_to_grammar

    body = json_schema_to_grammar(c["schema"])
    name = "call"
    while re.search(rf"^{name} ::=", body, flags=re.M):     # a rule of the schema's own
        name += "0"
    body = re.sub(r"^root ::=", f"{name} ::=", body, count=1, flags=re.M)
    if not re.search(r"^space ::=", body, flags=re.M):
        body += 'space ::= | " " | "\\n"{1,2} [ \\t]{0,20}\n'
    return _WRAP[fmt].format(call=name) + "\n" + body


# ---- messages in -------------------------------------------------------------------------------

def messages_for_template(messages: list[dict]) -> list[dict]:
    """Assistant tool_calls with their arguments as objects (a JSON string is parsed; templates
    write them with `tojson`, as llama.cpp's func_args_not_string does)."""
    out = []
    for m in messages:
        calls = m.get("tool_calls")
        if calls:
            m = dict(m, tool_calls=[_object_args(c) for c in calls])
        out.append(m)
    return out


def _object_args(call: dict) -> dict:
    fn = call.get("function")
    if isinstance(fn, dict) and isinstance(fn.get("arguments"), str):
        try:
            args = json.loads(fn["arguments"])
        except ValueError:
            return call
        return dict(call, function=dict(fn, arguments=args))
    return call


def generic_messages(messages: list[dict], tools: list[dict]) -> list[dict]:
    """The generic format's instructions, in the system message (first, or a new one)."""
    note = ("You can call these tools:\n" + json.dumps([t["function"] for t in tools], ensure_ascii=False, indent=2)
            + '\n\nAnswer with one JSON object: {"tool_calls": [{"name": <tool name>, "arguments": {...}}]} '
              'to call tools, or {"response": <your answer>} to answer directly.')
    if messages and messages[0].get("role") == "system":
        return [dict(messages[0], content=f"{messages[0].get('content') or ''}\n\n{note}")] + list(messages[1:])
    return [{"role": "system", "content": note}] + list(messages)


# ---- JSON scanning -----------------------------------------------------------------------------

_WS = " \t\r\n"


_SCALAR = re.compile(r"-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?|true|false|null")


def value_end(s: str, i: int, scan: dict | None = None, ns=0) -> int:
    """End of the JSON value starting at s[i] (after whitespace), or -1 if it is not complete yet.

    scan: where a scan of an object / array / string stopped, kept between calls on a text that only
    grows (a stream's), so each call resumes there instead of starting over; keyed by (ns, i), ns
    naming the text's origin."""
    n = len(s)
    state = scan.get((ns, i)) if scan is not None else None
    if state is None:
        j = i
        while j < n and s[j] in _WS:
            j += 1
        if j >= n:
            return -1
        if s[j] not in "{[\"":
            m = _SCALAR.match(s, j)
            return m.end() if m and m.end() < n else -1
        state = (j, 0, False, -1)
    j, depth, instr, end = state
    if end >= 0:
        return end
    while j < n:
        c = s[j]
        if instr:
            if c == "\\":
                j += 1
            elif c == '"':
                instr = False
                if depth == 0:
                    end = j + 1
                    break
        elif c == '"':
            instr = True
        elif c in "{[":
            depth += 1
        elif c in "}]":
            depth -= 1
            if depth == 0:
                end = j + 1
                break
        j += 1
    if scan is not None:
        scan[(ns, i)] = (j, depth, instr, end)
    return end


_HEAD = re.compile(r'\s*\{\s*(?:"type"\s*:\s*"function"\s*,\s*)?"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*'
                   r'"(arguments|parameters)"\s*:\s*')


def _call_object(s: str, i: int, fmt: str, scan: dict | None = None, ns=0) -> tuple[ToolCall | None, int]:
    """A `{"name": ..., "arguments": ...}` object at s[i]: (call, end), (partial call, -1) or (None, -1)."""
    m = _HEAD.match(s, i)
    if m is None:
        end = value_end(s, i, scan, ns)
        if end < 0:
            return None, -1
        try:
            obj = json.loads(s[i:end])
        except ValueError:
            return None, -1
        args = obj.get("arguments", obj.get("parameters")) if isinstance(obj, dict) else None
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or args is None:
            return None, -1
        text = args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)
        return ToolCall(obj["name"], text, str(obj.get("id") or "")), end
    name = json.loads(f'"{m.group(1)}"')
    a = m.end()
    b = value_end(s, a, scan, ns)
    if b < 0:
        return ToolCall(name, s[a:].rstrip(_WS), complete=False), -1
    end = value_end(s, i, scan, ns)
    if end < 0:
        return ToolCall(name, s[a:b], complete=False), -1
    rest = s[b:end - 1]
    idm = re.search(r'"id"\s*:\s*"([^"]*)"', rest)
    return ToolCall(name, s[a:b], idm.group(1) if idm else ""), end


# ---- parsing -----------------------------------------------------------------------------------

def _hold(text: str, markers) -> int:
    for n in range(min(len(text), max(map(len, markers)) - 1), 0, -1):
        if any(m.startswith(text[-n:]) for m in markers):
            return n
    return 0


def parse(text: str, fmt: str, partial: bool = False, scan: dict | None = None) -> tuple[str, list[ToolCall]]:
    """(content, calls) of an output. partial: the output so far (content that could still become a
    call is held back; the last call may be incomplete). scan: value_end's resumption points, for a
    text that only grows (CallStream's)."""
    if fmt == HERMES:
        return _parse_hermes(text, partial, scan)
    if fmt == GENERIC:
        return _parse_generic(text, partial, scan)
    return _parse_json_calls(text, fmt, partial, scan)


def _parse_hermes(text: str, partial: bool, scan=None):
    content, calls, i = [], [], 0
    while True:
        j = text.find("<tool_call>", i)
        if j < 0:
            tail = text[i:]
            keep = _hold(tail, ["<tool_call>"]) if partial else 0
            content.append(tail[:len(tail) - keep])
            break
        content.append(text[i:j])
        call, end = _call_object(text, j + len("<tool_call>"), HERMES, scan)
        if call is None:
            if partial:
                break
            content.append(text[j:])                      # not a call after all
            break
        calls.append(call)
        if end < 0:
            break
        k = end
        while k < len(text) and text[k] in _WS:
            k += 1
        if text.startswith("</tool_call>", k):
            i = k + len("</tool_call>")
        elif partial and "</tool_call>".startswith(text[k:]):
            break
        else:
            i = k
    return _strip("".join(content), calls), calls


def _parse_json_calls(text: str, fmt: str, partial: bool, scan=None):
    """llama3 / mistral: calls at the start (after content, for mistral's marker)."""
    marker = "[TOOL_CALLS]" if fmt == MISTRAL else "<|python_tag|>"
    j = text.find(marker)
    head, rest = (text[:j], text[j + len(marker):]) if j >= 0 else ("", text)
    s = rest.lstrip(_WS)
    opener = "[" if fmt == MISTRAL else "{"
    if not s or not (s.startswith(opener) or (fmt == MISTRAL and s.startswith("{"))):
        if partial and (not s or _hold(text, [marker]) or (j < 0 and not s)):
            return head, []
        return text if j < 0 else head + rest, []
    calls, i = [], len(rest) - len(s)
    if s.startswith("["):
        i += 1
    while True:
        call, end = _call_object(rest, i, fmt, scan, ("after", j))
        if call is None:
            if partial:
                return head, calls
            return (text, []) if not calls else (head, calls)
        calls.append(call)
        if end < 0:
            return head, calls
        k = end
        while k < len(rest) and rest[k] in _WS + ",;":
            k += 1
        if k >= len(rest) or rest[k] in "]":
            return head, calls
        i = k


def _parse_generic(text: str, partial: bool, scan=None):
    s = text.strip()
    at = len(text) - len(text.lstrip())          # where s starts in text (for scan's key)
    fence = re.match(r"```(?:json)?\s*", s)
    if fence:
        s = s[fence.end():]
        at += fence.end()
        s = s[:-3] if s.endswith("```") else s
    if not s.startswith("{"):
        return ("", []) if partial and (not s or "```".startswith(s)) else (text, [])
    end = value_end(s, 0, scan, ("generic", at))
    if end < 0:
        return "", []                                      # wait for the whole object
    try:
        obj = json.loads(s[:end])
    except ValueError:
        return text, []
    if isinstance(obj, dict) and isinstance(obj.get("response"), str):
        return obj["response"], []
    raw = obj.get("tool_calls") if isinstance(obj, dict) else None
    if raw is None and isinstance(obj, dict) and isinstance(obj.get("tool_call"), dict):
        raw = [obj["tool_call"]]
    calls = []
    for c in raw if isinstance(raw, list) else []:
        if isinstance(c, dict) and isinstance(c.get("name"), str):
            a = c.get("arguments", {})
            calls.append(ToolCall(c["name"], a if isinstance(a, str) else json.dumps(a, ensure_ascii=False),
                                  str(c.get("id") or "")))
    return ("", calls) if calls else (text, [])


def _strip(content: str, calls) -> str:
    return content.strip() if calls else content


# ---- streaming ---------------------------------------------------------------------------------

# What turns plain content into calls later on, by format (the generic format decides at its start).
# Once a stream is plain content (no call, nothing held back, so no marker can begin before the next
# chunk), a chunk that neither holds a marker nor ends with the start of one is content.
_MARKERS = {HERMES: "<tool_call>", LLAMA3: "<|python_tag|>", MISTRAL: "[TOOL_CALLS]"}


class CallStream:
    """Feed the answer's text as it comes: `feed(text)` -> (content delta, OpenAI tool_call deltas);
    `finish()` -> the same for the rest, and `calls` holds the final ToolCalls (with ids).

    Incremental: while the answer is plain content a chunk with no marker (or start of one) is content
    at once (its cost is its own length, nothing is parsed again); otherwise the text is parsed with
    value_end's scans resumed where they stopped, so a long call's arguments are read once."""

    def __init__(self, fmt: str):
        self.fmt, self.sent = fmt, 0
        self.calls: list[ToolCall] = []
        self._args_sent: list[int] = []
        self._chunks: list[str] = []
        self._scan: dict = {}
        self._plain = False            # all content so far, nothing held back: the fast path may run
        self._ws: list[str] = []       # the fast path's trailing whitespace, not sent yet

    @property
    def text(self) -> str:
        if len(self._chunks) > 1:
            self._chunks = ["".join(self._chunks)]
        return self._chunks[0] if self._chunks else ""

    def feed(self, text: str, final: bool = False) -> tuple[str, list[dict]]:
        if text:
            self._chunks.append(text)
        marker = _MARKERS.get(self.fmt)
        if self._plain and not final and not (marker and (marker in text or _hold(text, [marker]))):
            body = text.rstrip()                         # whitespace waits: before a call it is cut
            if not body:
                self._ws.append(text)
                return "", []
            delta = "".join(self._ws) + body
            self._ws = [text[len(body):]]
            self.sent += len(delta)
            return delta, []
        full = self.text
        content, calls = parse(full, self.fmt, partial=not final, scan=self._scan)
        # (the generic format's opening ``` fence can still grow into ```json: not plain while it may)
        self._plain = not calls and content == full and not (self.fmt == GENERIC and full.lstrip()[:1] == "`")
        self._ws = [full[len(full.rstrip()):]] if self._plain else []
        if not final:
            content = content.rstrip()
            if calls and self.sent == 0:
                content = content.lstrip()
        delta = content[self.sent:] if len(content) > self.sent else ""
        self.sent += len(delta)
        out = []
        for k, c in enumerate(calls):
            if k == len(self.calls):
                c.id = c.id or new_id(self.fmt)
                self.calls.append(c)
                self._args_sent.append(0)
                out.append({"index": k, "id": c.id, "type": "function",
                            "function": {"name": c.name, "arguments": ""}})
            known = self.calls[k]
            if c.arguments.startswith(known.arguments[:self._args_sent[k]]) and len(c.arguments) > self._args_sent[k]:
                out.append({"index": k, "function": {"arguments": c.arguments[self._args_sent[k]:]}})
                self._args_sent[k] = len(c.arguments)
            known.arguments, known.complete = c.arguments, c.complete
        return delta, out

    def finish(self) -> tuple[str, list[dict]]:
        return self.feed("", final=True)


def openai_calls(calls: list[ToolCall], fmt: str = "") -> list[dict]:
    return [{"id": c.id or new_id(fmt), "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for c in calls]


def ollama_calls(calls: list[ToolCall], start: int = 0) -> list[dict]:
    """Ollama's message.tool_calls: arguments as an object; `start`: the first one's index."""
    out = []
    for i, c in enumerate(calls, start):
        try:
            args = json.loads(c.arguments) if c.arguments else {}
        except ValueError:
            args = {}
        out.append({"function": {"index": i, "name": c.name, "arguments": args if isinstance(args, dict) else {}}})
    return out


class ToolSession:
    """One chat request's tools: validated (`tool_names`, `check_choice`), the messages and tools the
    template gets, and the parse of the answer. Inactive (plain text) without tools or with "none"."""

    def __init__(self, tools, tool_choice=None):
        self.choice = check_choice(tool_choice, tools)
        self.tools = list(tools or [])
        self.active = bool(self.tools) and self.choice != "none"
        self.fmt = GENERIC
        self.stream: CallStream | None = None

    def prepare(self, template: str | None, messages: list[dict]) -> tuple[list[dict], list[dict] | None]:
        """(messages, tools) for the template; picks the format from it."""
        self.fmt = detect(template)
        messages = messages_for_template(messages)
        if not self.active:
            return messages, None
        self.stream = CallStream(self.fmt)
        if self.fmt == GENERIC and "tools" not in (template or ""):
            messages = generic_messages(messages, self.tools)
        return messages, self.tools

    def constraint(self) -> dict | None:
        """What a grammar must force for "required" / a named function (call_constraint)."""
        return call_constraint(self.fmt, self.tools, self.choice) if self.active else None

    def grammar(self) -> str | None:
        """The GBNF forcing that call (call_grammar), or None."""
        return call_grammar(self.fmt, self.tools, self.choice) if self.active else None

    def parse(self, text: str) -> tuple[str, list[ToolCall]]:
        return parse(text, self.fmt) if self.active else (text, [])
