"""`ramforge.Llama`'s completions: llama-cpp-python 0.3's `Llama._create_completion` and its Jinja chat
handler, step for step (the same prompt tokens, stop handling, UTF-8 hold-back, streaming cuts, logprobs
and usage), over `Llama.generate`. Differences, each deliberate:

- `suffix` builds a real fill-in-the-middle prompt from the model's FIM tokens (generation/fim.py);
  llama-cpp-python 0.3 puts token id 0 in their place. A model without FIM tokens refuses it. With
  `Llama(spm_infill=True)` the suffix comes first, in llama-cpp-python's order (llama-server's --spm-infill).
- errors are ramforge's typed ones (InvalidArgument, a ValueError, where llama-cpp-python raises ValueError).
- with no chat template in the GGUF, the chat falls back to ramforge's (the embedded model's gemma-3 template,
  else llama.cpp's ChatML) where llama-cpp-python falls back to its "llama-2" format.
"""
from __future__ import annotations

import random
import time
import uuid
import warnings

import numpy as np

from ..errors import ContextLengthExceeded, InvalidArgument, Unsupported
from ..sampling.params import stop_strings

# llama-cpp-python's format_chatml (a system block always, user/assistant turns only), as a Jinja template.
LCPP_CHATML = (
    "{%- set sys = messages | selectattr('role', 'equalto', 'system') | map(attribute='content') | first -%}"
    "{{- '<|im_start|>system\\n' + (sys or '') + '<|im_end|>\\n' -}}"
    "{%- for m in messages if m.role in ('user', 'assistant') -%}"
    "{%- if m.content -%}{{- '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' -}}"
    "{%- else -%}{{- '<|im_start|>' + m.role + '\\n' -}}{%- endif -%}"
    "{%- endfor -%}"
    "{{- '<|im_start|>assistant\\n' -}}")


def _stop_list(stop) -> list[str]:
    return stop if isinstance(stop, list) else [stop] if isinstance(stop, str) else []


def _bias_processor(llama, logit_bias: dict):
    n = llama.n_vocab()
    bias = {}
    for k, v in logit_bias.items():
        t = int(k)
        if not 0 <= t < n:
            raise InvalidArgument(f"logit_bias token id {k!r} is outside the vocabulary of {n}")
        bias[t] = float(v)

    def logit_bias_processor(input_ids, scores):
        new_scores = np.copy(scores)
        for input_id, score in bias.items():
            new_scores[input_id] = score + scores[input_id]
        return new_scores
    return logit_bias_processor


def _prompt_tokens(llama, prompt, suffix) -> list[int]:
    tok = llama.tokenizer_
    if suffix is not None:
        from .fim import fim_prompt

        if not isinstance(prompt, str):
            raise InvalidArgument("suffix needs a text prompt (the prefix), not token ids")
        return fim_prompt(tok, prompt, suffix, spm=llama.spm_infill)
    bos = llama.token_bos()
    sep = tok.sep_id if tok.sep_id is not None else -1
    bos_tokens = [] if isinstance(prompt, list) or not tok.add_bos or bos == -1 else [bos]
    eos_tokens = [] if isinstance(prompt, list) or (not tok.add_eos and sep == -1) else \
        [sep if sep != -1 else llama.token_eos()]
    if isinstance(prompt, str):
        body = llama.tokenize(prompt.encode("utf-8"), add_bos=False, special=True) if prompt != "" else []
    else:
        body = [int(t) for t in prompt]
    return bos_tokens + body + eos_tokens


def _cache_lookup(llama, prompt_tokens) -> None:
    from .session import PromptCache

    cache = llama.cache
    evaluated = llama.input_ids.tolist()
    if isinstance(cache, PromptCache):
        state, n = cache.best(prompt_tokens)
        if state is not None and n > llama.longest_token_prefix(evaluated, prompt_tokens):
            llama.load_state(state)
        return
    try:
        item = cache[prompt_tokens]
    except KeyError:
        return
    if llama.longest_token_prefix(item.input_ids.tolist(), prompt_tokens) > \
            llama.longest_token_prefix(evaluated, prompt_tokens):
        llama.load_state(item)


def _cache_save(llama, tokens) -> None:
    from .session import PromptCache

    if isinstance(llama.cache, PromptCache):
        llama.cache.put(llama._model.save_state())
    else:
        llama.cache[tokens] = llama.save_state()


def completion(llama, prompt, suffix=None, max_tokens=16, temperature=0.8, top_p=0.95, min_p=0.05, typical_p=1.0,
               logprobs=None, echo=False, stop=None, frequency_penalty=0.0, presence_penalty=0.0, repeat_penalty=1.0,
               top_k=40, stream=False, seed=None, tfs_z=1.0, mirostat_mode=0, mirostat_tau=5.0, mirostat_eta=0.1,
               model=None, stopping_criteria=None, logits_processor=None, grammar=None, logit_bias=None):
    """llama-cpp-python's _create_completion: a generator of the stream's chunks, or of the one response."""
    c = _Completion(llama, prompt, suffix, max_tokens, logprobs, stop, model, seed)
    if logit_bias is not None:
        logits_processor = list(logits_processor or []) + [_bias_processor(llama, logit_bias)]
    gen = llama.generate(c.prompt_tokens, top_k=top_k, top_p=top_p, min_p=min_p, typical_p=typical_p,
                         temp=temperature, tfs_z=tfs_z, mirostat_mode=mirostat_mode, mirostat_tau=mirostat_tau,
                         mirostat_eta=mirostat_eta, frequency_penalty=frequency_penalty,
                         presence_penalty=presence_penalty, repeat_penalty=repeat_penalty,
                         stopping_criteria=stopping_criteria, logits_processor=logits_processor, grammar=grammar)
    try:
        for token in gen:
            if c.step(token):
                break
            if c.held:                          # an unfinished UTF-8 character: the next token first
                continue
            if stream:
                yield from c.stream_pending()
            if len(c.completion_tokens) >= c.max_tokens:
                c.finish(c.detok(c.completion_tokens, c.prompt_tokens), "length")
                break
    finally:
        gen.close()
        llama._sampler = None
    if stopping_criteria is not None and llama.n_tokens and stopping_criteria(llama.input_ids, llama.scores[-1, :]):
        c.finish(c.detok(c.completion_tokens, c.prompt_tokens), "stop")
    if llama.verbose:
        t = llama._engine.timings
        print(f"ramforge.Llama: prompt {t.prompt_tokens} tokens in {t.prompt_s:.2f} s, {len(c.completion_tokens)} "
              f"generated", file=__import__("sys").stderr)
    if stream:
        yield from c.stream_tail()
        yield c.chunk("", None, c.finish_reason)
    if llama.cache:
        _cache_save(llama, c.prompt_tokens + c.completion_tokens)
    if not stream:
        yield c.response(echo)


class _Completion:
    """One completion's state, as _create_completion's locals: the prompt and completion tokens, how many
    were streamed (returned_tokens), the UTF-8 hold-back (multibyte_fix), the text and finish reason."""

    def __init__(self, llama, prompt, suffix, max_tokens, logprobs, stop, model, seed):
        if suffix is not None and not isinstance(suffix, str):
            raise InvalidArgument(f"suffix must be a string, not {type(suffix).__name__}")
        if not isinstance(prompt, (str, list)):
            raise InvalidArgument(f"prompt must be a string or a list of token ids, not {type(prompt).__name__}")
        if logprobs is not None and not llama._logits_all:
            raise InvalidArgument("logprobs is not supported for models created with logits_all=False")
        self.llama, self.prompt, self.logprobs, self.detok = llama, prompt, logprobs, llama.detokenize
        self.id, self.created = f"cmpl-{uuid.uuid4()}", int(time.time())
        self.bos = llama.token_bos()
        self.prompt_tokens = _prompt_tokens(llama, prompt, suffix)
        self.completion_tokens: list[int] = [] if len(prompt) > 0 else [self.bos]
        stop = _stop_list(stop)
        stop_strings(stop)                                           # non-string stops fail as InvalidArgument
        self.stop_sequences = [s.encode("utf-8") for s in stop]
        self.model_name = model if model is not None else llama.model_path
        if self.prompt_tokens[:2] == [self.bos] * 2:
            warnings.warn(f'Detected duplicate leading "{llama.tokenizer_.token_text(self.bos)}" in prompt, this '
                          f'will likely reduce response quality, consider removing it...', RuntimeWarning)
        n_ctx, n_prompt = llama.n_ctx(), len(self.prompt_tokens)
        if n_prompt >= n_ctx:
            raise ContextLengthExceeded(f"Requested tokens ({n_prompt}) exceed context window of {n_ctx}")
        if max_tokens is None or max_tokens <= 0:
            max_tokens = n_ctx - n_prompt
        self.max_tokens = max_tokens if max_tokens + n_prompt < n_ctx else n_ctx - n_prompt
        if llama.cache:
            _cache_lookup(llama, self.prompt_tokens)
        llama.set_seed(seed if seed is not None else random.Random(llama._seed).randint(0, 2 ** 32))
        self.finish_reason, self.multibyte_fix, self.returned_tokens, self.text = "length", 0, 0, b""
        self.held, self.all_text = False, b""

    def chunk(self, text_piece, lp=None, finish=None) -> dict:
        return {"id": self.id, "object": "text_completion", "created": self.created, "model": self.model_name,
                "choices": [{"text": text_piece, "index": 0, "logprobs": lp, "finish_reason": finish}]}

    def finish(self, text: bytes, reason: str) -> None:
        self.text, self.finish_reason = text, reason

    def step(self, token) -> bool:
        """One sampled token: True when the completion ends here (end of generation, a stop string).
        `held`: an unfinished UTF-8 character at the end, held back from the stream."""
        detok, toks = self.detok, self.completion_tokens
        if self.llama.tokenizer_.is_eog(token):
            self.finish(detok(toks, self.prompt_tokens), "stop")
            return True
        toks.append(token)
        self.all_text = all_text = detok(toks, self.prompt_tokens)
        for k, char in enumerate(all_text[-3:]):              # an unfinished UTF-8 character: hold it back
            k = 3 - k
            for num, pattern in ((2, 192), (3, 224), (4, 240)):
                if num > k and pattern & char == pattern:
                    self.multibyte_fix = num - k
        self.held = self.multibyte_fix > 0
        if self.held:
            self.multibyte_fix -= 1
            return False
        any_stop = [s for s in self.stop_sequences if s in all_text]
        if any_stop:
            self.finish(all_text[:all_text.index(any_stop[0])], "stop")
            return True
        return False

    def top_of(self, logits, token, token_str, n, prev=None):
        current = self.llama.logits_to_logprobs(logits).tolist()
        ranked = sorted(zip(current, range(len(current))), reverse=True)
        top = {self.detok([i], prev).decode("utf-8", errors="ignore"): lp for lp, i in ranked[:n]}
        top.update({token_str: current[int(token)]})
        return current[int(token)], top

    def stream_pending(self):
        """The streamed chunks of the tokens not yet returned, short of a possible stop string's start."""
        detok, toks = self.detok, self.completion_tokens
        remaining_tokens = toks[self.returned_tokens:]
        prev = self.prompt_tokens + toks[:self.returned_tokens]
        remaining_text = detok(remaining_tokens, prev)
        remaining_length = len(remaining_text)
        first_stop_position = 0
        for s in self.stop_sequences:
            for i in range(min(len(s), remaining_length), 0, -1):
                if remaining_text.endswith(s[:i]):
                    first_stop_position = max(first_stop_position, i)
                    break
        token_end_position = 0
        if self.logprobs is not None:
            for token in remaining_tokens:
                if token == self.bos:
                    continue
                prev = self.prompt_tokens + toks[:self.returned_tokens]
                token_end_position += len(detok([token], prev))
                if token_end_position > remaining_length - first_stop_position:
                    break
                token_str = detok([token], prev).decode("utf-8", errors="ignore")
                text_offset = len(self.prompt) + len(detok(toks[:self.returned_tokens], prev).decode(
                    "utf-8", errors="ignore"))
                token_offset = len(self.prompt_tokens) + self.returned_tokens
                lp, top = self.top_of(self.llama._scores[token_offset - 1, :], token, token_str, self.logprobs)
                lps = {"tokens": [token_str], "text_offset": [text_offset], "token_logprobs": [lp],
                       "top_logprobs": [top]}
                self.returned_tokens += 1
                yield self.chunk(detok([token], self.prompt_tokens + toks[:self.returned_tokens]).decode(
                    "utf-8", errors="ignore"), lps)
            return
        while remaining_tokens:
            prev = self.prompt_tokens + toks[:self.returned_tokens]
            for i in range(1, len(remaining_tokens) + 1):
                try:
                    bs = detok(remaining_tokens[:i], prev)
                    ts = bs.decode("utf-8")
                    break
                except UnicodeError:
                    pass
            else:
                break
            token_end_position += len(bs)
            if token_end_position > remaining_length - first_stop_position:
                break
            remaining_tokens = remaining_tokens[i:]
            self.returned_tokens += i
            yield self.chunk(ts)

    def stream_tail(self):
        """After the loop: the tokens not yet streamed, up to the first stop string."""
        detok, toks = self.detok, self.completion_tokens
        remaining_tokens = toks[self.returned_tokens:]
        prev = self.prompt_tokens + toks[:self.returned_tokens]
        remaining_text = detok(remaining_tokens, prev)
        any_stop = [s for s in self.stop_sequences if s in remaining_text]
        end = min(remaining_text.index(s) for s in any_stop) if any_stop else len(remaining_text)
        token_end_position = 0
        for token in remaining_tokens:
            token_end_position += len(detok([token], self.prompt_tokens + toks[:self.returned_tokens]))
            lps = None
            if self.logprobs is not None:
                if token == self.bos:
                    continue
                token_str = detok([token]).decode("utf-8", errors="ignore")
                text_offset = len(self.prompt) + len(detok(toks[:self.returned_tokens],
                                                           self.prompt_tokens + toks[:self.returned_tokens]))
                token_offset = len(self.prompt_tokens) + self.returned_tokens - 1
                lp, top = self.top_of(self.llama._scores[token_offset, :], token, token_str, self.logprobs)
                lps = {"tokens": [token_str], "text_offset": [text_offset], "token_logprobs": [lp],
                       "top_logprobs": [top]}
            if token_end_position >= end:
                last_text = detok([token])
                if token_end_position == end - 1:
                    break
                self.returned_tokens += 1
                yield self.chunk(last_text[:len(last_text) - (token_end_position - end)].decode(
                    "utf-8", errors="ignore"), lps)
                break
            self.returned_tokens += 1
            yield self.chunk(detok([token]).decode("utf-8", errors="ignore"), lps)

    def response(self, echo: bool) -> dict:
        """The one non-streamed response: text (after the prompt when echo), logprobs, usage."""
        text_str = self.text.decode("utf-8", errors="ignore")
        if echo:
            p = self.prompt
            text_str = (p if isinstance(p, str) else self.detok(p).decode("utf-8", errors="ignore")) + text_str
        lps = None
        if self.logprobs is not None:
            lps = _logprobs(self.llama, self.prompt, self.prompt_tokens, self.completion_tokens, echo, self.logprobs)
        out = self.chunk(text_str, lps, self.finish_reason)
        n_p, n_c = len(self.prompt_tokens), len(self.completion_tokens)
        out["usage"] = {"prompt_tokens": n_p, "completion_tokens": n_c, "total_tokens": n_p + n_c}
        return out


def _logprobs(llama, prompt, prompt_tokens, completion_tokens, echo, n) -> dict:
    """The non-streamed completion's logprobs, as llama-cpp-python lays them out."""
    detok, bos = llama.detokenize, llama.token_bos()
    text_offset = 0 if echo else len(prompt)
    token_offset = 0 if echo else len(prompt_tokens[1:])
    offsets, token_logprobs, tokens, tops = [], [], [], []
    if echo:
        all_tokens = prompt_tokens[1 if prompt_tokens[0] == bos else 0:] + completion_tokens
    else:
        all_tokens = completion_tokens
    strs = [detok([t], all_tokens[:i]).decode("utf-8", errors="ignore") for i, t in enumerate(all_tokens)]
    all_logprobs = llama.logits_to_logprobs(llama._scores)[token_offset:]
    for idx, (token, token_str, row) in enumerate(zip(all_tokens, strs, all_logprobs)):
        if token == bos:
            continue
        offsets.append(text_offset + len(detok(all_tokens[:idx]).decode("utf-8", errors="ignore")))
        tokens.append(token_str)
        ranked = sorted(zip(row, range(len(row))), reverse=True)
        token_logprobs.append(row[int(token)])
        top = {detok([i], all_tokens[:idx]).decode("utf-8", errors="ignore"): lp for lp, i in ranked[:n]}
        top.update({token_str: row[int(token)]})
        tops.append(top)
    if echo and all_tokens:
        token_logprobs[0] = None
        tops[0] = None
    return {"tokens": tokens, "text_offset": offsets, "token_logprobs": token_logprobs, "top_logprobs": tops}


# ---- chat ----------------------------------------------------------------------------------------------

def chat_template_for(llama, chat_format: str | None):
    """The ChatTemplate of a chat_format: None or "chat_template.default" (the GGUF's template, or ramforge's
    fallback), "chat_template.NAME" (the GGUF's tokenizer.chat_template.NAME), "chatml" (llama-cpp-python's
    format_chatml). Unsupported for llama-cpp-python's other hand-written formats."""
    from .chat import ChatTemplate

    md = llama._gguf_metadata
    if chat_format in (None, "chat_template.default"):
        return llama._model.chat_template()
    if chat_format.startswith("chat_template.") and isinstance(md.get("tokenizer." + chat_format), str):
        return ChatTemplate.from_metadata(md, md["tokenizer." + chat_format])
    if chat_format == "chatml":
        t = ChatTemplate.from_metadata(md, LCPP_CHATML)
        t.eos_token, t.bos_token = "<|im_end|>", ""       # format_chatml's stop; it adds BOS through tokenize
        t.add_bos = False
        return t
    named = sorted("chat_template." + k[len("tokenizer.chat_template."):] for k in md
                   if k.startswith("tokenizer.chat_template."))
    raise Unsupported(f"chat_format={chat_format!r} is one of llama-cpp-python's hand-written formats, which "
                      f"ramforge does not carry; use the model's template (chat_format=None), "
                      f"{', '.join(['chat_template.default', 'chatml'] + named)}, "
                      f"chat_template= (a Jinja template) or chat_handler=")


def chat_completion(llama, messages, functions=None, function_call=None, tools=None, tool_choice=None,
                    response_format=None, stop=None, stream=False, logprobs=None, top_logprobs=None, grammar=None,
                    **kwargs):
    """llama-cpp-python's Jinja chat handler: render, tokenize, create_completion, and the chat shapes."""
    from .api import _response_grammar

    if functions is not None and tools is None:
        tools = [{"type": "function", "function": f} for f in functions]
    if function_call is not None and tool_choice is None:
        tool_choice = function_call if isinstance(function_call, str) else \
            {"type": "function", "function": {"name": function_call["name"]}}
    template = chat_template_for(llama, llama.chat_format)
    if tools and llama.chat_format is None:
        template = llama._model.chat_template(tools=True)
    prompt_text = template.render(messages, tools=tools, tool_choice=tool_choice)
    fmt = llama.chat_format or "chat_template.default"
    added_special = fmt != "chatml"                  # a Jinja template writes BOS itself; format_chatml does not
    prompt = llama.tokenize(prompt_text.encode("utf-8"), add_bos=not added_special, special=True)
    stop = _stop_list(stop) + ([template.eos_token] if template.eos_token else [])
    eos = llama.token_eos()
    stopping_criteria = None
    if added_special and eos != -1:
        stopping_criteria = [lambda tokens, logits: tokens[-1] in (eos,)]
    if response_format is not None and response_format.get("type") == "json_object" and grammar is None:
        grammar = _response_grammar(response_format)
    elif response_format is not None and grammar is None:
        grammar = _response_grammar(response_format)
    tool = None
    if isinstance(tool_choice, dict) and tools:
        name = tool_choice["function"]["name"]
        tool = next((t for t in tools if t["function"]["name"] == name), None)
        if tool is None:
            raise InvalidArgument(f"Tool choice '{name}' not found in tools.")
        schema = tool["function"].get("parameters")
        from ..structured import for_response_format

        grammar = for_response_format({"type": "json_schema", "json_schema": {"schema": schema}}) if schema \
            else for_response_format({"type": "json_object"})
    out = completion(llama, prompt, logprobs=top_logprobs if logprobs else None, stream=stream, stop=stop,
                     grammar=grammar, stopping_criteria=_criteria(stopping_criteria), **kwargs)
    if tool is not None:
        return _tool_response(next(out) if not stream else out, tool, stream)
    return _chat_stream(out) if stream else _chat(next(out))


def _criteria(fns):
    if fns is None:
        return None

    def all_of(input_ids, logits):
        return any(f(input_ids, logits) for f in fns)
    return all_of


def _chat_logprobs(lp):
    if lp is None:
        return None
    return {"content": [{"token": t, "bytes": None, "logprob": lp["token_logprobs"][i],
                         "top_logprobs": [{"token": k, "logprob": v, "bytes": None}
                                          for k, v in (lp["top_logprobs"][i] or {}).items()]}
                        for i, t in enumerate(lp["tokens"])], "refusal": None}


def _chat(c: dict) -> dict:
    ch = c["choices"][0]
    return {"id": "chat" + c["id"], "object": "chat.completion", "created": c["created"], "model": c["model"],
            "choices": [{"index": 0, "message": {"role": "assistant", "content": ch["text"]},
                         "logprobs": _chat_logprobs(ch["logprobs"]), "finish_reason": ch["finish_reason"]}],
            "usage": c["usage"]}


def _chat_stream(chunks):
    for i, c in enumerate(chunks):
        ch = c["choices"][0]
        base = {"id": "chat" + c["id"], "model": c["model"], "created": c["created"],
                "object": "chat.completion.chunk"}
        if i == 0:
            yield {**base, "choices": [{"index": 0, "delta": {"role": "assistant"}, "logprobs": None,
                                        "finish_reason": None}]}
        delta = {"content": ch["text"]} if ch["finish_reason"] is None else {}
        yield {**base, "choices": [{"index": 0, "delta": delta, "logprobs": _chat_logprobs(ch["logprobs"]),
                                    "finish_reason": ch["finish_reason"]}]}


def _tool_response(c, tool, stream):
    """A forced function call (tool_choice naming one): the constrained text is its arguments."""
    if stream:
        c = _collect(c)
    ch, name = c["choices"][0], tool["function"]["name"]
    call = {"id": "call__" + name, "type": "function", "function": {"name": name, "arguments": ch["text"]}}
    resp = {"id": "chat" + c["id"], "object": "chat.completion", "created": c["created"], "model": c["model"],
            "choices": [{"index": 0, "finish_reason": "tool_calls", "logprobs": _chat_logprobs(ch["logprobs"]),
                         "message": {"role": "assistant", "content": None, "tool_calls": [call],
                                     "function_call": {"name": name, "arguments": ch["text"]}}}],
            "usage": c.get("usage")}
    if not stream:
        return resp

    def gen():
        base = {k: resp[k] for k in ("id", "created", "model")} | {"object": "chat.completion.chunk"}
        yield {**base, "choices": [{"index": 0, "delta": {"role": "assistant", "content": None, "tool_calls": [
            {"index": 0, **call}]}, "logprobs": None, "finish_reason": None}]}
        yield {**base, "choices": [{"index": 0, "delta": {}, "logprobs": None, "finish_reason": "tool_calls"}]}
    return gen()


def _collect(chunks) -> dict:
    parts, last = [], None
    for c in chunks:
        parts.append(c["choices"][0]["text"])
        last = c
    last["choices"][0]["text"] = "".join(parts)
    last.setdefault("usage", None)
    return last
