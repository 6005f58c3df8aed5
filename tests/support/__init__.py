"""Shared test builders, imported as `support.<module>` (pytest puts tests/ on the path):

- `models`: tiny models by preset name, cached for the run when a test only reads them.
- `cli`: the command line run as a user runs it, in a fresh process.
- `registries`: the pieces the package itself registers (policies, caches, objectives, ...).
- `forward`: a jitted model call.
- torch references, one per family: `llada_reference` (LLaDA), `llada2_reference` (LLaDA2 MoE),
  `hf_models` (transformers' Llama / Qwen2), `diffusion_gemma_reference` (transformers' DiffusionGemma).
- `optional`: torch and transformers (the test extra) imported on first use, so that without them only
  the tests that use them skip (tests/test_torch_optional.py keeps them off every module's top).
- `sampler_fixtures` (a confident tiny LLaDA checkpoint and padded prompts), `mask_rules`
  (attention masks written out by brute force).
"""
