"""The ops' signatures as the C binding declares them: the one place an op's arguments are
written (``csrc/python/bind_<family>.c``'s argument rows, exported by
``mapformer._C.signatures()``), read here by every other layer: the NumPy backend's
accumulation into written arguments (:func:`numpy_op`), the fuzzer's written sets and
scalars, the op inventory and the docstrings' test.

    >>> sig = signature("sln_backward")
    >>> sig.text()
    'sln_backward(dp, delta, gen, start, dgen, dstart, clamp=10) -> ddelta'
    >>> sig.updated, sig.returned
    (('dgen', 'dstart'), ('ddelta',))
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
import inspect

from . import _C

ARRAY_KINDS = ("in", "inout", "out", "out_or_into")


@dataclass(frozen=True)
class Arg:
    """One argument row of an op's table. ``kind``: 'in' (read), 'inout' (updated in place:
    a gradient +=, optimizer state), 'out' (a new array, returned), 'out_or_into' (None: a
    new array; an array: accumulated into and returned), 'result' (a returned float), or a
    scalar 'float', 'int', 'choice'. ``pos``: the place in the Python signature (from 1;
    None for what is not a Python argument). ``shape``: space-separated letters ('B T H D';
    'D/2' is half of D, '...' any shape) for arrays. ``field``: the params struct's field."""
    name: str
    pos: int | None
    kind: str
    written: bool
    optional: bool
    accepts_none: bool
    kwonly: bool
    shape: str | None
    dtype: str | None
    field: str | None
    given: str | None = None
    when: str | None = None
    default: object = None
    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False
    choices: tuple = ()

    @property
    def is_array(self):
        return self.kind in ARRAY_KINDS

    @property
    def letters(self):
        """The shape's letters, e.g. ('B', 'T', 'H', 'D/2'); () for a scalar."""
        return tuple(self.shape.split()) if self.shape else ()


@dataclass(frozen=True)
class Signature:
    """An op's table: ``args`` in the order the binding checks them; ``sizes``: {letter:
    params field} of the sizes the op reads; ``scratch``: whether it borrows scratch."""
    name: str
    args: tuple
    sizes: dict
    scratch: bool
    index_arg: str | None

    def arg(self, name):
        """The row called ``name`` (KeyError naming the op and its arguments)."""
        for a in self.args:
            if a.name == name:
                return a
        raise KeyError(f"{self.name} has no argument {name!r}; it has "
                       f"{', '.join(a.name for a in self.args)}")

    @property
    def parameters(self):
        """The Python arguments in signature order (Arg rows)."""
        return tuple(sorted((a for a in self.args if a.pos), key=lambda a: a.pos))

    @property
    def updated(self):
        """Names of the arrays updated in place and not returned ('inout'), in row order."""
        return tuple(a.name for a in self.args if a.kind == "inout")

    @property
    def returned(self):
        """Names of what a call returns, in order: new and given outputs and results."""
        return tuple(a.name for a in self.args if a.kind in ("out", "out_or_into", "result"))

    @property
    def written(self):
        """Names of every array the op writes that its caller passes (in place)."""
        return tuple(a.name for a in self.args if a.written and a.pos)

    def text(self):
        """The call as a docstring's first line writes it: 'op(a, b, *, c=1) -> (x, y)'."""
        parts, starred = [], False
        for a in self.parameters:
            if a.kwonly and not starred:
                parts.append("*")
                starred = True
            if not a.optional:
                parts.append(a.name)
                continue
            d = a.default
            if isinstance(d, float) and d.is_integer():
                d = int(d)
            parts.append(f"{a.name}={d!r}")
        out = self.returned
        result = ("None" if not out else out[0] if len(out) == 1
                  else "(" + ", ".join(out) + ")")
        return f"{self.name}({', '.join(parts)}) -> {result}"

    def bind(self, args, kwargs):
        """{name: value} of a Python call's arguments, omitted optional ones at their
        defaults (None for arrays); TypeError as Python's for a missing, unknown or repeated
        argument or too many positional ones."""
        params = self.parameters
        positional = [a for a in params if not a.kwonly]
        if len(args) > len(positional):
            raise TypeError(f"{self.name}() takes at most {len(positional)} positional "
                            f"arguments ({len(args)} given)")
        values = {a.name: v for a, v in zip(positional, args)}
        names = {a.name for a in params}
        for key, value in kwargs.items():
            if key not in names:
                raise TypeError(f"{self.name}() got an unexpected keyword argument {key!r}")
            if key in values:
                raise TypeError(f"{self.name}() got multiple values for argument {key!r}")
            values[key] = value
        for a in params:
            if a.name not in values:
                if not a.optional:
                    raise TypeError(f"{self.name}() missing required argument {a.name!r}")
                values[a.name] = a.default
        return values


def _arg(row):
    row = dict(row)
    row["choices"] = tuple(row.get("choices", ()))
    return Arg(**row)


@lru_cache(maxsize=None)
def signatures():
    """{op: Signature} of every op of mapformer._C."""
    return {name: Signature(name=name, args=tuple(_arg(r) for r in s["args"]),
                            sizes=dict(s["sizes"]), scratch=s["scratch"],
                            index_arg=s["index_arg"])
            for name, s in sorted(_C.signatures().items())}


def signature(op):
    """The Signature of the op called ``op`` (ValueError naming it when there is none)."""
    try:
        return signatures()[op]
    except KeyError:
        raise ValueError(f"mapformer._C has no op {op!r}") from None


def numpy_op(op, reference):
    """The NumPy backend's op ``op`` with the C op's signature, computed by ``reference``
    (a float64 function of the op's read arguments, by their names, returning what its
    ``returns`` names: ``mapformer.reference.returns``): its gradients for the 'inout' rows
    are added in place (+=), an 'out_or_into' row given an array is accumulated into and
    returned, and the call returns what the C op returns, in its order. Arguments the
    reference does not name are not passed to it."""
    sig = signature(op)
    names = getattr(reference, "returns", None)
    if names is None:
        raise TypeError(f"the reference of {op} does not name its returns "
                        "(reference.returns)")
    missing = set(sig.updated + sig.returned) - set(names)
    if missing:
        raise TypeError(f"the reference of {op} returns {names}, lacking {sorted(missing)}")
    accepted = set(inspect.signature(reference).parameters)
    kinds = {a.name: a.kind for a in sig.args}

    def call(*args, **kwargs):
        values = sig.bind(args, kwargs)
        got = reference(**{k: v for k, v in values.items()
                           if k in accepted and kinds[k] not in ("inout", "out_or_into")})
        got = dict(zip(names, got if len(names) > 1 else (got,)))
        for name in sig.updated:
            if values[name] is not None:
                values[name] += got[name]
        out = []
        for name in sig.returned:
            if kinds[name] == "out_or_into" and values[name] is not None:
                values[name] += got[name]
                out.append(values[name])
            else:
                out.append(got[name])
        return None if not out else out[0] if len(out) == 1 else tuple(out)

    call.__name__ = op
    call.__doc__ = f"{sig.text()}\n\nThe float64 NumPy reference ({reference.__module__}."\
                   f"{reference.__name__}) in the C op's signature."
    return call
