"""Fill-in-the-middle: the prompt llama-server's /infill builds (tools/server format_prompt_infill),
token for token, from the model's FIM tokens (`tokenizer.ggml.fim_pre_token_id` etc., or the texts
llama.cpp recognises: ramforge.tokenizer.vocab).

    [extra context]  [BOS]  FIM_PRE prefix prompt  FIM_SUF suffix  FIM_MID

The extra context (the repo-level pattern) is `FIM_REP "myproject\\n"`, then per chunk `FIM_SEP
"{filename}\\n" text` (without FIM_SEP: a "--- snippet ---" separator), then `FIM_SEP "filename\\n"`;
it takes what the context leaves beyond a batch and twice n_predict, its last tokens first. The
prefix keeps its last 3/4 of a batch, the suffix its first n_batch/4 - 2 - len(prompt) tokens.
Prefix, suffix and chunks are tokenized with no special tokens parsed. spm (suffix first) is
llama-server's --spm-infill (`ramforge serve --spm-infill`, for /infill and every `suffix`) and
llama-cpp-python's `Llama(spm_infill=True)`. /api/generate's and /v1/completions' `suffix` use this prompt with the request's
prompt as the prefix and no extra context (fim_prompt: Ollama's FIM templates have no repo header
either); `Llama(...)(prompt, suffix=)` too, refusing a model without FIM tokens with NoFIMTokens where
the servers answer 400 (check_fim). tests/test_fim_oracle.py holds all of it to llama.cpp's records.
"""
from __future__ import annotations

from ..errors import Unsupported, UnsupportedField

N_BATCH = 2048            # llama-server's default --batch-size, which sizes the prefix and suffix taken
_SNIPPET = "\n\n--- snippet ---\n\n"


class NoFIMTokens(Unsupported):
    """The model's vocabulary has no fill-in-the-middle tokens, so a `suffix` cannot be honoured."""


def fim_ids(tok) -> dict[str, int | None]:
    """The FIM token ids of a tokenizer: pre, suf, mid (needed), rep and sep (optional)."""
    sp = tok.vocab.special
    return {k: sp.get(f"fim_{k}") for k in ("pre", "suf", "mid", "rep", "sep")}


def _missing(tok) -> list[str]:
    """The FIM tokens a fill-in-the-middle prompt needs that the vocabulary lacks."""
    ids = fim_ids(tok)
    return [n for n, k in (("prefix", "pre"), ("suffix", "suf"), ("middle", "mid")) if ids[k] is None]


def has_fim(tok) -> bool:
    return not _missing(tok)


def check_fim(tok, field: str = "suffix", error: type[Exception] = UnsupportedField) -> None:
    """`error` (a request's UnsupportedField, 400; the library's NoFIMTokens) naming the missing tokens when
    the model cannot fill in the middle."""
    missing = _missing(tok)
    if missing:
        raise error(f"{field}: fill-in-the-middle is not supported by this model: its vocabulary has no "
                    f"{', '.join(missing)} token (tokenizer.ggml.fim_pre/suf/mid_token_id); use a code model with "
                    f"FIM tokens (e.g. Qwen2.5-Coder, CodeGemma) or leave {field} out")


def infill_ids(tok, prefix: str, suffix: str, extra: list[dict] | None = None, prompt: list[int] | None = None, *,
               n_ctx: int, n_predict: int = -1, n_batch: int = N_BATCH, spm: bool = False) -> list[int]:
    """format_prompt_infill's token ids (see the module doc); check_fim first."""
    check_fim(tok, "input_suffix")
    ids, prompt = fim_ids(tok), list(prompt or [])

    def enc(text: str) -> list[int]:
        return tok.encode(text, add_special=False, parse_special=False)

    extra_ids: list[int] = []
    if ids["rep"] is not None:
        extra_ids += [ids["rep"]] + enc("myproject\n")
    for chunk in extra or []:
        if ids["sep"] is not None:
            extra_ids += [ids["sep"]] + enc(chunk.get("filename", "tmp") + "\n")
        else:
            extra_ids += enc(_SNIPPET)
        extra_ids += enc(chunk.get("text", ""))
    if ids["sep"] is not None:
        extra_ids += [ids["sep"]] + enc("filename\n")

    pre, suf = enc(prefix), enc(suffix)
    n_pre = min(len(pre), 3 * (n_batch // 4))
    n_suf = min(len(suf), max(0, n_batch // 4 - (2 + len(prompt))))
    n_extra = min(max(0, n_ctx - n_batch - 2 * n_predict), len(extra_ids))
    pre = [ids["pre"]] + pre[len(pre) - n_pre:] + prompt
    suf = [ids["suf"]] + suf[:n_suf]
    first, last = (suf, pre) if spm else (pre, suf)
    if tok.add_bos and tok.bos_id is not None:
        first = [tok.bos_id] + first
    return extra_ids[len(extra_ids) - n_extra:] + first + last + [ids["mid"]]


def fim_prompt(tok, prefix: str, suffix: str, n_batch: int = N_BATCH, error: type[Exception] = NoFIMTokens, *,
               spm: bool = False) -> list[int]:
    """A `suffix`'s infill prompt (Llama's, /api/generate's, /v1/completions'): infill_ids with no extra
    context, i.e. llama-server's where the context leaves it no room (without this, a context above
    n_batch + 2 would bring the repo header's last tokens); `error` when the vocabulary lacks FIM
    prefix/suffix/middle tokens (the library's NoFIMTokens, a request's UnsupportedField). spm: suffix
    first (`serve --spm-infill`, `Llama(spm_infill=True)`: BOS SUF suffix PRE prefix MID)."""
    check_fim(tok, "suffix", error)
    return infill_ids(tok, prefix, suffix, n_ctx=0, n_batch=n_batch, spm=spm)
