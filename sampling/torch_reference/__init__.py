"""PyTorch references of the published models and decoding policies (see README.md here)."""
