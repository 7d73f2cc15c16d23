"""CLI commands of the model store: pull (URLs and Hugging Face sources, planned first), list, rm, cp, verify, create."""
from __future__ import annotations

import json
import os
from datetime import datetime
from pathlib import Path

import click
from rich.markup import escape
from rich.progress import (BarColumn, DownloadColumn, Progress, TaskProgressColumn, TextColumn,
                           TimeRemainingColumn, TransferSpeedColumn)
from rich.table import Table

from ..errors import RamforgeError
from ..memory.size import format_bytes, parse_memory_size
from ..store import DEFAULT_TIMEOUT, Store, StoreError, default_name, expand_source, normalize_name
from .console import err, out


class _Bar:
    """A rich progress bar on stderr (bytes, rate, ETA), fed by the store's progress callback."""

    def __init__(self, label: str):
        self.label = label
        self.progress = Progress(TextColumn("{task.description}"), BarColumn(bar_width=24), TaskProgressColumn(),
                                 DownloadColumn(), TransferSpeedColumn(), TimeRemainingColumn(),
                                 console=err, transient=False)
        self.tasks: dict[str, int] = {}

    def __enter__(self):
        self.progress.start()
        return self

    def __exit__(self, *exc):
        self.progress.stop()
        return False

    def __call__(self, phase: str, done: int, total: int | None) -> None:
        if phase.startswith("retry"):
            self.progress.console.print(f"[yellow]{escape(phase)}[/]")
            return
        task = self.tasks.get(phase)
        if task is None:
            desc = self.label if phase == "download" else f"{self.label} ({phase})"
            task = self.tasks[phase] = self.progress.add_task(escape(desc), total=total, completed=done)
        self.progress.update(task, completed=done, total=total)


def _date(iso: str) -> str:
    try:
        return datetime.fromisoformat(iso).astimezone().strftime("%Y-%m-%d %H:%M")
    except ValueError:
        return iso or "-"


@click.command()
@click.argument("source")
@click.option("--name", default=None, help="Store name (default: the file's stem, lower-cased; hf.co/ORG/REPO:QUANT "
                                          "for a Hugging Face source).")
@click.option("--sha256", "sha256", default=None, metavar="HEX", help="Expected sha256 of the file (a URL SOURCE).")
@click.option("--hf", "hf", is_flag=True, help="SOURCE is a Hugging Face ORG/REPO[:QUANT] (as llama.cpp's -hf).")
@click.option("--include", default=None, metavar="GLOB",
              help="Pick the model of a Hugging Face repository by a glob on its file names, e.g. '*Q4_K_M*'.")
@click.option("--dry-run", is_flag=True, help="Read only the GGUF header(s) by HTTP range requests, print the plan "
                                              "at --ram, download nothing.")
@click.option("--ram", default=None, help="With --dry-run: the budget to plan for (default: this machine's memory).")
@click.option("--ctx", type=click.IntRange(min=1), default=None, help="Context length the plan is made for.")
@click.option("--storage-gb-s", type=click.FloatRange(min=0, min_open=True), default=None,
              help="With --dry-run: storage read speed for the expected seconds per token (default 2).")
@click.option("--force", is_flag=True, help="Pull without the plan first, even a model this machine's memory "
                                            "cannot run.")
@click.option("--timeout", type=click.FloatRange(min=0.1), default=DEFAULT_TIMEOUT, show_default=True,
              help="Socket timeout in seconds (connect and each read).")
@click.option("--retries", type=click.IntRange(min=0), default=3, show_default=True,
              help="Resume this many times after a dropped connection before giving up.")
@click.option("--insecure", is_flag=True, help="Allow a plain http:// SOURCE or HF_ENDPOINT (the file could be "
                                               "altered on the way).")
@click.option("--quiet", "-q", is_flag=True, help="No progress bar.")
def pull(source, name, sha256, hf, include, dry_run, ram, ctx, storage_gb_s, force, timeout, retries, insecure, quiet):
    """Download SOURCE into the model store, resuming an interrupted pull.

    SOURCE is a Hugging Face model as Ollama and llama.cpp name it, hf.co/ORG/REPO[:QUANT] (or
    ORG/REPO[:QUANT] with --hf; the QUANT picks the file, or split set, as llama.cpp's -hf does:
    Q4_K_M by default), hf.co/ORG/REPO/FILE.gguf, or an https URL (http:// only with --insecure).
    Hugging Face files go to the shared Hugging Face cache (HF_HOME; HF_TOKEN or `hf auth login` for
    gated repos; HF_ENDPOINT for a mirror), each checked against the sha256 the Hub lists. A URL is
    hashed while it streams, checked against --sha256 or the sha256 ETag the server sends, and stored
    as blobs/sha256-<hex>; a resume is sent with If-Range. The URL of a split GGUF's shard
    (NAME-0000K-of-0000N.gguf) pulls every shard of its set, one blob each.

    Before a byte of weights moves, the GGUF header(s) are read by HTTP range requests and planned:
    a model whose minimum budget exceeds this machine's memory is refused (--force pulls it anyway);
    --dry-run prints the plan and stops. Afterwards NAME works wherever a MODEL is asked for.
    """
    from ..store import hf as hfs

    store = Store()
    ref = hfs.parse_source(source, hf=hf, include=include)
    canon = normalize_name(name) if name is not None else None      # checked before any request
    if ref is None:
        url = expand_source(source)
        canon = canon or default_name(url)
        store.manifest_path(canon)
    if dry_run or not force:
        if _plan_first(source, hf, include, insecure, ram, ctx, storage_gb_s, dry_run, canon or source):
            return
    if ref is not None:
        return _pull_hf(store, ref, canon, insecure, quiet)
    part = store.part_path(canon)
    try:
        if quiet:
            m = store.pull(url, canon, sha256, timeout=timeout, retries=retries, insecure=insecure)
        else:
            with _Bar(canon) as bar:
                m = store.pull(url, canon, sha256, progress=bar, timeout=timeout, retries=retries, insecure=insecure)
    except KeyboardInterrupt:
        if part.exists():
            err.print(f"interrupted: {format_bytes(part.stat().st_size)} kept in {escape(str(part))}; "
                      f"run the same pull again to resume")
        raise
    files = f"{1 + len(m.shards)} files, " if m.shards else ""
    err.print(f"pulled [bold]{escape(m.name)}[/] {m.digest[:19]} {files}{format_bytes(m.total_size)} ({m.total_size:,} B)")
    if not m.verified:
        err.print(f"[yellow]warning:[/] {escape(m.name)} is unverified: no --sha256 was given and the server sent no "
                  f"sha256 ETag, so nothing checked the bytes are the intended file; `ramforge list` marks it")


def _plan_first(model, hf, include, insecure, ram, ctx, storage_gb_s, dry_run, what) -> bool:
    """The plan from the header(s) alone: printed with --dry-run (True: stop there); else WontFit when
    its minimum budget exceeds this machine's memory. A source whose header cannot be read by ranges
    (no range support, not a GGUF) is pulled without a plan, saying so."""
    import psutil

    from ..errors import GGUFError
    from ..store import WontFit
    from ..store import hf as hfs
    from ..store.ranged import RangeUnsupported
    from ..stream.plan import plan_for_budget
    from .describe import open_header, show_plan

    total = psutil.virtual_memory().total
    budget = parse_memory_size(ram) if ram else total
    if include:                                   # a glob: the file it picks, by name
        ref = hfs.parse_source(model, hf=hf, include=include)
        model, hf = f"hf.co/{ref.repo_id}/{hfs.resolve(ref, insecure).files[0].path}", False
    try:
        with open_header(model, hf, insecure) as (f, remote):
            p = plan_for_budget(f, budget, ctx)
    except (RangeUnsupported, GGUFError) as e:
        if dry_run:
            raise
        err.print(f"[yellow]note:[/] no plan before the download ({escape(str(e))}); pulling anyway")
        return False
    if dry_run:
        show_plan(p, budget, remote, storage_gb_s=storage_gb_s)
        return True
    if p.min_budget > total:
        raise WontFit(what, p.min_budget, total)
    return False


def _pull_hf(store, ref, name, insecure, quiet) -> None:
    from ..store import hf as hfs

    model = hfs.resolve(ref, insecure)
    label = name or hfs.store_name(ref, [f.path for f in model.files])
    if quiet:
        m = hfs.pull(ref, store, name, insecure=insecure, model=model)
    else:
        with _Bar(label) as bar:
            m = hfs.pull(ref, store, name, insecure=insecure, model=model, progress=bar)
    files = f"{1 + len(m.shards)} files, " if m.shards else ""
    err.print(f"pulled [bold]{escape(m.name)}[/] {m.digest[:19]} {files}{format_bytes(m.total_size)} "
              f"({m.total_size:,} B) into {escape(str(Path(m.path).parent))}")
    if not m.verified:
        err.print(f"[yellow]warning:[/] {escape(m.name)} is unverified: the Hub listed no sha256 for it")


@click.command(name="list")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON array.")
def list_(as_json):
    """Models in the store (name, digest, size, date pulled, whether it was verified against a digest),
    and the GGUF models already in the Hugging Face cache, by the name that runs them."""
    from ..store import hf as hfs

    store = Store()
    entries = store.entries()
    models = [e for e in entries if not isinstance(e, tuple)]
    named = {os.path.abspath(m.path) for m in models if m.path}
    cached = [c for c in hfs.cached_models() if os.path.abspath(c.path) not in named]
    if as_json:
        print(json.dumps([{"name": m.name, "digest": m.digest, "size": m.total_size, "source": m.source,
                           "pulled_at": m.pulled_at, "verified": m.verified, "path": str(store.file_of(m))}
                          for m in models] +
                         [{"name": c.name, "digest": None, "size": c.size, "source": "huggingface-cache",
                           "pulled_at": None, "verified": None, "path": str(c.path)} for c in cached],
                         indent=1))
    else:
        if not models and not cached:
            out.print(f"no models in {escape(str(store.root))} nor in the Hugging Face cache; add one with "
                      f"`ramforge pull hf.co/ORG/REPO:QUANT` or `ramforge pull URL`")
        if models:
            t = Table(title=f"models in {escape(str(store.root))}")
            t.add_column("name", no_wrap=True), t.add_column("digest", no_wrap=True)
            t.add_column("size", justify="right", no_wrap=True), t.add_column("pulled", no_wrap=True)
            t.add_column("verified", no_wrap=True), t.add_column("source", overflow="fold")
            for m in models:
                t.add_row(escape(m.name), m.hex[:12], format_bytes(m.total_size), _date(m.pulled_at),
                          "yes" if m.verified else "[yellow]unverified[/]", escape(m.source))
            out.print(t)
        if cached:
            t = Table(title=f"in the Hugging Face cache {escape(str(hfs.hub_cache()))} (run by these names)")
            t.add_column("name", no_wrap=True), t.add_column("size", justify="right", no_wrap=True)
            t.add_column("file", overflow="fold")
            for c in cached:
                t.add_row(escape(c.name), format_bytes(c.size), escape(str(c.path)))
            out.print(t)
    for path, problem in (e for e in entries if isinstance(e, tuple)):
        err.print(f"[yellow]warning:[/] skipped {escape(str(path))}: {escape(problem)}")


@click.command()
@click.argument("names", metavar="NAME...", nargs=-1, required=True)
def rm(names):
    """Remove each NAME from the store (its blob too, unless another name refers to it), as ollama rm; a
    running `ramforge serve` that holds one unloads it first."""
    store, failed = Store(), []
    _stop_on_server(names)
    for name in names:
        try:
            _remove_one(store, name)
        except RamforgeError as e:
            if len(names) == 1:
                raise
            err.print(f"[red]error:[/] {escape(str(e))}")
            failed.append(name)
    if failed:
        raise StoreError(f"{len(failed)} of {len(names)} names not removed: {', '.join(failed)}")


def _stop_on_server(names) -> None:
    """As `ollama rm` does first: a running server ($RAMFORGE_HOST / $OLLAMA_HOST, as `ramforge ps`) that
    holds one of the names loaded unloads it (a keep_alive 0 request), freeing its memory; no server
    answering: nothing to do; a server that refuses: a warning, and the names are removed all the same."""
    from .running import ServerUnreachable, _request

    try:
        answer = _request("GET", "/api/ps", timeout=3.0)
        loaded = {m.get("name") for m in answer.get("models", []) if isinstance(m, dict)} \
            if isinstance(answer, dict) else set()
    except ServerUnreachable:
        return
    except RamforgeError as e:
        err.print(f"[yellow]warning:[/] unable to ask the server which models it holds: {escape(str(e))}")
        return
    for name in names:
        try:
            held = name in loaded or normalize_name(name) in loaded
        except RamforgeError:                   # an invalid name: its removal says so
            continue
        if held:
            try:
                _request("POST", "/api/generate", {"model": name, "keep_alive": 0}, timeout=300.0)  # after its turn
            except RamforgeError as e:
                err.print(f"[yellow]warning:[/] unable to stop model {escape(name)!r}: {escape(str(e))}")


def _remove_one(store: Store, name: str) -> None:
    r = store.remove(name)
    parts = []
    if r["manifest"]:
        parts.append(f"removed {r['name']}")
        if r["blob"]:
            parts.append("deleted its blob" if r["blob_deleted"] else
                         f"kept blob {r['blob'][:19]} (another name refers to it)")
    if r["part_deleted"]:
        parts.append(f"deleted the partial download of {r['name']}")
    err.print(escape("; ".join(parts)))


@click.command()
@click.argument("name")
@click.option("--quiet", "-q", is_flag=True, help="No progress bar.")
def verify(name, quiet):
    """Re-hash NAME's blob and compare it with the digest recorded when it was pulled."""
    store = Store()
    if quiet:
        m = store.verify(name)
    else:
        with _Bar(normalize_name(name)) as bar:
            m = store.verify(name, progress=bar)
    out.print(f"{escape(m.name)}: ok, {m.digest} ({m.size:,} B)")


@click.command()
@click.argument("source")
@click.argument("destination")
def cp(source, destination):
    """Copy the store name SOURCE to DESTINATION (a second name for the same blob), as ollama cp."""
    from ..store.modelfile import copy as copy_model

    store = Store()
    store.path_of(source)                        # its blob is there (and unchanged)
    copy = copy_model(store, source, destination)
    err.print(f"copied '{escape(normalize_name(source))}' to '{escape(copy.name)}'")

@click.command()
@click.argument("name")
@click.option("--file", "-f", "modelfile", type=click.Path(exists=True, dir_okay=False), default="Modelfile",
              show_default=True, help="The Modelfile: FROM, PARAMETER, TEMPLATE, SYSTEM.")
@click.option("--quiet", "-q", is_flag=True, help="No progress bar.")
def create(name, modelfile, quiet):
    """Create NAME in the store from a Modelfile, as `ollama create NAME -f Modelfile`.

    FROM is a .gguf file (relative to the Modelfile's folder; copied into the store), a store
    name, or sha256:<hex> of a blob in the store. TEMPLATE (a Jinja chat template), SYSTEM and
    PARAMETERs apply where NAME is served."""
    from pathlib import Path

    from ..store.modelfile import create as create_model, parse_modelfile

    text = Path(modelfile).read_text(encoding="utf-8")
    mf = parse_modelfile(text)
    source = mf.source
    local = Path(modelfile).parent / Path(source).expanduser()
    if not source.lower().startswith("sha256:") and local.is_file():     # Ollama: FROM relative to the Modelfile
        source = str(local)
    store = Store()
    if quiet:
        m = create_model(store, name, source, mf.config)
    else:
        with _Bar(normalize_name(name)) as bar:
            m = create_model(store, name, source, mf.config, progress=bar)
    out.print(f"created {escape(m.name)}: {m.digest} ({m.size:,} B)")


COMMANDS = [pull, list_, rm, cp, verify, create]
