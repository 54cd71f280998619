"""Training InertiaKV's learned bilinear scorer by self-distillation against the model's attention."""
