"""Reproduce TDB's Table 1 (Dedieu et al. 2024, 2D aliased rooms): TestAccu, ImpFallback,
RatioSP and NormGED of a vanilla transformer, an LSTM, TDB(S, M) and TDB(1, enc, 1), several
seeds (a new room per seed). Beyond the paper, the row ``mapwm_angles``: a MapWM transformer
trained as the vanilla one, its map extracted from its path-integrated angles
(:func:`mapformer.cogmap.evaluate_angle_map`: k-means of the angles into ``--angle-places``
places, by default as many as TDB has codes).

    python benchmarks/reproduce_tdb_table1.py --scale cpu     # or paper, tiny

Each (row, seed) is written to ``--out``/<row>_seed<k>.json as it finishes (a TDB's or
mapwm_angles' weights to <row>_seed<k>.npz as its training ends: ``python -m mapformer map``
draws its map); a rerun skips the ones already there, evaluates without retraining a run whose
weights are there but whose .json is not, and the table (beside the paper's numbers) is printed
from every file present.

Scales (the paper: 15 x 20 room, O = 4, one 4 x 4 patch twice, walks of 400, 2048 training
walks, 25k steps of batch 32, width 256, 4 layers, 8 heads, K = 1000 codes):
- ``paper``: those settings (a GPU's job: about 1.6e16 flop a run);
- ``cpu``: the issue's reduction keeping the paper's ratios: 10 x 15 room, 3 x 3 patch, walks
  of 200, width 128, 2 layers, K = 500, 2048 training walks, batch 32, 3000 steps;
- ``tiny``: a 6 x 8 room and walks of 60, for a smoke test (numbers mean nothing).

Deviations (all said in mapformer/tdb.py): RoPE in place of Transformer-XL positions; the M
codebooks quantise d_model / M channels each; the enc loss is averaged over positions (the
paper sums it). The transformer and the LSTM plan by appendix D's random rollouts with tail
evaluation (``--rollouts``, 100 as the paper; mapformer/rollouts.py), by incremental decoding
(the transformer's KV cache, the LSTM's state: ``Transformer.decode``), and the tail holds
C - 1 observations (the walk ends at x_{N-1}, counting from 0). Measured on this machine by
``benchmarks/rollout_decoding.py`` (one thread, untrained models, 10 rollouts of one
cpu-scale problem, a loaded machine): the rollouts 0.14 s transformer, 0.09 s LSTM CPU time
(38x and 83x less than recomputing every prefix), the whole planner with the tail evaluation
of every rollout at every length (an untrained model's worst case) 1.9 s and 1.4 s (5.6x and
10x less); ``--plan-problems K`` plans the first K test walks only.
"""
import argparse
import json
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np

from mapformer import cogmap, rollouts as rollout_planner
from mapformer.models import ModelConfig, Transformer
from mapformer.tasks import rooms
from mapformer.tdb import TDB, TDBConfig, load_checkpoint, save_checkpoint, vanilla_targets
from mapformer.train import AdamW, TrainConfig

# the paper's Table 1: TestAccu, ImpFallback, RatioSP, NormGED (None: not reported)
PAPER = {"transformer": (99.00, 29.53, 16.82, None), "lstm": (98.85, 31.97, 16.81, None),
         "tdb_s1_m1": (98.94, 6.61, 1.00, 0.532), "tdb_s1_enc_m1": (98.74, 99.20, 1.00, 0.118),
         "tdb_s3_m1": (99.06, 99.55, 1.00, 0.124), "tdb_s3_m4": (99.00, 96.59, 1.00, 0.186)}


@dataclass(frozen=True)
class Scale:
    room: rooms.RoomsConfig
    d_model: int
    n_heads: int
    n_layers: int
    codes: int
    head_hidden: int
    train_walks: int
    test_walks: int
    batch: int
    iterations: int
    lr: float
    context: int  # C: plans go from position C to N - C


SCALES = {
    "paper": Scale(rooms.RoomsConfig(15, 20, 4, 4, 400), 256, 8, 4, 1000, 512, 2048, 2048, 32,
                   25000, 1e-3, 50),
    "cpu": Scale(rooms.RoomsConfig(10, 15, 4, 3, 200), 128, 4, 2, 500, 256, 2048, 256, 32,
                 3000, 1e-3, 25),
    "tiny": Scale(rooms.RoomsConfig(6, 8, 4, 3, 60), 32, 2, 1, 64, 32, 64, 16, 8, 20, 1e-3, 8),
}

# TDB rows: (S, M, enc)
ROWS = {"transformer": None, "lstm": None, "tdb_s1_m1": (1, 1, False),
        "tdb_s1_enc_m1": (1, 1, True), "tdb_s3_m1": (3, 1, False), "tdb_s3_m4": (3, 4, False),
        "mapwm_angles": None}


def make_model(row, scale, n_obs, seed, restart_dead=0):
    if ROWS[row] is not None:
        steps, m, enc = ROWS[row]
        return TDB(TDBConfig(n_obs=n_obs, d_model=scale.d_model, n_heads=scale.n_heads,
                             n_layers=scale.n_layers, steps=steps, codebooks=m,
                             codes=scale.codes, head_hidden=scale.head_hidden,
                             restart_dead=restart_dead, enc=enc), seed=seed)
    if row == "mapwm_angles":  # omega spans the room's side, as omega_grid does a torus's
        return Transformer(ModelConfig.preset(
            "mapwm", n_obs + rooms.N_ACTIONS, d_model=scale.d_model, n_heads=scale.n_heads,
            n_layers=scale.n_layers, mlp_ratio=2,
            omega_grid=float(max(scale.room.height, scale.room.width))), seed=seed)
    mixer, positional = ("lstm", "none") if row == "lstm" else ("attention", "rope")
    return Transformer(ModelConfig(vocab_size=n_obs + rooms.N_ACTIONS, d_model=scale.d_model,
                                   n_heads=scale.n_heads, n_layers=scale.n_layers,
                                   mlp_ratio=2, mixer=mixer, positional=positional),
                       seed=seed)


def step_loss(model, tokens, n_obs):
    if isinstance(model, TDB):
        return model.loss(tokens)
    targets, mask = vanilla_targets(tokens, n_obs)
    return model.loss(tokens, targets, mask)


def test_accuracy(model, tokens, n_obs, batch):
    """Next-observation accuracy over every test position with a next observation."""
    right = total = 0
    for i in range(0, len(tokens), batch):
        t = tokens[i:i + batch]
        step_loss(model, t, n_obs)
        if isinstance(model, TDB):
            pred = model.predictions().reshape(len(t), -1)[:, :-1]
        else:
            pred = np.asarray(model.logits).reshape(len(t), t.shape[1], -1)[:, 1:-1:2]
            pred = pred.argmax(-1)
        want = t[:, 2::2]
        right += int((pred == want).sum())
        total += want.size
    return 100.0 * right / total


def run(row, scale, seed, log, checkpoint=None, restart_dead=0, rollouts=100,
        angle_places=None, plan_problems=0, topology="room"):
    config = replace(scale.room, seed=seed, topology=topology)
    places = scale.codes if angle_places is None else angle_places  # mapwm_angles' places
    room = rooms.make_room(config)
    train_walks = rooms.walks(config, room, scale.train_walks, [seed, 1])
    test_walks = rooms.walks(config, room, scale.test_walks, [seed, 2])
    n_obs = config.n_obs
    tokens = train_walks.tokens(n_obs)
    C = scale.context
    meta = {"room": asdict(config), "seed": seed, "train_walks": scale.train_walks,
            "test_walks": scale.test_walks, "context": C}
    if checkpoint is not None and Path(checkpoint).exists():  # trained, not yet evaluated
        model, saved = load_checkpoint(checkpoint)
        if {k: saved.get(k) for k in meta} != meta:
            raise ValueError(f"{checkpoint}: saved for {saved}, this run is {meta}")
        log(f"    {row} seed {seed}: weights from {checkpoint}, evaluating")
        return evaluate(row, model, saved, saved["train_s"], config, room, train_walks,
                        test_walks, n_obs, scale, rollouts, places, plan_problems)
    model = make_model(row, scale, n_obs, seed, restart_dead)
    opt = AdamW(model, TrainConfig(lr=scale.lr, weight_decay=0.0, clip=1.0))
    rng = np.random.default_rng([seed, 3])
    t0 = time.perf_counter()
    for it in range(scale.iterations):
        idx = rng.integers(0, len(tokens), scale.batch)
        loss = step_loss(model, tokens[idx], n_obs)
        model.backward()
        opt.step(scale.lr)
        if isinstance(model, TDB):
            model.update_teacher()  # enc: the teacher follows the student (else nothing)
        if (it + 1) % max(1, scale.iterations // 10) == 0:
            usage = model.vq.usage() if isinstance(model, TDB) else None
            log(f"    {row} seed {seed} step {it + 1}: loss {loss:.4f}"
                + (f" perplexity {usage['perplexity']} dead {usage['dead']}" if usage else ""))
    meta["train_s"] = time.perf_counter() - t0
    if checkpoint is not None and isinstance(model, TDB):
        save_checkpoint(model, checkpoint, **meta)
    elif checkpoint is not None and row == "mapwm_angles":  # map's default places: these
        save_checkpoint(model, checkpoint, **meta, angle_places=places)
    return evaluate(row, model, meta, meta["train_s"], config, room, train_walks, test_walks,
                    n_obs, scale, rollouts, places, plan_problems)


def evaluate(row, model, meta, train_s, config, room, train_walks, test_walks, n_obs, scale,
             rollouts, places, plan_problems):
    """A trained model's row of the table: TestAccu and its map's or its rollouts' metrics."""
    model.train(False)
    seed, C = meta["seed"], meta["context"]
    result = {"row": row, "seed": seed, "scale": asdict(scale), "train_s": train_s,
              "TestAccu": test_accuracy(model, test_walks.tokens(n_obs), n_obs, scale.batch)}
    if isinstance(model, TDB):
        _, _, metrics = cogmap.evaluate_map(model, meta, C)
        result.update(metrics)
    elif row == "mapwm_angles":
        _, metrics = cogmap.evaluate_angle_map(model, config, room, train_walks, test_walks, C,
                                               places)
        result.update(metrics, angle_places=places)
    else:  # no map: random rollouts with tail evaluation (appendix D)
        t0 = time.perf_counter()
        k = plan_problems or len(test_walks.obs)
        problems = rooms.Walks(test_walks.obs[:k], test_walks.actions[:k], test_walks.pos[:k])
        result.update(rollout_planner.evaluate_rollouts(
            rollout_planner.greedy_decoder(model, n_obs), problems, room, n_obs, C,
            rollouts, seed=[seed, 4]))
        result["plan_s"] = time.perf_counter() - t0
    return result


def table(results, paper=PAPER):
    """The mean ± std over seeds of each row present, ``paper``'s figures in parentheses."""
    lines = ["| model | TestAccu % | ImpFallback % | RatioSP | NormGED | seeds |",
             "|---|---|---|---|---|---|"]
    for row in ROWS:
        runs = [r for r in results if r["row"] == row]
        if not runs:
            continue
        cells = []
        for i, key in enumerate(("TestAccu", "ImpFallback", "RatioSP", "NormGED")):
            values = np.array([r.get(key, np.nan) for r in runs], float)
            ref = paper.get(row, (None,) * 4)[i]
            cell = "-" if np.all(np.isnan(values)) else \
                f"{np.nanmean(values):.2f} ± {np.nanstd(values):.2f}"
            cells.append(cell + (f" ({ref})" if ref is not None else ""))
        lines.append(f"| {row} | " + " | ".join(cells) + f" | {len(runs)} |")
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scale", choices=sorted(SCALES), default="cpu")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--rows", default=",".join(ROWS))
    parser.add_argument("--out", default=None, help="folder of per-run JSON (default "
                        "results/tdb_table1_<scale>)")
    parser.add_argument("--restart-dead", type=int, default=0,
                        help="TDB: restart codes unused for this many steps (0: never, as the "
                        "paper; without it small runs collapse onto a few codes)")
    parser.add_argument("--rollouts", type=int, default=100,
                        help="transformer and LSTM: random rollouts per planning problem "
                        "(appendix D: 100)")
    parser.add_argument("--plan-problems", type=int, default=0,
                        help="transformer and LSTM: plan only the first K test walks (0: "
                        "all; at the cpu scale a problem costs about 15 CPU seconds)")
    parser.add_argument("--topology", choices=("room", "torus"), default="room",
                        help="the rooms' (default: the paper's, walls); torus: edges joined, "
                        "beyond the paper (default --out then ends in _torus)")
    parser.add_argument("--angle-places", type=int, default=None,
                        help="mapwm_angles: k-means places of the angles (default: the "
                        "scale's TDB codes, 500 at cpu)")
    args = parser.parse_args(argv)
    scale = SCALES[args.scale]
    suffix = "" if args.topology == "room" else f"_{args.topology}"
    out = Path(args.out or f"results/tdb_table1_{args.scale}{suffix}")
    out.mkdir(parents=True, exist_ok=True)
    for row in [r.strip() for r in args.rows.split(",")]:
        if row not in ROWS:
            parser.error(f"unknown row {row!r}; rows: {list(ROWS)}")
        for seed in range(args.seeds):
            path = out / f"{row}_seed{seed}.json"
            if path.exists():
                print(f"  {row} seed {seed}: done ({path})")
                continue
            result = run(row, scale, seed, log=print,
                         checkpoint=out / f"{row}_seed{seed}.npz",
                         restart_dead=args.restart_dead, rollouts=args.rollouts,
                         angle_places=args.angle_places,
                         plan_problems=args.plan_problems, topology=args.topology)
            result["restart_dead"] = args.restart_dead
            path.write_text(json.dumps(result, indent=1))
            print(f"  {row} seed {seed}: " + ", ".join(
                f"{k} {result[k]:.3f}" for k in ("TestAccu", "ImpFallback", "RatioSP",
                                                 "NormGED") if k in result), flush=True)
    results = [json.loads(p.read_text()) for p in sorted(out.glob("*_seed*.json"))]
    print(table(results, PAPER if args.topology == "room" else {}))
    return results


if __name__ == "__main__":
    main()
