"""llama-server's slot actions: `POST /slots/{id}?action=save|restore|erase` with `{"filename": ...}`.

The server holds one sequence, slot 0 (the loaded model's KV cache and tokens). save writes it to
a state file under `--slot-save-path` (ramforge.generation.session: the model's sha256, the context shape and KV
types, the tokens, a sha256 of the contents; a new 0600 temporary file, then renamed over a state
file of that name, never over another file); restore reads one back, refusing a file for another
model, shape or KV type, a damaged or truncated one, tokens outside the vocabulary, a link, FIFO or
device (400, the slot left empty); erase empties the slot. Both stream between the file and the KV
cache a layer at a time (session.write_state_file / load_state_file): no copy of the cache in RAM.
A file name is `[A-Za-z0-9._-]{1,128}` (the whole name: no newline), never `.` or `..`. A later request whose prompt
starts with the restored tokens resumes from them, as in the uninterrupted server.
"""
from __future__ import annotations

import re
import time

from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict

from ..errors import InvalidArgument, Unsupported
from ..generation.session import load_state_file, write_state_file
from .manager import manager_of

router = APIRouter()
N_SLOTS = 1
_NAME = re.compile(r"[A-Za-z0-9._-]{1,128}")


class SlotAction(BaseModel):
    model_config = ConfigDict(extra="forbid")
    filename: str | None = None


def _file(cfg, filename: str | None):
    from pathlib import Path

    if not cfg.slot_save_path:
        raise Unsupported("This server does not support slots save/restore: start it with --slot-save-path DIR")
    if not isinstance(filename, str) or not _NAME.fullmatch(filename) or filename in (".", ".."):
        raise InvalidArgument(f"Invalid filename {filename!r}: letters, digits, '.', '_' and '-' only, "
                              "no directories")
    return Path(cfg.slot_save_path) / filename


@router.post("/slots/{id_slot}")
async def slot_action(id_slot: int, request: Request, action: str | None = None, body: SlotAction | None = None):
    m = manager_of(request)
    if not 0 <= id_slot < N_SLOTS:
        raise InvalidArgument(f"Invalid slot ID {id_slot}: this server has {N_SLOTS} slot (0)")
    if action not in ("save", "restore", "erase"):
        raise InvalidArgument(f"Invalid action {action!r}: use ?action=save, restore or erase")
    path = _file(m.cfg, body.filename if body else None) if action != "erase" else None
    await m.acquire()
    try:
        loaded = m.current if m.current is not None else (await m.ensure(None))[0]
        model = loaded.model
        t0 = time.perf_counter()
        if action == "save":
            n = model.engine.n_past
            written = await m.call(write_state_file, path, model.engine)
            return {"id_slot": id_slot, "filename": path.name, "n_saved": n, "n_written": written,
                    "timings": {"save_ms": (time.perf_counter() - t0) * 1e3}}
        if action == "restore":
            read = await m.call(load_state_file, model.engine, path)
            return {"id_slot": id_slot, "filename": path.name, "n_restored": model.engine.n_past,
                    "n_read": read, "timings": {"restore_ms": (time.perf_counter() - t0) * 1e3}}
        n = model.engine.n_past
        await m.call(model.engine.reset, 0)
        return {"id_slot": id_slot, "n_erased": n}
    finally:
        await m.release(None)
