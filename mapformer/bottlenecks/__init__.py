"""Bottlenecks, registered in BOTTLENECKS by ``@register_bottleneck``: the slot a Block calls
on its residual stream between the mixer and the MLP (``none``, the identity, by default; the
VQ bottleneck of the TDB will plug in here). What a bottleneck implements is in
:mod:`mapformer.bottlenecks.base`. Every module of this package is imported here."""
import importlib
import pkgutil

from ..registry import Registry
from .base import Bottleneck

BOTTLENECKS = Registry("bottleneck", "bottleneck")
register_bottleneck = BOTTLENECKS.register
get_bottleneck = BOTTLENECKS.get

for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")
del _module

__all__ = ["BOTTLENECKS", "Bottleneck", "get_bottleneck", "register_bottleneck"]
