"""What people look at: match galleries and token-affinity maps."""
