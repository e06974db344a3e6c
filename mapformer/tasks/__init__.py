"""Task generators: NumPy int32 token sequences with aligned targets and loss masks.

navigation: forced navigation on an n-dimensional torus (MapFormer, section 5.2), with the
paper's IID and OOD presets.
selective_copy: Mamba's selective copying (MapFormer, section 5.1), with the paper's IID and OOD
presets; its generic names (PRESETS, preset, generate, ...) live in the submodule.
transduction: APE's sequence copy / repeat / reverse (section 4, appendix 9) as a causal
prefix-LM, variable lengths padded, fixed train/dev/test splits (submodule names only).
trees: APE's tree copy / rotation / C3 reduction / tree operations (appendix 9) as a prefix-LM,
tokens carrying their heap numbers (submodule names only).
grid2d: 2D grid copy / transpose / rotate90 / flip as a prefix-LM, tokens carrying their
(row, column) on the page (submodule names only).
rooms: TDB's aliased rooms and cube, their random walks and the training task (submodule names
only).
ginc: GINC's mixture of HMMs (Xie et al. 2022; TDB appendix K): documents and in-context
prompts (submodule names only; no training task yet).
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
from . import grid2d, selective_copy, transduction, trees
from .selective_copy import (
    SelectiveCopyBatch,
    SelectiveCopyConfig,
    sequence_accuracy,
    token_accuracy,
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
    "grid2d",
    "preset",
    "recall_accuracy",
    "selective_copy",
    "SelectiveCopyBatch",
    "SelectiveCopyConfig",
    "sequence_accuracy",
    "token_accuracy",
    "transduction",
    "trees",
]
