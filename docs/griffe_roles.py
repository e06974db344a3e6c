"""A griffe extension for the API reference: the docstrings' Sphinx roles
(``:func:`mapformer.train.train```, ``:class:`~Table```) become inline code, so that they read
as names in Markdown (the docstrings are prose, not a docstring dialect)."""
import re

import griffe

ROLE = re.compile(r":(?:func|class|meth|attr|data|mod|exc|obj):`~?([^`]+)`")


class RolesToCode(griffe.Extension):
    """Rewrite every role of an object's docstring as ``name``."""

    def on_instance(self, *, obj, **kwargs):
        if obj.docstring is not None:
            obj.docstring.value = ROLE.sub(r"`\1`", obj.docstring.value)
