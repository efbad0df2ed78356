"""What envd's `/files` route takes and gives beyond the bytes, as pure values:

- **gzip**: an upload with `Content-Encoding: gzip` is inflated here, bounded (a
  body that inflates past 16 MiB is refused, whatever its ratio); a read whose
  `Accept-Encoding` names gzip is answered compressed (`Content-Encoding: gzip`).
- **metadata**: `X-Metadata-<key>: <value>` headers, E2B's file metadata: keys
  HTTP tokens (lowercased), values printable ASCII; kept on the file as
  `user.e2b.<key>` extended attributes by `settle` (python3 in the guest: busybox
  has no xattr tool; a guest without python3 cannot hold metadata).
- **signed URLs**: the SDK's `download_url`/`upload_url` of a secured sandbox
  carry `signature=v1_<base64 sha256 of path:operation:user:token[:expiration]>`
  and `signature_expiration`; the token is the sandbox's envdAccessToken (its
  task's handle), which this process holds in memory only (never stored).
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import hmac
import shlex
import zlib
from collections.abc import Iterable, Mapping

from rift.contract.base import MAX_CONTENT
from rift.domain.errors import InvalidArgument
from rift.e2b.entries import META_PREFIX

METADATA_HEADER = "x-metadata-"
MAX_METADATA = 64
_TOKEN = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
                   "!#$%&'*+-.^_`|~")
NO_METADATA_HERE = 23  # the settle script's exit code: the guest cannot hold metadata

# Clears the file's user.e2b.* attributes, then sets the given ones (hex pairs).
_SET_META = f"""\
import os,sys
p=sys.argv[1]
try:
 for k in os.listxattr(p):
  if k.startswith('{META_PREFIX}'):os.removexattr(p,k)
except OSError:pass
try:
 for a in sys.argv[2:]:
  k,v=a.split('=')
  os.setxattr(p,'{META_PREFIX}'+bytes.fromhex(k).decode(),bytes.fromhex(v))
except OSError:sys.exit({NO_METADATA_HERE})
"""


def inflate(body: bytes) -> bytes:
    """A gzip body's bytes, at most MAX_CONTENT of them (a bomb is refused early)."""
    inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
    try:
        data = inflater.decompress(body, MAX_CONTENT + 1)
    except zlib.error as exc:
        raise InvalidArgument("body", f"is not gzip: {exc}") from exc
    if len(data) > MAX_CONTENT or inflater.unconsumed_tail:
        raise InvalidArgument("content", "at most 16 MiB once inflated")
    if not inflater.eof:
        raise InvalidArgument("body", "the gzip stream is cut short")
    return data


def wants_gzip(accept_encoding: str) -> bool:
    for part in accept_encoding[:1024].split(","):
        name, _, params = part.strip().partition(";")
        if name.strip().lower() == "gzip":
            return params.strip().replace(" ", "") not in ("q=0", "q=0.0", "q=0.00")
    return False


def deflate(data: bytes) -> bytes:
    return gzip.compress(data, compresslevel=1)  # speed over size: the link is local


def metadata_of(headers: Iterable[tuple[str, str]]) -> dict[str, str] | None:
    """The upload's metadata from its `X-Metadata-*` headers, or None; bad names or
    values are invalid_argument (envd's 400)."""
    found: dict[str, str] = {}
    for name, value in headers:
        lowered = name.lower()
        if not lowered.startswith(METADATA_HEADER):
            continue
        key = lowered[len(METADATA_HEADER):]
        if not key or len(key) > 128 or not set(key) <= _TOKEN:
            raise InvalidArgument("metadata", f"{key[:40]!r} is not a metadata key")
        if len(value) > 1024 or not all(" " <= ch <= "~" for ch in value):
            raise InvalidArgument("metadata", f"the value of {key!r} is not printable ASCII")
        found[key] = value
    if len(found) > MAX_METADATA:
        raise InvalidArgument("metadata", f"at most {MAX_METADATA} keys")
    return found or None


def settle(path: str, user: str, metadata: Mapping[str, str] | None) -> str:
    """The shell script run after a write: the file given to `user` as envd gives
    it (to root where the guest has no such user), its `user.e2b.*` attributes
    replaced by `metadata` (cleared without), where the guest has python3."""
    who = shlex.quote(user)
    pairs = " ".join(f"{k.encode().hex()}={v.encode().hex()}"
                     for k, v in (metadata or {}).items())
    lacking = f"exit {NO_METADATA_HERE}" if metadata else "true"
    return (f"p={shlex.quote(path)}; if id -u {who} >/dev/null 2>&1; then "
            f"chown \"$(id -u {who}):$(id -g {who})\" -- \"$p\" || exit 1; "
            f"else chown 0:0 -- \"$p\" || exit 1; fi; "
            f"if command -v python3 >/dev/null 2>&1; then exec python3 -S -c "
            f"{shlex.quote(_SET_META)} \"$p\" {pairs}; else {lacking}; fi")


def signature(path: str, operation: str, user: str, token: str,
              expiration: int | None) -> str:
    """E2B's v1 signature of a file URL (the SDK's `get_signature`)."""
    raw = f"{path}:{operation}:{user}:{token}"
    if expiration is not None:
        raw += f":{expiration}"
    digest = hashlib.sha256(raw.encode()).digest()
    return "v1_" + base64.b64encode(digest).rstrip(b"=").decode("ascii")


def signed_by(query: Mapping[str, str], operation: str, now: float,
              held: Iterable[tuple[str, str]]) -> tuple[str, str]:
    """The (sandbox, handle) whose token signed this URL, among the held ones.
    Raises PermissionError with envd's message when none did or it expired."""
    given = query.get("signature", "")
    raw_expiration = query.get("signature_expiration")
    expiration = None
    if raw_expiration is not None:
        if not raw_expiration.lstrip("-").isdigit() or len(raw_expiration) > 20:
            raise PermissionError("invalid signature expiration")
        expiration = int(raw_expiration)
        if expiration < now:
            raise PermissionError("signature is already expired")
    if not given.startswith("v1_") or len(given) > 100:
        raise PermissionError("invalid signature")
    path, user = query.get("path", ""), query.get("username", "")
    for sandbox, handle in held:
        if hmac.compare_digest(signature(path, operation, user, handle, expiration), given):
            return sandbox, handle
    raise PermissionError("invalid signature")
