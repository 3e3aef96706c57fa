"""Choosing and applying a page's character encoding.

Order, as browsers do it (WHATWG "encoding sniffing"): a byte-order mark, then the charset of the
Content-Type header, then a `<meta charset>` or `<meta http-equiv>` in the first 4 KiB, then detection.
Labels are mapped the way browsers map them, because that is what page authors tested against: GB2312 is
read as GBK, Shift_JIS as Windows-31J (cp932), ISO-8859-1 and US-ASCII as windows-1252, EUC-KR as cp949.
Detection (charset-normalizer) is slow, so it runs only for undeclared bytes that are not valid UTF-8,
and only on a bounded sample. Broken bytes are replaced; nothing here raises on any input.
"""

from __future__ import annotations

import codecs
import re
from functools import lru_cache

__all__ = ["DETECTION_SAMPLE_BYTES", "META_SCAN_BYTES", "charset_of_content_type", "decode_to_utf8", "lookup"]

META_SCAN_BYTES = 4096  # where a <meta> charset must appear to count (WHATWG prescan reads 1024; be lenient)
DETECTION_SAMPLE_BYTES = 64 * 1024  # detection reads at most this much; enough to tell encodings apart

_HEADER_CHARSET = re.compile(r"""charset\s*=\s*["']?\s*([^"';,\s]+)""", re.I)
_META_CHARSET = re.compile(rb"""<meta\b[^>]*?charset\s*=\s*["']?\s*([A-Za-z0-9_\-.:+]+)""", re.I)

# Browser label mapping, to Python codec names.
_ALIASES = {
    "gb2312": "gbk",
    "gb_2312": "gbk",
    "gb_2312-80": "gbk",
    "csgb2312": "gbk",
    "chinese": "gbk",
    "iso-ir-58": "gbk",
    "x-gbk": "gbk",
    "gbk": "gbk",
    "shift_jis": "cp932",
    "shift-jis": "cp932",
    "sjis": "cp932",
    "x-sjis": "cp932",
    "ms_kanji": "cp932",
    "ms932": "cp932",
    "windows-31j": "cp932",
    "csshiftjis": "cp932",
    "iso-8859-1": "cp1252",
    "iso8859-1": "cp1252",
    "latin1": "cp1252",
    "l1": "cp1252",
    "us-ascii": "cp1252",
    "ascii": "cp1252",
    "euc-kr": "cp949",
    "ks_c_5601-1987": "cp949",
    "windows-949": "cp949",
    "tis-620": "cp874",
    "iso-8859-11": "cp874",
    "big5": "big5hkscs",
    "unicode-1-1-utf-8": "utf-8",
    "x-unicode20utf8": "utf-8",
    "utf8": "utf-8",
}
# Codecs a page may never choose: not text encodings, or dangerous (UTF-7 smuggles markup).
_REFUSED = frozenset(
    {"utf-7", "idna", "punycode", "raw-unicode-escape", "unicode-escape", "undefined", "mbcs", "oem"}
)
_NON_ASCII = re.compile(r"[^\x00-\x7f]")
_UTF16 = frozenset({"utf-16", "utf-16-le", "utf-16-be", "utf-32", "utf-32-le", "utf-32-be"})


def lookup(label: str | None) -> str | None:
    """The Python codec for a charset label, mapped as browsers map it; None if unknown or refused."""
    if not label:
        return None
    key = label.strip().strip("\"'").lower()
    key = _ALIASES.get(key, key)
    try:
        info = codecs.lookup(key)
    except (LookupError, ValueError):
        return None
    name = info.name
    if name in _REFUSED or not getattr(info, "_is_text_encoding", True):
        return None
    return _ALIASES.get(name, name)


def charset_of_content_type(content_type: str | None) -> str | None:
    """The codec named by a Content-Type header's charset parameter, if it names a usable one."""
    if not content_type:
        return None
    m = _HEADER_CHARSET.search(content_type)
    return lookup(m.group(1)) if m else None


def _bom(body: bytes) -> tuple[str, int] | None:
    if body.startswith(codecs.BOM_UTF8):
        return "utf-8", 3
    if body.startswith(codecs.BOM_UTF16_LE):
        return "utf-16-le", 2
    if body.startswith(codecs.BOM_UTF16_BE):
        return "utf-16-be", 2
    return None


def _meta_charset(body: bytes) -> str | None:
    m = _META_CHARSET.search(body, 0, META_SCAN_BYTES)
    if m is None:
        return None
    codec = lookup(m.group(1).decode("ascii"))
    # A <meta> that claims UTF-16 was read from ASCII-compatible bytes, so it cannot be true.
    return "utf-8" if codec in _UTF16 else codec


@lru_cache(maxsize=64)
def _single_byte(codec: str) -> bool:
    try:
        return len(bytes(range(128, 256)).decode(codec, "replace")) == 128
    except (LookupError, UnicodeError, ValueError):
        return False


def _symbol_count(sample: bytes, codec: str) -> int:
    """Non-ASCII characters that are not letters: what a wrong single-byte guess produces ("³", "¿")."""
    return sum(1 for ch in _NON_ASCII.findall(sample.decode(codec, "replace")) if not ch.isalpha())


def _detect(body: bytes) -> str:
    """Guess the encoding of undeclared bytes that are not UTF-8.

    charset-normalizer decides between multi-byte encodings well, but on short Latin text it often prefers
    a Baltic or Central European code page for French or German. So among its single-byte candidates the
    one whose text has the fewest non-letter symbols wins, ties going to windows-1252 (the browsers'
    fallback), then to the detector's order.
    """
    from charset_normalizer import from_bytes  # imported on first use: it is slow to import

    sample = body[:DETECTION_SAMPLE_BYTES]
    codecs_found = [c for c in (lookup(m.encoding) for m in from_bytes(sample)) if c is not None]
    if not codecs_found:
        return "cp1252"
    if not _single_byte(codecs_found[0]):
        return codecs_found[0]
    candidates = [c for c in dict.fromkeys(codecs_found) if _single_byte(c)]
    return min(
        candidates,
        key=lambda c: (_symbol_count(sample, c), c != "cp1252", candidates.index(c)),
    )


def decode_to_utf8(body: bytes, content_type: str | None) -> tuple[bytes, str]:
    """The page's bytes re-encoded as UTF-8 (bad bytes replaced), and the codec that was used."""
    bom = _bom(body)
    codec: str | None
    if bom is not None:
        codec, skip = bom
        body = body[skip:]
    else:
        codec = charset_of_content_type(content_type) or _meta_charset(body)
    if codec is None:
        try:
            body.decode("utf-8")
        except UnicodeDecodeError:
            codec = _detect(body)
        else:
            return body, "utf-8"
    if codec == "utf-8":
        try:
            body.decode("utf-8")
        except UnicodeDecodeError:
            pass
        else:
            return body, "utf-8"
    try:
        text = body.decode(codec, "replace")
    except (LookupError, UnicodeError, ValueError):
        codec = "utf-8"
        text = body.decode("utf-8", "replace")
    return text.encode("utf-8", "replace"), codec
