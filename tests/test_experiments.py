"""The experiment layer (mapformer.experiments): runs are pure descriptions with stable ids,
records carry their provenance and are written atomically, tables render from records only
(marking cells of mixed commits), a rerun executes only what is missing, and the serial, pool
and Dask executors give the same records bit for bit: on a LocalCluster, and on a cluster of
`dask scheduler` and `dask worker` processes on 127.0.0.1 of which one is killed mid-table,
the table still completing with every run finished exactly once."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import subprocess_env
from mapformer import reproduce
from mapformer.experiments import Dask, Pool, RecordStore, Run, Serial, run_all
from mapformer.experiments.records import git_state
from mapformer.experiments.runs import task_from_dict, task_to_dict
from mapformer.experiments.tables import Table, standing
from mapformer.tasks import navigation

HERE = Path(__file__).resolve().parent


def tiny_table():
    """MapFormer's Table 1 at 64 training sequences, 4 per evaluation set."""
    return reproduce.table("mapformer", "1", sequences=64, eval_sequences=4)


def toy_runs(ledger, n, sleep=0.0):
    return [Run(model={}, train={"seed": s}, kind="toy_runs:sleepy",
                extra={"ledger": str(ledger), "sleep": sleep}) for s in range(n)]


def results(store, runs):
    """What a record holds that does not depend on where or when it ran."""
    out = []
    for run in runs:
        record = store.get(run.id)
        out.append(json.dumps({k: v for k, v in record.items()
                               if k not in ("provenance", "wall_s")}, sort_keys=True))
    return out


def test_run_id_is_stable_and_the_description_round_trips():
    run = tiny_table().runs(1, rows=["MapWM"])[0]
    again = Run.from_dict(json.loads(json.dumps(run.to_dict())))
    assert again == run and again.id == run.id and hash(again) == hash(run)
    assert len(run.id) == 16 and int(run.id, 16) >= 0
    assert run.train["sequences"] == 64 and run.model["positional"] == "mapwm"
    other = tiny_table().runs(2, rows=["MapWM"])[1]
    assert other.id != run.id and other.seed == 1
    # the id is the description's: the same in another process
    code = ("from mapformer import reproduce; "
            "print(reproduce.table('mapformer', '1', sequences=64, eval_sequences=4)"
            ".runs(1, rows=['MapWM'])[0].id)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True, env=subprocess_env(1))
    assert done.stdout.strip() == run.id
    with pytest.raises(ValueError, match="no field 'bogus'"):
        Run.from_dict({**run.to_dict(), "bogus": 1})


def test_task_configs_round_trip():
    for fields in navigation.scaled_presets(32, 16).values():
        config = navigation.NavigationConfig(dims=2, **fields)
        assert task_from_dict(json.loads(json.dumps(task_to_dict(config)))) == config
    with pytest.raises(ValueError, match="unknown task config"):
        task_from_dict({"config": "Nothing"})
    with pytest.raises(TypeError, match="must be one of"):
        task_to_dict(object())


def test_record_holds_metrics_and_provenance(tmp_path):
    table = tiny_table()
    store = RecordStore(tmp_path)
    summary = run_all(table.runs(1, rows=["MapWM"]), store, progress=False)
    assert summary == {"held": 0, "ran": 1, "failed": []}
    run = table.runs(1, rows=["MapWM"])[0]
    record = store.get(run.id)
    assert record["run"] == run.to_dict() and record["id"] == run.id
    assert set(record["metrics"]) == {"iid", "ood_dense", "ood_sparse"}
    assert all(0 <= record["metrics"][c]["accuracy"] <= 1 for c in record["metrics"])
    assert record["steps"] == 1 and record["sequences"] == 64
    prov = record["provenance"]
    assert prov["commit"] == git_state()["commit"] and len(prov["commit"]) == 40
    assert prov["kernels"] and prov["cpu"] and prov["threads"] >= 1
    assert "OpenBLAS" in prov["blas"] and prov["numpy"] and prov["mapformer"]
    assert [p.name for p in tmp_path.iterdir()] == [f"{run.id}.json"]  # no temporary left
    # a record file holding another run's record is refused
    (tmp_path / "0000000000000000.json").write_text(json.dumps(record))
    with pytest.raises(ValueError, match="holds the record of run"):
        store.get("0000000000000000")


def test_git_state_of_an_installed_copy_is_its_build_stamp_not_the_enclosing_repository(
        tmp_path):
    """An installed copy under some other checkout (pyenv's site-packages are one) must not
    report that checkout's commit as its own: it reports the commit its build was made from
    (setup.py's mapformer/_build.json), else "unknown". The mapformer under test, installed or
    not, reports the HEAD of the checkout these tests are in."""
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    subprocess.run(["git", "-C", str(tmp_path), "-c", "user.name=t", "-c", "user.email=t@t",
                    "commit", "-q", "--allow-empty", "-m", "other"], check=True)
    copy = tmp_path / "lib" / "site-packages"
    (copy / "mapformer").mkdir(parents=True)
    assert git_state(copy) == {"commit": "unknown", "dirty": "unknown"}
    installed = tmp_path / "lib2" / "site-packages"
    (installed / "mapformer").mkdir(parents=True)
    stamp = {"commit": "ab" * 20, "dirty": True}
    (installed / "mapformer" / "_build.json").write_text(json.dumps(stamp))
    assert git_state(installed) == stamp
    top = git_state(tmp_path)  # the checkout's own top does report
    assert len(top["commit"]) == 40 and top["dirty"] is False
    tests_checkout = Path(__file__).resolve().parents[1]
    assert git_state()["commit"] == subprocess.run(
        ["git", "-C", str(tests_checkout), "rev-parse", "HEAD"], capture_output=True,
        text=True).stdout.strip()


def test_rows_with_commas_in_their_labels_can_be_named():
    """--rows splits at commas outside parentheses: every row of Table 3, whose ablation
    labels hold commas, comes back from its comma-joined labels."""
    from mapformer.experiments.cli import split_labels

    labels = reproduce.table("mapformer", "3").rows
    assert any("," in label for label in labels)
    assert split_labels(",".join(labels)) == list(labels)
    assert split_labels(" MapWM , MAMPa (decay, ZOH)") == ["MapWM", "MAMPa (decay, ZOH)"]


def test_rerun_executes_only_what_is_missing_and_force_reruns(tmp_path):
    ledger = tmp_path / "ledger.txt"
    store = RecordStore(tmp_path / "records")
    runs = toy_runs(ledger, 4)
    assert run_all(runs, store, progress=False)["ran"] == 4
    store.path(runs[2].id).unlink()  # as if interrupted before it finished
    assert run_all(runs + runs[:1], store, progress=False) == {"held": 3, "ran": 1,
                                                               "failed": []}
    ends = [line.split()[1] for line in ledger.read_text().splitlines()
            if line.startswith("end")]
    assert ends == [r.id for r in runs] + [runs[2].id]
    assert run_all(runs, store, force=True, progress=False)["ran"] == 4


def test_failed_run_is_reported_and_the_others_finish(tmp_path):
    store = RecordStore(tmp_path)
    runs = toy_runs(tmp_path / "ledger", 2) + [Run(model={}, train={}, kind="no such kind")]
    summary = run_all(runs, store, progress=False)
    assert summary["ran"] == 2 and len(summary["failed"]) == 1
    assert summary["failed"][0][0] == runs[2].id
    assert "unknown run kind 'no such kind'" in summary["failed"][0][1]


def test_table_renders_from_records_and_marks_mixed_commits(tmp_path):
    runs = {(r, s): Run(model={"row": r}, train={"seed": s}, kind="toy_runs:sleepy",
                        extra={"ledger": str(tmp_path / "ledger")})
            for r in ("A", "B") for s in range(2)}
    table = Table("toy", "t", "Toy table", "cpu", "tiny", ("",), ("A", "B"), ("iid",),
                  ("accuracy",), lambda part, row, seed: runs[(row, seed)],
                  {"": {"A": (0.5,)}})
    store = RecordStore(tmp_path / "records")
    for (row, seed), run in runs.items():
        if (row, seed) == ("B", 1):
            continue  # missing
        store.put({"id": run.id, "run": run.to_dict(),
                   "metrics": {"iid": {"accuracy": 0.25 + 0.5 * seed}},
                   "provenance": {"commit": "c1" if seed == 0 or row == "B" else "c2",
                                  "dirty": False}})
    text = table.markdown(store, seeds=2)
    assert "| A | 0.50 ± 0.25 (n=2)† [0.50] |" in text
    assert "| B | 0.25 (n=1) |" in text
    assert "† records from more than one commit." in text and "‡" not in text
    cells = {c["row"]: c for c in table.to_json(store, 2)["cells"]}
    assert cells["B"]["missing"] == [1] and cells["A"]["commits"] == ["c1", "c2"]
    assert cells["A"]["values"] == {"accuracy": {"iid": [0.25, 0.75]}}
    assert "¶" not in text and "Kernel sets" not in text  # these records name none


def test_table_marks_cells_trained_on_more_than_one_kernel_set(tmp_path):
    runs = {(r, s): Run(model={"row": r}, train={"seed": s}, kind="toy_runs:sleepy")
            for r in ("A", "B") for s in range(2)}
    table = Table("toy", "t", "Toy table", "cpu", "tiny", ("",), ("A", "B"), ("iid",),
                  ("accuracy",), lambda part, row, seed: runs[(row, seed)], {})
    store = RecordStore(tmp_path)
    for (row, seed), run in runs.items():
        store.put({"id": run.id, "run": run.to_dict(), "metrics": {"iid": {"accuracy": 0.5}},
                   "provenance": {"commit": "c1", "dirty": False,
                                  "kernels": "avx2" if (row, seed) == ("A", 1) else "avx512"}})
    text = table.markdown(store, seeds=2)
    assert "| A | 0.50 ± 0.00 (n=2)¶ |" in text and "| B | 0.50 ± 0.00 (n=2) |" in text
    assert "¶ records trained on more than one kernel set." in text
    assert "Kernel sets: avx2 (A); avx512 (every row)." in text


def test_standing_classes_of_the_ape_papers_count():
    """Lower is better; an interval (mean - spread) reaching the top ties with it."""
    champions = ("ape",)
    assert standing({"ape": (1.0, 0.0), "rope": (1.2, 0.1)}, champions) == (
        "uncontested top", "ape")
    assert standing({"ape": (1.0, 0.0), "rope": (1.2, 0.2)}, champions) == (
        "among the best", "ape")
    assert standing({"ape": (1.0, 0.0), "rope": (1.0, 0.0)}, champions) == (
        "among the best", "ape")  # a tie goes to the champion, and is not uncontested
    assert standing({"ape": (1.3, 0.3), "rope": (1.0, 0.0)}, champions) == (
        "within the interval of the top", "rope")
    assert standing({"ape": (1.3, 0.2), "rope": (1.0, 0.0)}, champions) == ("behind", "rope")
    assert standing({"rope": (1.0, 0.0)}, champions) == (None, None)
    assert standing({"ape": (1.0, 0.0)}, champions) == (None, None)


def test_table_counts_the_standing_of_its_contest_here_and_in_the_paper(tmp_path):
    """Two parts; the paper's side uses only the rows that have records (C has none)."""
    runs = {(p, r, s): Run(model={"row": r, "part": p}, train={"seed": s}, kind="toy_runs:sleepy")
            for p in ("x", "y") for r in ("A", "B", "C") for s in range(2)}
    reference = {"x": {"A": ((1.0, 0.0),), "B": ((2.0, 0.1),), "C": ((0.5, 0.0),)},
                 "y": {"A": ((1.5, 0.1),), "B": ((1.0, 0.0),)}}
    table = Table("toy", "t", "Toy", "cpu", "tiny", ("x", "y"), ("A", "B", "C"), ("iid",),
                  ("perplexity",), lambda part, row, seed: runs[(part, row, seed)],
                  reference, statistic="ci95", reference_metrics=("perplexity",),
                  contest=("A-family", ("A",), ("B", "C")))
    store = RecordStore(tmp_path)
    values = {("x", "A"): (1.0, 1.0), ("x", "B"): (1.5, 1.7), ("y", "A"): (2.0, 2.2),
              ("y", "B"): (1.0, 1.2)}
    for (part, row), pair in values.items():
        for seed, value in enumerate(pair):
            run = runs[(part, row, seed)]
            store.put({"id": run.id, "run": run.to_dict(),
                       "metrics": {"iid": {"perplexity": value}},
                       "provenance": {"commit": "c1", "dirty": False}})
    # x: A 1.0 ± 0; B 1.6 ± 12.706 * 0.1 / 1 = 1.27: B's interval reaches 1.0 -> among the best
    # y: B 1.1 ± 1.27 top, A 2.1 ± 1.27 reaches 1.1 -> within the interval of the top
    assert table.standings(store, 2) == {
        "x": (("among the best", "A"), ("uncontested top", "A")),
        "y": (("within the interval of the top", "B"), ("behind", "B"))}
    text = table.markdown(store, seeds=2)
    assert "| x | among the best | A | uncontested top | A |" in text
    assert ("Here uncontested top in 0, among the best in 1, within the interval of the top "
            "in 1, behind in 0 of 2; the paper on the same parts uncontested top in 1, among "
            "the best in 0, within the interval of the top in 0, behind in 1.") in text


def test_serial_pool_and_local_dask_cluster_give_the_same_records(tmp_path):
    """Two rows of Table 1 at 64 sequences (real training runs): the serial executor (this
    process's threads), a pool of 2 single-thread processes and a Dask LocalCluster of 2
    single-thread workers write the same records, bit for bit."""
    runs = tiny_table().runs(1, rows=["MapWM", "RoPE"])
    stores = {name: RecordStore(tmp_path / name) for name in ("serial", "pool", "dask")}
    executors = {"serial": Serial(), "pool": Pool(2), "dask": Dask(workers=2, threads=1)}
    try:
        for name, executor in executors.items():
            summary = run_all(runs, stores[name], executor, progress=False)
            assert summary == {"held": 0, "ran": 2, "failed": []}, name
    finally:
        executors["dask"].close()
    want = results(stores["serial"], runs)
    assert results(stores["pool"], runs) == want
    assert results(stores["dask"], runs) == want
    assert {stores["pool"].get(r.id)["provenance"]["threads"] for r in runs} == {1}


def start(command, env, log):
    return subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)


def test_dask_cli_cluster_survives_a_killed_worker(tmp_path):
    """`dask scheduler` and two `dask worker` processes on 127.0.0.1; 8 runs of 1.5 s; one
    worker is killed (SIGKILL) while it runs one: the table completes, every run's record
    written, every run finished exactly once (the killed run started twice)."""
    env = {**subprocess_env(1), "PYTHONPATH": os.pathsep.join(
        [str(HERE), *filter(None, [os.environ.get("PYTHONPATH")])])}
    scheduler_file = tmp_path / "scheduler.json"
    log = open(tmp_path / "cluster.log", "w")
    procs = [start([sys.executable, "-m", "distributed.cli.dask_scheduler", "--host",
                    "127.0.0.1", "--port", "0", "--no-dashboard", "--scheduler-file",
                    str(scheduler_file)], env, log)]
    try:
        deadline = time.monotonic() + 60
        while not scheduler_file.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        address = json.loads(scheduler_file.read_text())["address"]
        assert address.startswith("tcp://127.0.0.1:")
        workers = [start([sys.executable, "-m", "distributed.cli.dask_worker", address,
                          "--nthreads", "1", "--nworkers", "1", "--no-nanny", "--no-dashboard",
                          "--host", "127.0.0.1"], env, log) for _ in range(2)]
        procs += workers
        ledger = tmp_path / "ledger.txt"
        runs = toy_runs(ledger, 8, sleep=1.5)
        executor = Dask(scheduler=address, retries=0)
        try:
            deadline = time.monotonic() + 60
            while len(executor.client.scheduler_info()["workers"]) < 2:
                assert time.monotonic() < deadline, "the workers did not connect"
                time.sleep(0.2)
            victim = workers[0].pid

            def kill_when_busy():
                while time.monotonic() < deadline + 120:
                    lines = ledger.read_text().splitlines() if ledger.exists() else []
                    if any(line.startswith("start") and line.endswith(f" {victim}")
                           for line in lines):
                        os.kill(victim, signal.SIGKILL)
                        return
                    time.sleep(0.05)

            import threading
            killer = threading.Thread(target=kill_when_busy)
            killer.start()
            store = RecordStore(tmp_path / "records")
            summary = run_all(runs, store, executor, progress=False)
            killer.join()
        finally:
            executor.close()
        assert summary == {"held": 0, "ran": 8, "failed": []}
        assert sorted(store.ids()) == sorted(r.id for r in runs)
        lines = [line.split() for line in ledger.read_text().splitlines()]
        ends = [run_id for kind, run_id, _ in lines if kind == "end"]
        assert sorted(ends) == sorted(r.id for r in runs)  # each finished exactly once
        killed = [run_id for kind, run_id, pid in lines
                  if kind == "start" and pid == str(victim) and run_id not in
                  {i for k, i, p in lines if k == "end" and p == str(victim)}]
        assert len(killed) == 1  # the run the killed worker had started ran again elsewhere
        assert workers[0].wait(timeout=10) == -signal.SIGKILL
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
        log.close()


def test_slurm_job_script(tmp_path):
    """SLURM cannot run here: the job script dask-jobqueue writes for the slurm executor
    (its text) asks for the partition, cores, memory and time, and sets the OpenMP threads."""
    from mapformer.experiments.executors import slurm_cluster

    cluster = slurm_cluster(0, partition="gpu-short", cores=4, memory="16GB",
                            walltime="01:30:00")
    try:
        script = cluster.job_script()
    finally:
        cluster.close()
    assert "#SBATCH -p gpu-short" in script and "#SBATCH --cpus-per-task=4" in script
    assert "#SBATCH --mem=15G" in script and "#SBATCH -t 01:30:00" in script
    assert "export OMP_NUM_THREADS=4" in script and "--nthreads 4" in script


def test_reproduce_command_runs_what_is_missing_then_renders(tmp_path):
    command = [sys.executable, "-m", "mapformer", "reproduce", "mapformer", "1", "--seeds", "1",
               "--sequences", "64", "--eval-sequences", "4", "--rows", "MapWM",
               "--records", str(tmp_path), "--no-progress", "--json", str(tmp_path / "t.json")]
    env = subprocess_env(2)
    first = subprocess.run(command, capture_output=True, text=True, env=env, cwd=HERE.parent)
    assert first.returncode == 0, first.stderr
    assert first.stdout.startswith("1 runs executed, 0 held")
    second = subprocess.run(command, capture_output=True, text=True, env=env, cwd=HERE.parent)
    assert second.stdout.startswith("0 runs executed, 1 held")
    assert "| MapWM | " in second.stdout and "[1.00]" in second.stdout
    table = json.loads((tmp_path / "t.json").read_text())
    assert [c["n"] for c in table["cells"] if c["row"] == "MapWM"] == [1]
    bad = subprocess.run(command[:6] + ["--rows", "Nope", "--records", str(tmp_path)],
                         capture_output=True, text=True, env=env, cwd=HERE.parent)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "Traceback" not in bad.stderr
    assert "--rows: no row 'Nope'" in bad.stderr


def alive(pid):
    """Whether process ``pid`` runs (a zombie awaiting its reaper does not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_pool_workers_end_with_a_killed_parent(tmp_path, sig):
    """A `Pool(2)` parent killed while both workers run (SIGTERM or SIGKILL, as a batch system
    or a user stopping a campaign does): the workers end within seconds instead of finishing
    their runs and writing records nobody asked for."""
    ledger = tmp_path / "ledger.txt"
    script = (
        "import sys; sys.path[:0] = [%r]\n"
        "from test_experiments import toy_runs\n"
        "from mapformer.experiments import Pool, RecordStore, run_all\n"
        "run_all(toy_runs(%r, 4, sleep=60), RecordStore(%r), Pool(2), progress=False)\n"
        % (str(HERE), str(ledger), str(tmp_path / "records")))
    env = {**subprocess_env(1), "PYTHONPATH": os.pathsep.join(
        [str(HERE), *filter(None, [os.environ.get("PYTHONPATH")])])}
    parent = subprocess.Popen([sys.executable, "-c", script], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        workers = []
        while len(workers) < 2:
            assert time.monotonic() < deadline, "the workers did not start their runs"
            assert parent.poll() is None
            lines = ledger.read_text().splitlines() if ledger.exists() else []
            workers = [int(line.split()[2]) for line in lines if line.startswith("start")]
            time.sleep(0.1)
        assert all(alive(pid) for pid in workers)
        parent.send_signal(sig)
        assert parent.wait(timeout=30) == -sig
        deadline = time.monotonic() + 20
        while any(alive(pid) for pid in workers) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not any(alive(pid) for pid in workers)
        assert not (tmp_path / "records").exists() or not list((tmp_path / "records").iterdir())
        assert not [line for line in ledger.read_text().splitlines() if line.startswith("end")]
    finally:
        if parent.poll() is None:
            parent.kill()
