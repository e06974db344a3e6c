"""``none``: no positional information (MapEM-o, the paper's control; NoPE). The mixer
attends with the content queries and keys alone."""
from . import Scheme, register_scheme


@register_scheme
class NoPositions(Scheme):
    """No parameters, no options, nothing to trace."""

    name = "none"
