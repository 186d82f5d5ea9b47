"""Building blocks of the model families: attention, MoE, norms, rotary."""
