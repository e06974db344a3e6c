"""Token mixers, one module each, registered in MIXERS by ``@register_mixer``; a Block calls
its mixer where a transformer has attention (see :mod:`mapformer.mixers.base` for what a
mixer declares). Every module of this package is imported here."""
from ..registry import Registry, import_package_modules
from .base import Mixer, QKVMixer

MIXERS = Registry("mixer", "mixer")
register_mixer = MIXERS.register
get_mixer = MIXERS.get

import_package_modules(__name__, __path__)

__all__ = ["MIXERS", "Mixer", "QKVMixer", "get_mixer", "register_mixer"]
