"""CSM-1B (sesame/csm-1b in the transformers layout): a Llama backbone over a text column and 32 Mimi
codebook columns, a depth decoder for codebooks 1..31, and Mimi."""
