"""`make bench`: run every benchmark and print its table."""

from __future__ import annotations

import sys

from bench import engine, mcp


def main() -> int:
    engine.main()
    mcp.main()
    return 0


if __name__ == "__main__":
    sys.exit(main())
