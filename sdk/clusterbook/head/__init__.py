"""What a running head serves besides its nodes: its record and the catalog of records, its
housekeeping, the control channel, the supervisor of a detached cluster."""
