"""The package version, at the bottom of the layers so that anything may import it."""

__version__ = "0.1.0"
