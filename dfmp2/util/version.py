"""dfmp2's version, in the lowest layer so that any module may record it without importing the
package's face (`dfmp2/__init__.py` re-exports it; pyproject.toml carries the same string, and
tests/test_cli.py checks that the installed metadata agrees)."""

__version__ = "0.1.0"
