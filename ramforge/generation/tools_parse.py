"""Parsing a model's tool calls out of its output text, by format (see ramforge.generation.tools_call, which
re-exports these names): value_end's resumable JSON scan, the `{"name": ..., "arguments": ...}` call
objects, and `parse` for the whole text or the text so far (partial) of each format."""
from __future__ import annotations

import json
import re
from dataclasses import dataclass

HERMES, LLAMA3, MISTRAL, GENERIC = "hermes", "llama3", "mistral", "generic"


@dataclass
class ToolCall:
    name: str
    arguments: str          # JSON text
    id: str = ""
    complete: bool = True


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
    """The longest end of text (shorter than the longest marker) that some marker starts with: what may
    still become a marker. Found from the marker's first character (one find, rarely more)."""
    limit, best = min(len(text), max(map(len, markers)) - 1), 0
    for m in markers:
        p = text.find(m[0], len(text) - limit)
        while p >= 0 and len(text) - p > best:
            if m.startswith(text[p:]):
                best = len(text) - p
                break
            p = text.find(m[0], p + 1)
    return best


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
    content, calls, _ = _hermes(text, partial, scan)
    return _strip("".join(content), calls), calls


def _hermes(text: str, partial: bool, scan=None) -> tuple[list[str], list[ToolCall], tuple[int, int, int]]:
    """Hermes: (content pieces, calls, done) of text, the content not yet stripped. done = (position,
    pieces, calls): everything before `position` is final, those first pieces and calls with it, and
    parsing text[position:] goes on from there (the loop's state there is the position alone), so a
    stream needs to parse again only from it (CallStream)."""
    content, calls, i = [], [], 0
    while True:
        done = (i, len(content), len(calls))
        j = text.find("<tool_call>", i)
        if j < 0:
            tail = text[i:]
            keep = _hold(tail, ["<tool_call>"]) if partial else 0
            content.append(tail[:len(tail) - keep])
            done = (len(text) - keep, len(content), len(calls))      # no marker can start before the held part
            break
        content.append(text[i:j])
        done = (j, len(content), len(calls))                        # the content before a marker is final
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
    return content, calls, done


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
