"""Zonos v0.1 transformer (Zyphra): prefix-conditioned LM over 9 DAC codebooks with a delay pattern."""
