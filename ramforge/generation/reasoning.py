"""A chat model's reasoning, split from its answer as the servers report it: llama-server's
`reasoning_content`, Ollama's `message.thinking`. Qwen 3's and DeepSeek-R1's `<think>` block: `Think`.

gpt-oss writes OpenAI's harmony format. After the prompt's `<|start|>assistant` it writes messages
`[<|start|>assistant]<|channel|>NAME[ to=RECIPIENT][<|constrain|>...]<|message|>BODY<|end|>`, the last one
ending in `<|return|>` (an end-of-generation token, never text) or `<|call|>`. The `analysis` channel is
the reasoning; `final` (and a `commentary` preamble) the answer. Output that does not open with a
header is all answer. `Harmony.feed` takes text as it is generated and returns what can be told
apart so far, holding back only what could still be the start of a marker.
"""
from __future__ import annotations

MESSAGE = "<|message|>"
CHANNEL = "<|channel|>"
START = "<|start|>"
ENDS = ("<|end|>", "<|return|>", "<|call|>", START)   # a body ends at any of these
THINKING_CHANNELS = frozenset({"analysis"})
MAX_HEADER = 256                                       # characters: a longer "header" is plain text


def _hold(text: str, markers) -> int:
    """How many trailing characters of text could begin one of the markers."""
    for n in range(min(len(text), max(map(len, markers)) - 1), 0, -1):
        tail = text[-n:]
        if any(m.startswith(tail) for m in markers):
            return n
    return 0


class Harmony:
    """Incremental harmony splitter: feed(text) -> (thinking, content) deltas; flush() the rest."""

    def __init__(self):
        self.buf = ""
        self.state = "header"            # header: before <|message|>; body; plain: no harmony at all
        self.thinking = False            # the current body's channel is a reasoning one

    def _header(self, head: str) -> None:
        channel = head.split(CHANNEL, 1)[1] if CHANNEL in head else ""
        name = channel.split("<|", 1)[0].split(" ", 1)[0].strip()
        self.thinking = name in THINKING_CHANNELS

    def feed(self, text: str) -> tuple[str, str]:
        self.buf += text
        out = {True: [], False: []}
        while self.buf:
            if self.state == "plain":
                out[False].append(self.buf)
                self.buf = ""
            elif self.state == "header":
                i = self.buf.find(MESSAGE)
                if i < 0:
                    opens = self.buf.startswith("<|") or "<|".startswith(self.buf)
                    if opens and len(self.buf) <= MAX_HEADER:
                        break                    # wait for the rest of the header
                    self.state = "plain"
                    continue
                self._header(self.buf[:i])
                self.buf, self.state = self.buf[i + len(MESSAGE):], "body"
            else:
                ends = [(j, m) for m in ENDS if (j := self.buf.find(m)) >= 0]
                if ends:
                    j, m = min(ends)
                    out[self.thinking].append(self.buf[:j])
                    self.buf = self.buf[j + (0 if m == START else len(m)):]
                    self.state = "header"
                    continue
                keep = _hold(self.buf, ENDS)
                out[self.thinking].append(self.buf[:len(self.buf) - keep])
                self.buf = self.buf[len(self.buf) - keep:]
                break
        return "".join(out[True]), "".join(out[False])

    def flush(self) -> tuple[str, str]:
        """What is left at the end of generation: a body's held-back tail (an unfinished header is dropped)."""
        rest, self.buf = self.buf, ""
        if self.state == "body":
            return (rest, "") if self.thinking else ("", rest)
        return "", (rest if self.state == "plain" else "")


THINK, END_THINK = "<think>", "</think>"


class Think:
    """`<think>...</think>` (Qwen 3, DeepSeek-R1): the block is the thinking, the rest the answer,
    each stripped of surrounding whitespace as llama.cpp's deepseek reasoning format does. `opened`:
    the prompt already ends with `<think>` (R1's template forces it open), so the output starts
    inside the block. feed(text) -> (thinking, content) deltas; flush() the rest."""

    def __init__(self, opened: bool = False):
        self.buf, self.state = "", "think" if opened else "start"
        self.lead = True                               # at the start of a part: whitespace is dropped

    def feed(self, text: str) -> tuple[str, str]:
        self.buf += text
        think, content = [], []
        while self.buf:
            if self.state == "start":
                b = self.buf.lstrip()
                if not b or (THINK.startswith(b) and len(b) < len(THINK)):
                    break
                if b.startswith(THINK):
                    self.buf, self.state, self.lead = b[len(THINK):], "think", True
                else:
                    self.state = "content"
            elif self.state == "think":
                if self.lead:
                    self.buf = self.buf.lstrip()
                    self.lead = not self.buf
                j = self.buf.find(END_THINK)
                if j >= 0:
                    think.append(self.buf[:j].rstrip())
                    self.buf, self.state, self.lead = self.buf[j + len(END_THINK):], "content", True
                    continue
                cut = len(self.buf) - _hold(self.buf, [END_THINK])     # a possible end tag waits,
                keep = len(self.buf) - len(self.buf[:cut].rstrip())      # and the whitespace before it
                think.append(self.buf[:len(self.buf) - keep])
                self.buf = self.buf[len(self.buf) - keep:]
                break
            else:
                if self.lead:
                    self.buf = self.buf.lstrip()
                    self.lead = not self.buf
                content.append(self.buf)
                self.buf = ""
        return "".join(think), "".join(content)

    def flush(self) -> tuple[str, str]:
        rest, self.buf = self.buf, ""
        if self.state == "think":
            return rest.rstrip(), ""
        return "", rest.strip() if self.state == "start" else rest


def parser_for(template: str | None, prompt: str | None = None):
    """A fresh splitter for a model whose chat template is `template` (and rendered `prompt`), or
    None (its output is all answer)."""
    if template and CHANNEL in template and MESSAGE in template:
        return Harmony()
    if template and THINK in template and END_THINK in template:
        return Think(opened=bool(prompt) and prompt.rstrip().endswith(THINK))
    return None


def split(text: str, parser) -> tuple[str, str]:
    """(thinking, content) of a whole output."""
    if parser is None:
        return "", text
    a, b = parser.feed(text)
    c, d = parser.flush()
    return a + c, b + d
