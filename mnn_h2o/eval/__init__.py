"""Quality of a compressed KV cache against the full one, measured on the real model."""
