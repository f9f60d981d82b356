"""What the node is: facts read through the host, and the guards the table names."""
