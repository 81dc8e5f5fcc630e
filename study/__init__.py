"""The study tools: the paper's analyses of trained runs (representations, curves, depth) and the arithmetic task."""
