"""Unicode facts the tokenizers need, shaped the way llama.cpp sees them.

llama.cpp classifies every code point into one general-category group (letter, number, mark,
punctuation, symbol, separator, control, undefined) from its own generated table, which follows
Unicode 15.1. We derive the same groups from Python's ``unicodedata`` and patch the code points
that Unicode 15.0/15.1 assigned and an older Python (3.11 ships Unicode 14.0) still calls
unassigned. Lookups are memoised per character, so importing this module costs nothing and a
text only pays for the distinct characters it contains.

Also here: llama.cpp's whitespace set (it is *not* Python's ``str.isspace``) and GPT-2's
byte-to-unicode table used by byte-level BPE.
"""
from __future__ import annotations

import bisect
import unicodedata

# category groups, same bit values as llama.cpp's flags (only the bits matter to us)
UNDEFINED = 0x0001
NUMBER = 0x0002       # \p{N}
LETTER = 0x0004       # \p{L}
SEPARATOR = 0x0008    # \p{Z}
MARK = 0x0010         # \p{M}
PUNCTUATION = 0x0020  # \p{P}
SYMBOL = 0x0040       # \p{S}
CONTROL = 0x0080      # \p{C}
WHITESPACE = 0x0100   # llama.cpp's \s (a fixed list, see below)

_GROUP = {
    "C": CONTROL, "L": LETTER, "M": MARK, "N": NUMBER, "P": PUNCTUATION, "S": SYMBOL, "Z": SEPARATOR,
}

# The code points llama.cpp treats as whitespace.  Python's str.isspace() differs: it also
# accepts U+001C..U+001F, so we never use it.
WHITESPACE_CHARS = frozenset(
    "\t\n\x0b\x0c\r \x85\xa0\u1680"
    + "".join(chr(c) for c in range(0x2000, 0x200B))
    + "\u2028\u2029\u202f\u205f\u3000"
)

# Code points assigned by Unicode 15.0 and 15.1 (inclusive ranges with their group).  Applied only
# where the running Python's unicodedata still reports them as unassigned ("Cn"), so newer
# Pythons that already know them take their own (identical) answer.
_TARGET_UNICODE = (15, 1)
_NEWER_ASSIGNED = (
    (0x0CF3, 0x0CF3, MARK), (0x0ECE, 0x0ECE, MARK), (0x2FFC, 0x2FFF, SYMBOL), (0x31EF, 0x31EF, SYMBOL),
    (0x10EFD, 0x10EFF, MARK), (0x1123F, 0x11240, LETTER), (0x11241, 0x11241, MARK),
    (0x11B00, 0x11B09, PUNCTUATION), (0x11F00, 0x11F01, MARK), (0x11F02, 0x11F02, LETTER),
    (0x11F03, 0x11F03, MARK), (0x11F04, 0x11F10, LETTER), (0x11F12, 0x11F33, LETTER),
    (0x11F34, 0x11F3A, MARK), (0x11F3E, 0x11F42, MARK), (0x11F43, 0x11F4F, PUNCTUATION),
    (0x11F50, 0x11F59, NUMBER), (0x1342F, 0x1342F, LETTER), (0x13439, 0x1343F, CONTROL),
    (0x13440, 0x13440, MARK), (0x13441, 0x13446, LETTER), (0x13447, 0x13455, MARK),
    (0x1B132, 0x1B132, LETTER), (0x1B155, 0x1B155, LETTER), (0x1D2C0, 0x1D2D3, NUMBER),
    (0x1DF25, 0x1DF2A, LETTER), (0x1E030, 0x1E06D, LETTER), (0x1E08F, 0x1E08F, MARK),
    (0x1E4D0, 0x1E4EB, LETTER), (0x1E4EC, 0x1E4EF, MARK), (0x1E4F0, 0x1E4F9, NUMBER),
    (0x1F6DC, 0x1F6DC, SYMBOL), (0x1F774, 0x1F776, SYMBOL), (0x1F77B, 0x1F77F, SYMBOL),
    (0x1F7D9, 0x1F7D9, SYMBOL), (0x1FA75, 0x1FA77, SYMBOL), (0x1FA87, 0x1FA88, SYMBOL),
    (0x1FAAD, 0x1FAAF, SYMBOL), (0x1FABB, 0x1FABD, SYMBOL), (0x1FABF, 0x1FABF, SYMBOL),
    (0x1FACE, 0x1FACF, SYMBOL), (0x1FADA, 0x1FADB, SYMBOL), (0x1FAE8, 0x1FAE8, SYMBOL),
    (0x1FAF7, 0x1FAF8, SYMBOL), (0x2B739, 0x2B739, LETTER), (0x2EBF0, 0x2EE5D, LETTER),
    (0x31350, 0x323AF, LETTER),
)
_NEWER_STARTS = [r[0] for r in _NEWER_ASSIGNED]


def _compute_flags(ch: str) -> int:
    cat = unicodedata.category(ch)
    if cat == "Cn":
        cp = ord(ch)
        i = bisect.bisect_right(_NEWER_STARTS, cp) - 1
        flags = _NEWER_ASSIGNED[i][2] if i >= 0 and cp <= _NEWER_ASSIGNED[i][1] else UNDEFINED
    else:
        flags = _GROUP[cat[0]]
    if ch in WHITESPACE_CHARS:
        flags |= WHITESPACE
    return flags


_FLAGS: dict[str, int] = {}


def char_flags(ch: str) -> int:
    """Category group bits (plus WHITESPACE) of one character, as llama.cpp computes them."""
    f = _FLAGS.get(ch)
    if f is None:
        f = _FLAGS[ch] = _compute_flags(ch)
    return f


def flags_of(text: str) -> list[int]:
    """char_flags for every character of `text`."""
    get = _FLAGS.get
    out = [get(c) for c in text]
    if None in out:
        out = [char_flags(c) for c in text]
    return out


# --- collapsed text for the general regex path -------------------------------------------
# llama.cpp runs std::regex over a "collapsed" copy of the text where each non-ASCII code point
# becomes one placeholder byte naming its group; \p{..} classes in the pattern are rewritten to
# the same placeholders.  We do the same with Python's re.
COLLAPSED = {NUMBER: "\xd1", LETTER: "\xd2", PUNCTUATION: "\xd3", MARK: "\xd4", SYMBOL: "\xd5"}
COLLAPSED_OTHER = "\xd0"
COLLAPSED_SPACE = "\x0b"

_COLLAPSE: dict[str, str] = {}


def _collapse_char(ch: str) -> str:
    if ch < "\x80":
        return ch
    f = char_flags(ch)
    if f & WHITESPACE:
        return COLLAPSED_SPACE
    return COLLAPSED.get(f & 0xFF, COLLAPSED_OTHER)


def collapse(text: str) -> str:
    """One placeholder character per code point (ASCII kept as is)."""
    get = _COLLAPSE.get
    parts = []
    for c in text:
        r = get(c)
        if r is None:
            r = _COLLAPSE[c] = _collapse_char(c)
        parts.append(r)
    return "".join(parts)


def whitespace_to_vt(text: str) -> str:
    """Non-ASCII whitespace replaced by U+000B, as llama.cpp does before std::wregex."""
    if text.isascii():
        return text
    return "".join("\x0b" if (c >= "\x80" and c in WHITESPACE_CHARS) else c for c in text)


# --- GPT-2 byte-level mapping ------------------------------------------------------------
def _byte_to_unicode() -> list[str]:
    keep = list(range(0x21, 0x7F)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    table = [""] * 256
    for b in keep:
        table[b] = chr(b)
    n = 0
    for b in range(256):
        if not table[b]:
            table[b] = chr(256 + n)
            n += 1
    return table


BYTE_TO_UNICODE: list[str] = _byte_to_unicode()
UNICODE_TO_BYTE: dict[str, int] = {c: b for b, c in enumerate(BYTE_TO_UNICODE)}
# str.translate table: latin-1 decoded byte string -> byte-level unicode string
_BYTE_ENCODE_TABLE = {b: c for b, c in enumerate(BYTE_TO_UNICODE)}


def byte_encode(word: str) -> str:
    """GPT-2 byte-level encoding of a word's UTF-8 bytes."""
    # surrogatepass: a surrogate code point read from invalid input re-encodes as 3 bytes, as in llama.cpp
    return word.encode("utf-8", "surrogatepass").decode("latin-1").translate(_BYTE_ENCODE_TABLE)
