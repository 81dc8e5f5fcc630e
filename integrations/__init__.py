"""Interop with transformers, lm-eval and the LIMe authors' code."""
