"""Boxes page logins: sessions kept in the store, failed logins slowed down.

A session id is 32 random bytes (URL-safe base64, 43 characters) that lives in
the person's cookie; the store keeps only its SHA-256 digest, with an expiry,
so any replica sharing the database answers for it and logout ends it at once.

Failed logins are counted in the store under two keys: the user name with the
client address, and the address alone. Past a few free failures, each further
attempt under a key must wait ``base * 2**(failures - free)`` seconds after the
last failure (capped), and is refused without a password check until then.
Counts are forgotten a while after the last failure and cleared by a success.

An attempt is counted as a failure *before* its password is checked, in the same
write that finds it may be checked (SPEC §15): concurrent attempts queue on that
write (SQLite's write lock, PostgreSQL's row lock of the count), so forty wrong
passwords at once get no more checks than the throttle allows. A success, or an
attempt turned away unchecked because `RIFT_LOGIN_CONCURRENCY` argon2 checks are
running already (`LoginBusy`, a 429), takes its count back.
"""

from __future__ import annotations

import hashlib
import hmac
import math
import threading
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from rift.domain.records import LoginFailures, WebSession
from rift.domain.secrets import digest, new_secret
from rift.services.access import accounts
from rift.services.context import Deps
from rift.services.ports import Tx

# The cookie a signed-in person's session id lives in: the Boxes page sets it; the
# doors' gate reads it too (a logout form posted without a live session goes to the login).
SESSION_COOKIE = "rift_session"
MAX_NAME = 64
MAX_PASSWORD = 1024
_ID_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_")


@dataclass(frozen=True)
class Throttle:
    """Failures allowed free under one key, then an exponential wait."""

    prefix: str
    free: int
    base_s: float = 1.0
    max_s: float = 300.0
    forget_s: int = 900  # a count is forgotten this long after its last failure

    def wait_s(self, found: LoginFailures | None, now: datetime) -> float:
        """Seconds until the next attempt under this key may be checked (0: now)."""
        if found is None or self.forgotten(found, now) or found.failures < self.free:
            return 0.0
        delay = min(self.max_s, self.base_s * 2.0 ** min(found.failures - self.free, 32))
        return max(0.0, (found.last_failed_at - now).total_seconds() + delay)

    def forgotten(self, found: LoginFailures, now: datetime) -> bool:
        return now - found.last_failed_at >= timedelta(seconds=self.forget_s)


# Three free guesses per user name and address, then 1 s, 2 s, 4 s … up to 5 min;
# an address spraying many names gets thirty free, then the same curve.
PER_NAME_AND_ADDRESS = Throttle("pair", free=3)
PER_ADDRESS = Throttle("addr", free=30)


class LoginRefused(Exception):
    """A wrong password or an unknown user: one answer for both."""


class LoginThrottled(Exception):
    """Too many recent failures under this name or address."""

    def __init__(self, retry_after_s: int) -> None:
        super().__init__(f"too many failed logins; try again in {retry_after_s} s")
        self.retry_after_s = retry_after_s


class LoginBusy(LoginThrottled):
    """`RIFT_LOGIN_CONCURRENCY` password checks are running already."""

    def __init__(self) -> None:
        super().__init__(1)


@dataclass(frozen=True)
class NewSession:
    session_id: str = field(repr=False)  # goes in the cookie; never stored
    user: str
    expires_at: datetime


def _keys(name: str, address: str) -> list[tuple[Throttle, str]]:
    def key(policy: Throttle, text: str) -> str:
        return f"{policy.prefix}:{hashlib.sha256(text.encode()).hexdigest()}"

    return [(PER_NAME_AND_ADDRESS, key(PER_NAME_AND_ADDRESS, f"{name}\0{address}")),
            (PER_ADDRESS, key(PER_ADDRESS, address))]


def _wait_s(tx: Tx, keys: list[tuple[Throttle, str]], now: datetime) -> float:
    return max(policy.wait_s(tx.web.login_failures(key), now) for policy, key in keys)


def _count_attempt(deps: Deps, keys: list[tuple[Throttle, str]], now: datetime) -> None:
    """Count the attempt as a failure, or refuse it (`LoginThrottled`, nothing
    counted) when a key must wait. The count's increment comes before the wait is
    judged, so it holds the count's row (or SQLite's write lock) until this
    commits: a concurrent attempt judges after it, counting this one."""
    with deps.store.write() as tx:
        wait = 0.0
        for policy, key in keys:
            found = tx.web.login_failures(key)
            if found is not None and policy.forgotten(found, now):
                tx.web.clear_login_failures(key)
                found = None
            count = tx.web.add_login_failure(key, now)
            if found is None or count - 1 != found.failures:  # a concurrent attempt counted
                found = LoginFailures(key, count - 1, now) if count > 1 else None
            wait = max(wait, policy.wait_s(found, now))
        if wait > 0:
            raise LoginThrottled(max(1, math.ceil(wait)))  # rolls the counts back
        forget = max(policy.forget_s for policy, _ in keys)
        tx.web.purge_login_failures(now - timedelta(seconds=forget))


def _uncount(deps: Deps, keys: list[tuple[Throttle, str]]) -> None:
    with deps.store.write() as tx:
        for _policy, key in keys:
            tx.web.uncount_login_failure(key)


@dataclass(frozen=True)
class LoginAttempt:
    """A sign-in as the page posts it: the name, the password (never in a repr) and
    the address it came from."""

    name: str
    password: str = field(repr=False)
    address: str = "unknown"


def log_in(deps: Deps, attempt: LoginAttempt, ttl_s: int,
           checks: threading.Semaphore | None = None) -> NewSession:
    """A new session for ``attempt.name``, or ``LoginRefused`` / ``LoginThrottled`` /
    ``LoginBusy`` (when ``checks``, the process's budget of password checks at
    once, is spent).

    An unknown name costs one argon2id verify like a known one (see
    ``accounts.verify_password``), so the answer and its time say nothing about
    which names exist.
    """
    name, password, address = attempt.name, attempt.password, attempt.address
    now = deps.clock.now()
    keys = _keys(name, address)
    with deps.store.read() as tx:
        wait = _wait_s(tx, keys, now)
    if wait > 0:  # the common refusal: no write
        raise LoginThrottled(max(1, math.ceil(wait)))
    _count_attempt(deps, keys, now)
    if checks is not None and not checks.acquire(blocking=False):
        _uncount(deps, keys)
        raise LoginBusy()
    try:
        fits = 0 < len(name) <= MAX_NAME and len(password) <= MAX_PASSWORD
        ok = accounts.verify_password(deps, name[:MAX_NAME], password[:MAX_PASSWORD]) and fits
    finally:
        if checks is not None:
            checks.release()
    if not ok:
        raise LoginRefused()  # counted already
    session_id = new_secret()
    session = WebSession(digest(session_id), name, now, now + timedelta(seconds=ttl_s))
    with deps.store.write() as tx:
        tx.web.clear_login_failures(keys[0][1])
        tx.web.uncount_login_failure(keys[1][1])
        tx.web.purge_sessions(now)
        tx.web.add_session(session)
    deps.log.info("web login", extra={"user": name})
    return NewSession(session_id, name, session.expires_at)


def _well_formed(session_id: str) -> bool:
    return len(session_id) == 43 and set(session_id) <= _ID_CHARS


def session_user(deps: Deps, session_id: str | None) -> str | None:
    """The user a live session belongs to; None when missing, unknown or expired."""
    if not session_id or not _well_formed(session_id):
        return None
    with deps.store.read() as tx:
        found = tx.web.get_session(digest(session_id))
    if found is None or found.expires_at <= deps.clock.now():
        return None
    return found.user


def log_out(deps: Deps, session_id: str | None) -> bool:
    """End the session at once, on every replica. True when there was one."""
    if not session_id or not _well_formed(session_id):
        return False
    with deps.store.write() as tx:
        return tx.web.delete_session(digest(session_id))


def form_token() -> str:
    """A fresh random token for a form that has no session yet (the login)."""
    return new_secret()


def session_form_token(session_id: str) -> str:
    """The token a signed-in page's forms carry (logout): derived from the
    session id, which only the person's browser holds (HttpOnly cookie)."""
    return hashlib.sha256(f"rift-form\0{session_id}".encode()).hexdigest()


def same_token(given: str | None, expected: str | None) -> bool:
    if not given or not expected:
        return False
    return hmac.compare_digest(given.encode(), expected.encode())
