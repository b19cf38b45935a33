"""kvtier.sim."""
