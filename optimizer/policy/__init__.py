"""kvtier.policy."""
