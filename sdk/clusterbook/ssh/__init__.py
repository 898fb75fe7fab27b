"""SSH: user-level sshd and the pieces that reach nodes over SSH."""
