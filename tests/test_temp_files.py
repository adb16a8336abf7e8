"""What gnnio leaves in the temporary directory: nothing. PyG's generated layer modules are removed
when a gnnio process exits (gnnio/utils/pyg_templates.py; PyG alone leaves them there), and the
launcher removes the elastic agent's run directory."""

from __future__ import annotations

import getpass
import os
import subprocess
import sys
import textwrap

import pytest

_LAYERS = "from torch_geometric.nn import GATConv, SAGEConv\nSAGEConv(4, 4); GATConv(4, 4)\n"


def _run(code: str, tmp) -> subprocess.CompletedProcess:
    env = {**os.environ, "TMPDIR": str(tmp)}
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env,
                          capture_output=True, text=True, timeout=120)  # fmt: skip


def _generated(tmp) -> list[str]:
    return sorted(p for p in os.listdir(tmp) if p.endswith(".py") and "_propagate_" in p)


def test_pyg_alone_leaves_its_files_and_gnnio_removes_them(tmp_path):
    alone, ours = tmp_path / "alone", tmp_path / "ours"
    alone.mkdir(), ours.mkdir()
    (ours / "mine_propagate_x.py").write_text("# a user's file\n")
    r = _run(_LAYERS, alone)
    assert r.returncode == 0, r.stderr
    assert len(_generated(alone)) >= 2  # what the fix is for (SAGEConv's and GATConv's)
    r = _run("import gnnio.train.models\n" + _LAYERS + "gnnio.train.models.SAGELayer\n", ours)
    assert r.returncode == 0, r.stderr
    assert _generated(ours) == ["mine_propagate_x.py"]  # PyG's gone, the user's file kept


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_leaves_its_parents_files(tmp_path):
    code = (
        "import os, sys\nimport gnnio.train.models\n"
        + _LAYERS
        + """
        from gnnio.utils.pyg_templates import generated_files
        files = generated_files()
        assert files, "no generated files"
        pid = os.fork()
        if pid == 0:
            sys.exit(0)  # a normal exit: runs the exit handlers
        os.waitpid(pid, 0)
        assert all(os.path.exists(f) for f in files), "the child removed the parent's files"
        print(len(files))
        """
    )
    r = _run(code.replace("\n        ", "\n"), tmp_path)
    assert r.returncode == 0, r.stderr
    assert int(r.stdout.strip()) >= 2
    assert _generated(tmp_path) == []  # the parent removed them at its exit


def test_a_two_rank_run_leaves_nothing_in_the_temporary_directory(tmp_path):
    """Neither the ranks' PyG modules nor the elastic agent's run directory (torch's default: a
    ``torchelastic_*`` directory per run, never removed) stay behind."""
    from gnnio.importers.synthetic import prepare_synthetic

    data, tmp = tmp_path / "g", tmp_path / "tmp"
    tmp.mkdir()
    prepare_synthetic(data, num_nodes=300, avg_degree=4, feat_dim=8, num_classes=3, seed=0,
                      split=(0.5, 0.2, 0.3), progress=False)  # fmt: skip
    env = {**os.environ, "TMPDIR": str(tmp)}
    cmd = [sys.executable, "-m", "gnnio", "train", str(data), "--nproc", "2", "--epochs", "1",
           "--fanouts", "3,3", "--batch-size", "64"]  # fmt: skip
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stderr[-2000:]
    cache = f"torchinductor_{getpass.getuser()}"  # torch's cache, named for the user
    left = sorted(p for p in os.listdir(tmp) if p != cache)
    assert left == []
