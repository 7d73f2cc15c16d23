"""Fill-in-the-middle prompts: the model's FIM tokens around a prefix and a suffix, as llama.cpp's infill
(llama-server's format_infill without extra context: [BOS] <FIM_PRE> prefix <FIM_SUF> suffix <FIM_MID>)."""
from __future__ import annotations

from ..errors import Unsupported


class NoFIMTokens(Unsupported):
    """The model's vocabulary has no fill-in-the-middle tokens, so a `suffix` cannot be honoured."""


def fim_prompt(tokenizer, prefix: str, suffix: str) -> list[int]:
    """The token ids of an infill prompt; NoFIMTokens when the vocabulary lacks FIM prefix/suffix/middle."""
    sp = tokenizer.vocab.special
    pre, suf, mid = sp.get("fim_pre"), sp.get("fim_suf"), sp.get("fim_mid")
    if None in (pre, suf, mid):
        raise NoFIMTokens("this model has no fill-in-the-middle tokens (tokenizer.ggml.fim_pre/suf/mid_token_id "
                          "or <|fim_prefix|>-style tokens), so `suffix` cannot be used; use a code model with FIM "
                          "(e.g. Qwen2.5-Coder, CodeGemma) or leave suffix out")
    ids = [tokenizer.bos_id] if tokenizer.add_bos and tokenizer.bos_id is not None else []
    ids.append(pre)
    ids += tokenizer.encode(prefix, add_special=False, parse_special=False) if prefix else []
    ids.append(suf)
    ids += tokenizer.encode(suffix, add_special=False, parse_special=False) if suffix else []
    ids.append(mid)
    return ids
