"""Mimi (Kyutai), in the transformers `MimiModel` checkpoint layout: a streaming decoder and a clip encoder."""
