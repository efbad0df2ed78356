"""Users and tokens: argon2id passwords, SHA-256 token digests, revocation."""

from __future__ import annotations

import pytest

from rift.services.access import accounts
from rift.services.context import Deps
from tests.support.engine import refused


def test_a_token_names_its_user_and_labels_the_caller(deps: Deps) -> None:
    accounts.add_user(deps, "alice", "a good password")
    made = accounts.new_token(deps, "alice", "laptop")
    record, caller = accounts.authenticate(deps, made.token.value)
    assert record.id == made.record.id and caller.user == "alice"
    assert caller.label == "api:laptop"
    assert made.record.digest != made.token.value and made.token.value not in repr(made)
    assert caller.operator is False and record.operator is False


def test_only_a_token_made_as_an_operators_names_an_operator(deps: Deps) -> None:
    accounts.add_user(deps, "alice")
    plain = accounts.new_token(deps, "alice", "agent")
    ops = accounts.new_token(deps, "alice", "prometheus", operator=True)
    assert accounts.authenticate(deps, plain.token.value)[1].operator is False
    record, caller = accounts.authenticate(deps, ops.token.value)
    assert record.operator is True and caller.operator is True
    assert caller.user == "alice" and caller.label == "api:prometheus"
    assert {t.label: t.operator for t in accounts.list_tokens(deps, "alice")} == {
        "agent": False, "prometheus": True}


def test_missing_malformed_unknown_and_revoked_tokens_are_unauthorized(deps: Deps) -> None:
    accounts.add_user(deps, "alice")
    made = accounts.new_token(deps, "alice")
    for bad in (None, "", "Bearer x", "rift_short", "rift_" + "A" * 43):
        err = refused("unauthorized", accounts.authenticate, deps, bad)
        assert "rift token new" in err.hint
    assert accounts.revoke_token(deps, made.record.id)
    refused("unauthorized", accounts.authenticate, deps, made.token.value)
    assert not accounts.revoke_token(deps, made.record.id)  # once


def test_passwords_are_argon2id_and_verify(deps: Deps) -> None:
    user = accounts.add_user(deps, "alice", "correct horse")
    assert user.password_hash is not None and user.password_hash.startswith("$argon2id$")
    assert accounts.verify_password(deps, "alice", "correct horse")
    assert not accounts.verify_password(deps, "alice", "wrong horse")
    assert not accounts.verify_password(deps, "nobody", "correct horse")


def test_a_user_without_a_password_cannot_log_in(deps: Deps) -> None:
    accounts.add_user(deps, "robot")
    assert not accounts.verify_password(deps, "robot", "")


@pytest.mark.parametrize("name", ["", "Alice", "a b", "-x", "x" * 65, "a/b"])
def test_bad_user_names_are_refused(deps: Deps, name: str) -> None:
    refused("invalid_argument", accounts.add_user, deps, name)


def test_a_user_name_is_taken_once_and_short_passwords_are_refused(deps: Deps) -> None:
    accounts.add_user(deps, "alice")
    refused("invalid_argument", accounts.add_user, deps, "alice")
    refused("invalid_argument", accounts.add_user, deps, "bob", "short")
    refused("invalid_argument", accounts.new_token, deps, "nobody")
