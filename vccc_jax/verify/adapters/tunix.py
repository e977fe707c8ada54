"""tunix adapters (filled below)."""

ADAPTERS = ()
