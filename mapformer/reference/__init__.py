"""Float64 NumPy reference of every C op: the specification and the tests' oracle, a module
per op family mirroring ``csrc/ops/`` (``reference.sln``: ``csrc/ops/sln.c``), every op
re-exported here (``reference.sln_forward``).

Each op has ``<op>_forward`` and ``<op>_backward`` written for clarity, not speed: full
matrices, no tiling. Shapes follow the C core (``csrc/include/mapformer/ops/<family>.h``):
B batch, T tokens, H heads, D head dim (even), NB = D/2 rotation blocks, C model width,
V vocabulary, N rows (B*T). Inputs may be any float dtype; every op computes and returns in
its ``dtype`` argument (float64 by default: the oracle; the benchmarks time the same code in
float32 as the NumPy baseline of each C op).
"""
from ..ape_maps import (ape_basis_backward, ape_basis_forward, ape_powers_backward,  # noqa: F401
                        ape_powers_forward, ape_tree_backward, ape_tree_forward, expm, expm_frechet,
                        skew_eig)
from ..geometry import (CONJ_MODES, decay_table, grid_distance, rope_generator,  # noqa: F401
                        tape_initial_state, tree_distance)
from .common import GELU_K, TWO_PI, returns  # noqa: F401
from .embedding import embedding_forward, embedding_backward  # noqa: F401
from .linear import linear_forward, linear_backward  # noqa: F401
from .layernorm import layernorm_forward, layernorm_backward  # noqa: F401
from .gelu import GELU_APPROXIMATIONS, gelu_forward, gelu_backward  # noqa: F401
from .mlp import mlp_forward, mlp_backward  # noqa: F401
from .residual import residual_forward, residual_backward  # noqa: F401
from .attention import (MASKS, attention_mask, pair_factors, attention_forward,  # noqa: F401
                        attention_backward)
from .attention_decode import attention_decode_forward  # noqa: F401
from .path_integration import (wrap_angle, path_integration_forward,  # noqa: F401
                               path_integration_backward)
from .rotary import rotate_pairs, rotary_forward, rotary_backward  # noqa: F401
from .softmax_xent import softmax_xent_forward, softmax_xent_backward  # noqa: F401
from .adamw import adamw_step  # noqa: F401
from .grad_norm import global_norm, clip_grad_norm  # noqa: F401
from .cope import _cope_parts, cope_forward, cope_backward  # noqa: F401
from .relative import relative_offsets, relative_forward, relative_backward  # noqa: F401
from .tape import (tape_rotate_forward, tape_rotate_backward, tape_mix_forward,  # noqa: F401
                   tape_mix_backward)
from .conj_attention import conj_attention_forward, conj_attention_backward  # noqa: F401
from .activation import (SOFTPLUS_THRESHOLD, silu_forward, silu_backward,  # noqa: F401
                         softplus_forward, softplus_backward, silu_gate_forward, silu_gate_backward)
from .conv1d import causal_conv1d_forward, causal_conv1d_backward  # noqa: F401
from .scan import (selective_scan_forward, selective_scan_backward,  # noqa: F401
                   complex_scan_forward, complex_scan_backward)
from .sln import _sln_parts, sln_forward, sln_backward  # noqa: F401
from .b4 import qmul, qconj, quaternion_generator, b4_forward, b4_backward  # noqa: F401
from .nc import nc_blocks, nc_features, nc_forward, nc_backward  # noqa: F401
from .ape import (ape_apply_forward, ape_apply_backward, ape_decay_forward,  # noqa: F401
                  ape_decay_backward)
from .gridpe import gridpe_complex_forward, gridpe_complex_backward  # noqa: F401
from .vq import vq_forward, vq_backward  # noqa: F401
from .l2_normalize import l2_normalize_forward, l2_normalize_backward  # noqa: F401
from .ema import ema_update  # noqa: F401
from .lstm import lstm_forward, lstm_backward  # noqa: F401
from .nc_general import nc_general_forward, nc_general_backward  # noqa: F401
