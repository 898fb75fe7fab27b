"""Elastic rendezvous: nodes join, heartbeat and leave; ranks are assigned per round."""
