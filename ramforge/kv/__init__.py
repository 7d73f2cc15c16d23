"""The KV cache: its types and sizes, its cells and the in-RAM cache."""
