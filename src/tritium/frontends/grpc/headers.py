"""A connection's HPACK decoder, with the repeated header blocks of a busy client remembered."""

from __future__ import annotations

import hpack

from tritium.frontends.grpc.http2 import H2Error, ProtocolViolation, references_only

_CACHE_SIZE = 64
# RFC 9113 8.2.2: connection-specific fields make a request malformed (te only as trailers).
_CONNECTION_FIELDS = frozenset({"connection", "keep-alive", "proxy-connection",
                                "transfer-encoding", "upgrade"})


class MalformedHeaders(Exception):
    """A header block that decoded (the table is in step) but makes a malformed request:
    a stream error, not a connection error (RFC 9113 8.1.1)."""


class HeaderDecoder:
    """Header blocks to fields. A client repeating a call sends the same block of table
    references each time; such a block does not change the decoder's table, so its fields
    are remembered until a block that may change the table arrives."""

    def __init__(self, max_header_list_bytes: int):
        self._decoder = hpack.Decoder(max_header_list_size=max_header_list_bytes)
        self._cache: dict[bytes, dict[str, str]] = {}  # never mutated once stored

    def decode(self, block: bytes) -> dict[str, str]:
        cache = self._cache
        headers = cache.get(block)
        if headers is not None:
            return headers
        try:
            fields = self._decoder.decode(block, raw=True)
        except hpack.HPACKError as exc:
            raise ProtocolViolation(H2Error.COMPRESSION_ERROR, f"bad header block: {exc}") from None
        headers = {name.decode("latin-1"): value.decode("latin-1") for name, value in fields}
        # RFC 9113 8.2.1/8.2.2: names in lower case, no connection-specific fields.
        names = "".join(headers)
        if not (names.islower() or names == names.lower()) \
                or not _CONNECTION_FIELDS.isdisjoint(headers) \
                or headers.get("te", "trailers") != "trailers":
            raise MalformedHeaders
        if not references_only(block):
            cache.clear()
        elif len(cache) < _CACHE_SIZE:
            cache[block] = headers
        return headers

