"""Errors in one place: every typed error has a category of ramforge.errors.HTTP_STATUS, nothing
raises a bare RamforgeError, and the token-id range check is written once."""
from __future__ import annotations

import ast
import importlib
import pkgutil
from pathlib import Path

import numpy as np
import pytest

import ramforge
from ramforge.errors import (HTTP_STATUS, BudgetTooSmall, ClientDisconnected, ContextLengthExceeded, EmptyPrompt,
                             InternalError, InvalidArgument, MissingExtra, ModelFileError, ModelNotFound, RamforgeError,
                             ServerBusy, TokenIdError, TokenizerInputError, UnsupportedArch, UnsupportedField,
                             check_token_ids, http_status)

PACKAGE = Path(ramforge.__file__).resolve().parent
# kernels/ is rewritten in another branch; its shape checks (invariants: 500) are left to it
NOT_HERE = ("kernels",)


def _all_modules():
    for info in pkgutil.walk_packages([str(PACKAGE)], "ramforge."):
        if info.name.endswith("__main__") or (info.name.startswith("ramforge.server")
                                               and importlib.util.find_spec("fastapi") is None):
            continue
        importlib.import_module(info.name)


def _subclasses(cls):
    for sub in cls.__subclasses__():
        yield sub
        yield from _subclasses(sub)


def category(cls) -> tuple[type, int]:
    return next((c, s) for c, s in HTTP_STATUS if issubclass(cls, c))


# Errors that no request and no model file can trigger: they keep the fallback 500.
FALLBACK_OK = {"InternalError", "MissingExtra", "StoreError", "PullError", "DownloadIncomplete", "StoreBusy",
               "DequantError",
               "AuthRequired", "RangeUnsupported",          # a pull's upstream failures (PullError's)
               "ServerUnreachable", "ServerRefused"}        # the CLI's ps / stop, never served


def test_every_typed_error_has_a_category():
    _all_modules()
    found = {cls.__name__: cls for cls in _subclasses(RamforgeError)}
    assert {"SamplerError", "TokenIdError", "ChatTemplateError", "InvalidModelName", "GGUFError", "ModelError",
            "ConfigError", "IOError_", "UnsupportedTokenizer", "NotInStore"} <= set(found)
    fallback = sorted(n for n, cls in found.items() if category(cls)[0] is RamforgeError)
    assert set(fallback) <= FALLBACK_OK, f"errors without a category (so a 500): {fallback}"


@pytest.mark.parametrize("exc,status", [
    (InvalidArgument("x"), 400), (EmptyPrompt("x"), 400), (UnsupportedField("x"), 400), (TokenIdError(7, 5), 400),
    (TokenizerInputError("x"), 400), (ContextLengthExceeded("x"), 400), (ModelNotFound("x"), 404),
    (BudgetTooSmall(1, 2, 3), 507), (UnsupportedArch("x"), 501), (ModelFileError("x"), 500), (ServerBusy("x"), 503),
    (ClientDisconnected("x"), 499), (InternalError("x"), 500), (MissingExtra("x"), 500), (ValueError("x"), 500),
])
def test_status_by_type(exc, status):
    assert http_status(exc) == status


def test_errors_of_other_modules_map_by_their_category():
    from ramforge.generation.chat import ChatTemplateError, ChatTemplateInvalid
    from ramforge.sampling.params import SamplerError
    from ramforge.store import InvalidModelName, NotInStore

    assert http_status(SamplerError("top_p", 2, "a number in [0, 1]")) == 400
    assert http_status(InvalidModelName("../x", "a path")) == 400
    assert http_status(NotInStore("x", Path("/s"))) == 404
    assert http_status(ChatTemplateError("messages[0] must be a dict", "messages")) == 400
    bad_template = ChatTemplateInvalid("syntax error", "syntax", 3)      # the model's template: not the request's fault
    assert isinstance(bad_template, ChatTemplateError) and http_status(bad_template) == 500


def _python_files():
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.relative_to(PACKAGE).parts[0] not in NOT_HERE:
            yield path


def test_nothing_raises_a_bare_ramforge_error():
    bare = []
    for path in _python_files():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call):
                f = node.exc.func
                if isinstance(f, ast.Name) and f.id == "RamforgeError":
                    bare.append(f"{path.relative_to(PACKAGE)}:{node.lineno}")
    assert not bare, f"raise a typed subclass (ramforge.errors), not RamforgeError: {bare}"


def test_token_id_check():
    check_token_ids([0, 5, 9], 10)
    check_token_ids(np.array([0, 9], dtype=np.int64), 10)
    check_token_ids([], 10)
    for ids, bad in (([3, 10, 11], 10), ([-1], -1), (np.array([2, 12, -3]), 12), (np.array([-3, 12]), -3)):
        with pytest.raises(TokenIdError) as e:
            check_token_ids(ids, 10)
        assert e.value.token_id == bad and e.value.n_vocab == 10
        assert f"token id {bad} " in str(e.value) and "vocabulary of 10 tokens" in str(e.value) and "0..9" in str(e.value)
        assert isinstance(e.value, IndexError) and isinstance(e.value, InvalidArgument)


def test_the_token_id_check_is_written_once():
    # one helper: no other module compares ids with the vocabulary or words the message itself
    copies = [str(p.relative_to(PACKAGE)) for p in _python_files()
              if p.name != "errors.py" and "out of range for a vocabulary" in p.read_text()]
    assert not copies, copies
