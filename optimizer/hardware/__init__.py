"""kvtier.hardware."""
