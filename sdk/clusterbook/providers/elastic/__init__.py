"""Nodes that join by themselves, and how the head reaches far ones."""
