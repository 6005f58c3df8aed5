"""Serving: an engine that keeps the compiled decoding loop's rows full (`engine.py`, no Ray needed),
and an OpenAI-compatible server on Ray Serve around it."""
