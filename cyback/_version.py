# The one place the version is written: pyproject.toml reads it (dynamic version) and
# cyback/__init__.py re-exports it.
__version__ = "0.1.0"
