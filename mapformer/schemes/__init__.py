"""Positional schemes, one module each, registered in SCHEMES by ``@register_scheme``.

Every module of this package is imported here, so a new scheme is one new module (see
docs/how-to/add-a-scheme.md); a scheme defined elsewhere registers when its module
is imported (``python -m mapformer --import MODULE``). What a scheme declares, and the
interfaces of its ``kind``, are in :mod:`mapformer.schemes.base`.
"""
from ..registry import Registry, import_package_modules
from .base import AdditiveScheme, AngleScheme, AttentionScheme, Scheme, shared_once

SCHEMES = Registry("positional scheme", "positional")
register_scheme = SCHEMES.register
get_scheme = SCHEMES.get

import_package_modules(__name__, __path__)

__all__ = ["SCHEMES", "AdditiveScheme", "AngleScheme", "AttentionScheme", "Scheme",
           "get_scheme", "register_scheme", "shared_once"]
