"""The node program (plain standard library, sent to nodes as source) and the head's side of it:
fan-out, files in and out, commands on every node."""
