"""lm-eval's tasks as harness tasks (``task=lm_eval``), and lm-eval's requests as engine calls."""
