import hashlib
import re

from rift.domain.ids import is_task_id, is_vm_id, new_task_id, new_token_id, new_vm_id
from rift.domain.secrets import Handle, Token, digest, matches


def test_ids_are_a_prefix_and_eight_lowercase_base32_characters() -> None:
    assert re.fullmatch(r"task_[a-z2-7]{8}", new_task_id())
    assert re.fullmatch(r"vm_[a-z2-7]{8}", new_vm_id())
    assert re.fullmatch(r"tok_[a-z2-7]{8}", new_token_id())
    assert is_task_id("task_k3v9x2m7") is False  # 9 is not base32
    assert is_task_id("task_k3v7x2m7") and is_vm_id("vm_abcdefgh")
    assert not is_task_id("vm_abcdefgh") and not is_task_id("task_ABCDEFGH")


def test_ids_do_not_repeat_in_ten_thousand_draws() -> None:
    assert len({new_task_id() for _ in range(10_000)}) == 10_000


def test_a_handle_is_the_task_id_a_dot_and_43_characters_of_url_safe_base64() -> None:
    handle = Handle.mint("task_abcdefgh")
    text = str(handle)
    task_id, secret = text.split(".")
    assert task_id == "task_abcdefgh"
    assert re.fullmatch(r"[A-Za-z0-9_-]{43}", secret)
    assert Handle.parse(text) == handle


def test_malformed_handles_do_not_parse() -> None:
    good = str(Handle.mint("task_abcdefgh"))
    for bad in ["", "task_abcdefgh", "task_abcdefgh.", good + "x", good[:-1], "vm_abcdefgh." +
                good.split(".")[1], "task_ABCDEFGH." + good.split(".")[1], good.replace(".", ":"),
                good[:20] + "!" + good[21:]]:
        assert Handle.parse(bad) is None, bad


def test_a_handles_repr_hides_its_secret() -> None:
    handle = Handle.mint("task_abcdefgh")
    assert handle.secret not in repr(handle)
    assert "hidden" in repr(handle)
    token = Token.mint()
    assert token.value not in repr(token)


def test_only_the_sha256_digest_is_compared() -> None:
    handle = Handle.mint("task_abcdefgh")
    assert handle.digest == hashlib.sha256(handle.secret.encode()).hexdigest()
    assert matches(handle.secret, handle.digest)
    assert not matches(handle.secret, digest("other"))
    assert not matches(handle.secret, None)


def test_tokens_are_rift_and_43_characters() -> None:
    token = Token.mint()
    assert re.fullmatch(r"rift_[A-Za-z0-9_-]{43}", token.value)
    assert Token.looks_valid(token.value)
    assert not Token.looks_valid("rift_short")
    assert Token.mint().value != token.value


def test_a_trailing_newline_does_not_pass_for_an_id_a_handle_or_a_token() -> None:
    handle = str(Handle.mint("task_abcdefgh"))
    assert not is_task_id("task_abcdefgh\n")
    assert Handle.parse(handle + "\n") is not None  # surrounding blanks are trimmed
    assert Handle.parse(handle + "\nx") is None
    assert not Token.looks_valid(Token.mint().value + "\n")
