"""Starts the three PagedWeight processes together (the README's serve command)."""
