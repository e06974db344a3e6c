"""The same training step in mapformer and in PyTorch (eager and torch.compile), interleaved in
one run: medians and ratios.

A step is forward, masked cross-entropy, backward, gradient clipping at 1.0 and AdamW, on
forced-navigation tokens, for three models of the same architecture in both libraries:
pre-LN blocks (LayerNorm, attention with q, k, v, out projections with biases, residual,
LayerNorm, MLP of 4x width with tanh-GELU, residual), a final LayerNorm and a linear head.
- rope: queries and keys rotated by fixed angles omega_i t (F.scaled_dot_product_attention,
  causal, in PyTorch);
- mapwm: rotated by path-integrated angles theta = omega * cumsum_t(x W_in W_out) (rank 2);
- mapem_os: conjunctive attention softmax(scale (q_x k_x^T) * (q_p k_p^T)) with positional
  queries and keys R(theta) p* (explicit score matrices in PyTorch: no fused kernel does
  this);
- mamba (not in the default list: --models mamba): the Mamba-1 mixer in place of attention
  (expand 2, d_state 16, conv width 4, dt_rank ceil(d_model / 16), Euler B_bar), in PyTorch
  as johnma2006/mamba-minimal writes it: the selective scan a Python loop over time, eager
  only (torch.compile unrolls the loop: skipped). PyTorch has no fused CPU scan.
PyTorch runs on the same number of threads (torch.set_num_threads) as mapformer's OpenMP
(OMP_NUM_THREADS, default: all cores). The models are the same size and do the same math; their
parameters are initialised independently (this measures time, not training).

PyTorch is for comparison only, never a dependency: install it in a separate virtualenv
(`pip install torch==2.13.0` takes a CPU build here), with mapformer importable there
(`pip install .`, or PYTHONPATH=<repository root> after an in-place build).

Prints one line per model and variant and a JSON line at the end.
"""
import argparse
import json
import os
import time

import numpy as np

from mapformer import _C
from mapformer.models import ModelConfig, Transformer
from mapformer.tasks import navigation
from mapformer.train import AdamW, TrainConfig

try:
    import torch
    import torch.nn.functional as F
except ImportError:  # pragma: no cover - the benchmark's only precondition
    raise SystemExit("bench_vs_pytorch.py needs PyTorch: in a separate virtualenv, "
                     "`pip install torch==2.13.0` (CPU build), with mapformer importable there")

MODELS = ("mapwm", "rope", "mapem_os")


# ---- the PyTorch models ------------------------------------------------------------------
def rotate(x, cos, sin):
    """x (B, T, H, D) with pairs (x[2i], x[2i+1]) rotated by angles whose cos, sin are
    (B or 1, T, H, D/2)."""
    x0, x1 = x[..., 0::2], x[..., 1::2]
    return torch.stack((x0 * cos - x1 * sin, x0 * sin + x1 * cos), -1).flatten(-2)


class TorchBlock(torch.nn.Module):
    def __init__(self, kind, d, heads, rank, grid):
        super().__init__()
        self.kind, self.heads, self.hd = kind, heads, d // heads
        nb = self.hd // 2
        self.ln1, self.ln2 = torch.nn.LayerNorm(d), torch.nn.LayerNorm(d)
        self.fc, self.proj = torch.nn.Linear(d, 4 * d), torch.nn.Linear(4 * d, d)
        if kind != "mamba":
            self.q, self.k, self.v, self.o = (torch.nn.Linear(d, d) for _ in range(4))
        if kind == "mamba":
            self.mixer = TorchMamba(d)
            return
        if kind == "rope":
            self.register_buffer("omega", 10000.0 ** (-torch.arange(nb) / nb))
        else:
            self.delta_in = torch.nn.Linear(d, rank, bias=False)
            self.delta_out = torch.nn.Linear(rank, heads * nb, bias=False)
            self.omega = torch.nn.Parameter(
                (np.pi * grid ** (-torch.arange(nb) / (nb - 1))).repeat(heads, 1))
        if kind == "mapem_os":
            self.start = torch.nn.Parameter(torch.randn(heads, self.hd))

    def angles(self, x):
        B, T, _ = x.shape
        if self.kind == "rope":
            theta = torch.arange(1, T + 1, dtype=x.dtype)[:, None, None] * self.omega
            return theta[None].expand(1, T, self.heads, -1)
        delta = self.delta_out(self.delta_in(x)).view(B, T, self.heads, -1)
        return self.omega * torch.cumsum(delta, 1)

    def attend(self, x):
        B, T, d = x.shape
        shape = (B, T, self.heads, self.hd)
        q, k, v = self.q(x).view(shape), self.k(x).view(shape), self.v(x).view(shape)
        theta = self.angles(x)
        cos, sin = torch.cos(theta), torch.sin(theta)
        scale = self.hd ** -0.5
        if self.kind == "mapem_os":
            p = rotate(self.start.expand(B, T, -1, -1), cos, sin)
            sx = torch.einsum("bihd,bjhd->bhij", q, k)
            sp = torch.einsum("bihd,bjhd->bhij", p, p)
            causal = torch.ones(T, T, dtype=torch.bool).tril()
            a = torch.softmax((scale * sx * sp).masked_fill(~causal, float("-inf")), -1)
            out = torch.einsum("bhij,bjhd->bihd", a, v)
        else:
            q, k = rotate(q, cos, sin), rotate(k, cos, sin)
            out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                                 v.transpose(1, 2), is_causal=True,
                                                 scale=scale).transpose(1, 2)
        return self.o(out.reshape(B, T, d))

    def forward(self, x):
        x = x + (self.mixer if self.kind == "mamba" else self.attend)(self.ln1(x))
        return x + self.proj(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class TorchMamba(torch.nn.Module):
    """The Mamba-1 mixer, as mamba-minimal: x (B, T, d) -> (B, T, d)."""

    def __init__(self, d, expand=2, d_state=16, d_conv=4):
        super().__init__()
        e, self.rank = expand * d, -(-d // 16)
        self.in_proj = torch.nn.Linear(d, 2 * e, bias=False)
        self.conv = torch.nn.Conv1d(e, e, d_conv, groups=e, padding=d_conv - 1)
        self.x_proj = torch.nn.Linear(e, self.rank + 2 * d_state, bias=False)
        self.dt_proj = torch.nn.Linear(self.rank, e)
        self.A_log = torch.nn.Parameter(torch.log(torch.arange(1, d_state + 1.0)).repeat(e, 1))
        self.D = torch.nn.Parameter(torch.ones(e))
        self.out_proj = torch.nn.Linear(e, d, bias=False)

    def forward(self, x):
        T, n = x.shape[1], self.A_log.shape[1]
        u, z = self.in_proj(x).chunk(2, -1)
        u = F.silu(self.conv(u.transpose(1, 2))[..., :T].transpose(1, 2))
        dt, Bs, Cs = self.x_proj(u).split((self.rank, n, n), -1)
        delta = F.softplus(self.dt_proj(dt))                      # (B, T, E)
        dA = torch.exp(delta[..., None] * -torch.exp(self.A_log))  # (B, T, E, N)
        dBu = (delta * u)[..., None] * Bs[:, :, None]              # (B, T, E, N)
        h, ys = torch.zeros_like(dA[:, 0]), []
        for t in range(T):
            h = dA[:, t] * h + dBu[:, t]
            ys.append((h * Cs[:, t, None]).sum(-1))
        y = torch.stack(ys, 1) + u * self.D
        return self.out_proj(y * F.silu(z))


class TorchModel(torch.nn.Module):
    def __init__(self, kind, vocab, d, heads, layers, rank=2, grid=64):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, d)
        self.blocks = torch.nn.ModuleList(TorchBlock(kind, d, heads, rank, grid)
                                          for _ in range(layers))
        self.ln_f, self.head = torch.nn.LayerNorm(d), torch.nn.Linear(d, vocab)

    def forward(self, tokens, targets, mask):
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        losses = F.cross_entropy(self.head(self.ln_f(x)).flatten(0, 1), targets.flatten(),
                                 reduction="none")
        return (losses * mask.flatten()).sum() / mask.sum()


def torch_step(kind, task, batch, args, compiled):
    """A callable running one PyTorch training step (forward, backward, clip, AdamW)."""
    model = TorchModel(kind, task.vocab_size, args.d_model, args.heads, args.layers)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.05)
    tokens, targets = torch.from_numpy(batch.tokens).long(), torch.from_numpy(batch.targets).long()
    mask = torch.from_numpy(batch.mask).float()
    loss_fn = torch.compile(model) if compiled else model

    def step():
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(tokens, targets, mask)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
    return step


def mapformer_step(kind, task, batch, args):
    """A callable running one mapformer training step."""
    cfg = ModelConfig.for_task(kind, task, d_model=args.d_model, n_heads=args.heads,
                               n_layers=args.layers)
    model = Transformer(cfg, seed=0)
    opt = AdamW(model, TrainConfig())

    def step():
        model.loss(batch.tokens, batch.targets, batch.mask)
        model.backward()
        opt.step(1e-4)
    return step


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--tokens", type=int, default=256, help="tokens per sequence (even)")
    p.add_argument("--d-model", type=int, default=128)
    p.add_argument("--heads", type=int, default=2)
    p.add_argument("--layers", type=int, default=1)
    p.add_argument("--models", default=",".join(MODELS),
                   help=f"comma-separated, of {', '.join(MODELS + ('mamba',))}")
    p.add_argument("--repeats", type=int, default=7, help="timed rounds (each runs every "
                   "variant once, in turn)")
    p.add_argument("--warmup", type=int, default=3, help="untimed rounds (torch.compile "
                   "compiles in its first)")
    p.add_argument("--no-compile", action="store_true", help="skip torch.compile")
    p.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                   help="wall time, or the process's CPU time (all threads'; for one-thread "
                        "figures on a shared machine)")
    args = p.parse_args()
    clock = time.process_time if args.clock == "cpu" else time.perf_counter
    threads = int(os.environ.get("OMP_NUM_THREADS", os.cpu_count()))
    torch.set_num_threads(threads)
    task = navigation.NavigationConfig(dims=2, steps=args.tokens // 2, grid_size=64)
    batch = navigation.generate(task, args.batch, np.random.default_rng(0))
    print(f"batch {args.batch}, {args.tokens} tokens, d_model {args.d_model}, {args.heads} "
          f"heads, {args.layers} layer(s), {threads} thread(s); mapformer kernels "
          f"{_C.kernels()}, torch {torch.__version__}")
    figures = {"clock": args.clock, "batch": args.batch, "tokens": args.tokens, "d_model": args.d_model,
               "heads": args.heads, "layers": args.layers, "threads": threads,
               "kernels": _C.kernels(), "torch": torch.__version__}
    for kind in args.models.split(","):
        variants = {"mapformer": mapformer_step(kind, task, batch, args),
                    "eager": torch_step(kind, task, batch, args, compiled=False)}
        if not args.no_compile and kind != "mamba":
            variants["compile"] = torch_step(kind, task, batch, args, compiled=True)
        times = {name: [] for name in variants}
        for round_ in range(args.warmup + args.repeats):
            for name, step in variants.items():
                t0 = clock()
                step()
                if round_ >= args.warmup:
                    times[name].append(clock() - t0)
        medians = {name: float(np.median(t)) * 1e3 for name, t in times.items()}
        ours = medians["mapformer"]
        line = "   ".join(f"{name} {ms:.1f} ms" + ("" if name == "mapformer" else
                                                  f" ({ms / ours:.2f}x mapformer's time)")
                          for name, ms in medians.items())
        print(f"{kind}: {line}   (medians of {args.repeats})")
        figures[kind] = {name: round(ms, 1) for name, ms in medians.items()}
        figures[kind].update({f"{name}_over_mapformer": round(ms / ours, 2)
                              for name, ms in medians.items() if name != "mapformer"})
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
