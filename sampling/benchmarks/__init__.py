"""Benchmarks and measurements of jaxdllm (see README.md here)."""
