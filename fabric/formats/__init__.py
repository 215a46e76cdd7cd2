"""Files the field already speaks: ibnetdiscover output and ibsim net files (``netfile``)."""

from fabric.formats.netfile import format_net, parse_net, read_net, write_net

__all__ = ["format_net", "parse_net", "read_net", "write_net"]
