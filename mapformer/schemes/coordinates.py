"""Options and helpers shared by the schemes that read the task's token coordinates
(``Scheme.coordinates``: gridpe, ape_grid). Not a scheme itself."""
from ..registry import Option


def task_dims(task):
    """The dimension of a task's coordinates: the task's own ``coord_dims`` (navigation: its
    dims; digits: 2, the pixel's row and column), else 1 (the token index)."""
    return getattr(task, "coord_dims", 1)


def task_extent(task):
    """Positions a task's coordinates take per axis: the task's own ``coord_extent``
    (navigation: the grid side; digits: the canvas side), else its sequence length."""
    return getattr(task, "coord_extent", task.seq_len)


COORD_DIMS = Option("coord_dims", int, 1, "dimensions n of the token coordinates the task "
                    "supplies (navigation: its dims; 1: the token index)", minimum=1,
                    from_task=task_dims)


def task_coord_source(task):
    """Where a scheme's positions come from on a task: the task's own ``coord_source`` (the
    tree tasks: 'index', their heap numbers are for ape_tree), else 'task'."""
    return getattr(task, "coord_source", "task")


COORD_SOURCE = Option("coord_source", str, "task", "where a scheme's positions come from: "
                      "task (the coordinates the task supplies, e.g. navigation's true cells: "
                      "an oracle) or index (the token index, with coord_dims 1)",
                      choices=("task", "index"), from_task=task_coord_source)


def task_coordinates(scheme):
    """The task's coordinates (B, T, n) when the scheme reads them (``coord_source`` 'task',
    the default, and the task gives some), else None (the token index is the position)."""
    if scheme.config.options.get("coord_source", "task") == "index":
        return None
    return scheme.coordinates


def coordinates_or_index(scheme, steps):
    """(TB, T, n) coordinates: the task's (TB = B), or the token index 0..T-1 as (1, T, 1)
    when the task gives none or ``coord_source`` is 'index' (only for n = 1: ValueError
    otherwise, naming the scheme)."""
    n = scheme.config.options["coord_dims"]
    coordinates = task_coordinates(scheme)
    if coordinates is None:
        if scheme.config.options.get("coord_source") == "index" and n != 1:
            raise ValueError(f"positional scheme {scheme.name!r} with coord_source 'index' "
                             f"reads the token index (1D) but has coord_dims = {n}: set "
                             "coord_dims = 1 (--coord-dims 1)")
        if n != 1:
            raise ValueError(f"positional scheme {scheme.name!r} with coord_dims = {n} needs "
                             "the tokens' coordinates (B, T, n): pass coordinates= to "
                             "Transformer.forward / loss")
        return scheme.ops.asarray(range(steps)).reshape(1, steps, 1)
    if coordinates.shape[2] != n:
        raise ValueError(f"positional scheme {scheme.name!r} has coord_dims = {n} but the "
                         f"coordinates have shape {coordinates.shape}")
    return coordinates
