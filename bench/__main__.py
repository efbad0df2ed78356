"""`make bench`: run every benchmark and print its table; `python -m bench NAME ...`
runs only those named (engine, mcp, vms, boxes, scale, starts, execs, forks,
exposures, hosts, hostile, e2b, volumes, code, builds)."""

from __future__ import annotations

import sys
from collections.abc import Callable


def benches() -> dict[str, Callable[[], object]]:
    from bench import (
        boxes,
        builds,
        code,
        e2b,
        engine,
        execs,
        exposures,
        forks,
        hostile,
        hosts,
        mcp,
        scale,
        starts,
        vms,
        volumes,
    )

    return {"engine": engine.main, "mcp": mcp.main, "vms": vms.main, "boxes": boxes.main,
            "scale": scale.main, "starts": starts.main, "execs": execs.main,
            "forks": forks.main, "exposures": exposures.main, "hosts": hosts.main,
            "hostile": hostile.main, "e2b": e2b.main,
            "volumes": volumes.main, "code": code.main, "builds": builds.main}


def main(argv: list[str]) -> int:
    known = benches()
    unknown = [name for name in argv if name not in known]
    if unknown:
        print(f"unknown benchmark {', '.join(unknown)}; known: {', '.join(known)}",
              file=sys.stderr)
        return 2
    for name in argv or list(known):
        known[name]()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
