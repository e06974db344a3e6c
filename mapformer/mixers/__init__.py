"""Token mixers, one module each, registered in MIXERS by ``@register_mixer``; a Block calls
its mixer where a transformer has attention (see :mod:`mapformer.mixers.base` for what a
mixer declares). Every module of this package is imported here."""
import importlib
import pkgutil

from ..registry import Registry
from .base import Mixer, QKVMixer

MIXERS = Registry("mixer", "mixer")
register_mixer = MIXERS.register
get_mixer = MIXERS.get

for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")
del _module

__all__ = ["MIXERS", "Mixer", "QKVMixer", "get_mixer", "register_mixer"]
