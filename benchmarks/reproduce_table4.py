"""Reproduce the MapFormer paper's Table 4: `python benchmarks/reproduce_table4.py --scale cpu`
(or `--scale paper`); `-h` lists the options. The rows, the paper's numbers and both scales
are defined in mapformer/reproduce.py."""
from mapformer.reproduce import main

if __name__ == "__main__":
    main("4")
