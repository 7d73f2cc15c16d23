"""The engine: one model's forward passes over streamed weights and its KV cache."""
