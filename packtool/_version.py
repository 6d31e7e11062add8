"""The version of packtool (kept apart so that reading it imports nothing else)."""

__version__ = "0.1.0"
