"""DAC 44.1 kHz decoder (transformers DacModel layout) and its windowed streaming decode."""
