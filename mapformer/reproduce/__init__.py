"""Every paper's tables and figures as experiment specs, one module per paper.

A paper's module holds its tables as data (rows, the paper's figures, scales) and
``table(name, scale="cpu", sequences=None, eval_sequences=None)``, which returns the
:class:`~mapformer.experiments.Table` spec; ``TABLE_NAMES`` lists what it has. This package
finds them by paper:

    from mapformer import reproduce
    from mapformer.experiments import RecordStore, run_all
    table = reproduce.table("mapformer", "2", scale="cpu")
    store = RecordStore("results/records/mapformer")
    run_all(table.runs(seeds=3), store)
    print(table.markdown(store, seeds=3))

and so does the command line: ``python -m mapformer reproduce PAPER TABLE --scale cpu``.
"""
import importlib

# paper -> the module of its specs (mapformer.reproduce.<module>)
PAPERS = {"mapformer": "mapformer",
          "tdb": "tdb",
          "gridpe": "gridpe",
          "ape": "ape"}


def paper_module(paper):
    """The module of ``paper``'s specs (a key of :data:`PAPERS`)."""
    if paper not in PAPERS:
        raise ValueError(f"papers with table specs: {', '.join(sorted(PAPERS))}, not {paper!r}")
    return importlib.import_module(f"{__name__}.{PAPERS[paper]}")


def table_names(paper):
    """The names of ``paper``'s tables and figures."""
    return paper_module(paper).TABLE_NAMES


def table(paper, name, scale="cpu", **options):
    """The spec of ``paper``'s table ``name`` at ``scale`` (options: ``sequences`` overrides
    the scale's training sequences, ``eval_sequences`` its sequences per evaluation set)."""
    return paper_module(paper).table(name, scale, **options)
