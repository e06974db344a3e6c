"""Registries of model components, and the options the components declare.

Three registries name the parts a :class:`mapformer.models.ModelConfig` picks: positional
schemes (:mod:`mapformer.schemes`), token mixers (:mod:`mapformer.mixers`) and bottlenecks
(:mod:`mapformer.bottlenecks`). A component is a class with a ``name`` (its key in the
registry) and ``options``: a tuple of :class:`Option` declarations. A model's options are one
flat dict over its three components, so an option name means one thing everywhere: two
components may declare the same name only with the same :class:`Option` (MapWM and MapEM share
their path-integration options), and no option may be named like a ModelConfig field.
"""
import importlib
import math
import numbers
import pkgutil
from dataclasses import dataclass

REGISTRIES = []  # every Registry, kept sorted by kind (whatever order they were created in)
RESERVED = set()  # names options may not take (ModelConfig's fields; see reserve())

TYPE_NAMES = {int: "an integer", float: "a finite number", bool: "true or false", str: "a string"}


@dataclass(frozen=True)
class Option:
    """One option of a component.

    type: int, float, bool or str. default: the value when the option is not given; None
    makes the option required. help: one line for ``-h``. choices: the allowed values (str).
    minimum / above: inclusive / exclusive lower bound (numbers). from_task: a function of a
    task config giving the option's value for a run on that task, used where a task is known
    (:meth:`ModelConfig.for_task`: the command line, the reproduction scripts)."""

    name: str
    type: type
    default: object
    help: str
    choices: tuple = None
    minimum: float = None
    above: float = None
    from_task: object = None

    def validate(self, value, owner):
        """The value, checked and converted to ``type``; ValueError naming the option and
        ``owner`` (e.g. "positional scheme 'mapwm'") otherwise."""
        if value is None:
            raise ValueError(f"{self.name} is required by {owner}: {self.help}")
        if self.type is bool:
            ok = isinstance(value, bool)
        elif self.type in (int, float):
            ok = isinstance(value, numbers.Real) and not isinstance(value, bool) and (
                self.type is float or isinstance(value, numbers.Integral))
            ok = ok and math.isfinite(value)
        else:
            ok = isinstance(value, self.type)
        requirement = TYPE_NAMES[self.type]
        if ok and self.choices is not None:
            ok, requirement = value in self.choices, f"one of {self.choices}"
        if ok and self.minimum is not None:
            ok, requirement = value >= self.minimum, f"{requirement} >= {self.minimum}"
        if ok and self.above is not None:
            ok, requirement = value > self.above, f"{requirement} > {self.above}"
        if not ok:
            raise ValueError(f"{self.name} must be {requirement}, got {value!r} (an option of "
                             f"{owner})")
        return self.type(value)


class Registry:
    """Components of one kind by name. ``kind`` names them in messages ("positional
    scheme"); ``field`` is the ModelConfig field that picks one ("positional")."""

    def __init__(self, kind, field):
        self.kind, self.field = kind, field
        self.entries = {}
        REGISTRIES.append(self)
        REGISTRIES.sort(key=lambda registry: registry.kind)

    def describe(self, name):
        return f"{self.kind} {name!r}"

    def register(self, cls):
        """Class decorator: add ``cls`` under ``cls.name``. Its options must not clash with
        another component's option of the same name, nor with a ModelConfig field."""
        name = getattr(cls, "name", None)
        if not isinstance(name, str) or not name:
            raise ValueError(f"a {self.kind} needs a class attribute name (a string), "
                             f"{cls.__name__} has {name!r}")
        if name in self.entries:
            raise ValueError(f"{self.describe(name)} is already registered "
                             f"({self.entries[name].__qualname__})")
        for option in cls.options:
            if option.name in RESERVED:
                raise ValueError(f"{self.describe(name)}: option {option.name!r} is named like a "
                                 "ModelConfig field")
            for registry, other in declarations(option.name):
                if registry.options_of(other)[option.name] != option:
                    raise ValueError(f"{self.describe(name)}: option {option.name!r} is declared "
                                     f"differently by {registry.describe(other.name)}; options "
                                     "are one flat namespace: share the declaration or rename it")
        self.entries[name] = cls
        return cls

    def unregister(self, name):
        del self.entries[name]

    def get(self, name):
        try:
            return self.entries[name]
        except (KeyError, TypeError):
            raise ValueError(f"{self.field} must be one of the registered {self.kind}s "
                             f"{sorted(self.entries)}, got {name!r}") from None

    @staticmethod
    def options_of(cls):
        return {option.name: option for option in cls.options}


def import_package_modules(package, path):
    """Import every module of the package ``package`` (whose ``__path__`` is ``path``): each
    registers its components, so a new component is one new module."""
    for module in pkgutil.iter_modules(path):
        importlib.import_module(f"{package}.{module.name}")


def declarations(option_name):
    """[(registry, component class)] of every registered component declaring the option."""
    return [(registry, registry.entries[name]) for registry in REGISTRIES
            for name in sorted(registry.entries)
            if option_name in registry.options_of(registry.entries[name])]


def registered_options():
    """{option name: Option} of every registered component, in a fixed order (registries by
    kind, their components by name, each one's options as it declares them), whatever order
    the modules were imported in."""
    return {option.name: option for registry in REGISTRIES
            for name in sorted(registry.entries) for option in registry.entries[name].options}


def reserve(names):
    """Forbid options named ``names`` (the ModelConfig fields), now and in later
    registrations."""
    for name in names:
        for registry, cls in declarations(name):
            raise ValueError(f"{registry.describe(cls.name)}: option {name!r} is named like a "
                             "ModelConfig field")
        RESERVED.add(name)


def declared_by(option_name):
    """Who declares an option, e.g. "positional scheme 'mapem' (and 'mapwm')" ('' for no
    one)."""
    owners = {}
    for registry, cls in declarations(option_name):
        owners.setdefault(registry, []).append(repr(cls.name))
    return " and ".join(
        f"{registry.kind} {names[0]}" + (f" (and {', '.join(names[1:])})" if names[1:] else "")
        for registry, names in owners.items())


def foreign_option_message(name, chosen, spelled=None):
    """Why option ``name`` (written ``spelled``, e.g. a CLI flag) does not apply to the
    ``chosen`` components ({registry: component class}): who declares it instead."""
    spelled = spelled or name
    owners = declared_by(name)
    if not owners:
        kinds = [registry.kind for registry in REGISTRIES]
        return (f"unknown option {spelled}: no registered {', '.join(kinds[:-1])} or "
                f"{kinds[-1]} declares it")
    not_of = " or ".join(registry.describe(cls.name) for registry, cls in chosen.items()
                         if any(r is registry for r, _ in declarations(name)))
    return f"{spelled} is an option of {owners}, not of {not_of}"


def resolve_options(chosen, given):
    """The options of the ``chosen`` components ({registry: component class}), each given
    value validated by its declaration and every other one at its default: {name: value}.
    ValueError for an option none of them declares (naming who does) or a bad value."""
    owned = {}
    for registry, cls in chosen.items():
        for option in cls.options:
            owned.setdefault(option.name, (option, registry.describe(cls.name)))
    for name in given:
        if name not in owned:
            raise ValueError(foreign_option_message(name, chosen))
    return {name: option.validate(given.get(name, option.default), owner)
            for name, (option, owner) in owned.items()}
