"""GINC, the synthetic in-context-learning data of Xie et al. 2022 ("An explanation of
in-context learning as implicit Bayesian inference"), as TDB uses it (Dedieu et al. 2024,
section 4.4 and appendix K): documents drawn from a mixture of HMMs over one vocabulary, and
prompts of n examples whose next token is the in-context answer.

Written from the description of the authors' generator (p-lambda/incontext-learning,
``generate_data.py``: the paper's dataset is its GINC_trans0.1_start10.0_nsymbols50_nvalues10_
nslots10_vic0.9_nhmms10), with NumPy's Generator in place of its global seeds (so the same
settings give other draws than the published files, the same distribution):

- hidden state h = value * n_slots + slot (``n_values`` x ``n_slots`` states), emitting the
  symbol ``emission[h]`` deterministically; ``emission`` is an (n_values, n_slots) table of
  symbols drawn from 1 .. n_symbols - 1, its slot 0 the delimiter, symbol 0 ('/');
- transitions T = V (x) S_c (Kronecker): V (n_values^2) shared by every HMM, the identity
  mixed in with weight ``value_identity``; S_c (n_slots^2) the HMM's own; each a mixture of
  as many random permutation matrices as its side, weighted by softmax((u - 0.5) /
  ``transition_temp``), u uniform; the start distribution softmax((u - 0.5) / ``start_temp``)
  over the states;
- ``n_hmms`` HMMs, the first half the in-distribution concepts: a document picks one
  uniformly and is one sample of ``length`` symbols from it;
- a prompt ("ID_sample" in the generator) of n examples with k tokens each: one concept and
  one start slot (1 .. n_slots - 1) for the whole prompt, each example a hidden walk of k
  states from (a uniform value, the start slot), its k symbols then the delimiter; the last,
  (n + 1)-th, example is cut to its first k - 1 symbols, and the label is the argmax of the
  concept's next-symbol probability given them, its start distribution uniform over the
  values at the start slot (:func:`next_symbol_probabilities`, forward filtering).

As a training task of :func:`mapformer.train.train` (task "ginc", :class:`GincTask`): a corpus
of ``documents`` documents of ``length`` symbols (the paper's 1000 of 10,240), each step's
batch windows of ``window`` symbols at uniform offsets of uniform documents; TDB reads text
with one dummy action (the CSCG convention the research notes choose: the paper says only
"the same models"), so a sequence is x_1, a, x_2, a, ..., its vocabulary the symbols and the
one action, and the loss is on the next symbol at every action's position, as the rooms
task's. The evaluation sets are the prompts of every k of :data:`PROMPT_LENGTHS` and n of
:data:`EXAMPLE_COUNTS` (:class:`GincPrompts`, "k3_n0" ...), scored at the last position
only: their accuracy is the in-context accuracy of the paper's Table 9.
"""
import functools
from dataclasses import dataclass, field

import numpy as np

from .stream import check_task_options

DELIMITER = 0
PROMPT_LENGTHS = (3, 5, 8, 10)  # k, the paper's
EXAMPLE_COUNTS = (0, 1, 2, 4, 8, 16, 32, 64)  # n, the paper's (Table 9)


@dataclass(frozen=True)
class GincConfig:
    """The mixture's settings (the paper's dataset by default) and the seed it is drawn
    from."""

    n_symbols: int = 50
    n_values: int = 10
    n_slots: int = 10
    n_hmms: int = 10
    transition_temp: float = 0.1
    start_temp: float = 10.0
    value_identity: float = 0.9
    seed: int = 1111

    def __post_init__(self):
        for name, low in (("n_symbols", 2), ("n_values", 1), ("n_slots", 2), ("n_hmms", 2)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
        for name in ("transition_temp", "start_temp"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)!r}")
        if not 0.0 <= self.value_identity <= 1.0:
            raise ValueError(f"value_identity must be in [0, 1], got {self.value_identity!r}")

    @property
    def n_states(self):
        return self.n_values * self.n_slots


@dataclass(frozen=True)
class Mixture:
    """emission int (n_values, n_slots): each state's symbol (column 0 the delimiter);
    start float (H, n_states); transitions float (H, n_states, n_states), rows summing to 1;
    slot_transitions (H, n_slots, n_slots); value_transitions (n_values, n_values), shared;
    concepts: the in-distribution HMMs' indices (the first H // 2)."""

    config: GincConfig
    emission: np.ndarray
    start: np.ndarray
    transitions: np.ndarray
    slot_transitions: np.ndarray
    value_transitions: np.ndarray

    @property
    def concepts(self):
        return np.arange(self.config.n_hmms // 2)

    @property
    def symbols(self):
        """int (n_states,): the symbol each hidden state emits."""
        return self.emission.reshape(-1)


def softmax(x, temp):
    """softmax(x / temp) of a vector."""
    e = np.exp((x - x.max()) / temp)
    return e / e.sum()


def permutation_mixture(n, temp, rng):
    """(n, n): a mixture of n random permutation matrices weighted by softmax((u - 0.5) /
    temp) (the generator's generate_transmat_block)."""
    weights = softmax(rng.random(n) - 0.5, temp)
    eye = np.eye(n)
    return sum(w * eye[rng.permutation(n)] for w in weights)


def make_mixture(config):
    """The HMMs of ``config``, drawn from default_rng([seed, 0]) (emissions, then per HMM its
    start distribution and slot transitions) and default_rng([seed, 1]) (the shared value
    transitions)."""
    rng = np.random.default_rng([config.seed, 0])
    emission = rng.integers(1, config.n_symbols, (config.n_values, config.n_slots))
    emission[:, 0] = DELIMITER
    values = permutation_mixture(config.n_values, config.transition_temp,
                                 np.random.default_rng([config.seed, 1]))
    values = (1 - config.value_identity) * values + config.value_identity * np.eye(
        config.n_values)
    start, slots = [], []
    for _ in range(config.n_hmms):
        start.append(softmax(rng.random(config.n_states) - 0.5, config.start_temp))
        slots.append(permutation_mixture(config.n_slots, config.transition_temp, rng))
    slots = np.array(slots)
    return Mixture(config, emission, np.array(start),
                   np.array([np.kron(values, s) for s in slots]), slots, values)


def sample_next(rows, rng):
    """One draw per row of the probability rows (n, S): int (n,)."""
    u = rng.random((len(rows), 1))
    return np.minimum((np.cumsum(rows, axis=1) < u).sum(1), rows.shape[1] - 1)


def hidden_walks(mixture, hmm, first, steps, rng):
    """int (n, steps + 1): from the hidden states ``first`` (n,), ``steps`` transitions of
    each walk's HMM ``hmm`` (n,)."""
    states = np.empty((len(first), steps + 1), np.int64)
    states[:, 0] = first
    for t in range(steps):
        states[:, t + 1] = sample_next(mixture.transitions[hmm, states[:, t]], rng)
    return states


def documents(mixture, n, length, rng):
    """(symbols int32 (n, length), the HMM of each document int (n,), its hidden states
    (n, length)): each document one sample of an in-distribution HMM drawn uniformly."""
    rng = np.random.default_rng(rng)
    hmm = rng.choice(mixture.concepts, n)
    hidden = hidden_walks(mixture, hmm, sample_next(mixture.start[hmm], rng), length - 1,
                          rng)
    return mixture.symbols[hidden].astype(np.int32), hmm, hidden


def next_symbol_probabilities(mixture, hmm, start, symbols):
    """float (n_symbols,): p(next symbol | symbols) under HMM ``hmm`` whose first state is
    drawn from ``start`` (n_states,) (forward filtering; hmmlearn's predict_proba, then one
    transition and the emissions). ValueError when the symbols have no probability."""
    T, out = mixture.transitions[hmm], mixture.symbols
    belief = start * (out == symbols[0])
    for x in symbols[1:]:
        if belief.sum() == 0:
            break
        belief = (belief / belief.sum()) @ T * (out == x)
    if belief.sum() == 0:
        raise ValueError("the symbols have probability 0 under the HMM")
    ahead = (belief / belief.sum()) @ T
    return np.bincount(out, weights=ahead, minlength=mixture.config.n_symbols)


@dataclass(frozen=True)
class Prompts:
    """tokens int32 (P, L): n examples of k symbols, each followed by the delimiter, then
    the last example's first k - 1 symbols (L = n (k + 1) + k - 1); labels int (P,): the
    in-context answer; hmm, start_slot int (P,): the concept and the start slot of each."""

    tokens: np.ndarray
    labels: np.ndarray
    hmm: np.ndarray
    start_slot: np.ndarray


def prompts(mixture, k, n, count, rng):
    """``count`` prompts of ``n`` examples of ``k`` symbols (see the module)."""
    if isinstance(k, bool) or not isinstance(k, int) or k < 2:
        raise ValueError(f"k (the example length) must be an integer >= 2, got {k!r}")
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise ValueError(f"n (the examples) must be an integer >= 0, got {n!r}")
    c = mixture.config
    rng = np.random.default_rng(rng)
    hmm = rng.choice(mixture.concepts, count)
    slot = rng.integers(1, c.n_slots, count)
    values = rng.integers(0, c.n_values, (count, n + 1))
    first = (values * c.n_slots + slot[:, None]).reshape(-1)
    walks = hidden_walks(mixture, np.repeat(hmm, n + 1), first, k - 1, rng)
    symbols = mixture.symbols[walks].reshape(count, n + 1, k)
    examples = np.concatenate([symbols, np.full((count, n + 1, 1), DELIMITER)], axis=2)
    tokens = examples.reshape(count, -1)[:, :(n + 1) * (k + 1) - 2].astype(np.int32)
    labels = np.empty(count, np.int64)
    for i in range(count):
        start = np.zeros(c.n_states)
        start[np.arange(c.n_values) * c.n_slots + slot[i]] = 1.0 / c.n_values
        labels[i] = next_symbol_probabilities(mixture, hmm[i], start,
                                              symbols[i, -1, :k - 1]).argmax()
    return Prompts(tokens, labels, hmm, slot)


# ---- the training task ----------------------------------------------------------------------
LOSS_POSITIONS = ("observations",)
TASK_OPTIONS = {"documents": int, "length": int, "window": int, "seed": int}
"""The task's options (TrainConfig.task_options): the corpus' documents and their length, the
training windows' symbols and the mixture's seed."""


@dataclass(frozen=True)
class GincTask:
    """Training on the documents of ``mixture`` (a GincConfig): ``documents`` documents of
    ``length`` symbols drawn from default_rng([mixture.seed, 2]), windows of ``window``
    symbols. No blank token."""

    mixture: GincConfig = field(default_factory=GincConfig)
    documents: int = 1000
    length: int = 10240
    window: int = 1024
    blank_id = None

    def __post_init__(self):
        for name in ("documents", "length", "window"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 2:
                raise ValueError(f"task 'ginc': {name} must be an integer >= 2, got {value!r}")
        if self.window > self.length:
            raise ValueError(f"task 'ginc': window ({self.window}) must not exceed the "
                             f"documents' length ({self.length})")

    @property
    def vocab_size(self):
        return self.mixture.n_symbols + 1  # the symbols and the dummy action

    @property
    def seq_len(self):
        return 2 * self.window


@dataclass(frozen=True)
class GincPrompts:
    """An evaluation set: prompts of ``n`` examples of ``k`` symbols of ``mixture``."""

    mixture: GincConfig
    k: int
    n: int
    blank_id = None

    @property
    def vocab_size(self):
        return self.mixture.n_symbols + 1

    @property
    def seq_len(self):
        return 2 * (self.n * (self.k + 1) + self.k - 1)


def task_preset(name="iid", **options):
    """The GincTask of preset ``name`` ("iid": the paper's dataset) with ``options``
    (:data:`TASK_OPTIONS`; seed the mixture's)."""
    if name != "iid":
        raise ValueError(f"task 'ginc' has the preset 'iid' only, not {name!r}")
    options = check_task_options("ginc", options, TASK_OPTIONS)
    seed = options.pop("seed", GincConfig.seed)
    return GincTask(GincConfig(seed=seed), **options)


@functools.lru_cache(maxsize=2)
def mixture_of(config):
    """The (cached) Mixture of a GincConfig."""
    return make_mixture(config)


@functools.lru_cache(maxsize=2)
def corpus(task):
    """The task's documents, int32 (documents, length), read-only (cached)."""
    symbols = documents(mixture_of(task.mixture), task.documents, task.length,
                        [task.mixture.seed, 2])[0]
    symbols.flags.writeable = False
    return symbols


@dataclass
class GincBatch:
    """tokens int32 (B, 2N): x_1, a, ..., x_N, a (a = n_symbols); targets int32 (B, 2N) and
    mask bool (B, 2N): the next symbol at every action's position but the last (training) or
    the label at the last one only (prompts)."""

    tokens: np.ndarray
    targets: np.ndarray
    mask: np.ndarray


def interleave(symbols, n_symbols):
    """symbols int (B, N) -> tokens int32 (B, 2N) with the dummy action after each."""
    tokens = np.full((symbols.shape[0], 2 * symbols.shape[1]), n_symbols, np.int32)
    tokens[:, 0::2] = symbols
    return tokens


def generate(task, batch_size, rng=None):
    """``batch_size`` windows of the corpus, each a uniform document at a uniform offset."""
    rng = np.random.default_rng(rng)
    docs = corpus(task)
    which = rng.integers(0, task.documents, batch_size)
    start = rng.integers(0, task.length - task.window + 1, batch_size)
    symbols = docs[which[:, None], start[:, None] + np.arange(task.window)]
    tokens = interleave(symbols, task.mixture.n_symbols)
    targets = np.zeros_like(tokens)
    mask = np.zeros(tokens.shape, bool)
    targets[:, 1:-1:2], mask[:, 1:-1:2] = tokens[:, 2::2], True
    return GincBatch(tokens, targets, mask)


def eval_set(task, n_sequences, seed=None, batch_size=32):
    """A GincTask's evaluation: its windows (seed [seed, 1]); a GincPrompts set's:
    ``n_sequences`` prompts drawn from default_rng([mixture.seed, 3, k, n]) (``seed`` is not
    read: the prompts are the set's), scored at the last position."""
    if isinstance(task, GincTask):
        rng = np.random.default_rng([0 if seed is None else seed, 1])
        return [generate(task, min(batch_size, n_sequences - i), rng)
                for i in range(0, n_sequences, batch_size)]
    drawn = prompts(mixture_of(task.mixture), task.k, task.n, n_sequences,
                    [task.mixture.seed, 3, task.k, task.n])
    tokens = interleave(drawn.tokens, task.mixture.n_symbols)
    targets = np.zeros_like(tokens)
    mask = np.zeros(tokens.shape, bool)
    targets[:, -1], mask[:, -1] = drawn.labels, True
    return [GincBatch(tokens[i:i + batch_size], targets[i:i + batch_size],
                      mask[i:i + batch_size]) for i in range(0, n_sequences, batch_size)]


def loss_mask(batch, positions):
    """bool (B, 2N): "observations", every position whose target is the next symbol."""
    if positions not in LOSS_POSITIONS:
        raise ValueError(f"loss_positions must be one of {LOSS_POSITIONS} for task 'ginc', "
                         f"got {positions!r}")
    return batch.mask


def token_coordinates(batch):
    """None: no positions but the token order."""
    return None


def ood_sets(task):
    """The prompt sets {"k{k}_n{n}": GincPrompts} of every k and n of the paper whose prompt
    fits the training window."""
    return {f"k{k}_n{n}": GincPrompts(task.mixture, k, n)
            for k in PROMPT_LENGTHS for n in EXAMPLE_COUNTS
            if n * (k + 1) + k - 1 <= task.window}


def describe(task):
    """'1000 documents of 10240 symbols from 5 of 10 HMMs, windows of 1024' or a prompt set's
    'prompts of n examples of k symbols'."""
    if isinstance(task, GincPrompts):
        return f"prompts of {task.n} examples of {task.k} symbols"
    m = task.mixture
    return (f"{task.documents} documents of {task.length} symbols from {m.n_hmms // 2} of "
            f"{m.n_hmms} HMMs ({m.n_symbols} symbols, mixture seed {m.seed}), windows of "
            f"{task.window}")
