"""The parser process of large /mcp bodies (rift.api.parsing): the value each
era's parser would give, its errors as that parser raises them, the budget of
values, and a child that dies is replaced."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from rift.api.parsing import MAX_VALUES, BodyParser, TooManyValues


@pytest.fixture
def parser() -> Iterator[BodyParser]:
    made = BodyParser()
    try:
        yield made
    finally:
        made.close()


def test_a_body_comes_back_as_its_parser_gives_it(parser: BodyParser) -> None:
    message = {"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {
        "name": "rift_vm_write_file", "arguments": {
            "content": "é\n" * 100_000, "mode": 420, "x": [1.5, None, True, {"k": -2 ** 70}]}}}
    body = json.dumps(message).encode()
    for stdlib in (True, False):
        parsed = parser.parse(body, stdlib)
        assert parsed.error is None and parsed.value == message


def test_each_parser_keeps_its_own_verdict(parser: BodyParser) -> None:
    lone = b'{"a": "\\ud800"}'  # the standard library takes a lone surrogate, pydantic-core not
    assert parser.parse(lone, True).value == {"a": "\ud800"}
    assert isinstance(parser.parse(lone, False).error, ValueError)
    for stdlib in (True, False):
        assert isinstance(parser.parse(b'{"a": 1', stdlib).error, ValueError)
    deep = b"[" * 100_000 + b"]" * 100_000
    assert isinstance(parser.parse(deep, True).error, RecursionError)
    assert isinstance(parser.parse(deep, False).error, ValueError)


def test_more_values_than_the_budget_are_refused(parser: BodyParser) -> None:
    fits = json.dumps(list(range(MAX_VALUES - 1))).encode()
    assert len(parser.parse(fits, True).value) == MAX_VALUES - 1
    over = b"[" + b"0," * MAX_VALUES + b"0]"
    error = parser.parse(over, True).error
    assert isinstance(error, TooManyValues) and error.seen > MAX_VALUES
    wide = json.dumps({f"k{i}": "" for i in range(MAX_VALUES)}).encode()  # keys count too
    assert isinstance(parser.parse(wide, False).error, TooManyValues)


def test_a_child_that_died_is_replaced(parser: BodyParser) -> None:
    assert parser.parse(b"[1]", True).value == [1]
    child = parser._child
    assert child is not None
    child.kill()
    child.wait(5)
    assert parser.parse(b"[2]", True).value == [2]
    assert parser._child is not child
