"""Request bodies: bounded in size, decompressed per Content-Encoding (also bounded: no bombs).

The output limit is handed to the decompressor itself (`max_length`), so a small body that
inflates to gigabytes stops at the limit instead of filling memory first.
"""

from __future__ import annotations

import zlib

import lz4.frame

try:  # Python 3.14+: in the standard library
    from compression import zstd
except ImportError:
    from backports import zstd

ENCODINGS = ("gzip", "deflate", "zstd", "lz4", "identity")
_DECODE_ERRORS = (zlib.error, zstd.ZstdError, RuntimeError, EOFError)


class BodyTooLarge(Exception):
    pass


class BadEncoding(Exception):
    pass


def _normal(encoding: str) -> str:
    return (encoding or "identity").strip().lower()


def _decoder(encoding: str):
    if encoding in ("gzip", "x-gzip", "deflate"):
        d = zlib.decompressobj(zlib.MAX_WBITS | 16 if "gzip" in encoding else zlib.MAX_WBITS)
        return d, lambda chunk, n: d.decompress(chunk, n)
    if encoding in ("zstd", "lz4"):
        d = zstd.ZstdDecompressor() if encoding == "zstd" else lz4.frame.LZ4FrameDecompressor()
        return d, lambda chunk, n: d.decompress(chunk, max_length=n)
    raise BadEncoding(f"unsupported Content-Encoding {encoding!r} (supported: {', '.join(ENCODINGS)})")


def _inflate(data: bytes, encoding: str, max_length: int) -> tuple[bytes, bool]:
    """At most `max_length` decoded bytes, and whether the compressed stream ended. A body may
    hold several gzip members (or zstd / lz4 frames) one after the other: all are decoded."""
    if encoding in ("", "identity"):
        return data[:max_length], True
    out, rest = [], data
    while True:
        d, decode = _decoder(encoding)
        out.append(decode(rest, max_length - sum(map(len, out))))
        rest = d.unused_data
        if not (d.eof and rest) or sum(map(len, out)) >= max_length:
            return b"".join(out), d.eof and not rest


def decompress(data: bytes, encoding: str, limit: int) -> bytes:
    """`data` decoded per Content-Encoding, refusing output over `limit` bytes."""
    encoding = _normal(encoding)
    if encoding in ("", "identity"):
        out = data
    else:
        try:
            out, ended = _inflate(data, encoding, limit + 1)
        except _DECODE_ERRORS as e:
            raise BadEncoding(f"cannot decode the {encoding} body: {e}") from None
        if len(out) <= limit and not ended:
            raise BadEncoding(f"truncated {encoding} body")
    if len(out) > limit:
        raise BodyTooLarge(f"decompressed body exceeds the limit of {limit} bytes")
    return out


def peek(data: bytes, encoding: str, size: int = 64) -> bytes:
    """The first `size` decoded bytes of a body, possibly not all received yet (to tell an INSERT
    from a statement early); b"" when they cannot be decoded (the full decode will say why)."""
    try:
        return _inflate(data, _normal(encoding), size)[0]
    except (BadEncoding, *_DECODE_ERRORS):
        return b""
