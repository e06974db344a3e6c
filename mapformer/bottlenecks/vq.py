"""``vq``: the discrete bottleneck of TDB (Dedieu et al. 2024, eq. 2-3), in the Block's slot.

The residual stream x (N, C) is cut into M = ``vq_codebooks`` slices of D = C / M, and slice
m is snapped to the nearest of the K = ``vq_codes`` codes of its own codebook (the C op
``vq``: one product per codebook, lowest index on ties); the output is the codes, taken
straight through (the gradient reaching them goes to x unchanged). With ``vq_width``
'full' every codebook reads the whole x (D = C) and the output is the M codes concatenated,
(N, M C) (TDB's multiple bottlenecks as the paper's Sec. 3.5 defines them); the gradient to
x is then the sum of the M codebooks' straight-through gradients. A Block's slot must keep
the residual width, so there 'full' takes M = 1 only (where both readings are one).
The auxiliary loss is the standard VQ-VAE form (van den Oord et al. 2017; sonnet's
VectorQuantizer)
    codebook term ||e - sg(x)||^2  +  beta ||sg(e) - x||^2  (commitment, beta = ``vq_beta``)
summed over the M codebooks, each averaged over its N D elements (``vq_reduction`` 'mean',
the convention of the reference implementations) or summed over D and averaged over the N
rows ('sum', the paper's notation). The paper's printed eq. 3 puts the second stop-gradient
around the whole difference (a term with no gradient); this is the intended VQ-VAE form.
Codebooks are trained by that gradient (no EMA), initialised N(0, 1) (LayerNorm'd scale),
and are excluded from weight decay.

Deviations from the paper, said here: TDB quantises the transformer's final output and reads
M codebooks of width C each from the same vector; the slot sits inside a block (between its
mixer and its MLP; only the last block's quantises unless ``vq_every_block``) and the M
codebooks share the width by default (product quantisation, ``vq_width`` 'split'), so the
output keeps the residual width.

Code usage (:meth:`VQ.usage`: perplexity, dead codes per codebook over the forwards since the
last call) is for the training log; ``vq_restart_dead`` replaces the codes no row chose over
that many forwards by rows of the current batch (off by default: the paper has none).
"""
import zlib

import numpy as np

from .. import codeusage
from ..registry import Option
from . import Bottleneck, register_bottleneck


@register_bottleneck
class VQ(Bottleneck):
    """Parameters: ``codebook`` (M, K, D), no weight decay (D = d_model / M, or d_model with
    ``vq_width`` 'full'). Traces: ``indices`` (N, M) int32, ``codes`` (N, M, D). ``out_width``:
    the output's width, M D."""

    name = "vq"
    options = (
        Option("vq_codes", int, 1000, "codes per codebook (K)", minimum=1),
        Option("vq_codebooks", int, 1, "parallel codebooks (M), each over d_model / M "
               "channels", minimum=1),
        Option("vq_width", str, "split", "what each codebook reads: split (d_model / M "
               "channels, the output d_model wide) or full (all d_model channels, the output "
               "the M codes concatenated, M d_model wide)", choices=("split", "full")),
        Option("vq_beta", float, 0.25, "weight of the VQ commitment term", minimum=0.0),
        Option("vq_reduction", str, "mean", "VQ loss per codebook: mean over its elements, "
               "or summed over the code width and averaged over rows",
               choices=("mean", "sum")),
        Option("vq_restart_dead", int, 0, "restart codes unused for this many forwards (0: "
               "never)", minimum=0),
        Option("vq_every_block", bool, False, "quantise in every block (default: the last)"),
    )
    traces = ("indices", "codes")

    def __init__(self, store, name, config, ops):
        super().__init__(store, name, config, ops)
        o = config.options
        self.M, self.K = o["vq_codebooks"], o["vq_codes"]
        self.full = o["vq_width"] == "full" and self.M > 1
        if self.full and name.startswith("blocks."):
            raise ValueError(f"vq_width 'full' with vq_codebooks {self.M} makes the output "
                             f"{self.M} x d_model wide: a Block's slot keeps d_model (use "
                             "'split', or TDB's bottleneck)")
        if not self.full and config.d_model % self.M:
            raise ValueError(f"vq_codebooks ({self.M}) must divide d_model ({config.d_model})")
        self.D = config.d_model if self.full else config.d_model // self.M
        self.out_width = self.M * self.D
        block = int(name.split(".")[1]) if name.startswith("blocks.") else 0
        self.active = o["vq_every_block"] or block == config.n_layers - 1
        self.beta, self.reduction = o["vq_beta"], o["vq_reduction"]
        self.restart_every = o["vq_restart_dead"]
        self.codebook = store.declare(f"{name}.codebook", (self.M, self.K, self.D),
                                      lambda rng, shape: rng.standard_normal(shape),
                                      decay=False) if self.active else None
        self.rng = np.random.default_rng(zlib.crc32(name.encode()))
        self.counts = np.zeros((self.M, self.K), np.int64)
        self.restart_counts = np.zeros((self.M, self.K), np.int64)
        self.forwards = 0
        self.loss = 0.0

    def loss_weight(self, rows):
        """The weight of sum ||e - x||^2 in the loss (before beta)."""
        return 1.0 / (rows * (self.D if self.reduction == "mean" else 1))

    def forward(self, x):
        if not self.active:
            return x
        rows = x.shape[0]
        if self.full:  # every codebook reads the whole row
            self.z = self.ops.zeros((rows, self.M, self.D))
            self.z[...] = x.reshape(rows, 1, self.D)
        else:
            self.z = x.reshape(rows, self.M, self.D)
        self.codes, self.indices, _, total = self.ops.vq_forward(self.z, self.codebook.value)
        self.loss = (1.0 + self.beta) * self.loss_weight(rows) * total
        self.count(rows)
        return self.codes.reshape(rows, -1)

    def count(self, rows):
        """Add the last forward's indices to the usage counts; restart dead codes when due.
        Training forwards only: an evaluation leaves the codebook and the counts as they
        were."""
        if not self.training:
            return
        counts = codeusage.count_codes(self.ops.to_numpy(self.indices), self.K)
        self.counts += counts
        if not self.restart_every:
            return
        self.restart_counts += counts
        self.forwards += 1
        if self.forwards % self.restart_every == 0:
            for m, k, r in codeusage.restart_choices(self.restart_counts, rows, self.rng):
                self.codebook.value[m, k] = self.z[r, m]
            self.restart_counts[...] = 0

    def backward(self, dy):
        if not self.active:
            return dy
        rows = dy.shape[0]
        w = self.loss_weight(rows)
        dz = self.ops.vq_backward(dy.reshape(rows, self.M, self.D), self.z,
                                  self.codebook.value, self.indices, self.codebook.grad, w,
                                  self.beta * w)
        return dz.sum(axis=1) if self.full else dz.reshape(rows, -1)

    def aux_loss(self):
        return self.loss if self.active else 0.0

    def usage(self):
        """Code usage since the last call ({perplexity, dead, used}, one entry per codebook),
        then the counts restart; None for an inactive (identity) slot."""
        if not self.active:
            return None
        out = codeusage.usage(self.counts)
        self.counts[...] = 0
        return out

    @classmethod
    def flops(cls, config, batch, steps):
        """The distance products: 2 N C K (every codebook's D-wide slice against its K codes;
        M times that with ``vq_width`` 'full'), in the quantising blocks."""
        o = config.options
        blocks = config.n_layers if o["vq_every_block"] else 1
        readers = o["vq_codebooks"] if o["vq_width"] == "full" else 1
        return (2 * batch * steps * config.d_model * o["vq_codes"] * readers * blocks
                // config.n_layers)
