"""KVpop training: activation capture, the future-attention target, the loss, the data, the sparse pattern."""
