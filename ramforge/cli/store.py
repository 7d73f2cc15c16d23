"""CLI commands of the model store: pull, list, rm, verify, create."""
from __future__ import annotations

import json
from datetime import datetime

import click
from rich.markup import escape
from rich.progress import (BarColumn, DownloadColumn, Progress, TaskProgressColumn, TextColumn,
                           TimeRemainingColumn, TransferSpeedColumn)
from rich.table import Table

from ..memory.size import format_bytes
from ..store import DEFAULT_TIMEOUT, Store, default_name, expand_source, normalize_name
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
@click.option("--name", default=None, help="Store name (default: the file's stem, lower-cased).")
@click.option("--sha256", "sha256", default=None, metavar="HEX", help="Expected sha256 of the file.")
@click.option("--timeout", type=click.FloatRange(min=0.1), default=DEFAULT_TIMEOUT, show_default=True,
              help="Socket timeout in seconds (connect and each read).")
@click.option("--retries", type=click.IntRange(min=0), default=3, show_default=True,
              help="Resume this many times after a dropped connection before giving up.")
@click.option("--insecure", is_flag=True, help="Allow a plain http:// SOURCE (the file could be altered on the way).")
@click.option("--quiet", "-q", is_flag=True, help="No progress bar.")
def pull(source, name, sha256, timeout, retries, insecure, quiet):
    """Download SOURCE into the model store, resuming an interrupted pull.

    SOURCE is an https URL (http:// only with --insecure) or hf.co/ORG/REPO/FILE.gguf (a Hugging
    Face file on the main branch). The file is hashed while it streams, checked against --sha256 or
    the sha256 ETag the server sends (without either it is recorded as unverified), checked for the
    GGUF magic, and stored as blobs/sha256-<hex> under a manifest NAME. A resume is sent with
    If-Range, so a file changed upstream is downloaded again from the start.
    Afterwards NAME works wherever a MODEL is asked for.
    """
    store = Store()
    url = expand_source(source)
    canon = normalize_name(name) if name is not None else default_name(url)
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
    err.print(f"pulled [bold]{escape(m.name)}[/] {m.digest[:19]} {format_bytes(m.size)} ({m.size:,} B)")
    if not m.verified:
        err.print(f"[yellow]warning:[/] {escape(m.name)} is unverified: no --sha256 was given and the server sent no "
                  f"sha256 ETag, so nothing checked the bytes are the intended file; `ramforge list` marks it")


@click.command(name="list")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON array.")
def list_(as_json):
    """Models in the store: name, digest, size, date pulled, whether it was verified against a digest."""
    store = Store()
    entries = store.entries()
    models = [e for e in entries if not isinstance(e, tuple)]
    if as_json:
        print(json.dumps([{"name": m.name, "digest": m.digest, "size": m.size, "source": m.source,
                           "pulled_at": m.pulled_at, "verified": m.verified, "path": str(store.blob_path(m.digest))}
                          for m in models],
                         indent=1))
    else:
        if not models:
            out.print(f"no models in {escape(str(store.root))}; add one with `ramforge pull URL` or "
                      f"`ramforge pull hf.co/ORG/REPO/FILE.gguf`")
        else:
            t = Table(title=f"models in {escape(str(store.root))}")
            t.add_column("name", no_wrap=True), t.add_column("digest", no_wrap=True)
            t.add_column("size", justify="right", no_wrap=True), t.add_column("pulled", no_wrap=True)
            t.add_column("verified", no_wrap=True), t.add_column("source", overflow="fold")
            for m in models:
                t.add_row(escape(m.name), m.hex[:12], format_bytes(m.size), _date(m.pulled_at),
                          "yes" if m.verified else "[yellow]unverified[/]", escape(m.source))
            out.print(t)
    for path, problem in (e for e in entries if isinstance(e, tuple)):
        err.print(f"[yellow]warning:[/] skipped {escape(str(path))}: {escape(problem)}")


@click.command()
@click.argument("name")
def rm(name):
    """Remove NAME from the store (its blob too, unless another name refers to it)."""
    r = Store().remove(name)
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


COMMANDS = [pull, list_, rm, verify, create]
