"""Layers and model-level techniques: batch-norm variants, patch whitening, weight
averaging and test-time augmentation. Import from the submodules."""
