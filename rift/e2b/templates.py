"""E2B's template builds (SDK `Template.build`) through Rift's builder (SPEC §16,
§19): the engine calls behind rift.e2b.template_routes. A template is a built
image of the caller's; its ID and its name are the image's name.

- `request` (`POST /v3/templates`): checks the name and answers a build ID (a Rift
  build id, not yet recorded: the build takes it when it starts); the user's
  uploads no build took within a day go.
- `upload_link` (`GET /templates/{id}/files/{hash}`): `present` when the caller's
  upload of that hash is here, else a one-time URL to `PUT` it to (`upload`), at
  most RIFT_BUILD_CONTEXT_MIB, kept in the data folder under the user's name.
- `start` (`POST /v2/templates/{id}/builds/{build}`): the steps become a recipe
  (rift.e2b.template_steps), the uploads a context folder, and the builder's
  `submit` runs it in the background; its refusals before any VM starts are
  `build_failed` naming E2B's step and the recipe's line.
- `status` (`GET /templates/{id}/builds/{build}/status?logsOffset=N`): the build's
  state in E2B's words, its log lines from the N-th, and for a failure its reason
  (Rift's message and code, and E2B's step).
- `alias` (`GET /templates/aliases/{alias}`): whether the caller may start it.

Upload URLs hold no state of their own: a token signs (HMAC-SHA256) its user, hash,
expiry and a nonce with a key kept in the store's `meta` table (made by the first
replica that needs it), so a URL outlives a restart and any replica on the same
database takes it; its use is marked by a file beside the uploads (made once:
a second use is refused), pruned with them. A build itself is the builder's record
and survives as any build does.
"""

from __future__ import annotations

import hmac
import os
import re
import secrets
import shutil
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rift.contract.builds import BuildGetIn, ImageBuildIn
from rift.domain.builds import new_build_id
from rift.domain.errors import BuildFailed, ImageNotFound, InvalidArgument
from rift.e2b import shapes
from rift.e2b.template_steps import step_of, translate, untagged
from rift.services.builds import builder
from rift.services.builds.builder import BuildParts
from rift.services.builds.context import MIB, Context, context_folder, unpack
from rift.services.context import Caller, Deps
from rift.services.lifecycle.image_access import sees, visible_names

_NAME = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,63}$")
_HASH = re.compile(r"^[0-9a-f]{64}$")
_BUILD = re.compile(r"^build_[a-z2-7]{8}$")
UPLOAD_S = 3600  # how long an upload URL holds
UPLOAD_KEY = "e2b_upload_key"  # the `meta` row of the upload URLs' signing key (hex)
KEEP_UPLOAD_S = 24 * 3600  # an upload no build took goes at the user's next build past this
LOG_PAGE = 100  # log entries per status answer, as E2B's API pages them
STATES = {"running": "building", "succeeded": "ready", "failed": "error"}


@dataclass(frozen=True)
class Setup:
    data_dir: Path
    context_mib: int
    ready_s: float
    public_url: str | None


class Templates:
    def __init__(self, setup: Setup, deps: Callable[[], Deps]) -> None:
        self.setup, self._deps = setup, deps
        self._key: bytes | None = None  # the upload URLs' signing key (UPLOAD_KEY)
        self._lock = threading.Lock()

    def _signing_key(self, deps: Deps) -> bytes:
        with self._lock:
            if self._key is None:
                with deps.store.write() as tx:
                    found = tx.meta.get(UPLOAD_KEY)
                    if found is None:
                        made = secrets.token_hex(32)
                        found = made if tx.meta.swap(UPLOAD_KEY, None, made) \
                            else tx.meta.get(UPLOAD_KEY)
                assert found is not None
                self._key = bytes.fromhex(found)
            return self._key

    def _signed(self, deps: Deps, payload: str) -> str:
        return hmac.new(self._signing_key(deps), payload.encode(), "sha256").hexdigest()[:40]

    def _uploads(self, user: str) -> Path:
        return self.setup.data_dir / "e2b-uploads" / user.encode().hex()

    def request(self, deps: Deps, _registry: object, caller: Caller,
                body: dict[str, Any]) -> dict[str, Any]:
        raw = body.get("name") or body.get("alias")
        name = template_name(untagged(raw, "name") if isinstance(raw, str) else raw, "name")
        self.prune(caller.user, time.time() - KEEP_UPLOAD_S)
        tags = body.get("tags") or []
        if not isinstance(tags, list) or not all(isinstance(t, str) for t in tags):
            raise InvalidArgument("tags", "a list of tags")
        for tag in tags:
            untagged(f"{name}:{tag}", "tags")
        return {"templateID": name, "buildID": new_build_id(), "public": False,
                "names": [name], "tags": ["default"], "aliases": [name]}

    def prune(self, user: str, before: float) -> list[str]:
        """Remove the user's uploads (and half-written ones) last written before
        `before` (a Unix time): ones an SDK sent and no build took."""
        folder = self._uploads(user)
        gone = [p for p in folder.iterdir() if p.stat().st_mtime < before] \
            if folder.is_dir() else []
        for path in gone:
            path.unlink(missing_ok=True)
        return [p.name for p in gone]

    def upload_link(self, deps: Deps, _registry: object, caller: Caller, template: str,
                    files_hash: str, base_url: str) -> dict[str, Any]:
        template_name(template, "templateID")
        if not _HASH.match(files_hash):
            raise InvalidArgument("hash", "the sha256 of the files, in hex")
        if (self._uploads(caller.user) / files_hash).exists():
            return {"present": True}
        payload = (f"{caller.user.encode().hex()}.{files_hash}.{int(time.time()) + UPLOAD_S}."
                   f"{secrets.token_hex(8)}")
        token = f"{payload}.{self._signed(deps, payload)}"
        base = (self.setup.public_url or base_url).rstrip("/")
        return {"present": False, "url": f"{base}/e2b/template-uploads/{token}"}

    def claim(self, token: str) -> tuple[str, str]:
        """The (user, hash) an upload URL's token was given for, once: PermissionError
        for a token Rift did not sign, one past its hour, or one used before."""
        refused = PermissionError("this upload URL is not Rift's, or was used or expired: "
                                  "build the template again")
        payload, _, signature = token.rpartition(".")
        parts = payload.split(".")
        if len(parts) != 4 or not hmac.compare_digest(
                self._signed(self._deps(), payload), signature):
            raise refused
        user_hex, files_hash, until, nonce = parts
        if not until.isdigit() or int(until) < time.time():
            raise refused
        user = bytes.fromhex(user_hex).decode()
        folder = self._uploads(user)
        folder.mkdir(parents=True, exist_ok=True)
        try:  # its use, once (the mark is pruned with the uploads, after the URL's hour)
            os.close(os.open(folder / f".used-{nonce}", os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            raise refused from None
        return user, files_hash

    def upload(self, user: str, files_hash: str, data: bytes) -> None:
        """Keep a claimed upload (at most RIFT_BUILD_CONTEXT_MIB) for the build to take."""
        if len(data) > self.setup.context_mib * MIB:
            raise InvalidArgument("context", f"the upload is over RIFT_BUILD_CONTEXT_MIB "
                                  f"({self.setup.context_mib} MiB)")
        folder = self._uploads(user)
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".part-", delete=False) as made:
            made.write(data)
        os.replace(made.name, folder / files_hash)

    def start(self, deps: Deps, _registry: object, caller: Caller, template: str,
              build_id: str, body: dict[str, Any]) -> None:
        name = template_name(template, "templateID")
        if not _BUILD.match(build_id):
            raise InvalidArgument("buildID", "the build ID `POST /v3/templates` answered")
        made = translate(body, deps.default_image)
        folder = self._context(caller.user, build_id, made.hashes)
        parts = BuildParts(context=Context(folder), ready_s=self.setup.ready_s,
                           remove_context=folder is not None,
                           context_mib=self.setup.context_mib, build_id=build_id,
                           ready=made.ready)
        try:
            builder.submit(deps, caller, ImageBuildIn(name=name, recipe=made.recipe,
                                                      no_cache=made.no_cache), parts)
        except BuildFailed as exc:
            if folder is not None:
                shutil.rmtree(folder, ignore_errors=True)
            raise BuildFailed(f"step {step_of(made.recipe, exc.message)}: {exc.message}",
                              build_id=build_id) from exc
        except BaseException:
            if folder is not None:
                shutil.rmtree(folder, ignore_errors=True)
            raise
        for files_hash in made.hashes:  # in the build's context now
            (self._uploads(caller.user) / files_hash).unlink(missing_ok=True)

    def _context(self, user: str, build_id: str, hashes: tuple[str, ...]) -> Path | None:
        """The uploads the COPY steps name, unpacked into one folder of the build's."""
        if not hashes:
            return None
        try:
            folder = context_folder(self.setup.data_dir, build_id)
        except FileExistsError as exc:
            raise InvalidArgument("buildID", f"{build_id} is another build's; ask for a "
                                  "new one") from exc
        try:
            for files_hash in dict.fromkeys(hashes):
                upload = self._uploads(user) / files_hash
                if not upload.exists():
                    raise InvalidArgument("filesHash", f"{files_hash[:12]}… was not uploaded: "
                                          "ask GET /templates/{id}/files/{hash} first")
                unpack(upload.read_bytes(), folder, self.setup.context_mib)
        except BaseException:
            shutil.rmtree(folder, ignore_errors=True)
            raise
        return folder

    def status(self, deps: Deps, _registry: object, caller: Caller, template: str,
               build_id: str, query: dict[str, str]) -> dict[str, Any]:
        raw = query.get("logsOffset", "0")
        if not raw.isdigit() or len(raw) > 9:
            raise InvalidArgument("logsOffset", "a count of log entries")
        if not _BUILD.match(build_id):
            raise InvalidArgument("buildID", "the build ID `POST /v3/templates` answered")
        build = builder.get(deps, caller, BuildGetIn(build_id=build_id)).build
        if build.image != template:
            raise InvalidArgument("build_id", f"no build {build_id} of {template[:64]!r}")
        with deps.store.read() as tx:
            row = tx.builds.get(build_id)
        recipe = row.recipe if row is not None else ""
        when = build.ended_at or deps.clock.now().isoformat()
        lines = build.log.splitlines()

        def entries(chosen: list[str]) -> list[dict[str, str]]:
            return [{"timestamp": when, "message": line,
                     "level": "error" if line.startswith("failed: ") else "info"}
                    for line in chosen]

        page = entries(lines[int(raw):int(raw) + LOG_PAGE])
        answer: dict[str, Any] = {"templateID": template, "buildID": build_id,
                                  "status": STATES.get(build.state, "building"),
                                  "logEntries": page, "logs": [e["message"] for e in page]}
        if build.state == "failed":
            failure = BuildFailed(build.error or "the build failed")
            answer["reason"] = {"message": shapes.message_of(failure),
                                "step": step_of(recipe, build.error),
                                "logEntries": entries(lines[-20:])}
        return answer

    def alias(self, deps: Deps, _registry: object, caller: Caller,
              alias: str) -> dict[str, Any]:
        alias = untagged(alias, "alias")
        with deps.store.read() as tx:
            row = tx.owned_images.get(alias)
            if alias not in deps.images.names() or not sees(row, caller, alias):
                raise ImageNotFound(alias[:64], visible_names(deps, tx, caller))
        return {"templateID": alias, "public": row is None or row.published}


def template_name(value: object, field: str) -> str:
    """A template's name: a Rift image name (lower case, digits, `.`, `_`, `-`)."""
    if not isinstance(value, str) or not _NAME.match(value):
        raise InvalidArgument(field, "a template's name is a Rift image name: lower case "
                              "letters, digits, '.', '_' and '-' (no ':tag')")
    return value
