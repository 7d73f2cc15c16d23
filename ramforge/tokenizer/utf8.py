"""Byte-exact handling of text that is not valid UTF-8, as llama.cpp sees it.

Valid text never comes here.  A Python str can only carry invalid input as lone surrogates (bytes
decoded with errors="surrogateescape" become U+DC80..U+DCFF); llama.cpp instead works on the raw
bytes: its BPE path decodes them leniently (encoded surrogates and overlong forms are accepted,
every other bad byte becomes U+FFFD) and its SPM path groups bytes by their lead byte alone.
"""
from __future__ import annotations

from .vocab import TokenizerInputError


def has_surrogates(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def to_bytes(text: str) -> bytes:
    """The bytes llama.cpp would receive: surrogateescape'd bytes restored, other surrogates encoded
    as 3-byte sequences."""
    out = bytearray()
    for part in _chunks(text):
        if len(part) == 1 and "\udc80" <= part <= "\udcff":
            out.append(ord(part) - 0xDC00)
        else:
            out += part.encode("utf-8", "surrogatepass")
    return bytes(out)


def _chunks(text: str):
    start = 0
    for i, c in enumerate(text):
        if "\ud800" <= c <= "\udfff":
            if start < i:
                yield text[start:i]
            yield c
            start = i + 1
    if start < len(text):
        yield text[start:]


def lenient_decode(b: bytes) -> str:
    """Code points the way llama.cpp's unicode_cpts_from_utf8 reads them."""
    out = []
    i, n = 0, len(b)
    while i < n:
        c = b[i]
        if c < 0x80:
            out.append(chr(c))
            i += 1
            continue
        if c & 0x40 == 0:
            need = 0
        elif c & 0x20 == 0:
            need = 2
        elif c & 0x10 == 0:
            need = 3
        elif c & 0x08 == 0:
            need = 4
        else:
            need = 0
        if need and i + need - 1 < n and all(b[i + k] & 0xC0 == 0x80 for k in range(1, need)):
            cp = c & (0x7F >> need)
            for k in range(1, need):
                cp = (cp << 6) | (b[i + k] & 0x3F)
            if cp > 0x10FFFF:   # llama.cpp aborts (uncaught std::invalid_argument) on these
                raise TokenizerInputError(
                    f"input bytes {b[i:i + need].hex(' ')} at offset {i} decode to code point U+{cp:X}, past "
                    "U+10FFFF; llama.cpp cannot tokenize this text either")
            out.append(chr(cp))
            i += need
        else:
            out.append("\ufffd")
            i += 1
    return "".join(out)


def byte_units(b: bytes) -> list[bytes]:
    """llama.cpp's SPM symbols: chunks whose length comes from the lead byte's high nibble."""
    units = []
    i, n = 0, len(b)
    while i < n:
        hi = b[i] >> 4
        k = 1 if hi < 0xC else 2 if hi < 0xE else 3 if hi == 0xE else 4
        units.append(b[i:i + k])
        i += k
    return units
