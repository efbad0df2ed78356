"""A TLS ClientHello, parsed strictly (SPEC §15: fail closed): the whole message,
every record of it, however the client split it into records, and its server name
(SNI). Any length that disagrees with another is a `BadHello`, never a guess."""

from __future__ import annotations

TLS_RECORD_LIMIT = 16 * 1024 + 256  # a TLSPlaintext record's body at most (RFC 8446 §5.1)
HELLO_LIMIT = 32 * 1024  # a ClientHello's records, all told


class BadHello(ValueError):
    """Bytes that are not one whole, well-formed TLS ClientHello."""


def hello_message(records: bytes) -> bytes:
    """The ClientHello handshake message carried by `records` (TLS handshake records,
    the message possibly split across several); BadHello unless they are exactly
    one whole ClientHello and nothing more, within HELLO_LIMIT."""
    if len(records) > HELLO_LIMIT:
        raise BadHello(f"a ClientHello of more than {HELLO_LIMIT} bytes")
    message, at = b"", 0
    while at < len(records):
        if at + 5 > len(records):
            raise BadHello("a TLS record cut short")
        kind, length = records[at], int.from_bytes(records[at + 3:at + 5], "big")
        if kind != 0x16 or records[at + 1] != 0x03 or not 0 < length <= TLS_RECORD_LIMIT:
            raise BadHello("not a TLS handshake record")
        if at + 5 + length > len(records):
            raise BadHello("a TLS record cut short")
        message += records[at + 5:at + 5 + length]
        at += 5 + length
    if len(message) < 4 or message[0] != 0x01:
        raise BadHello("not a ClientHello")
    if len(message) != 4 + int.from_bytes(message[1:4], "big"):
        raise BadHello("a ClientHello cut short, or with more after it")
    return message


def hello_server_name(message: bytes) -> str | None:
    """The server name (SNI) a ClientHello handshake message asks for, None when it
    names none; BadHello when any length in it disagrees with the others."""

    def take(at: int, size: int) -> tuple[bytes, int]:
        if at + size > len(message):
            raise BadHello("a ClientHello field runs past its end")
        return message[at:at + size], at + size

    def vector(at: int, width: int) -> tuple[bytes, int]:
        size, at = take(at, width)
        return take(at, int.from_bytes(size, "big"))

    at = 4 + 2 + 32  # handshake header, legacy version, random
    session, at = vector(at, 1)
    suites, at = vector(at, 2)
    methods, at = vector(at, 1)
    if len(session) > 32 or not suites or len(suites) % 2 or not methods:
        raise BadHello("a ClientHello's session id, cipher suites or compression is wrong")
    if at == len(message):
        return None  # no extensions at all
    extensions, at = vector(at, 2)
    if at != len(message):
        raise BadHello("bytes after a ClientHello's extensions")
    name, seen, pos = None, set(), 0
    while pos < len(extensions):
        if pos + 4 > len(extensions):
            raise BadHello("an extension cut short")
        kind = int.from_bytes(extensions[pos:pos + 2], "big")
        size = int.from_bytes(extensions[pos + 2:pos + 4], "big")
        body = extensions[pos + 4:pos + 4 + size]
        if len(body) != size or kind in seen:
            raise BadHello("an extension cut short, or twice")
        seen.add(kind)
        pos += 4 + size
        if kind != 0:
            continue
        if len(body) < 2 or int.from_bytes(body[:2], "big") != len(body) - 2:
            raise BadHello("a server_name extension whose list length is wrong")
        entry = body[2:]
        if len(entry) < 3 or entry[0] != 0:
            raise BadHello("a server_name extension without one host_name")
        length = int.from_bytes(entry[1:3], "big")
        if len(entry) != 3 + length or length == 0:
            raise BadHello("a server_name extension with more or less than one host_name")
        raw = entry[3:]
        if not all(0x21 <= byte < 0x7F for byte in raw):
            raise BadHello("a server name that is not printable ASCII")
        name = raw.decode("ascii").lower().rstrip(".")
    return name


def server_name(hello: bytes) -> str | None:
    """The server name (SNI) of a whole TLS ClientHello (its records); None when it
    has none or `hello` is not one, whole."""
    try:
        return hello_server_name(hello_message(hello))
    except BadHello:
        return None


def hello_whole(records: bytes) -> bool:
    """Whether whole TLS records `records` carry as much as their handshake message
    says it holds (its length is in its first 4 bytes, which may span records)."""
    message, at = b"", 0
    while at + 5 <= len(records):
        size = int.from_bytes(records[at + 3:at + 5], "big")
        message += records[at + 5:at + 5 + size]
        at += 5 + size
    return len(message) >= 4 and len(message) >= 4 + int.from_bytes(message[1:4], "big")
