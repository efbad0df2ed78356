"""`make bench`: run every benchmark and print its table."""

from __future__ import annotations

import sys

from bench import boxes, engine, mcp, scale, vms


def main() -> int:
    engine.main()
    mcp.main()
    vms.main()
    boxes.main()
    scale.main()
    return 0


if __name__ == "__main__":
    sys.exit(main())
