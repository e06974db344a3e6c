"""The layers leave allocation and tensor arithmetic to the backend (mapformer/backend.py),
so that a backend whose arrays live elsewhere (CuPy) can run the same layers: checked on the
source, no method of a class in the layer modules (nn, models, schemes, mixers, bottlenecks)
uses NumPy (``np.`` or ``numpy.``) but constructors and flop counts, which run at build time
(parameter shapes and initial values) or on sizes only."""
import ast
from pathlib import Path

import mapformer

PACKAGE = Path(mapformer.__file__).resolve().parent
BUILD_TIME = {"__init__", "flops"}
# methods that run on every step: the check must see them (it cannot pass by finding nothing)
HOT = {"Linear.forward", "Linear.backward", "LayerNorm.backward", "MLP.backward",
       "Dropout.forward", "Dropout.backward", "ParameterStore.build", "Block.forward",
       "Block.backward", "Transformer.forward", "Transformer.loss", "Transformer.backward",
       "QKVMixer.project", "QKVMixer.project_backward", "CausalAttention.forward",
       "CausalAttention.attend_rotated", "CausalAttention.attend_rotated_backward",
       "CausalAttention.attend_by_scheme_backward", "ConjunctiveAttention.forward",
       "ConjunctiveAttention.backward", "RoPE.angles", "PathIntegrator.angles",
       "PathIntegrator.angles_backward", "MapEMPositions.positions",
       "MapEMPositions.positions_backward", "CoPE.attend", "CoPE.attend_backward",
       "TAPE.initial_state", "TAPE.attend", "TAPE.attend_backward", "TAPE.input_backward",
       "Identity.forward", "Identity.backward", "AdditiveScheme.embed",
       "AdditiveScheme.embed_backward", "Sinusoidal.code", "LearnedAbsolute.code",
       "LearnedAbsolute.code_backward", "RoPE.angles_backward"}


def layer_modules():
    packages = ("schemes", "mixers", "bottlenecks")
    found = {p: sorted((PACKAGE / p).glob("*.py")) for p in packages}
    assert all(len(files) >= 3 for files in found.values()), found  # __init__, base, one more
    return [PACKAGE / "nn.py", PACKAGE / "models.py"] + [f for p in packages for f in found[p]]


def numpy_in_methods(source):
    """{'Class.method': [line numbers using np. / numpy.]} for every method of every class
    in ``source`` but the build-time ones; module-level ``from numpy import`` counts too."""
    tree = ast.parse(source)
    uses = {"<module>": [n.lineno for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)
                         and (n.module or "").split(".")[0] == "numpy"]}
    for cls in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)):
        for fn in cls.body:
            if isinstance(fn, ast.FunctionDef) and fn.name not in BUILD_TIME:
                uses[f"{cls.name}.{fn.name}"] = [
                    n.lineno for n in ast.walk(fn) if isinstance(n, ast.Attribute)
                    and isinstance(n.value, ast.Name) and n.value.id in ("np", "numpy")]
    return uses


def test_the_check_finds_numpy_in_a_method():
    source = ("import numpy as np\nclass Layer:\n    def __init__(self):\n"
              "        self.w = np.zeros(3)\n    def forward(self, x):\n"
              "        return np.tanh(x)\n")
    assert numpy_in_methods(source) == {"<module>": [], "Layer.forward": [6]}
    assert numpy_in_methods("from numpy import tanh\n")["<module>"] == [1]


def test_layers_call_no_numpy_on_activations():
    inspected, offenders = set(), {}
    for path in layer_modules():
        for name, lines in numpy_in_methods(path.read_text()).items():
            inspected.add(name)
            if lines:
                offenders[f"{path.relative_to(PACKAGE)}:{name}"] = lines
    assert not offenders, f"NumPy used in layer methods (file:method: lines): {offenders}"
    assert HOT <= inspected, sorted(HOT - inspected)
