"""The error raised for malformed MADs and bad attribute values."""

from fabric.errors import IbfmError


class MadError(IbfmError):
    """A malformed MAD or attribute: the message names the field or header part at fault."""


class FieldValueError(MadError, ValueError):
    """A value that does not fit its field (wrong type, negative, too wide, wrong byte length)."""
