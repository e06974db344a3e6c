"""Task generators: NumPy int32 token sequences with aligned targets and loss masks.

navigation: forced navigation on an n-dimensional torus (MapFormer, section 5.2), with the
paper's IID and OOD presets.
"""

from .navigation import (
    PRESETS,
    PRESETS_BY_DIMS,
    Batch,
    NavigationConfig,
    batches,
    blank_floor,
    eval_set,
    fixed_map,
    generate,
    preset,
    recall_accuracy,
)

__all__ = [
    "PRESETS",
    "PRESETS_BY_DIMS",
    "Batch",
    "NavigationConfig",
    "batches",
    "blank_floor",
    "eval_set",
    "fixed_map",
    "generate",
    "preset",
    "recall_accuracy",
]
