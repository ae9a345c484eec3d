"""Request bodies: bounded in size, decompressed per Content-Encoding (also bounded: no bombs)."""

from __future__ import annotations

import zlib

import lz4.frame

try:  # Python 3.14+: in the standard library
    from compression import zstd
except ImportError:
    from backports import zstd

ENCODINGS = ("gzip", "deflate", "zstd", "lz4", "identity")


class BodyTooLarge(Exception):
    pass


class BadEncoding(Exception):
    pass


def decompress(data: bytes, encoding: str, limit: int) -> bytes:
    """`data` decoded per Content-Encoding, refusing output over `limit` bytes."""
    encoding = (encoding or "identity").strip().lower()
    try:
        if encoding in ("", "identity"):
            out = data
        elif encoding in ("gzip", "x-gzip", "deflate"):
            d = zlib.decompressobj(zlib.MAX_WBITS | 16 if "gzip" in encoding else zlib.MAX_WBITS)
            out = d.decompress(data, limit + 1)
            if len(out) <= limit and not d.eof:
                raise BadEncoding(f"truncated {encoding} body")
        elif encoding in ("zstd", "lz4"):
            d = zstd.ZstdDecompressor() if encoding == "zstd" else lz4.frame.LZ4FrameDecompressor()
            out = d.decompress(data, max_length=limit + 1)
            if len(out) <= limit and not d.eof:
                raise BadEncoding(f"truncated {encoding} body")
        else:
            raise BadEncoding(f"unsupported Content-Encoding {encoding!r} (supported: {', '.join(ENCODINGS)})")
    except (zlib.error, zstd.ZstdError, RuntimeError, EOFError) as e:
        raise BadEncoding(f"cannot decode the {encoding} body: {e}") from None
    if len(out) > limit:
        raise BodyTooLarge(f"decompressed body exceeds the limit of {limit} bytes")
    return out
