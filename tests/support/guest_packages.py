"""Small packages made on the host for a guest to install: a pure-Python wheel
(written by hand: a wheel is a zip with its dist-info) and a Debian package
(`dpkg-deb --build`), so the tests need no index and no mirror."""

from __future__ import annotations

import base64
import hashlib
import subprocess
import zipfile
from pathlib import Path

WHEEL_MODULE = "rifthello"
WHEEL_GREETING = "hello from a wheel"
DEB_PACKAGE = "rift-hello"
DEB_GREETING = "hello from a deb"


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def make_wheel(folder: Path) -> Path:
    """`rifthello-1.0-py3-none-any.whl` in `folder`: module `rifthello` with GREETING."""
    info = f"{WHEEL_MODULE}-1.0.dist-info"
    files = {
        f"{WHEEL_MODULE}/__init__.py": f"GREETING = {WHEEL_GREETING!r}\n".encode(),
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {WHEEL_MODULE}\nVersion: 1.0\n".encode(),
        f"{info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: rift-tests\nRoot-Is-Purelib: true\n"
                         b"Tag: py3-none-any\n",
    }
    record = [_record_line(name, data) for name, data in files.items()] + [f"{info}/RECORD,,"]
    wheel = folder / f"{WHEEL_MODULE}-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in files.items():
            zf.writestr(name, data)
        zf.writestr(f"{info}/RECORD", "\n".join(record) + "\n")
    return wheel


def make_deb(folder: Path) -> Path:
    """`rift-hello_1.0_all.deb` in `folder`: /usr/bin/rift-hello prints DEB_GREETING."""
    tree = folder / "deb-tree"
    (tree / "DEBIAN").mkdir(parents=True)
    (tree / "usr" / "bin").mkdir(parents=True)
    (tree / "DEBIAN" / "control").write_text(
        f"Package: {DEB_PACKAGE}\nVersion: 1.0\nArchitecture: all\n"
        "Maintainer: Rift tests <tests@rift.invalid>\nDescription: a test package\n")
    script = tree / "usr" / "bin" / DEB_PACKAGE
    script.write_text(f"#!/bin/sh\necho '{DEB_GREETING}'\n")
    script.chmod(0o755)
    deb = folder / f"{DEB_PACKAGE}_1.0_all.deb"
    subprocess.run(["dpkg-deb", "--root-owner-group", "--build", str(tree), str(deb)],
                   check=True, capture_output=True, timeout=60)
    return deb
