"""Rendezvous stores: memory (tests, one process), file (shared directory), tcp (the head)."""
