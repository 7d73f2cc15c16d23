"""The `ramforge` command line. click parses, rich renders; errors are one line on stderr.

    console.py    the consoles and the options commands share (sampler options from ramforge.sampling.params)
    describe.py   inspect, support, plan, show: read a model without running it
    generate.py   run, chat, bench: run the model
    embed.py      embed: embeddings of a file's lines
    tokens.py     tokenize, detokenize, logits
    store.py      pull, list, rm, cp, verify, create: the model store
    running.py    ps, stop: a running serve's models (HTTP)
    serve.py      serve: the Ollama and OpenAI HTTP APIs (FastAPI is imported when it runs)

This module is the top: it imports the command modules, none of them imports it.
"""
from __future__ import annotations

import os
import sys

import click
from rich.markup import escape

from .. import flags
from ..errors import RamforgeError
from . import describe, embed, generate, running, serve, store, tokens
from .console import err

EXIT_USER, EXIT_USAGE, EXIT_INTERNAL = 1, 2, 3     # a RamforgeError, a usage error (click's), a bug


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="ramforge")
def cli():
    """Run GGUF language models larger than the RAM you allow.

    MODEL is a path to a .gguf file, or `default` (or nothing) for the embedded gemma-3-270m.
    Add --debug (or RAMFORGE_DEBUG=1) to any command to see tracebacks.
    """


for _module in (describe, generate, embed, tokens, store, running, serve):
    for _command in _module.COMMANDS:
        cli.add_command(_command)


def main(argv: list[str] | None = None) -> None:
    """Console entry point: typed errors become one line on stderr and a non-zero exit: 1 for a
    RamforgeError or an OS error (the user can fix it), 2 for a usage error (click's), 3 for an
    internal error (a bug), 130 when interrupted.

    Called without argv (the `ramforge` script, `python -m ramforge`), the process ends right after
    the command with os._exit, streams flushed: the interpreter's teardown of numba and LLVM (0.3 s
    once a kernel has run) is skipped. With argv (a caller's process) it returns or raises SystemExit."""
    if argv is not None:
        return _main(list(argv))
    try:
        _main(sys.argv[1:])
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        if isinstance(e.code, str):
            print(e.code, file=sys.stderr)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):      # a closed pipe: nothing more to say
            pass
    os._exit(code)


def _main(argv: list[str]) -> None:
    try:
        debug = flags.DEBUG.get()
    except RamforgeError as e:              # RAMFORGE_DEBUG=maybe: said as any other error
        err.print(f"[red]error:[/] {escape(str(e))}")
        sys.exit(1)
    if "--debug" in argv:
        argv.remove("--debug")
        debug = True
    try:
        cli.main(args=argv, prog_name="ramforge", standalone_mode=False)
    except click.exceptions.Abort:
        err.print("aborted")
        sys.exit(130)
    except click.ClickException as e:
        e.show()
        sys.exit(e.exit_code)
    except RamforgeError as e:
        if debug:
            err.print_exception()
        err.print(f"[red]error:[/] {escape(str(e))}")
        sys.exit(1)
    except (OSError, MemoryError) as e:
        if debug:
            err.print_exception()
        err.print(f"[red]error:[/] {type(e).__name__}: {escape(str(e))}")
        sys.exit(1)
    except Exception as e:  # a bug: still one line, with the way to see more
        if debug:
            err.print_exception()
        err.print(f"[red]internal error:[/] {type(e).__name__}: {escape(str(e))} (run with --debug for the traceback)")
        sys.exit(EXIT_INTERNAL)


if __name__ == "__main__":
    main()
