"""kiln's version (ground floor: cache keys, reports and the CLI read it without importing the
package root). Keep equal to pyproject.toml's `version`."""

__version__ = "0.1.0"
