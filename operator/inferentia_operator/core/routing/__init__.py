"""Routing by queue: the model's InferencePool, its endpoint picker, and the part."""
