"""Bottlenecks, registered in BOTTLENECKS by ``@register_bottleneck``: the slot a Block calls
on its residual stream between the mixer and the MLP (``none``, the identity, by default; the
VQ bottleneck of the TDB will plug in here). What a bottleneck implements is in
:mod:`mapformer.bottlenecks.base`. Every module of this package is imported here."""
from ..registry import Registry, import_package_modules
from .base import Bottleneck

BOTTLENECKS = Registry("bottleneck", "bottleneck")
register_bottleneck = BOTTLENECKS.register
get_bottleneck = BOTTLENECKS.get

import_package_modules(__name__, __path__)

__all__ = ["BOTTLENECKS", "Bottleneck", "get_bottleneck", "register_bottleneck"]
