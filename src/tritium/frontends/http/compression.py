"""HTTP body compression: Content-Encoding in, Accept-Encoding out (gzip, deflate)."""

from __future__ import annotations

import zlib
from collections.abc import Iterable

from tritium.core.errors import invalid

Part = bytes | memoryview  # as tensor_data.Part; kept local so compression needs no tensors


# zlib window bits: 15 = zlib stream ("deflate" on the wire), 31 = gzip, 47 = either.
_WBITS = {"gzip": 31, "deflate": 15}


def decompress_body(body: bytes | memoryview, content_encoding: str | None,
                    limit: int) -> bytes | memoryview:
    """Undo the request's Content-Encoding, refusing output larger than ``limit``."""
    encoding = (content_encoding or "identity").strip().lower()
    if encoding == "identity":
        return body
    if encoding not in _WBITS:
        raise invalid(
            f"unsupported Content-Encoding '{content_encoding}'; use gzip, deflate or identity"
        )
    inflater = zlib.decompressobj(47)
    try:
        out = inflater.decompress(body, limit + 1)
    except zlib.error as exc:
        raise invalid(f"failed to decompress the {encoding} request body: {exc}") from None
    if len(out) > limit or inflater.unconsumed_tail:
        raise invalid(
            f"Decompressed data size exceeds the maximum allowed value of {limit} bytes. "
            "Use --http-max-input-size to increase the limit."
        )
    if not inflater.eof:
        raise invalid(f"failed to decompress the {encoding} request body: truncated data")
    if inflater.unused_data:
        raise invalid(f"failed to decompress the {encoding} request body: bytes follow the "
                      "compressed data")
    return out


def choose_encoding(accept_encoding: str | None) -> str | None:
    """gzip or deflate when Accept-Encoding prefers one (highest q wins), else None."""
    best, best_weight = None, 0.0
    for item in (accept_encoding or "").split(","):
        coding, *params = item.split(";")
        coding = coding.strip().lower()
        weight = 1.0
        for param in params:
            key, _, value = param.partition("=")
            if key.strip() == "q":
                try:
                    weight = float(value)
                except ValueError:
                    weight = 0.0
        if coding in ("identity", "gzip", "deflate") and weight > best_weight:
            best, best_weight = coding, weight
    return best if best in _WBITS else None


def compress_response(
    parts: Iterable[Part], accept_encoding: str | None
) -> tuple[str | None, list[Part]]:
    """Compress the body per Accept-Encoding: (Content-Encoding or None, new parts)."""
    encoding = choose_encoding(accept_encoding) if accept_encoding else None
    if encoding is None:
        return None, list(parts)
    deflater = zlib.compressobj(wbits=_WBITS[encoding])
    chunks = [deflater.compress(part) for part in parts]
    chunks.append(deflater.flush())
    return encoding, [b"".join(chunks)]
