"""areal adapters (filled below)."""

ADAPTERS = ()
