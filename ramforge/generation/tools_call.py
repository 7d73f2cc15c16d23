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
from collections import deque

from ..errors import InvalidArgument
from .tools_parse import GENERIC, HERMES, LLAMA3, MISTRAL, ToolCall, _hermes, _hold, parse, value_end

_ALNUM = string.ascii_letters + string.digits


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
    from ..structured import json_schema_to_grammar

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


# ---- streaming ---------------------------------------------------------------------------------

# What turns plain content into calls later on, by format (the generic format decides at its start).
# Once a stream is plain content (no call, nothing held back, so no marker can begin before the next
# chunk), a chunk that neither holds a marker nor ends with the start of one is content.
_MARKERS = {HERMES: "<tool_call>", LLAMA3: "<|python_tag|>", MISTRAL: "[TOOL_CALLS]"}


class _Content:
    """A stream's final content so far (not stripped), as the pieces from the first not yet sent: its
    length, the whitespace it starts and ends with, and a slice near its end, each in time linear in
    what was added."""

    def __init__(self):
        self.pieces: deque[str] = deque()
        self.off = self.n = 0          # where pieces[0] starts; the length of it all
        self.lead = self.trail = 0     # whitespace it starts (all of it while blank) and ends with
        self.blank = True

    def add(self, s: str) -> None:
        if not s:
            return
        self.pieces.append(s)
        self.n += len(s)
        body = s.rstrip()
        if not body:
            self.trail += len(s)
            self.lead += len(s) if self.blank else 0
            return
        if self.blank:
            self.lead += len(s) - len(s.lstrip())
            self.blank = False
        self.trail = len(s) - len(body)

    def slice(self, a: int, b: int) -> str:
        """self[a:b], a at or after every earlier slice's a (the pieces before it are dropped)."""
        while self.pieces and self.off + len(self.pieces[0]) <= a:
            self.off += len(self.pieces.popleft())
        parts, pos = [], self.off
        for p in self.pieces:
            if pos >= b:
                break
            parts.append(p[max(0, a - pos):b - pos])
            pos += len(p)
        return "".join(parts)


class CallStream:
    """Feed the answer's text as it comes: `feed(text)` -> (content delta, OpenAI tool_call deltas);
    `finish()` -> the same for the rest, and `calls` holds the final ToolCalls (with ids). The deltas
    are those of parsing the whole text so far at each chunk (`parse`, partial), in less time:

    - Hermes: only the text after the last final point is parsed again (`_hermes`'s `done`: past a
      call's closing tag, before a marker, or before the start of one held back), the content before
      it kept as pieces (`_Content`); a chunk arriving with nothing held back and no marker (or start
      of one) is content at once. Content holding `<` (HTML), calls after calls: each chunk costs
      about its own length.
    - The others (their calls come first): while the answer is plain content a chunk with no marker
      (or start of one) is content at once; otherwise the text is parsed with value_end's scans
      resumed where they stopped.
    Either way a call's arguments are scanned once (value_end resumes)."""

    def __init__(self, fmt: str):
        self.fmt, self.sent = fmt, 0
        self.calls: list[ToolCall] = []
        self._args_sent: list[int] = []
        self._chunks: list[str] = []
        self._scan: dict = {}
        self._plain = False            # all content so far, nothing held back: the fast path may run
        self._ws: list[str] = []       # the fast path's trailing whitespace, not sent yet
        self._content = _Content()     # Hermes: the final content, before the window
        self._win = ""                 # Hermes: the text after the last final point
        self._done_calls = 0           # Hermes: the calls before the window

    def feed(self, text: str, final: bool = False) -> tuple[str, list[dict]]:
        if self.fmt == HERMES:
            return self._feed_hermes(text, final)
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
        if len(self._chunks) > 1:
            self._chunks = ["".join(self._chunks)]
        full = self._chunks[0] if self._chunks else ""
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
        return delta, self._deltas(calls, 0)

    def _feed_hermes(self, text: str, final: bool) -> tuple[str, list[dict]]:
        c = self._content
        if not final and not self._win and not ("<tool_call>" in text or _hold(text, ["<tool_call>"])):
            c.add(text)                                  # nothing held back, no marker: content, final
            rest, calls, out = "", [], []
        else:
            self._win += text
            pieces, calls, (at, n_pieces, n_calls) = _hermes(self._win, not final, self._scan)
            if final:
                n_pieces = n_calls = 0
            for p in pieces[:n_pieces]:
                c.add(p)
            rest = "".join(pieces[n_pieces:])
            out = self._deltas(calls, self._done_calls)
            self._done_calls += n_calls
            calls = calls[n_calls:]
            if at:
                self._win, self._scan = self._win[at:], {}     # value_end's positions were the window's
        # the content as parse() gives it then feed() cuts it: stripped when there are calls, its trailing
        # whitespace held back until the end; what of it was not sent yet
        has_calls = self._done_calls + len(calls) > 0
        n = c.n + len(rest)
        lead = c.lead + len(rest) - len(rest.lstrip()) if c.blank else c.lead
        body = rest.rstrip()
        trail = len(rest) - len(body) if body else len(rest) + c.trail
        a, b = self.sent + (lead if has_calls else 0), n - (trail if has_calls or not final else 0)
        delta = ""
        if b > a:
            delta = (c.slice(a, min(b, c.n)) if a < c.n else "") + (rest[max(0, a - c.n):b - c.n] if b > c.n else "")
            self.sent += len(delta)
        return delta, out

    def _deltas(self, calls: list[ToolCall], base: int) -> list[dict]:
        """The OpenAI tool_call deltas of `calls`, the calls from index `base` on as parsed now."""
        out = []
        for k, c in enumerate(calls, base):
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
        return out

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
