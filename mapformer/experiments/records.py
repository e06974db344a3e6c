"""Records: one JSON file per run id, and the provenance every record carries."""
import functools
import json
import os
import platform
import subprocess
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]  # the checkout (or site-packages) mapformer is in


@functools.lru_cache(maxsize=None)
def git_state(root=ROOT):
    """{"commit": HEAD's hash, "dirty": whether tracked files differ from it} of the checkout
    at ``root``, by default the one this mapformer was imported from. An installed copy has no
    checkout of its own (even one inside another repository, as pyenv's site-packages are): it
    reports the commit its build was made from, which the build wrote to
    ``mapformer/_build.json`` (setup.py), and "unknown" for both without one (an sdist)."""
    def git(*args):
        return subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True,
                              timeout=30)
    unknown = {"commit": "unknown", "dirty": "unknown"}
    try:
        top = git("rev-parse", "--show-toplevel")
        if top.returncode != 0 or Path(top.stdout.strip()).resolve() != Path(root).resolve():
            return built_from(root) or unknown
        head = git("rev-parse", "HEAD")
        if head.returncode != 0:
            return unknown
        status = git("status", "--porcelain", "--untracked-files=no")
        return {"commit": head.stdout.strip(), "dirty": bool(status.stdout.strip())}
    except (OSError, subprocess.SubprocessError):
        return built_from(root) or unknown


def built_from(root):
    """The {"commit", "dirty"} an installed build under ``root`` was made from, else None."""
    try:
        stamp = json.loads((Path(root) / "mapformer" / "_build.json").read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(stamp, dict) or set(stamp) != {"commit", "dirty"}:
        return None
    return stamp


def cpu_model():
    """The CPU's model name (/proc/cpuinfo on Linux), else platform.processor()."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def provenance():
    """What produced a record: library version, git commit and dirty flag, kernel set, the
    ops' subnormal mode ("flush" or "keep"; a record without it was made before the mode
    existed, with IEEE subnormals), CPU, thread count, NumPy, OpenBLAS and Python versions,
    machine and host."""
    from .. import __version__, _C

    info = _C.info()
    return {"mapformer": __version__, **git_state(), "kernels": info["kernels"],
            "subnormals": info["subnormals"],
            "cpu": cpu_model(), "cpu_level": info["cpu_level"], "threads": info["threads"],
            "numpy": np.__version__, "blas": info["blas"]["config"],
            "python": platform.python_version(), "machine": platform.machine(),
            "host": platform.node()}


def unknown_provenance(path, script, detail=None, **fields):
    """The provenance of a record converted from the file ``path`` that ``script`` wrote
    before the experiment layer, which recorded none: commit and dirty "unknown" (tables mark
    such cells §), the file, a note (``detail`` appended) and ``fields``."""
    note = (f"written by {script} before the experiment layer, which recorded no provenance"
            + (f"; {detail}" if detail else ""))
    return {"commit": "unknown", "dirty": "unknown", "converted_from": str(path),
            "note": note, **fields}


class RecordStore:
    """A directory of records, ``<id>.json`` each, written atomically (a temporary file in the
    same directory, then a rename): a killed writer leaves the old state, never half a
    record."""

    def __init__(self, directory):
        self.directory = Path(directory)

    def path(self, run_id):
        return self.directory / f"{run_id}.json"

    def __contains__(self, run_id):
        return self.path(run_id).is_file()

    def get(self, run_id):
        """The record of ``run_id``, or None."""
        path = self.path(run_id)
        if not path.is_file():
            return None
        record = json.loads(path.read_text())
        if record.get("id") != run_id:
            raise ValueError(f"{path} holds the record of run {record.get('id')!r}")
        return record

    def put(self, record):
        """Write ``record`` (its "id" names the file); returns its path."""
        self.directory.mkdir(parents=True, exist_ok=True)
        path = self.path(record["id"])
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(record, indent=1, sort_keys=True))
        tmp.replace(path)
        return path

    def ids(self):
        return sorted(p.stem for p in self.directory.glob("*.json"))
