"""kvtier.search."""
