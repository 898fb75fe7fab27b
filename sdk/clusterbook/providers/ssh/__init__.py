"""Nodes reached over SSH: the provider that bootstraps and releases them."""
