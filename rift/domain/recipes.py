"""Recipes (SPEC §19): the Dockerfile subset an image is built from, read into
steps, and each step's layer key.

The subset: `FROM` (a Rift image), `RUN`, `COPY`, `ENV`, `WORKDIR`, `USER`, `ARG`,
`EXPOSE` and `CMD`; `RUN` and `CMD` in the shell form or the JSON (exec) form;
`\\` at a line's end continues it on the next; `#` at a line's start is a comment
(also inside a continued instruction, as Docker reads it). Anything else is
refused with `RecipeError`, naming its line, before any VM starts.

A layer's key is the digest of its parent's key, the step's text, the `ARG`s in
effect and the content of what a `COPY` copies (its sources' digest, given by
the caller, who reads the context): two recipes share their layers up to the
first step that differs in any of these. Stdlib only; reading the context and
running steps are the engine's (rift.services.builds).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from rift.domain.recipe_steps import (
    Copy,
    RecipeError,
    Settings,
    Step,
    apply,
    json_words,
    shell_line,
)

INSTRUCTIONS = ("FROM", "RUN", "COPY", "ENV", "WORKDIR", "USER", "ARG", "EXPOSE", "CMD")
GUEST_CHANGING = ("RUN", "COPY")  # the steps that change the guest; the rest are settings
KEY_VERSION = "rift-recipe-1"
MAX_RECIPE_BYTES = 256 * 1024
_WORD = re.compile(r"^([A-Za-z]+)(?:\s+|$)")
_IMAGE = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,63}$")


@dataclass(frozen=True)
class Planned:
    """A step with what it runs under (`before`), what it leaves (`after`), its
    layer key and, for a COPY, what it copies."""

    step: Step
    key: str
    before: Settings
    after: Settings
    copy: Copy | None = None

    @property
    def changes_guest(self) -> bool:
        return self.step.instruction in GUEST_CHANGING


@dataclass(frozen=True)
class Recipe:
    base: str  # the FROM image
    base_line: int
    steps: tuple[Step, ...]  # after FROM
    settings: Settings = field(default_factory=Settings)  # after every step


def parse(text: str) -> Recipe:
    """The recipe's steps; RecipeError naming the first line it cannot take."""
    if len(text.encode()) > MAX_RECIPE_BYTES:
        raise RecipeError(1, f"a recipe is at most {MAX_RECIPE_BYTES // 1024} KiB")
    steps = list(_instructions(text))
    if not steps:
        raise RecipeError(1, "the recipe is empty; it begins with FROM <image>")
    first, rest = steps[0], steps[1:]
    if first.instruction != "FROM":
        raise RecipeError(first.line, f"{first.instruction} before FROM; a recipe begins "
                          "with FROM <image>")
    base = _from(first)
    settings = Settings()
    for step in rest:
        if step.instruction == "FROM":
            raise RecipeError(step.line, "a second FROM; a recipe builds one image from one "
                              "FROM (no stages)")
        settings, _ = apply(step, settings)
    return Recipe(base=base, base_line=first.line, steps=tuple(rest), settings=settings)


def plan(recipe: Recipe, root_key: str,
         copy_digests: Mapping[int, str] | None = None) -> list[Planned]:
    """Each step with its key, chained from `root_key` (the FROM image's identity,
    made by the engine); `copy_digests` gives each COPY's content digest by line."""
    digests = copy_digests or {}
    planned: list[Planned] = []
    parent, settings = root_key, Settings()
    for step in recipe.steps:
        after, copy = apply(step, settings)
        key = layer_key(parent, step.text, dict(settings.args), digests.get(step.line, ""))
        planned.append(Planned(step, key, settings, after, copy))
        parent, settings = key, after
    return planned


def layer_key(parent: str, text: str, args: Mapping[str, str], content: str = "") -> str:
    """The digest of a parent key, a step's text, the ARGs in effect and what it copies."""
    body = json.dumps([KEY_VERSION, parent, text, sorted(args.items()), content])
    return hashlib.sha256(body.encode()).hexdigest()


def root_key(image: str, identity: str, owner: str) -> str:
    """The key a recipe's first step has as its parent: the FROM image as it is now
    (`identity`, e.g. its manifest's digest) and whose layers these are."""
    return hashlib.sha256(json.dumps([KEY_VERSION, "FROM", image, identity,
                                      owner]).encode()).hexdigest()


# -- reading ---------------------------------------------------------------------------------

def _instructions(text: str) -> list[Step]:
    steps: list[Step] = []
    pending: list[str] = []
    start = 0
    for number, raw in enumerate(text.splitlines(), start=1):
        stripped = raw.strip()
        if stripped.startswith("#") or (not stripped and not pending):
            continue  # a comment (also inside a continuation), or a blank line
        if not pending:
            start = number
        continued = stripped.endswith("\\")
        pending.append(stripped[:-1].rstrip() if continued else stripped)
        if not continued:
            steps.append(_step(start, " ".join(p for p in pending if p)))
            pending = []
    if pending:
        steps.append(_step(start, " ".join(p for p in pending if p)))
    return steps


def _step(line: int, joined: str) -> Step:
    match = _WORD.match(joined)
    if match is None:
        raise RecipeError(line, f"{joined[:40]!r} is no instruction")
    word = match.group(1).upper()
    args = joined[match.end():].strip()
    if word not in INSTRUCTIONS:
        raise RecipeError(line, f"{word} is not supported; a recipe takes "
                          f"{', '.join(INSTRUCTIONS)}")
    if not args:
        raise RecipeError(line, f"{word} needs arguments")
    words = json_words(line, word, args) if word in ("RUN", "CMD", "COPY") else None
    return Step(line, word, args, words)


def _from(step: Step) -> str:
    parts = step.args.split()
    if len(parts) != 1 or parts[0].startswith("-"):
        raise RecipeError(step.line, "FROM takes one image name (no flags, no stage name)")
    image = parts[0]
    if not _IMAGE.match(image):
        raise RecipeError(step.line, f"FROM {image!r}: an image name is lower case letters, "
                          "digits, '.', '_' and '-'")
    return image


__all__ = ["Copy", "Planned", "Recipe", "RecipeError", "Settings", "Step", "layer_key",
           "parse", "plan", "root_key", "shell_line"]
