"""The ramforge version: a leaf, so that modules loaded while `ramforge/__init__` runs can read it."""
__version__ = "0.1.0"
