"""Write mapformer/data/digits.npz, the copy of scikit-learn's bundled 8x8 handwritten
digits that the ``digits`` task reads (so that neither the library nor its tests need
scikit-learn at run time).

    pip install ".[images]" && python benchmarks/make_digits_npz.py
    python benchmarks/make_digits_npz.py --csv sklearn/datasets/data/digits.csv.gz

The source is scikit-learn's ``sklearn/datasets/data/digits.csv.gz`` (``load_digits``; BSD
3-Clause, see mapformer/data/DIGITS_LICENSE.txt): 1797 rows of 64 grey levels 0..16 and
the digit. The npz holds ``images`` uint8 (1797, 8, 8) and ``labels`` uint8 (1797,), in the
file's order, compressed (45 KB); the script checks the counts and ranges it writes.
"""
import argparse
from pathlib import Path

import numpy as np

OUT = Path(__file__).resolve().parents[1] / "mapformer" / "data" / "digits.npz"


def read(csv):
    """(images uint8 (N, 8, 8), labels uint8 (N,)) from scikit-learn's load_digits, or from
    its digits.csv.gz at ``csv``."""
    if csv is None:
        from sklearn.datasets import load_digits  # the "images" extra
        data = load_digits()
        pixels, labels = data.data, data.target
    else:
        table = np.loadtxt(csv, delimiter=",")
        pixels, labels = table[:, :64], table[:, 64]
    return pixels.reshape(-1, 8, 8).astype(np.uint8), labels.astype(np.uint8)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--csv", default=None, help="scikit-learn's digits.csv.gz (default: "
                        "sklearn.datasets.load_digits)")
    parser.add_argument("--out", default=str(OUT))
    args = parser.parse_args(argv)
    images, labels = read(args.csv)
    assert images.shape == (1797, 8, 8) and images.max() == 16 and labels.max() == 9
    assert np.bincount(labels).min() >= 170  # about 180 of each digit
    np.savez_compressed(args.out, images=images, labels=labels)
    print(f"wrote {args.out}: {len(labels)} images, digits {np.bincount(labels).tolist()}")


if __name__ == "__main__":
    main()
