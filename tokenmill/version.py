"""The package version, at the bottom of the layers so the server and the CLI can both read it."""

__version__ = "0.1.0"
