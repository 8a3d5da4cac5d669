"""Stop an install that cannot fit on its disk before it starts, naming the space it needs (pip otherwise fails minutes
in with 'No space left on device' and leaves a half-built environment).

    python requirements/check_disk.py --need-gib 6 --what "the vLLM CPU venv (.venv-vllm)" [--path .]

Any Python 3 runs it: it imports nothing beyond the standard library, as it runs before the venv exists.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path


def shortfall(path: Path, need_gib: float) -> str | None:
    """Why ``need_gib`` GiB will not fit on ``path``'s file system (its nearest existing parent's), or None."""
    while not path.exists() and path != path.parent:
        path = path.parent
    free_gib = shutil.disk_usage(path).free / 2**30
    if free_gib >= need_gib:
        return None
    return f"needs about {need_gib:g} GiB free on the disk of {path.resolve()}; it has {free_gib:.1f} GiB"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--need-gib", type=float, required=True, help="the free space the install needs, in GiB")
    p.add_argument("--what", default="this install", help="what is being installed, for the message")
    p.add_argument("--path", type=Path, default=Path("."), help="where it is installed (default: here)")
    args = p.parse_args(argv)
    why = shortfall(args.path, args.need_gib)
    if why is not None:
        print(
            f"error: {args.what} {why}: free some space (old clones, venvs, caches) and run it again", file=sys.stderr
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
