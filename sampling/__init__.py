"""Measurements beside the library: `benchmarks/` and the PyTorch references `torch_reference/`
(run from the repository root, e.g. `python -m sampling.benchmarks.benchmark_sampler`). Nothing
in `jaxdllm` imports these."""
