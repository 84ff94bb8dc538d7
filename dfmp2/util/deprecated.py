"""Old public names kept importable for a while: a module's `__getattr__` hands the new object
for an old name, with a DeprecationWarning naming the new one (CHANGELOG.md lists them)."""

import warnings

MISSING = object()  # what `renamed` returns for a name that is no old one


def renamed(module: str, old_names: dict, name: str, namespace: dict):
    """namespace[old_names[name]] with a DeprecationWarning, for an old name of `module`; MISSING
    for any other name (the caller raises its AttributeError)."""
    if name not in old_names:
        return MISSING
    new = old_names[name]
    warnings.warn(f"{module}.{name} is deprecated: use {module}.{new}", DeprecationWarning, stacklevel=3)
    return namespace[new]
