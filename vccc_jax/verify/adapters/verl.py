"""verl adapters (filled below)."""

ADAPTERS = ()
