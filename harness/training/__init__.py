"""Training of learned eviction scorers, apart from the runtime: the runtime never imports it.

``harness.training.kvpop``: KVpop's scorer (and the optional distillation of the base model).
"""
