"""mnn_h2o: KV-cache compression for LLM decoding on the CPU, on top of MNN."""
__version__ = "0.1.0"
