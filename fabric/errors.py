"""The error every user-facing failure derives from.

Its message names the place (file and line, node and port, switch and
block, HTTP parameter) and what is wrong; the command line prints it
without a traceback and exits 2.
"""


class IbfmError(Exception):
    """A failure caused by input or by the fabric, explained in its message."""


class FormatError(IbfmError):
    """A malformed topology or state file; the message names file and line."""

    def __init__(self, path: str, line: int | None, what: str) -> None:
        where = f"{path}:{line}" if line is not None else path
        super().__init__(f"{where}: {what}")
        self.path = path
        self.line = line
        self.what = what


class ConfigFileError(IbfmError):
    """A configuration file read as written would mean something else: ``FILE:LINE:COL: what``
    (``FILE: what`` when the whole file is at fault, line 0)."""

    def __init__(self, source: str, line: int, col: int, what: str) -> None:
        super().__init__(f"{source}:{line}:{col}: {what}" if line else f"{source}: {what}")
        self.source = source
        self.line = line
        self.col = col
        self.what = what
