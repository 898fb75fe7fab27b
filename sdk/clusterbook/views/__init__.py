"""What people see of a cluster: HTML renderings of snapshots, progress bars."""
