"""The cluster a user holds: the facade, its heads (this process, or attached to another), its
options and how it shows itself."""
