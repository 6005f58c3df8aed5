"""Benchmarks, measurements and PyTorch reference ports: run from the repository root as
`python -m sampling.<script>`. Not part of the `jaxdllm` library (nothing in it imports these)."""
