"""kvtier.report."""
