"""Options and helpers shared by the schemes that read the task's token coordinates
(``Scheme.coordinates``: gridpe, ape_grid). Not a scheme itself."""
from ..registry import Option
from ..tasks import navigation


def task_dims(task):
    """The dimension of a task's coordinates: navigation's dims, a task's own ``coord_dims``
    (digits: 2, the pixel's row and column), else 1 (the token index)."""
    if isinstance(task, navigation.NavigationConfig):
        return task.dims
    return getattr(task, "coord_dims", 1)


def task_extent(task):
    """Positions a task's coordinates take per axis: navigation's grid side, a task's own
    ``coord_extent`` (digits: the canvas side), else its sequence length."""
    if isinstance(task, navigation.NavigationConfig):
        return task.grid_size
    return getattr(task, "coord_extent", task.seq_len)


COORD_DIMS = Option("coord_dims", int, 1, "dimensions n of the token coordinates the task "
                    "supplies (navigation: its dims; 1: the token index)", minimum=1,
                    from_task=task_dims)


def coordinates_or_index(scheme, steps):
    """(TB, T, n) coordinates: the task's (TB = B), or the token index 0..T-1 as (1, T, 1)
    when the task gives none (only for n = 1: ValueError otherwise, naming the scheme)."""
    n = scheme.config.options["coord_dims"]
    coordinates = scheme.coordinates
    if coordinates is None:
        if n != 1:
            raise ValueError(f"positional scheme {scheme.name!r} with coord_dims = {n} needs "
                             "the tokens' coordinates (B, T, n): pass coordinates= to "
                             "Transformer.forward / loss")
        return scheme.ops.asarray(range(steps)).reshape(1, steps, 1)
    if coordinates.shape[2] != n:
        raise ValueError(f"positional scheme {scheme.name!r} has coord_dims = {n} but the "
                         f"coordinates have shape {coordinates.shape}")
    return coordinates
