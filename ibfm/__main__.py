"""``python -m ibfm``: the ``ibfm`` command (the console script of pyproject.toml's ``[project.scripts]``)."""

from __future__ import annotations

import sys

from ibfm.cli import main

if __name__ == "__main__":
    sys.exit(main())
