"""A cluster another process runs, reached through its directory: on this machine, or on another
over ssh (and what answers there for the handle)."""
