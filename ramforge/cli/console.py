"""What the CLI's commands share: the rich consoles, value summaries, and the common options
(--ctx, --ram, --threads, --io, and the sampler options, made from ramforge.sampling.params' table)."""
from __future__ import annotations

import os
import re
import sys

import click
import numpy as np
from rich.console import Console

from .. import flags
from ..gguf.reader import GGUFFile
from ..memory.size import parse_memory_size
from ..sampling.params import PARAMS
from ..store.resolve import resolve_model

out = Console(highlight=False, soft_wrap=True)
err = Console(stderr=True, highlight=False, soft_wrap=True)
_ARRAY_HEAD = 8


def summarise(value, limit: int = 16):
    """A JSON-able value with long arrays cut to their head and length."""
    if isinstance(value, np.ndarray):
        value = value.tolist()
    if isinstance(value, list):
        if len(value) <= limit:
            return value
        return {"length": len(value), "head": value[:_ARRAY_HEAD]}
    return value


def short(value, width: int = 80) -> str:
    s = summarise(value)
    if isinstance(s, dict):
        head = ", ".join(repr(v) for v in s["head"])
        return f"[{s['length']:,} items] {head}, ..."
    s = repr(s) if not isinstance(s, str) else s
    return s if len(s) <= width else s[: width - 3] + "..."


def open_gguf(model: str | None) -> GGUFFile:
    return GGUFFile(resolve_model(model))


def load_tokenizer_of(model):
    from ..tokenizer import load_tokenizer

    with open_gguf(model) as f:
        return load_tokenizer(f.metadata)


def load_engine(model, ctx, ram, io="direct", threads=None, expert_cache=None, expert_prefetch=True, drafter=None,
                cluster=None, kv=(None, None), kv_spill=None, embed=False):
    """The engine under --ram; a DraftModel drafter is loaded first, resident under the same budget
    (the target then plans with what is left), and closed with the engine. cluster: cluster.Pipeline's
    keywords (--ray, --stages, --stage-ram): the model as stages on Ray instead. kv: the KV cache
    types (kv_types_of). embed: an embedding engine (Engine.load's embed: the chunk sized for embedding)."""
    from ..engine.engine import Engine
    from ..memory import MemoryBudget
    from ..engine.speculative import DraftModel, check_draft_length

    if cluster is not None:
        from ..cluster import Pipeline

        if drafter is not None:
            raise click.UsageError("--lookup and --draft are not supported with --ray")
        if kv != (None, None) and tuple(kv) != ("f16", "f16"):
            raise click.UsageError("--kv-type is not supported with --ray (the stages keep f16 caches)")
        if kv_spill:
            raise click.UsageError("--kv-spill is not supported with --ray")
        return Pipeline(model or "default", n_ctx=ctx, io=io, n_threads=threads,
                        **{**cluster, "stage_ram": cluster.get("stage_ram") or ram})
    budget = MemoryBudget(parse_memory_size(ram) if ram else None)
    if not isinstance(drafter, DraftModel):
        eng = Engine.load(resolve_model(model), n_ctx=ctx, budget=budget, io=io, n_threads=threads,
                          expert_policy=expert_cache, expert_prefetch=expert_prefetch, type_k=kv[0], type_v=kv[1],
                          kv_spill=kv_spill, embed=embed)
        if drafter is not None:
            _checked(eng, lambda: check_draft_length(drafter, eng.n_ctx))
        return eng
    drafter.path = str(resolve_model(drafter.path))
    check_draft_length(drafter, ctx or flags.DEFAULT_CTX)
    drafter.attach(Engine.load, budget, ctx, threads)
    try:
        eng = Engine.load(resolve_model(model), n_ctx=ctx, budget=budget, io=io, n_threads=threads,
                          expert_policy=expert_cache, expert_prefetch=expert_prefetch, type_k=kv[0], type_v=kv[1],
                          kv_spill=kv_spill)
    except BaseException:
        drafter.close()
        raise
    eng.closing.append(drafter.close)
    _checked(eng, lambda: (check_draft_length(drafter, eng.n_ctx), drafter.check_vocab(eng.tokenizer)))
    return eng


def _checked(eng, check):
    try:
        check()
    except BaseException:
        eng.close()
        raise


def speculative_options(command):
    """--lookup [N], --lookup-ngram, --lookup-fixed, --draft MODEL, --draft-max, --draft-min, --draft-p-min."""
    opts = [
        click.option("--lookup", type=click.IntRange(min=1), is_flag=False, flag_value=10, default=None,
                     help="Speculative decoding by prompt lookup: draft up to N tokens (default 10) from n-grams "
                          "of the prompt and the text so far; the length adapts to recent acceptance."),
        click.option("--lookup-ngram", type=click.IntRange(min=1), default=2, show_default=True,
                     help="Longest n-gram prompt lookup matches."),
        click.option("--lookup-fixed", is_flag=True,
                     help="Prompt lookup by llama-cpp-python's LlamaPromptLookupDecoding rules exactly (no "
                          "adaptive length): the same batches, so the same arithmetic."),
        click.option("--draft", "draft_model", default=None,
                     help="Speculative decoding with a draft model (a small model with the same vocabulary, "
                          "kept resident and charged to --ram)."),
        click.option("--draft-max", type=click.IntRange(min=1), default=16, show_default=True,
                     help="Most tokens the draft model proposes per pass."),
        click.option("--draft-min", type=click.IntRange(min=0), default=0, show_default=True,
                     help="A draft shorter than this is dropped."),
        click.option("--draft-p-min", type=click.FloatRange(0.0, 1.0), default=0.75, show_default=True,
                     help="The draft model stops at a token it gives less than this probability."),
    ]
    for o in reversed(opts):
        command = o(command)
    return command


def drafter_of(lookup, lookup_ngram, lookup_fixed, draft, draft_max, draft_min, draft_p_min):
    from ..engine.speculative import make_drafter
    return make_drafter(lookup, lookup_ngram, lookup_fixed, draft, draft_max, draft_min, draft_p_min)


ctx_option = click.option("--ctx", type=click.IntRange(min=1), default=None,
                          help=f"Context length (default: {flags.DEFAULT_CTX}, or the model's if smaller).")
ram_option = click.option("--ram", default=None, help="Memory budget, e.g. 4G (default: unlimited).")
threads_option = click.option("-t", "--threads", type=int, default=None,
                              help="Kernel threads (default: $RAMFORGE_THREADS or the physical cores).")
io_option = click.option("--io", type=click.Choice(["direct", "buffered", "mmap"]), default="direct", show_default=True,
                         help="How streamed weights are read: O_DIRECT, pread + fadvise(DONTNEED), or mmap.")


def cluster_options(command):
    """--ray [ADDRESS], --stages N, --stage-ram SIZE[,SIZE...]: the model as a pipeline on Ray."""
    opts = [
        click.option("--ray", "ray_address", is_flag=False, flag_value="local", default=None,
                     help="Run as a pipeline of layer ranges on Ray: a new local cluster (no value, or $RAY_ADDRESS), "
                          "HOST:PORT of a head node, ray://HOST:PORT, or auto (needs 'ramforge[cluster]')."),
        click.option("--stages", type=int, default=2, show_default=True,
                     help="With --ray: the number of stages (layer ranges), one actor each, spread over the nodes."),
        click.option("--stage-ram", default=None,
                     help="With --ray: each stage's budget, one size for all or one per stage (4G,8G); default --ram."),
        click.option("--ray-timeout", type=click.FloatRange(min=0, min_open=True), default=15.0, show_default=True,
                     help="With --ray ADDRESS: seconds to reach and join the cluster before giving up."),
        click.option("--stage-timeout", type=click.FloatRange(min=0, min_open=True), default=300.0,
                     show_default=True,
                     help="With --ray: seconds a chunk may take through the stages before the stage still on it "
                          "is declared hung (the request fails, the stage restarts)."),
        click.option("--placement", type=click.Choice(["spread", "strict"]), default="spread", show_default=True,
                     help="With --ray: one stage per node; with fewer nodes than stages they share nodes (spread) "
                          "or the start is refused (strict)."),
    ]
    for o in reversed(opts):
        command = o(command)
    return command


def cluster_of(ray_address, stages, stage_ram, ray_timeout=15.0, stage_timeout=300.0,
               placement="spread") -> dict | None:
    """cluster.Pipeline's keywords from --ray, --stages, --stage-ram, --ray-timeout, --stage-timeout and
    --placement (None without --ray)."""
    if ray_address is None:
        if stage_ram is not None:
            raise click.UsageError("--stage-ram needs --ray")
        return None
    return {"address": None if ray_address == "local" else ray_address, "stages": stages, "stage_ram": stage_ram,
            "connect_timeout": ray_timeout, "stage_timeout": stage_timeout, "placement": placement}


def kv_options(command):
    """--kv-type (K and V), --kv-type-k, --kv-type-v: the KV cache types, as llama.cpp's --cache-type-k/-v."""
    kinds = click.Choice(["f16", "q8_0", "q4_0"], case_sensitive=False)
    opts = [
        click.option("--kv-type", type=kinds, default=None,
                     help="KV cache type of K and V: f16, q8_0 (53% of f16's bytes) or q4_0 (28%) "
                          "(default: $RAMFORGE_KV_TYPE, else f16). A quantized cache is read as llama.cpp's "
                          "flash attention reads it."),
        click.option("--kv-type-k", type=kinds, default=None, help="KV cache type of K alone (over --kv-type)."),
        click.option("--kv-type-v", type=kinds, default=None, help="KV cache type of V alone (over --kv-type)."),
    ]
    for o in reversed(opts):
        command = o(command)
    return command


def spill_option(command):
    """--kv-spill [DIR]: spill the KV cache to storage (memory.kv_spill)."""
    return click.option(
        "--kv-spill", "kv_spill", is_flag=False, flag_value="on", default=None, metavar="[DIR|off]",
        help="Spill the KV cache to storage: older positions in a file per layer, read back each token (bit-exact "
             "with the cache in RAM). Alone: always, in a temporary directory; DIR: always, its files under DIR; "
             "off: never. Default: when the budget cannot hold the cache for the whole context.")(command)


def spill_of(value: str | None):
    """--kv-spill's value as Engine.load's kv_spill: None (when needed), True, False or a directory."""
    if value is None or value.strip().lower() == "auto":
        return None
    v = value.strip()
    return {"on": True, "off": False}.get(v.lower(), v)


def kv_types_of(kv_type, kv_type_k, kv_type_v, env: dict | None = None, ollama: bool = False) -> tuple[str, str]:
    """The KV cache types of the --kv-type options, else $RAMFORGE_KV_TYPE, else (ollama: `serve`)
    Ollama's $OLLAMA_KV_CACHE_TYPE (f16, q8_0, q4_0: K and V), else f16."""
    import os

    from ..engine.engine import kv_types
    env = os.environ if env is None else env
    k, v = kv_type_k or kv_type, kv_type_v or kv_type
    if ollama and not flags.KV_TYPE.raw(env) and env.get("OLLAMA_KV_CACHE_TYPE", "").strip():
        from ..errors import KVTypeError
        o = env["OLLAMA_KV_CACHE_TYPE"].strip()
        if o.lower() not in ("f16", "q8_0", "q4_0"):
            raise KVTypeError(f"OLLAMA_KV_CACHE_TYPE={o!r}: one of f16, q8_0, q4_0")
        env = {flags.KV_TYPE.name: o}
    return kv_types(k, v, env)


def expert_options(command):
    """--expert-cache and --expert-prefetch/--no-expert-prefetch: where a mixture's experts stream."""
    command = click.option("--expert-prefetch/--no-expert-prefetch", default=True, show_default=True,
                           help="Read the next layer's likely experts ahead (its router on this layer's state).")(command)
    return click.option("--expert-cache", type=click.Choice(["lfu", "lru"]), default=None,
                        help="Expert cache eviction: lfu (fewest recent uses) or lru (default: lfu).")(command)


# The CLI's spellings of the table's names (llama.cpp's); the rest are --name-with-dashes.
CLI_SPELLING = {"temperature": "--temp", "dry_sequence_breakers": "--dry-sequence-breaker"}


def _logit_bias(ctx, param, values):
    """llama.cpp's --logit-bias TOKEN_ID(+|-)BIAS, repeatable (15043+1, 15043-inf)."""
    out = []
    for v in values:
        m = re.fullmatch(r"\s*(\d+)\s*([+-])\s*(\S+)\s*", v)
        try:
            bias = float(m.group(3)) * (-1 if m.group(2) == "-" else 1)
        except (AttributeError, ValueError):
            raise click.BadParameter(f"{v!r}: expected TOKEN_ID+BIAS or TOKEN_ID-BIAS, e.g. 15043+1 or 15043-inf")
        out.append((int(m.group(1)), bias))
    return tuple(out) or None


def _breakers(ctx, param, values):
    """--dry-sequence-breaker STRING, repeatable: replaces the defaults; "none" for no breakers."""
    if not values:
        return None
    return tuple(v for v in values if v != "none")


def sampler_options(command):
    """Add an option per sampler parameter of the table (--temp, --top-k, ..., --seed), with its
    default and help; the command receives them as keywords named as the table (temperature, top_k,
    ...), for `ramforge.sampling.params.sampler_params`."""
    for p in reversed(PARAMS):
        flag = CLI_SPELLING.get(p.name, "--" + p.name.replace("_", "-"))
        if p.kind in (dict, tuple):
            command = click.option(flag, p.name, multiple=True, callback=_logit_bias if p.kind is dict else _breakers,
                                   help=p.doc + (" Repeatable: TOKEN_ID+BIAS or TOKEN_ID-BIAS (-inf bans)."
                                                 if p.kind is dict else ' Repeatable; "none" for none.'))(command)
            continue
        command = click.option(flag, p.name, type=p.kind, default=p.default, show_default=p.default is not None,
                               help=p.doc)(command)
    return command


# ---- run's prompt, chat template and the GGUF's sampler defaults ------------------------------------

def prompt_text(positional: str | None, option: str | None) -> str:
    """run's prompt: PROMPT or -p (not both); stdin for `-`, or when neither is given and stdin is no terminal."""
    if positional is not None and option is not None:
        raise click.UsageError("give the prompt once: as PROMPT or as -p/--prompt")
    text = positional if positional is not None else option
    if text == "-" or (text is None and not sys.stdin.isatty()):
        text = sys.stdin.read()
    if text is None:
        raise click.UsageError("no prompt: give PROMPT (or -p TEXT), or pipe it on stdin")
    return text


def model_metadata(model) -> tuple[dict, str]:
    """The GGUF metadata and path of MODEL (a path, a store name or default)."""
    from ..gguf.reader import GGUFFile
    from ..store.resolve import resolve_model

    path = str(resolve_model(model or "default"))
    with GGUFFile(path) as f:
        return f.metadata, path


def chat_template_of(md: dict, model, path: str):
    """The chat.ChatTemplate run applies: the GGUF's own (a chat model, as llama-cli decides); None for a
    model whose GGUF has none (the embedded gemma-3-270m base model included)."""
    from ..generation.api import model_chat_template

    if not isinstance(md.get("tokenizer.chat_template"), str):
        return None
    return model_chat_template(md, False)


def with_gguf_defaults(sampling: dict, md: dict) -> dict:
    """The sampler options with the GGUF's general.sampling.* values where no flag (or variable) set one."""
    from click.core import ParameterSource

    from ..sampling.gguf_defaults import gguf_sampling_defaults

    ctx = click.get_current_context(silent=True)
    out = dict(sampling)
    for name, value in gguf_sampling_defaults(md).items():
        if name in out and (ctx is None or ctx.get_parameter_source(name) in (ParameterSource.DEFAULT, None)):
            out[name] = value
    return out


# ---- the server's address: flags, then RAMFORGE_HOST / RAMFORGE_PORT, then OLLAMA_HOST ---------------

DEFAULT_HOST, DEFAULT_PORT = "127.0.0.1", 11434


def parse_ollama_host(value: str) -> tuple[str, str, int]:
    """(scheme, host, port) of an OLLAMA_HOST value as Ollama's envconfig.Host reads it: "HOST", "HOST:PORT",
    ":PORT", "http(s)://HOST[:PORT]" (a port-less URL takes its scheme's port); "" host means every address."""
    s = value.strip().strip("\"'")
    scheme, sep, hostport = s.partition("://")
    port = DEFAULT_PORT
    if not sep:
        scheme, hostport = "http", s
    elif scheme in ("http", "https"):
        port = 80 if scheme == "http" else 443
    else:
        raise click.UsageError(f"OLLAMA_HOST={value!r}: the scheme must be http or https")
    hostport = hostport.split("/", 1)[0]
    host, p = hostport, None
    if hostport.startswith("["):                       # [v6]:port
        host, _, rest = hostport[1:].partition("]")
        p = rest[1:] if rest.startswith(":") else None
    elif hostport.count(":") == 1:
        host, p = hostport.split(":")
    if p is not None:
        if not p.isdigit() or int(p) > 65535:
            raise click.UsageError(f"OLLAMA_HOST={value!r}: the port must be a number from 0 to 65535")
        port = int(p)
    elif not hostport:
        host = DEFAULT_HOST
    return scheme, host, port


def server_address(host: str | None = None, port: int | None = None) -> tuple[str, int]:
    """Where serve listens: --host / --port, else $RAMFORGE_HOST / $RAMFORGE_PORT, else $OLLAMA_HOST, else
    127.0.0.1:11434 (OLLAMA_HOST's empty host, ":PORT", is every address, as in Ollama)."""
    env_host, env_port = flags.HOST.get() or None, flags.PORT.get() or None
    o_host = o_port = None
    if os.environ.get("OLLAMA_HOST", "").strip():
        _, o_host, o_port = parse_ollama_host(os.environ["OLLAMA_HOST"])
        o_host = o_host or "0.0.0.0"
    if env_port is not None and port is None:
        if not env_port.isdigit() or int(env_port) > 65535:
            raise click.UsageError(f"RAMFORGE_PORT={env_port!r}: expected a port number from 0 to 65535")
        port = int(env_port)
    host = host or env_host or o_host or DEFAULT_HOST
    port = port if port is not None else (o_port if o_port is not None else DEFAULT_PORT)
    return host, port


def client_url() -> str:
    """The base URL of a running `ramforge serve` for ps and stop (server_address, 0.0.0.0 as loopback)."""
    scheme = "http"
    if os.environ.get("OLLAMA_HOST", "").strip() and not flags.HOST.get():
        scheme = parse_ollama_host(os.environ["OLLAMA_HOST"])[0]
    host, port = server_address()
    host = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(host, host)
    return f"{scheme}://{f'[{host}]' if ':' in host else host}:{port}"
