"""`make bench`: run every benchmark and print its table."""

from __future__ import annotations

import sys

from bench import boxes, engine, mcp, vms


def main() -> int:
    engine.main()
    mcp.main()
    vms.main()
    boxes.main()
    return 0


if __name__ == "__main__":
    sys.exit(main())
