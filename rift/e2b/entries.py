"""envd's EntryInfo from the guest: the scripts that stat and list paths there, and
the parser of what they print. Pure: the scripts are text run as Rift execs by
rift.e2b.filesystem and rift.e2b.watches.

A guest with `python3` (the `debian` image) runs `LISTER` (`python3 -S`: lstat,
owner and group names, a symlink's resolved target and its target's type, the
`user.e2b.*` extended attributes as metadata, a directory walked in name order
to a depth); one without (busybox `tiny`) runs the same walk with `find` and
`stat -c`, without metadata. Both print one line per entry:

    mode(hex) size owner group mtime(s) target-mode(hex or -) target meta path

tab-separated, `meta` being `-` or `<hex key>=<hex value>` pairs joined by `,`.
The guest's output is hostile (SPEC §15): a line is split on tabs with a fixed
count and no pattern, each field bounded; a line that does not parse is left out.
"""

from __future__ import annotations

import shlex
import stat as modes
from datetime import UTC, datetime
from typing import Any

MAX_ENTRIES = 20_000  # a listing's most entries (the guest stops printing there)
MAX_META = 64  # metadata pairs read per entry
MAX_META_VALUE = 4096
META_PREFIX = "user.e2b."  # the xattr namespace of E2B's file metadata

LISTER = f"""\
import os,sys,stat,pwd,grp
def nm(f,i):
 try:return f(i)[0]
 except KeyError:return str(i)
def meta(p):
 try:ks=os.listxattr(p)
 except OSError:return '-'
 o=[]
 for k in ks[:{MAX_META}]:
  if k.startswith('{META_PREFIX}'):
   try:v=os.getxattr(p,k)
   except OSError:continue
   o.append(k[{len(META_PREFIX)}:].encode().hex()+'='+v[:{MAX_META_VALUE}].hex())
 return ','.join(o) or '-'
n=0
def show(p):
 global n
 n+=1
 if n>{MAX_ENTRIES}:sys.exit(0)
 s=os.lstat(p);t='-';r=''
 if stat.S_ISLNK(s.st_mode):
  r=os.path.realpath(p)
  try:t='%x'%os.stat(p).st_mode
  except OSError:t='0'
 print('%x\\t%d\\t%s\\t%s\\t%d\\t%s\\t%s\\t%s\\t%s'%(s.st_mode,s.st_size,nm(pwd.getpwuid,s.st_uid),
  nm(grp.getgrgid,s.st_gid),int(s.st_mtime),t,r,meta(p),p))
def walk(p,l):
 try:names=sorted(os.listdir(p))
 except OSError:return
 for e in names:
  q=os.path.join(p,e)
  try:show(q)
  except OSError:continue
  if l<d and not os.path.islink(q) and os.path.isdir(q):walk(q,l+1)
d=int(sys.argv[1])
if d:walk(sys.argv[2],1)
else:
 for p in sys.argv[2:]:
  try:show(p)
  except OSError:pass
"""

_STAT = "stat -c '%f\t%s\t%U\t%G\t%Y' --"
_SHELL_ONE = (  # $q: one path, printed as a line of the format above
    f'if [ -L "$q" ]; then t=$(stat -L -c %f -- "$q" 2>/dev/null || echo 0); '
    f'r=$(readlink -f -- "$q"); else t=-; r=; fi; '
    f'printf \'%s\\t%s\\t%s\\t-\\t%s\\n\' "$({_STAT} "$q")" "$t" "$r" "$q"')


def script(paths: list[str], depth: int = 0) -> str:
    """The guest script printing the entries of `paths` (depth 0) or of the one
    directory `paths[0]` down to `depth`; python3 where the guest has it."""
    quoted = " ".join(shlex.quote(p) for p in paths)
    if depth:
        shell = (f"find {quoted} -mindepth 1 -maxdepth {depth} | head -n {MAX_ENTRIES} | "
                 f"while IFS= read -r q; do {_SHELL_ONE}; done")
    else:
        shell = f"for q in {quoted}; do [ -e \"$q\" ] || [ -L \"$q\" ] || continue; " \
                f"{_SHELL_ONE}; done"
    return (f"if command -v python3 >/dev/null 2>&1; then python3 -S -c "
            f"{shlex.quote(LISTER)} {depth} {quoted}; else {shell}; fi")


def _metadata(field: str) -> dict[str, str] | None:
    if field in {"", "-"}:
        return None
    found: dict[str, str] = {}
    for pair in field.split(",")[:MAX_META]:
        key, _, value = pair.partition("=")
        try:
            found[bytes.fromhex(key).decode()[:256]] = \
                bytes.fromhex(value).decode(errors="replace")[:MAX_META_VALUE]
        except ValueError:
            continue
    return found or None


def _kind(mode: int) -> str:
    return "FILE_TYPE_DIRECTORY" if modes.S_ISDIR(mode) else \
        "FILE_TYPE_FILE" if modes.S_ISREG(mode) else \
        "FILE_TYPE_SYMLINK" if modes.S_ISLNK(mode) else "FILE_TYPE_UNSPECIFIED"


def entry(line: str) -> dict[str, Any] | None:
    """envd's EntryInfo (its JSON form) from one printed line, or None when it does
    not parse. A symlink is described by its target's type and mode, and names the
    target it resolves to (`symlinkTarget`), as envd does."""
    parts = line.split("\t", 8)
    if len(parts) != 9 or len(line) > 64 * 1024:
        return None
    raw_mode, size, owner, group, mtime, target_mode, target, meta, path = parts
    try:
        mode, length, moment = int(raw_mode, 16), int(size), int(mtime)
        shown = mode if target_mode == "-" else int(target_mode, 16)
        when = datetime.fromtimestamp(moment, UTC)
    except (ValueError, OverflowError, OSError):
        return None
    if not path:
        return None
    found: dict[str, Any] = {
        "name": path.rstrip("/").rpartition("/")[2] or path, "type": _kind(shown),
        "path": path, "size": str(length), "mode": modes.S_IMODE(shown),
        "permissions": modes.filemode(mode), "owner": owner[:64], "group": group[:64],
        "modifiedTime": when.isoformat().replace("+00:00", "Z")}
    if target_mode != "-":
        found["symlinkTarget"] = target[:4096]
    metadata = _metadata(meta)
    if metadata:
        found["metadata"] = metadata
    return found


def parse(output: str) -> list[dict[str, Any]]:
    """The entries of a script's output, in walk order (a directory's entries by
    name, each followed by its own), as envd lists them."""
    found = [e for line in output.splitlines()[:MAX_ENTRIES] if (e := entry(line))]
    return sorted(found, key=lambda e: e["path"].split("/"))
