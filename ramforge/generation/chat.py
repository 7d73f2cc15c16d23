"""Chat templates: GGUF `tokenizer.chat_template` (Jinja) -> prompt text, as llama-cpp-python renders it.

Environment = llama-cpp-python's `Jinja2ChatFormatter` (= HF transformers'): sandboxed, trim/lstrip
blocks, loopcontrols, `{% generation %}`, HF `tojson`, `raise_exception`, `strftime_now`, and the
variables it passes. The prompt holds any BOS the template writes: tokenize it without adding BOS
(llama-cpp-python) or `strip_special` it first (llama.cpp server). Limits (`ChatLimits`) without
signals or tracing: loop iterables, `~` operands and literal output are routed through the sandbox's
`call`, which with filters, lookups, `finalize` and the operators `+ * ** %` checks a deadline,
sizes, loop and depth caps; huge allocations from small inputs are estimated before they run.
No template in the GGUF: llama.cpp's ChatML fallback (llama-cpp-python would use its "llama-2"
format, Ollama the bare prompt).
"""
from __future__ import annotations

import contextvars
import dataclasses
import json
import math
import re
import time
import types
from datetime import datetime
from functools import lru_cache, wraps

from ramforge import cancel
from ramforge.errors import ClientDisconnected, InvalidArgument, ModelFileError

CHATML_TEMPLATE = (
    "{%- for message in messages -%}\n"
    "  {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>\n' -}}\n"
    "{%- endfor -%}\n"
    "{%- if add_generation_prompt -%}\n"
    "  {{- '<|im_start|>assistant\n' -}}\n"
    "{%- endif -%}"
)
_SIZED = (str, list, tuple, set, frozenset, dict)


class ChatTemplateError(InvalidArgument):
    """A chat template failed. `kind`: "syntax", "raised" (raise_exception), "security" (sandbox),
    "limit", "render", "messages" or "metadata"; `lineno`: the template line where known.
    Rendering failures come from the messages (a request's fault); a template that does not compile
    or is missing ("syntax", "metadata") is a ChatTemplateInvalid, the model file's fault."""

    def __init__(self, message: str, kind: str = "render", lineno: int | None = None):
        self.kind, self.lineno, self.detail = kind, lineno, message
        super().__init__(f"chat template{f' line {lineno}' if lineno else ''}: {message}")


class ChatTemplateInvalid(ChatTemplateError, ModelFileError):
    """The template itself does not compile ("syntax") or the GGUF has none ("metadata")."""


@dataclasses.dataclass(frozen=True)
class ChatLimits:
    timeout_s: float = 2.0
    max_output_chars: int = 1 << 20       # also caps any intermediate string/list (printed size)
    max_loop_iterations: int = 1_000_000  # all `for` iterations of one render together
    max_depth: int = 64                   # nested calls: macro / recursive-loop recursion


def _measure(v, cap: int) -> int:
    """Characters/items `v` prints as, counted until past `cap`; a shared list counts each time it
    is referenced, so `[[l] * 1000] * 1000` is as big as it prints."""
    n, stack = 0, [v]
    while stack and n <= cap:
        x = stack.pop()
        if isinstance(x, str):
            n += len(x)
        elif isinstance(x, _SIZED):
            n += len(x) + 1
            stack.extend(x.items() if isinstance(x, dict) else x)
        else:
            n += 1
    return n


class _State:
    def __init__(self, limits: ChatLimits, deadline: float):
        self.limits, self.deadline, self.cap = limits, deadline, limits.max_output_chars
        self.iterations = self.depth = self.produced = 0

    def tick(self):
        cancel.check()                    # the request's client gone: stop rendering (ramforge.cancel)
        if time.perf_counter() > self.deadline:
            raise ChatTemplateError(f"render exceeded {self.limits.timeout_s:g} s", "limit")

    def estimate(self, n: int, what: str):
        if n > self.cap:
            raise ChatTemplateError(f"{what} would build {n:,} characters/items, over the cap of {self.cap:,}", "limit")

    def size(self, v, what="value"):
        if isinstance(v, int) and not isinstance(v, bool) and v.bit_length() > 65536:
            raise ChatTemplateError(f"{what}: integer of {v.bit_length():,} bits", "limit")
        if isinstance(v, _SIZED):
            self.estimate(_measure(v, self.cap), what)
        return v

    def emit(self, v):
        """Every `{{ }}` value and literal, also those buffered in macros, set/filter/call blocks."""
        n = _measure(v, self.cap)
        self.produced += n
        if self.produced > 16 * self.cap:
            raise ChatTemplateError(f"over {16 * self.cap:,} characters produced (with macro/block buffers)", "limit")
        self.estimate(n, "output")
        return v

    def take(self, iterable, what: str) -> list:
        """Materialise an iterable about to be joined/summed, refusing it once it is too big."""
        items, n = [], 0
        for x in iterable:
            items.append(x)
            n += 1 + _measure(x, self.cap)
            self.estimate(n, what)
        return items


_STATE: contextvars.ContextVar[_State] = contextvars.ContextVar(
    "ramforge_chat_state", default=_State(ChatLimits(), math.inf))  # the default serves compile-time folding
# Widths and precisions of %-formats and of str.format fields ({name:spec}, spec up to the next brace).
# Each pattern runs in linear time: after `%` everything is optional (the first try matches), and a
# field's name stops at its first ':' (no backtracking over other colons).
_PERCENT = re.compile(r"%[-#0 +]*(\d+|\*)?(?:\.(\d+|\*))?")
_FIELD = re.compile(r"\{[^{}:]*:([^{}]*)(\{)?")
_DIGITS = re.compile(r"\d+")
_TICK_EVERY = 256                         # matches between deadline checks


def _widths(text: str, st: "_State"):
    """(what, number text or '*' / '{') of each width or precision in a format string, checking the
    deadline as it goes."""
    for i, m in enumerate(_PERCENT.finditer(text)):
        if i % _TICK_EVERY == 0:
            st.tick()
        for g in m.groups():
            if g:
                yield m.group(0), g
    for i, m in enumerate(_FIELD.finditer(text)):
        if i % _TICK_EVERY == 0:
            st.tick()
        for d in _DIGITS.finditer(m.group(1)):
            yield m.group(0), d.group(0)
        if m.group(2):
            yield m.group(0), "{"


def _precheck(name: str, s, args: tuple, kwargs: dict, st: _State):
    """Refuse an operation whose result would be over the cap before it allocates. `name`: a filter,
    ".method" of a str `s`, or "%". Returns (s, args) with a join/sum iterable materialised."""
    for a in (s, *args, *kwargs.values()):
        st.size(a, f"argument of {name}")
    ints = [a for a in (*args, *kwargs.values()) if isinstance(a, int) and not isinstance(a, bool)]
    n = max(ints, default=0)
    text = s if isinstance(s, str) else str(s) if name in ("indent", "wordwrap", "replace", "format") else ""
    if name in ("batch", "slice", "center", ".center", ".ljust", ".rjust", ".zfill"):
        st.estimate(n, name)
    elif name == "sum" and not isinstance(kwargs.get("start", args[1] if len(args) > 1 else 0), (int, float)):
        s = st.take(s, name)
    elif name == "join":  # value|join(d)
        s = s if isinstance(s, (str, list, tuple)) else st.take(s, name)
        st.estimate(len(str(args[0] if args else kwargs.get("d", ""))) * len(s), name)
    elif name == ".join" and args:  # sep.join(iterable)
        args = (st.take(args[0], name), *args[1:])
        st.estimate(len(s) * len(args[0]), name)
    elif name == ".expandtabs":
        st.estimate(len(s) + s.count("\t") * n, name)
    elif name == "indent":
        w = args[0] if args else kwargs.get("width", 4)
        st.estimate(len(text) + (text.count("\n") + 1) * (len(w) if isinstance(w, str) else int(w)), name)
    elif name == "wordwrap":
        st.estimate(len(text) * (1 + len(kwargs.get("wrapstring") or (args[3] if len(args) > 3 else "\n"))), name)
    elif name in ("replace", ".replace") and len(args) >= 2 and isinstance(args[0], str) and isinstance(args[1], str):
        count = len(text) + 1 if args[0] == "" else text.count(args[0])
        st.estimate(len(text) + count * max(0, len(args[1]) - len(args[0])), name)
    elif name in ("format", ".format", ".format_map", "%"):
        for what, g in _widths(text, st):
            if g in "*{" and any(abs(i) > st.cap for i in ints) or g.isdigit() and len(g) > 6:
                st.estimate(10 ** 7, f"format width in {what[:40]!r}")
    return s, args


def _tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    """HF transformers' / llama-cpp-python's tojson (jinja's own one escapes HTML and sorts keys)."""
    if len(str(indent or "")) > 64 or isinstance(indent, int) and indent > 64 or any(
            len(str(s)) > 64 for s in separators or ()):
        raise ChatTemplateError("tojson indent/separators over 64 characters", "limit")
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _loop_guard(iterable):
    st = _STATE.get()
    for item in iterable:
        st.iterations += 1
        if st.iterations > st.limits.max_loop_iterations:
            raise ChatTemplateError(f"over {st.limits.max_loop_iterations:,} loop iterations", "limit")
        st.tick()
        yield item


def _guard_filter(name, f):
    from jinja2.utils import _PassArg
    skip = 1 if _PassArg.from_obj(f) else 0

    @wraps(f)
    def guarded(*args, **kwargs):
        st = _STATE.get()
        st.tick()
        if len(args) > skip:
            value, rest = _precheck(name, args[skip], args[skip + 1:], kwargs, st)
            args = (*args[:skip], value, *rest)
        return st.size(f(*args, **kwargs), f"filter {name!r}")
    return guarded


@lru_cache(maxsize=1)
def _environment():
    import jinja2
    import jinja2.ext
    from jinja2 import nodes
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class Generation(jinja2.ext.Extension):
        """HF's `{% generation %}...{% endgeneration %}`, rendered as its body (as llama-cpp-python)."""
        tags = {"generation"}

        def parse(self, parser):
            parser.stream.skip(1)
            return parser.parse_statements(("name:endgeneration",), drop_needle=True)

    class Env(ImmutableSandboxedEnvironment):
        intercepted_binops = frozenset({"+", "*", "**", "%"})

        def call_binop(self, context, op, left, right):
            st = _STATE.get()
            st.tick()
            if op == "*":
                seq, n = (left, right) if isinstance(right, int) else (right, left)
                if isinstance(seq, (str, list, tuple)) and isinstance(n, int):
                    st.estimate(_measure(seq, st.cap) * n, "'*' repetition")
            elif op == "**" and isinstance(left, int) and isinstance(right, int) and abs(left) > 1 and right > 0:
                st.estimate(abs(left).bit_length() * right // 64, "'**' result (in 64-bit words)")
            elif op == "%" and isinstance(left, str):
                _precheck("%", left, right if isinstance(right, tuple) else (right,), {}, st)
            return st.size(self.binop_table[op](left, right), f"'{op}' result")

        def getattr(self, obj, attribute):
            _STATE.get().tick()
            return super().getattr(obj, attribute)

        def getitem(self, obj, argument):
            _STATE.get().tick()
            return super().getitem(obj, argument)

        def call(__self, __context, __obj, *args, **kwargs):
            st = _STATE.get()
            st.tick()
            target = getattr(__obj, "__wrapped__", __obj)  # the sandbox wraps str.format
            if isinstance(target, types.BuiltinMethodType) and isinstance(target.__self__, str):
                _, args = _precheck("." + target.__name__, target.__self__, args, kwargs, st)
            else:
                for a in (*args, *kwargs.values()):
                    st.size(a, "call argument")
            st.depth += 1
            try:
                if st.depth > st.limits.max_depth:
                    raise ChatTemplateError(f"call depth over {st.limits.max_depth} (runaway recursion?)", "limit")
                return st.size(super().call(__context, __obj, *args, **kwargs), "call result")
            finally:
                st.depth -= 1

    env = Env(loader=jinja2.BaseLoader(), trim_blocks=True, lstrip_blocks=True,
              extensions=[Generation, "jinja2.ext.loopcontrols"], finalize=lambda v: _STATE.get().emit(v))
    env.filters["tojson"] = _tojson
    env.filters.update({k: _guard_filter(k, f) for k, f in env.filters.items()})
    del env.globals["lipsum"]  # no chat template uses it; lipsum(10**9) would be a bomb
    env.rf_loop, env.rf_value = _loop_guard, lambda v: v  # compiled as environment.call(environment.rf_*, x)

    def guarded(name, node):
        return nodes.Call(nodes.EnvironmentAttribute(name), [node], [], None, None, lineno=node.lineno)

    class Guard(jinja2.visitor.NodeTransformer):
        """Route every loop iterable, `~` operand and result, and literal output through call()/finalize."""
        def visit_Output(self, node):
            self.generic_visit(node)
            node.nodes = [guarded("rf_value", n) if isinstance(n, nodes.TemplateData) else n for n in node.nodes]
            return node

        def visit_For(self, node):
            self.generic_visit(node)
            node.iter = guarded("rf_loop", node.iter)
            return node

        def visit_Concat(self, node):
            self.generic_visit(node)
            node.nodes = [guarded("rf_value", n) for n in node.nodes]
            return guarded("rf_value", node)

    return env, Guard


def _lineno(exc: BaseException) -> int | None:
    tb, line = exc.__traceback__, None
    while tb is not None:
        line = tb.tb_lineno if tb.tb_frame.f_code.co_filename == "<template>" else line
        tb = tb.tb_next
    return line


@lru_cache(maxsize=32)
def _compile(text: str):
    import jinja2
    env, guard = _environment()
    if len(text) > 1 << 20:
        raise ChatTemplateInvalid(f"template of {len(text):,} characters is over 1 MiB", "syntax")
    try:
        return env.from_string(guard().visit(env.parse(text)))
    except jinja2.TemplateSyntaxError as e:
        raise ChatTemplateInvalid(f"syntax error: {e.message}", "syntax", e.lineno) from None
    except (RecursionError, MemoryError) as e:
        raise ChatTemplateInvalid(f"template too deeply nested to compile ({type(e).__name__})", "syntax") from None


def _validate(messages) -> list[dict]:
    """Checked shallow copies; text content parts joined with newlines and a null content next to
    tool_calls made "" (both as llama.cpp does)."""
    if not isinstance(messages, (list, tuple)):
        raise ChatTemplateError(f"messages must be a list of dicts, not {type(messages).__name__}", "messages")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise ChatTemplateError(f"messages[{i}] must be a dict, not {type(m).__name__}", "messages")
        m, bad = dict(m), lambda f, why: ChatTemplateError(f"messages[{i}].{f}: {why}", "messages")
        if not isinstance(m.get("role"), str) or not m["role"]:
            raise bad("role", f"must be a non-empty string, got {m.get('role')!r}")
        c = m.get("content")
        if c is None and m.get("tool_calls"):
            m["content"] = ""
        elif isinstance(c, (list, tuple)):
            for j, part in enumerate(c):
                if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                    raise bad(f"content[{j}]", f"only {{'type': 'text', 'text': str}} parts are supported, "
                                               f"got {part!r}"[:200])
            m["content"] = "\n".join(part["text"] for part in c)
        elif not isinstance(c, str):
            raise bad("content", f"must be a string or a list of text parts, got {type(c).__name__}")
        tc = m.get("tool_calls")
        if tc is not None and not (isinstance(tc, (list, tuple)) and all(isinstance(t, dict) for t in tc)):
            raise bad("tool_calls", "must be a list of dicts")
        for f in ("name", "tool_call_id", "reasoning_content"):
            if m.get(f) is not None and not isinstance(m[f], str):
                raise bad(f, f"must be a string, got {type(m[f]).__name__}")
        out.append(m)
    return out


# The variables render_chat itself passes a template (and its own keywords): a caller's extra
# template variables (llama-server's chat_template_kwargs) may not take these names.
RESERVED_VARIABLES = frozenset({"messages", "tools", "add_generation_prompt", "bos_token", "eos_token",
                                "raise_exception", "strftime_now", "functions", "function_call", "tool_choice",
                                "limits", "template"})


def check_template_kwargs(kwargs) -> dict:
    """A request's extra template variables (chat_template_kwargs): a JSON object whose names are
    none of RESERVED_VARIABLES; ChatTemplateError (400) otherwise."""
    if kwargs is None:
        return {}
    if not isinstance(kwargs, dict):
        raise ChatTemplateError(f"chat_template_kwargs must be an object, not {type(kwargs).__name__}", "messages")
    taken = sorted(k for k in kwargs if k in RESERVED_VARIABLES)
    if taken:
        raise ChatTemplateError(f"chat_template_kwargs cannot set {', '.join(taken)}: the template's own "
                                f"variables ({', '.join(sorted(RESERVED_VARIABLES))}) come from the request",
                                "messages")
    return dict(kwargs)


def render_chat(template: str, messages: list[dict], *, add_generation_prompt: bool = True, bos_token: str = "",
                eos_token: str = "", tools=None, limits: ChatLimits | None = None, **kwargs) -> str:
    """Render `messages` through the Jinja chat `template`; extra keywords become template variables."""
    import jinja2
    limits = limits or ChatLimits()
    compiled = _compile(template)
    if tools is not None and not (isinstance(tools, (list, tuple)) and all(isinstance(t, dict) for t in tools)):
        raise ChatTemplateError("tools must be a list of dicts", "messages")
    ctx = dict(functions=None, function_call=None, tool_choice=None)
    ctx.update(kwargs, messages=_validate(messages), bos_token=bos_token, eos_token=eos_token,
               add_generation_prompt=add_generation_prompt, tools=tools or None,  # [] -> None, as llama.cpp
               raise_exception=_raise_exception, strftime_now=_strftime_now)
    st = _State(limits, time.perf_counter() + limits.timeout_s)
    token, parts, total = _STATE.set(st), [], 0
    try:
        for chunk in compiled.generate(**ctx):
            total += len(chunk)
            if total > limits.max_output_chars:
                raise ChatTemplateError(f"output over {limits.max_output_chars:,} characters", "limit")
            st.tick()
            parts.append(chunk)
    except ChatTemplateError as e:
        if e.lineno is None and _lineno(e):
            raise type(e)(e.detail, e.kind, _lineno(e)) from None
        raise
    except jinja2.exceptions.SecurityError as e:
        raise ChatTemplateError(f"sandbox refused: {e}", "security", _lineno(e)) from None
    except (OverflowError, RecursionError, MemoryError) as e:
        raise ChatTemplateError(f"limit hit: {type(e).__name__}: {e}", "limit", _lineno(e)) from None
    except ClientDisconnected:
        raise
    except Exception as e:  # noqa: BLE001 - any runtime error is the template's (or its inputs') fault
        raise ChatTemplateError(f"{type(e).__name__}: {e}", "render", _lineno(e)) from None
    finally:
        _STATE.reset(token)
    return "".join(parts)


def _raise_exception(message):
    raise ChatTemplateError(f"template raised: {message}", "raised")


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


@dataclasses.dataclass
class ChatTemplate:
    text: str
    source: str            # "gguf:tokenizer.chat_template[.tool_use]", "override" or "default:chatml"
    bos_token: str = ""
    eos_token: str = ""
    add_bos: bool = False  # the vocabulary's settings, used only by strip_special
    add_eos: bool = False

    @classmethod
    def from_metadata(cls, md: dict, override: str | None = None, *, fallback: str | None = "chatml"):
        """The GGUF's template (`override`, e.g. a --chat-template file's text, wins; "chatml" names the
        default) and BOS/EOS text. No template: llama.cpp's ChatML, or an error if fallback is None."""
        tokens = md.get("tokenizer.ggml.tokens") or []

        def token(key):
            i = md.get(key)
            return str(tokens[i]) if isinstance(i, int) and 0 <= i < len(tokens) else ""

        names = [] if override is not None else ["tokenizer.chat_template", "tokenizer.chat_template.tool_use"]
        found = [k for k in names if isinstance(md.get(k), str)]
        if override is not None and override.strip() not in ("", "chatml"):
            text, source = override, "override"
        elif found:
            text, source = md[found[0]], f"gguf:{found[0]}"
        elif fallback == "chatml" or override is not None:
            text, source = CHATML_TEMPLATE, "default:chatml"
        else:
            raise ChatTemplateInvalid("the GGUF has no tokenizer.chat_template; pass --chat-template FILE", "metadata")
        _compile(text)  # syntax errors surface here, with their line
        return cls(text, source, token("tokenizer.ggml.bos_token_id"), token("tokenizer.ggml.eos_token_id"),
                   bool(md.get("tokenizer.ggml.add_bos_token", md.get("tokenizer.ggml.model") == "llama")),
                   bool(md.get("tokenizer.ggml.add_eos_token", False)))

    def render(self, messages, *, add_generation_prompt=True, tools=None, **kwargs) -> str:
        return render_chat(self.text, messages, add_generation_prompt=add_generation_prompt,
                           bos_token=self.bos_token, eos_token=self.eos_token, tools=tools, **kwargs)

    def strip_special(self, prompt: str) -> str:
        """llama.cpp's rule: drop a leading BOS / trailing EOS text that the tokenizer adds itself."""
        if self.add_bos and self.bos_token and prompt.startswith(self.bos_token):
            prompt = prompt[len(self.bos_token):]
        if self.add_eos and self.eos_token and prompt.endswith(self.eos_token):
            prompt = prompt[:-len(self.eos_token)]
        return prompt
