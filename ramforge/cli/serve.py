"""The `ramforge serve` command (FastAPI and uvicorn are imported only when it runs)."""
from __future__ import annotations

import ipaddress
import os

import click

from .. import flags
from ..errors import InvalidArgument, MissingExtra
from ..memory.size import parse_memory_size
from .console import (cluster_of, cluster_options, drafter_of, kv_options, kv_types_of, server_address,
                      speculative_options, spill_of, spill_option)


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


@click.command()
@click.argument("model", required=False)
@click.option("--host", default=None,
              help="Address to bind (default: $RAMFORGE_HOST, else $OLLAMA_HOST's, else 127.0.0.1); anything but "
                   "loopback exposes the server (use --api-key).")
@click.option("--port", type=click.IntRange(0, 65535), default=None,
              help="Port (default: $RAMFORGE_PORT, else $OLLAMA_HOST's, else 11434).")
@click.option("--api-key", default=lambda: flags.API_KEY.get(), show_default=False,
              help="Require 'Authorization: Bearer KEY' on every route but /health (or $RAMFORGE_API_KEY).")
@click.option("--ram", default=lambda: flags.RAM.get(), show_default=False,
              help="Memory budget of the resident model, e.g. 4G (or $RAMFORGE_RAM; default: unlimited).")
@click.option("--ctx", envvar="OLLAMA_CONTEXT_LENGTH", type=click.IntRange(min=1), default=None,
              help="Context length when a request sets no num_ctx (or $OLLAMA_CONTEXT_LENGTH; default: "
                   f"{flags.DEFAULT_CTX}, or the model's if smaller).")
@click.option("--pooling", type=click.Choice(["none", "mean", "cls", "last", "rank"]), default=None,
              help="Pooling of the embedding endpoints, over the model file's {arch}.pooling_type (llama-server's).")
@click.option("--spm-infill", is_flag=True,
              help="Fill-in-the-middle prompts (/infill, a `suffix`) put the suffix first, the order some code models "
                   "were trained on (llama-server's --spm-infill).")
@click.option("--max-ctx", type=click.IntRange(min=1), default=None,
              help="The most a request's num_ctx gets (default: the model's trained context, as Ollama clamps it).")
@click.option("-t", "--threads", type=int, default=None,
              help="Kernel threads (default: $RAMFORGE_THREADS or the physical cores).")
@click.option("--io", type=click.Choice(["direct", "buffered", "mmap"]), default="direct", show_default=True,
              help="How streamed weights are read.")
@click.option("--keep-alive", envvar="OLLAMA_KEEP_ALIVE", default="5m", show_default=True,
              help="How long a model stays loaded after a request when it sets no keep_alive (-1: forever; or "
                   "$OLLAMA_KEEP_ALIVE).")
@click.option("--max-body", default="1M", show_default=True, help="Request body size limit (413 above it).")
@click.option("--request-timeout", type=click.FloatRange(min=0, min_open=True), default=10.0, show_default=True,
              help="Seconds a client has to send a whole request (headers and body) before it is disconnected.")
@click.option("--write-timeout", type=click.FloatRange(min=0, min_open=True), default=30.0, show_default=True,
              help="Seconds a client may take nothing of a response (a stream it stopped reading) before it is "
                   "dropped, its generation stopped and the model freed.")
@click.option("--max-connections", type=click.IntRange(min=1), default=256, show_default=True,
              help="Open connections at most: beyond it the one waiting longest for its request is closed "
                   "(or, all being served, the new request gets 503).")
@click.option("--origins", envvar="OLLAMA_ORIGINS", default=None,
              help="Browser origins allowed beside the local ones (comma-separated, '*' a wildcard; or "
                   "$OLLAMA_ORIGINS); a request from any other origin is 403.")
@click.option("--log-level", type=click.Choice(["critical", "error", "warning", "info", "debug"]), default="info",
              show_default=True)
@click.option("--slot-save-path", type=click.Path(file_okay=False, writable=True), default=None,
              help="Directory of POST /slots/0?action=save|restore state files (llama-server's option).")
@click.option("--cache-ram", default=None,
              help="A prompt cache of this size: MiB as llama-server's --cache-ram (8192), or a size with a unit "
                   "(2G); 0: none. Conversations resume instead of recomputing their prompt.")
@click.option("-np", "--parallel", envvar="OLLAMA_NUM_PARALLEL", type=click.IntRange(1, 64), default=1,
              show_default=True,
              help="Slots: up to N requests decode together, one pass over the weights for all (continuous "
                   "batching); each slot holds PAD(ctx / N, 256) tokens, as llama-server's --parallel N.")
@click.option("--context-shift", is_flag=True,
              help="When generation fills the context, keep n_keep / num_keep tokens (+ BOS) and drop half of the "
                   "rest, as llama-server's --context-shift.")
@click.option("-a", "--alias", default=None,
              help="Serve the startup model under this name too, the one /v1/models lists (llama-server's --alias).")
@click.option("--strict-names", is_flag=True,
              help="An unknown model name on /v1 and llama-server's routes is a 404, as Ollama (default: the loaded "
                   "model answers, as llama-server).")
@click.option("--chat-template", "chat_template", default=None,
              help="The startup model's chat template: a Jinja FILE, or a name (chatml, gemma3), over the GGUF's.")
@kv_options
@spill_option
@speculative_options
@cluster_options
def serve(model, host, port, api_key, ram, ctx, pooling, spm_infill, max_ctx, threads, io, keep_alive, max_body, request_timeout,
          write_timeout, max_connections, origins, log_level,
          slot_save_path, cache_ram, parallel, context_shift, alias, strict_names, chat_template, kv_type, kv_type_k,
          kv_type_v,
          kv_spill, lookup,
          lookup_ngram, lookup_fixed, draft_model, draft_max, draft_min, draft_p_min, ray_address, stages, stage_ram,
          ray_timeout, stage_timeout, placement):
    """Serve MODEL over the Ollama (/api) and OpenAI (/v1) HTTP APIs, one request at a time (or --parallel N
    together).

    MODEL (a path, a store name or `default`) is loaded before the server starts; without it the
    default model loads on the first request. Requests may name `default` or any name from
    `ramforge list`; the resident model is swapped (the old one closed first) to stay under --ram.
    With --ray, each loaded model runs as --stages layer ranges on Ray (its stage actors stopped
    when it is swapped out or its keep-alive ends).
    The KV cache types: --kv-type*, else $RAMFORGE_KV_TYPE, else Ollama's $OLLAMA_KV_CACHE_TYPE, else f16.
    """
    import importlib.util

    if importlib.util.find_spec("fastapi") is None or importlib.util.find_spec("uvicorn") is None:
        raise MissingExtra("ramforge serve needs FastAPI and uvicorn: pip install 'ramforge[serve]'")
    from ..server.browser import parse_origins
    from ..server.common import ServerConfig, parse_keep_alive

    host, port = server_address(host, port)
    cache_ram = cache_ram_bytes(cache_ram)
    if ram is not None:
        parse_memory_size(ram)                      # a bad size fails here, as one line
    models_dir = os.environ.get("OLLAMA_MODELS")
    if models_dir and not flags.HOME.get():
        os.environ[flags.HOME.name] = models_dir    # the store's root (ramforge's layout), for this process
    if slot_save_path is not None:
        os.makedirs(slot_save_path, exist_ok=True)
    try:
        keep = parse_keep_alive(keep_alive)
    except InvalidArgument as e:
        raise click.BadParameter(str(e), param_hint="--keep-alive") from None
    spec = dict(lookup=lookup, lookup_ngram=lookup_ngram, lookup_fixed=lookup_fixed, draft=draft_model,
                draft_max=draft_max, draft_min=draft_min, draft_p_min=draft_p_min)
    drafter_of(**spec)                              # conflicting or bad options fail here, as one line
    cluster = cluster_of(ray_address, stages, stage_ram, ray_timeout, stage_timeout, placement)
    if cluster is not None and (lookup is not None or draft_model is not None):
        raise click.UsageError("--lookup and --draft are not supported with --ray")
    if parallel > 1 and (cluster is not None or context_shift or cache_ram is not None or slot_save_path is not None
                         or lookup is not None or draft_model is not None):
        raise click.UsageError("--parallel is not supported with --ray, --context-shift, --cache-ram, "
                               "--slot-save-path or speculative decoding")
    if spill_of(kv_spill) not in (None, False) and (parallel > 1 or context_shift):
        raise click.UsageError("--kv-spill is not supported with --parallel or --context-shift (their KV cells "
                               "stay in RAM): --kv-spill off, or leave it out")
    if cluster is not None and context_shift:
        raise click.UsageError("--context-shift is not supported with --ray (the KV caches live in the stages)")
    if cluster is not None and (slot_save_path is not None or cache_ram is not None):
        raise click.UsageError("--slot-save-path and --cache-ram are not supported with --ray (the KV caches "
                               "live in the stages)")
    type_k, type_v = kv_types_of(kv_type, kv_type_k, kv_type_v, ollama=True)
    if cluster is not None and (type_k, type_v) != ("f16", "f16"):
        raise click.UsageError("--kv-type is not supported with --ray (the stages keep f16 caches)")
    if cluster is not None and spill_of(kv_spill):
        raise click.UsageError("--kv-spill is not supported with --ray")
    if alias is not None:
        from ..store import InvalidModelName, normalize_name

        try:
            normalize_name(alias)
        except InvalidModelName as e:
            raise click.BadParameter(str(e), param_hint="--alias") from None
    template = _chat_template(chat_template)
    cfg = ServerConfig(model=model, ram=ram, alias=alias, lenient_names=not strict_names, chat_template=template,
                       n_ctx=ctx, n_threads=threads, io=io,
                       api_key=api_key or None,
                       origins=parse_origins(origins),
                       max_body=parse_memory_size(max_body), keep_alive=300.0 if keep is None else keep,
                       preload=model is not None, slot_save_path=slot_save_path, cache_ram=cache_ram,
                       type_k=type_k, type_v=type_v, kv_spill=spill_of(kv_spill), context_shift=context_shift,
                       parallel=parallel,
                       speculative=spec if lookup is not None or draft_model is not None else None,
                       cluster=cluster, max_ctx=max_ctx, pooling=pooling, spm_infill=spm_infill)
    ray = None
    if cluster is not None:                         # Ray connected from this (the main) thread, once for every model
        from ..cluster import connect

        ray = connect(cluster["address"], cluster["connect_timeout"])
    try:
        _serve(cfg, model, host, port, api_key, log_level, request_timeout=request_timeout,
               write_timeout=write_timeout, max_connections=max_connections)
    finally:
        if ray is not None:
            ray.shutdown()


def cache_ram_bytes(value: str | None) -> int | None:
    """--cache-ram in bytes: a bare number is MiB (llama-server's unit), a size with a unit is that size;
    0 (or none given) is no prompt cache. llama-server's -1 (no limit) is refused: the cache needs a budget."""
    if value is None:
        return None
    v = str(value).strip()
    if v.lstrip("-").isdigit():
        n = int(v)
        if n < 0:
            raise click.BadParameter(f"{value!r}: give a size (MiB, or with a unit such as 8G); the prompt cache "
                                     f"needs a budget", param_hint="--cache-ram")
        return n * 1024 * 1024 or None
    return parse_memory_size(v) or None


def _chat_template(value: str | None) -> str | None:
    """--chat-template: a file's text, or a named template ramforge has (llama.cpp's names)."""
    from pathlib import Path

    if value is None:
        return None
    from ..generation.chat import CHATML_TEMPLATE, ChatTemplateError, ChatTemplate

    named = {"chatml": lambda: CHATML_TEMPLATE,
             "gemma3": lambda: (Path(__file__).parents[1] / "templates" / "gemma3.jinja").read_text()}
    named["gemma"] = named["gemma3"]
    if value in named:
        text = named[value]()
    elif Path(value).is_file():
        text = Path(value).read_text(encoding="utf-8", errors="replace")
    else:
        raise click.BadParameter(f"{value!r} is neither a file nor a template name ({', '.join(sorted(named))})",
                                 param_hint="--chat-template")
    try:
        ChatTemplate.from_metadata({}, text)            # a syntax error fails here, with its line
    except ChatTemplateError as e:
        raise click.BadParameter(str(e), param_hint="--chat-template") from None
    return text


def _serve(cfg, model, host, port, api_key, log_level, **limits):
    import uvicorn

    from ..server.app import create_app
    from ..server.transport import uvicorn_config

    app = create_app(cfg)
    manager = app.state.manager
    if model is not None:
        manager.preload()                           # typed errors become the CLI's one-line errors
    if not _loopback(host) and not api_key:
        click.echo(f"warning: serving on {host} without --api-key: anyone who can reach it can use it", err=True)
    click.echo(f"ramforge serve: http://{host}:{port} (Ollama /api, OpenAI /v1), model "
               f"{manager.startup_name!r}{' loaded' if model is not None else ' loads on first use'}", err=True)
    uvicorn.Server(uvicorn_config(app, host, port, log_level=log_level, timeout_graceful_shutdown=5,
                                  **limits)).run()


COMMANDS = [serve]
