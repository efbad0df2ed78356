"""Logins under concurrency (SPEC §15): an attempt is counted before its password
is checked, so forty wrong passwords at once get no more checks than the throttle
allows; a process runs at most `RIFT_LOGIN_CONCURRENCY` checks at once."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from rift.catalog import StaticImages
from rift.domain.clock import FakeClock
from rift.services.access import accounts, sessions
from rift.services.access.sessions import PER_ADDRESS, PER_NAME_AND_ADDRESS, _keys
from rift.services.context import Deps
from rift.services.ports import Store
from tests.support.engine import FakePool

PASSWORD = "correct horse battery"


def _try(deps: Deps, name: str, password: str, address: str = "10.0.0.9",
         checks: threading.Semaphore | None = None) -> str:
    try:
        sessions.log_in(deps, sessions.LoginAttempt(name, password, address), 3600, checks)
    except sessions.LoginBusy:
        return "busy"
    except sessions.LoginThrottled:
        return "throttled"
    except sessions.LoginRefused:
        return "checked"
    return "in"


def _counts(deps: Deps, name: str, address: str = "10.0.0.9") -> list[int]:
    with deps.store.read() as tx:
        found = [tx.web.login_failures(key) for _, key in _keys(name, address)]
    return [f.failures if f is not None else 0 for f in found]


def test_forty_wrong_passwords_at_once_get_only_the_free_checks(deps: Deps) -> None:
    accounts.add_user(deps, "ada", PASSWORD)
    with ThreadPoolExecutor(40) as pool:
        answers = list(pool.map(lambda _: _try(deps, "ada", "wrong-wrong"), range(40)))
    assert answers.count("checked") == PER_NAME_AND_ADDRESS.free, answers
    assert answers.count("throttled") == 40 - PER_NAME_AND_ADDRESS.free
    assert _counts(deps, "ada") == [PER_NAME_AND_ADDRESS.free] * 2
    # and the right password is throttled too until the wait is over
    assert _try(deps, "ada", PASSWORD) == "throttled"


def test_concurrent_wrong_passwords_are_counted_before_their_checks_on_each_database(
        store: Store) -> None:
    """The same rule where the store is PostgreSQL (row locks, not a file lock)."""
    deps = Deps(store=store, clock=FakeClock(), hosts=FakePool(),
                images=StaticImages(["debian"]))
    accounts.add_user(deps, "ada", PASSWORD)
    with ThreadPoolExecutor(20) as pool:
        answers = list(pool.map(lambda _: _try(deps, "ada", "wrong-wrong"), range(20)))
    assert answers.count("checked") == PER_NAME_AND_ADDRESS.free, answers
    assert _counts(deps, "ada") == [PER_NAME_AND_ADDRESS.free] * 2


def test_a_login_beyond_the_concurrent_checks_is_busy_and_counts_nothing(deps: Deps) -> None:
    accounts.add_user(deps, "ada", PASSWORD)
    checks = threading.BoundedSemaphore(2)
    assert checks.acquire(blocking=False) and checks.acquire(blocking=False)
    assert _try(deps, "ada", "wrong-wrong", checks=checks) == "busy"
    assert _counts(deps, "ada") == [0, 0]
    checks.release()
    assert _try(deps, "ada", PASSWORD, checks=checks) == "in"
    assert checks.acquire(blocking=False)  # the check gave its place back
    assert not checks.acquire(blocking=False)


def test_at_most_the_allowed_checks_run_at_once(deps: Deps, monkeypatch: pytest.MonkeyPatch,
                                               ) -> None:
    """Many names from many addresses (no throttle applies): never more than the
    budget of argon2 checks at once; the rest are told at once."""
    accounts.add_user(deps, "ada", PASSWORD)
    running = 0
    most = 0
    lock = threading.Lock()
    release = threading.Event()
    real_verify = accounts.verify_password

    def slow_verify(deps: Deps, name: str, password: str) -> bool:
        nonlocal running, most
        with lock:
            running += 1
            most = max(most, running)
        release.wait(5)
        try:
            return real_verify(deps, name, password)
        finally:
            with lock:
                running -= 1

    monkeypatch.setattr(accounts, "verify_password", slow_verify)
    checks = threading.BoundedSemaphore(4)
    with ThreadPoolExecutor(40) as pool:
        futures = [pool.submit(_try, deps, f"user{i}", "wrong-wrong", f"10.1.0.{i}", checks)
                   for i in range(40)]
        threading.Timer(0.5, release.set).start()
        answers = [f.result(timeout=10) for f in futures]
    assert most == 4, most
    assert answers.count("checked") >= 4 and answers.count("busy") >= 30, answers
    assert answers.count("checked") + answers.count("busy") == 40


def test_a_success_takes_its_count_back(deps: Deps) -> None:
    accounts.add_user(deps, "ada", PASSWORD)
    for _ in range(PER_ADDRESS.free + 5):
        assert _try(deps, "ada", PASSWORD) == "in"
    assert _counts(deps, "ada") == [0, 0]
