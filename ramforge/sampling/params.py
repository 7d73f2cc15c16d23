"""Generation parameters: the one table of sampler parameters, and the one builder of them.

`SamplerParams` is the table: a field per parameter, with its default and its valid range
(`_param`); `PARAMS` lists it. Every front end builds its parameters with `sampler_params`, after
mapping its own spellings onto the table's names:

    front end                 its spellings                                   its defaults
    CLI run / chat            --temp, --top-k, ..., --mirostat, --dry-*,      the table's
                              --logit-bias ID+BIAS, --dry-sequence-breaker
                              (cli.console; llama.cpp's flags)
    ramforge.Model            keywords named as the table                     the table's (seed: Model(seed=))
    Ollama /api/*             options.<name> (Ollama's mirostat, mirostat_tau, top_p 0.9, min_p 0 (Ollama's)
                              mirostat_eta are the table's); a negative seed is random
    OpenAI /v1/*              <name> (OpenAI's, and llama-server's extra      temperature 1, top_p 1, min_p 0
                              fields: top_k, min_p, dry_*, xtc_*, ...);
                              seed mod 2**32 - 1

A value out of range is a SamplerError naming the parameter and its range; on the HTTP APIs the
parameters llama-server clamps (xtc_*, mirostat) are clamped and a dry_base below 1 takes the
default, as there (`Param.server`). logit_bias: token id -> bias, from a mapping (JSON keys are
strings) or [id, bias] pairs, False meaning -inf (llama-server's ban).

Generation length and stop strings are not sampler parameters: each front end maps its own length
(-n/--max-tokens, max_tokens, options.num_predict, max_completion_tokens) onto the engine's
max_tokens, and its stop strings through `stop_strings`.

Defaults are llama-cpp-python's ``Llama.create_completion`` (0.3.36): temperature 0.8, top_k 40,
top_p 0.95, min_p 0.05, typical_p 1.0, repeat_penalty 1.0, frequency_penalty 0.0, presence_penalty
0.0, mirostat 0 (tau 5, eta 0.1), seed None (random); repeat_last_n 64 is
``Llama(last_n_tokens_size=64)``. They equal llama.cpp's ``common_params_sampling`` defaults, which
give the rest (stages llama-cpp-python lacks): min_keep 0, top_n_sigma -1, xtc 0 / 0.1, dynatemp
0 / 1, DRY 0 / 1.75 / 2 / 64 with breakers newline, colon, quote and star.
"""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field, fields
from typing import Any, Mapping

from ..errors import InvalidArgument

LLAMA_DEFAULT_SEED = 0xFFFFFFFF      # llama.h: this seed (like None or -1) means "pick one at random"


class SamplerError(InvalidArgument):
    """A sampling parameter (or the logits handed to the sampler) is invalid."""

    def __init__(self, param: str, value, valid: str):
        self.param, self.value, self.valid = param, value, valid
        super().__init__(f"sampler: {param} = {value!r} is invalid: expected {valid}")


@dataclass(frozen=True)
class Param:
    """One row of the table: a parameter's name, default, type and valid range, and what it does."""

    name: str
    default: Any
    kind: type                   # int, float; dict (logit_bias) or tuple (dry_sequence_breakers)
    lo: float                    # lowest valid value (open_low: excluded)
    hi: float                    # highest valid value (math.inf: none)
    valid: str                   # what an error says is expected
    doc: str                     # what it does (the CLI's --help)
    open_low: bool = False
    optional: bool = False       # None is valid (seed: random)
    server: str = ""             # out of range on the HTTP APIs, as llama-server: "clamp" into
                                 # [lo, hi], "default" (the table's), or "" (a 400)

    def check(self, value) -> None:
        """SamplerError naming this parameter unless value is valid."""
        if value is None and self.optional:
            return
        if self.kind is dict:
            return _check_bias(self, value)
        if self.kind is tuple:
            if not isinstance(value, tuple) or not all(isinstance(s, str) and s for s in value):
                raise SamplerError(self.name, value, self.valid)
            return
        if self.kind is int:
            ok = not isinstance(value, bool) and isinstance(value, numbers.Integral)
        else:
            ok = not isinstance(value, bool) and isinstance(value, numbers.Real) and math.isfinite(value)
        if not ok or value < self.lo or value > self.hi or (self.open_low and value == self.lo):
            raise SamplerError(self.name, value, self.valid)

    def normalize(self, value):
        """A front end's spelling of a value in the table's form: breakers as a tuple, biases as
        ((token, bias), ...) from a mapping or pairs, False meaning -inf (llama-server's ban)."""
        if value is None:
            return None
        if self.kind is tuple and isinstance(value, (list, tuple)):
            return tuple(value)
        if self.kind is dict:
            pairs = value.items() if isinstance(value, Mapping) else value
            try:
                return tuple((_token_id(t), -math.inf if b is False else b) for t, b in pairs)
            except (TypeError, ValueError):
                raise SamplerError(self.name, value, self.valid) from None
        return value

    def for_server(self, value):
        """An HTTP request's value, clamped or defaulted where llama-server does so."""
        if value is None or not self.server or self.kind not in (int, float):
            return value
        if self.lo <= value <= self.hi:
            return value
        return min(max(value, self.lo), self.hi) if self.server == "clamp" else self.default


def _token_id(t) -> int:
    """A token id from an int or a decimal string (JSON object keys are strings)."""
    if isinstance(t, bool) or not isinstance(t, (numbers.Integral, str)):
        raise TypeError(t)
    return int(t)


def _check_bias(p: Param, value) -> None:
    ok = isinstance(value, tuple) and all(
        isinstance(x, tuple) and len(x) == 2 and isinstance(x[0], int) and not isinstance(x[0], bool) and x[0] >= 0
        and isinstance(x[1], numbers.Real) and not isinstance(x[1], bool) and (math.isfinite(x[1]) or x[1] == -math.inf)
        for x in value)
    if not ok:
        raise SamplerError(p.name, value, p.valid)


def _param(default, kind: type, lo: float, hi: float, valid: str, doc: str, **flags):
    return field(default=default, metadata={"param": dict(kind=kind, lo=lo, hi=hi, valid=valid, doc=doc, **flags)})


_ANY = "a finite number"
DRY_BREAKERS = ("\n", ":", "\"", "*")       # common_params_sampling's dry_sequence_breakers


@dataclass(frozen=True)
class SamplerParams:
    """The sampler parameters (the table: name, default, type, range, meaning). Build with
    `sampler_params`; `validate()` checks a hand-made one."""

    temperature: float = _param(0.8, float, 0.0, math.inf, "a finite number >= 0 (0 = greedy)",
                                "Temperature; 0 is greedy.")
    top_k: int = _param(40, int, 0, math.inf, "an integer >= 0 (0 disables top-k)",
                        "Keep the k most likely tokens; 0 disables.")
    top_p: float = _param(0.95, float, 0.0, 1.0, "a number in [0, 1] (1 disables top-p)",
                          "Keep the most likely tokens up to this probability mass; 1 disables.")
    min_p: float = _param(0.05, float, 0.0, 1.0, "a number in [0, 1] (0 disables min-p)",
                          "Drop tokens below min_p times the best token's probability; 0 disables.")
    typical_p: float = _param(1.0, float, 0.0, 1.0, "a number in [0, 1] (1 disables typical)",
                              "Locally typical sampling mass; 1 disables.")
    repeat_penalty: float = _param(1.0, float, 0.0, math.inf, "a finite number > 0 (1 = none)",
                                   "Penalty on tokens of the last repeat_last_n; 1 is none.", open_low=True)
    frequency_penalty: float = _param(0.0, float, -math.inf, math.inf, "a finite number (0 = none)",
                                      "Subtracted per occurrence in the last repeat_last_n; 0 is none.")
    presence_penalty: float = _param(0.0, float, -math.inf, math.inf, "a finite number (0 = none)",
                                     "Subtracted once for a token in the last repeat_last_n; 0 is none.")
    repeat_last_n: int = _param(64, int, -1, math.inf,
                                "an integer >= -1 (0 disables penalties, -1 = the whole history)",
                                "Tokens the penalties look back over; 0 disables, -1 is the whole history.")
    seed: int | None = _param(None, int, -1, LLAMA_DEFAULT_SEED,
                              "None or an integer in [-1, 4294967295] (None, -1 or 4294967295 = random)",
                              "Seed for sampling (default: random).", optional=True)
    # llama.cpp's further stages (common_params_sampling's defaults)
    min_keep: int = _param(0, int, 0, math.inf, "an integer >= 0",
                           "Filters keep at least this many tokens (0 = 1).")
    top_n_sigma: float = _param(-1.0, float, -math.inf, math.inf, f"{_ANY} (<= 0 disables)",
                                "Keep logits within n standard deviations of the best; <= 0 disables.")
    xtc_probability: float = _param(0.0, float, 0.0, 1.0, "a number in [0, 1] (0 disables XTC)",
                                    "XTC: chance of removing the top choices; 0 disables.", server="clamp")
    xtc_threshold: float = _param(0.1, float, 0.0, 1.0, "a number in [0, 1] (> 0.5 disables XTC)",
                                  "XTC: tokens at least this likely are removed, all but the least; > 0.5 disables.",
                                  server="clamp")
    dynatemp_range: float = _param(0.0, float, -math.inf, math.inf, f"{_ANY} (<= 0 disables)",
                                   "Dynamic temperature: temperature +- this range by entropy; 0 disables.")
    dynatemp_exponent: float = _param(1.0, float, -math.inf, math.inf, _ANY,
                                      "Dynamic temperature: exponent of the entropy mapping.")
    mirostat: int = _param(0, int, 0, 2, "0, 1 or 2 (0 disables)",
                           "Mirostat 1 or 2 replaces the filters and the draw; 0 disables.", server="clamp")
    mirostat_tau: float = _param(5.0, float, -math.inf, math.inf, _ANY, "Mirostat: target surprise (tau).")
    mirostat_eta: float = _param(0.1, float, -math.inf, math.inf, _ANY, "Mirostat: learning rate (eta).")
    dry_multiplier: float = _param(0.0, float, -math.inf, math.inf, f"{_ANY} (0 disables DRY)",
                                   "DRY: penalty multiplier; 0 disables.")
    dry_base: float = _param(1.75, float, 1.0, math.inf, "a finite number >= 1",
                             "DRY: base of the penalty's exponential.", server="default")
    dry_allowed_length: int = _param(2, int, 0, math.inf, "an integer >= 0",
                                     "DRY: repeats longer than this are penalised.")
    dry_penalty_last_n: int = _param(64, int, -1, math.inf,
                                     "an integer >= -1 (0 disables DRY, -1 = the whole history)",
                                     "DRY: tokens to look back over; 0 disables, -1 is the whole history.")
    dry_sequence_breakers: tuple = _param(DRY_BREAKERS, tuple, 0, 0, "a list of non-empty strings",
                                          "DRY: strings that end a repeat (default: newline, colon, quote, star).")
    logit_bias: tuple | None = _param(None, dict, 0, 0,
                                      "token id -> bias (a finite number, or -inf / false to ban the token)",
                                      "Added to a token's logit before every stage.", optional=True)

    def validate(self) -> "SamplerParams":
        """Return self, or raise SamplerError naming the first bad parameter and its valid range."""
        for p in PARAMS:
            p.check(getattr(self, p.name))
        return self

    def as_dict(self) -> dict[str, Any]:
        return {p.name: getattr(self, p.name) for p in PARAMS}


PARAMS: tuple[Param, ...] = tuple(Param(f.name, f.default, **f.metadata["param"]) for f in fields(SamplerParams))
NAMES: tuple[str, ...] = tuple(p.name for p in PARAMS)
_BY_NAME = {p.name: p for p in PARAMS}


def sampler_params(values: Mapping[str, Any] | None = None, defaults: Mapping[str, Any] | None = None) -> SamplerParams:
    """The one builder: validated SamplerParams from a front end's `values`, named as in the table.

    A value of None (or a name left out) takes the front end's `defaults`, else the table's. An
    unknown name is a TypeError, as an unknown keyword argument is; a bad value a SamplerError."""
    values, defaults = dict(values or {}), dict(defaults or {})
    unknown = sorted((values.keys() | defaults.keys()) - set(NAMES))
    if unknown:
        raise TypeError(f"unknown sampler parameter{'s' * (len(unknown) > 1)} {', '.join(unknown)}; "
                        f"the parameters are {', '.join(NAMES)}")
    chosen = {k: v for k, v in defaults.items() if v is not None}
    chosen.update({k: v for k, v in values.items() if v is not None})
    chosen = {k: _BY_NAME[k].normalize(v) for k, v in chosen.items()}
    return SamplerParams(**chosen).validate()


def stop_strings(stop, max_count: int | None = None, max_length: int | None = None) -> list[str]:
    """Stop strings (None, one string or a list of them) as a list; InvalidArgument for an empty or
    non-string one, or over the limits a server sets."""
    stops = [stop] if isinstance(stop, str) else list(stop or [])
    if max_count is not None and len(stops) > max_count:
        raise InvalidArgument(f"{len(stops)} stop strings: at most {max_count}")
    for s in stops:
        if not isinstance(s, str) or not s or (max_length is not None and len(s) > max_length):
            limit = f" of at most {max_length} characters" if max_length is not None else ""
            got = (f"a {type(s).__name__}" if not isinstance(s, str) else
                   "an empty string" if not s else f"one of {len(s):,} characters")
            raise InvalidArgument(f"stop strings must be non-empty strings{limit}: got {got}")
    return stops
