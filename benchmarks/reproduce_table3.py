"""Reproduce the MapFormer paper's Table 3 (SSMs: Mamba and MAMPa against the MapFormers on
2D navigation): `python benchmarks/reproduce_table3.py --scale cpu` (or `--scale paper`);
`-h` lists the options. Writes results/table3_<scale>.json after every run (row x seed);
`--resume` skips the runs already there. The rows (Mamba, MAMPa by default and with each
option, MapWM, MapEM-os, MapEM-s), the paper's numbers and both scales are defined in
mapformer/reproduce.py."""
from mapformer.reproduce import main

if __name__ == "__main__":
    main("3")
