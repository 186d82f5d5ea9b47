"""The one paged memory pool shared by the KV cache and expert weights."""

from dataplane.memory.arena import Arena, ArenaSnapshot, OutOfPages, PageTag

__all__ = ["Arena", "ArenaSnapshot", "OutOfPages", "PageTag"]
