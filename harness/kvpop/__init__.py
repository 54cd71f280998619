"""KVpop training support: activation capture, the future-attention target, the loss, the data."""
