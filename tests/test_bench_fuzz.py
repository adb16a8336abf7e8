"""``gnnio bench KIND`` under random option combinations (the single-process kinds): every run
either ends with exit 0 and one strictly valid JSON object (finite numbers) last on stdout, or is
refused with exactly one ``gnnio: error:`` line and exit 2 -- never a traceback, another exit
status, or an output file written where it was refused.

``REFUSED`` holds the combinations a 1,200-case exploration found ending in a traceback (or
doing nothing without a word): ``bench placement --strategies ,`` (IndexError), the ``--dataset``
grid's ``--batch-size 0`` / ``--trace-epochs 0`` / ``--buffers nan`` / ``-0.1`` (ZeroDivision- and
ValueErrors after the trace was sampled), ``--markdown`` or ``--plot`` naming a directory, a path
under a file or a file inside the dataset (a traceback after the whole run, or a PNG written into
the dataset), ``--markdown`` without ``--dataset`` (ignored: no tables written), and ``bench loader
--prefetch 1e20`` (an OverflowError). The
hypothesis test (derandomized, 30 draws) is a smoke test over each kind's options with edge
values (0, 1, huge, negative, nan, empty lists, repeats): it catches a crash that a common
option value reaches, not a rare one -- its 30 draws over 11 kinds do not draw ``placement
--strategies ,`` (checked by removing that check), which is why the table above exists; and
most of its draws are refusals, so ``test_each_kind_runs_on_its_short_options`` runs each kind
once on its short options (a bench made to raise in its measuring code fails there, not in the
draws: checked with ``bench sampling``)."""

from __future__ import annotations

import contextlib
import io
import json
import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gnnio.cli.main import main
from tests.helpers import write_tiny_dataset

#: kind -> arguments that keep its run short (DIR: the tiny dataset)
BASE = {
    "reorder": "--num-nodes 300 --avg-degree 4 --impls numpy --passes 1 --warmup 0",
    "placement": "--num-nodes 500 --strategies alg1,mod --passes 1 --no-progress",
    "grid": "--dataset DIR --topologies 2 --buffers 0.1 --grid-strategies alg1,mod "
    "--fanouts 3,3 --batch-size 16 --no-progress",
    "sampling": "DIR --fanouts 3,3 --batch-size 16 --passes 1 --warmup 0 --batches 2 --quiet",
    "gather": "DIR --fanouts 3,3 --batch-size 16 --batches 2 --passes 1 --warmup 0 "
    "--ceiling-gib 0.001 --evict-mib 0 --quiet",
    "loader": "DIR --fanouts 3,3 --batch-size 16 --batches 2 --passes 1 --warmup 0 --quiet",
    "hotness": "DIR --fanouts 3,3 --batch-size 16 --scores degree --fractions 0.1 --quiet",
    "tiers": "DIR --fanouts 3,3 --batch-size 16 --scores degree --fractions 0.1 --max-batches 2 "
    "--quiet",
    "cache": "DIR --fanouts 3,3 --batch-size 16 --batches 2 --policies lru --orders random "
    "--sizes 0.1 --warmup 0 --eta-batch-sizes 16 --eta-batches 2 --quiet",
    "locality": "DIR --fanouts 3,3 --batch-size 16 --scales 1,2 --gpu-cache-fraction 0.1 "
    "--no-progress",
    "disk": "DIR --fanouts 3,3 --batch-size 16 --batches 2 --sizes 0.1 --policies lru "
    "--random-reads 8 --seq-mib 1 --repeats 1 --no-progress --epochs 1",
}

FAN = ["3,3", "1", "0", "-1,2", "", "3,,3"]
COUNT = ["0", "1", "2", "-1", "99999999999"]
FRAC = ["0", "0.5", "1", "-0.1", "1.5", "nan"]
#: kind -> option -> values drawn (PNG: a fresh file name; BAD: a path under a file)
OPTS = {
    "reorder": {"--num-nodes": ["0", "1", "300"], "--avg-degree": ["0", "0.5", "nan"],
                "--impls": ["numba", "numpy,numpy", "", "x"], "--threads": ["1", "0"]},
    "placement": {"--num-nodes": ["0", "1", "500"], "--buffer": FRAC, "--topology": ["1", "2+2"],
                  "--alpha": ["0", "1", "nan"], "--strategies": ["mod", "rule1,rule1", ",", "x"],
                  "--markdown": ["MD"]},
    "grid": {"--topologies": ["2", "2,2", ","], "--buffers": ["0.1", "0.1,0.1", ",", *FRAC],
             "--grid-strategies": ["alg1", "naive,naive", ",", "x"], "--trace-epochs": COUNT,
             "--batch-size": COUNT, "--score": ["degree", "x"], "--markdown": ["MD", "BAD"]},
    "sampling": {"--fanouts": FAN, "--sampler": ["uniform", "labor", "ladies"],
                 "--layer-size": COUNT, "--batch-size": COUNT, "--batches": COUNT,
                 "--prune-threshold": ["1,1", "0,0", "nan,1"], "--locality-scale": ["1", "4", "0"]},
    "gather": {"--fanouts": FAN, "--batch-size": COUNT, "--batches": COUNT,
               "--store": ["memory", "mmap"], "--ceiling-gib": ["0", "nan"], "--evict-mib": ["1"]},
    "loader": {"--fanouts": FAN, "--batch-size": COUNT, "--batches": COUNT, "--prefetch": COUNT,
               "--workers": ["0", "1", "3"], "--store": ["memory", "mmap"]},
    "hotness": {"--fanouts": FAN, "--epochs": COUNT, "--presample-epochs": COUNT,
                "--scores": ["degree,degree", "presample", "", "x"],
                "--fractions": ["0,1", "0.1,0.1", "", *FRAC], "--plot": ["PNG", "BAD"]},
    "tiers": {"--fanouts": FAN, "--epochs": COUNT, "--max-batches": COUNT,
              "--scores": ["degree,degree", "oracle", "", "x"], "--fractions": ["0,1", "", *FRAC],
              "--gather": [None], "--plot": ["PNG", "BAD"]},
    "cache": {"--fanouts": FAN, "--batches": COUNT, "--warmup": COUNT,
              "--policies": ["static", "fifo,fifo", "lookahead", "", "x"],
              "--orders": ["po", "po,po", ""], "--sizes": ["0,1", "", *FRAC],
              "--lookahead": COUNT, "--lookahead-ks": ["1,1", "0", ","], "--plot": ["PNG", "BAD"]},
    "locality": {"--fanouts": FAN, "--scales": ["1,1", "0", "", "nan", "0.5"],
                 "--gpu-cache-fraction": FRAC, "--sampler": ["uniform", "ladies"],
                 "--layer-size": COUNT, "--batches": COUNT, "--prune": ["1,1", "0,0", "1"],
                 "--q-size": COUNT},
    "disk": {"--fanouts": FAN, "--queue-depth": COUNT, "--block-size": ["auto", "512", "4096"],
             "--random-reads": COUNT, "--seq-mib": ["0", "1", "nan"], "--repeats": COUNT,
             "--sizes": ["0,1", "", *FRAC], "--policies": ["static", "sieve,sieve", "", "x"],
             "--lookahead": COUNT, "--epochs": COUNT, "--batches": COUNT},
}  # fmt: skip

#: combinations that ended in a traceback or did nothing without a word (module docstring)
REFUSED = [
    ("reorder", "--impls ,", "--impls: give at least one (choose from numba, numpy"),
    ("reorder", "--impls x", "--impls: unknown 'x' (choose from"),
    ("placement", "--strategies ,", "--strategies: give at least one of"),
    ("placement", "--markdown MD", "--markdown: has no effect without --dataset"),
    ("placement", "--topologies 2", "--topologies: has no effect without --dataset"),
    ("placement", "--grid-alpha eq7", "--grid-alpha: has no effect without --dataset"),
    ("grid", "--buffer 0.2", "--buffer: has no effect with --dataset"),
    ("grid", "--num-nodes 5", "--num-nodes: has no effect with --dataset"),
    ("grid", "--batch-size 0", "--batch-size must be >= 1, got 0"),
    ("grid", "--trace-epochs 0", "--trace-epochs must be >= 1, got 0"),
    ("grid", "--buffers nan", "--buffers: each a fraction in (0, 1], got nan"),
    ("grid", "--buffers 0.1,-0.1", "--buffers: each a fraction in (0, 1], got -0.1"),
    ("grid", "--grid-strategies ,", "--grid-strategies: give at least one"),
    ("grid", "--grid-alpha inf", "--grid-alpha: must be in [0, 1], got inf"),
    ("grid", "--markdown BAD", "is a file, not a directory"),
    ("grid", "--markdown TMP", "is a directory; give a file path"),
    ("hotness", "--plot DS", "inside the dataset directory"),
    ("hotness", "--plot curves.xyz", "curves.xyz: name the image format by the file's suffix"),
    ("tiers", "--plot BAD", "is a file, not a directory"),
    ("cache", "--plot TMP", "is a directory; give a file path"),
    ("loader", "--prefetch 99999999999999999999", "--prefetch: must be at most 4096"),
]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return write_tiny_dataset(tmp_path_factory.mktemp("bf") / "ds", 200, 1200)


def _run(kind, pairs, tiny, tmp):
    (tmp / "file").write_text("x")
    names = {"DIR": str(tiny), "DS": str(tiny / "x.png"), "TMP": str(tmp), "PNG": str(tmp / "p.png"),
             "MD": str(tmp / "t.md"), "BAD": str(tmp / "file" / "x")}  # fmt: skip
    argv = ["bench", "placement" if kind == "grid" else kind]
    argv += [names.get(a, a) for a in BASE[kind].split()]
    for k, v in pairs:
        argv += [k] if v is None else [f"{k}={names.get(v, v)}"]
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main([*argv, "--json"])
    return rc, out.getvalue(), err.getvalue().strip().splitlines()


def _no_constants(name):
    raise ValueError(f"not strict JSON: {name}")


def _check(rc, out, lines, tiny, tmp):
    assert not any("Traceback" in x for x in lines), lines
    errors = [x for x in lines if x.startswith("gnnio: error:")]
    assert not (tiny / "x.png").exists()
    if rc == 0:
        assert not errors, errors
        doc = json.loads(out.strip().splitlines()[-1], parse_constant=_no_constants)
        assert isinstance(doc, dict)
        nums = [v for v in _leaves(doc) if isinstance(v, float)]
        assert all(map(math.isfinite, nums))
    else:
        others = [x for x in lines if not x.startswith("gnnio: warning:")]
        assert rc == 2 and others == errors and len(errors) == 1, (rc, lines)
        assert not (tmp / "p.png").exists() and not (tmp / "t.md").exists()
    return errors


def _leaves(x):
    if isinstance(x, dict):
        x = list(x.values())
    if isinstance(x, list):
        for v in x:
            yield from _leaves(v)
    else:
        yield x


@pytest.mark.parametrize("kind,extra,words", REFUSED)
def test_a_combination_that_crashed_is_refused_in_one_line(kind, extra, words, tiny, tmp_path):
    k, v = extra.split()
    rc, out, lines = _run(kind, [(k, v)], tiny, tmp_path)
    assert rc == 2 and len(lines) == 1 and words in lines[0], lines
    assert out == "" and not (tiny / "x.png").exists() and not (tmp_path / "t.md").exists()


def test_the_grid_writes_its_tables_and_honours_no_progress(tiny, tmp_path):
    rc, out, lines = _run("grid", [("--markdown", "MD")], tiny, tmp_path)
    assert rc == 0 and lines == []  # (the trace's bar ignored --no-progress)
    assert (tmp_path / "t.md").read_text().startswith("**tiny**")


@st.composite
def cases(draw):
    kind = draw(st.sampled_from(sorted(OPTS)))
    keys = draw(st.lists(st.sampled_from(sorted(OPTS[kind])), min_size=1, max_size=3, unique=True))
    return kind, [(k, draw(st.sampled_from(OPTS[kind][k]))) for k in keys]


@pytest.mark.filterwarnings("ignore")  # the warnings under test are the CLI's one-line ones
@settings(max_examples=30, derandomize=True, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])  # fmt: skip
@given(case=cases())
def test_every_combination_runs_or_is_refused_in_one_line(tiny, tmp_path_factory, case):
    tmp = tmp_path_factory.mktemp("case")
    rc, out, lines = _run(*case, tiny, tmp)
    _check(rc, out, lines, tiny, tmp)


@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize("kind", sorted(OPTS))
def test_each_kind_runs_on_its_short_options(kind, tiny, tmp_path):
    """The draws above are mostly refusals (edge values): each kind's own short run, checked the
    same way, is what reaches the measuring code (a bench that raised there fails here)."""
    rc, out, lines = _run(kind, [], tiny, tmp_path)
    assert rc == 0, lines
    _check(rc, out, lines, tiny, tmp_path)


def test_placement_knows_each_modes_options_by_their_parser_defaults():
    """``bench placement`` tells a given option from its default by ``TIMING_ONLY`` and
    ``GRID_ONLY``: they must be the parser's defaults, or an option left alone reads as given."""
    from gnnio.bench.placement import GRID_ONLY, TIMING_ONLY, _given
    from gnnio.cli.main import build_parser

    args = build_parser().parse_args(["bench", "placement"])
    assert _given(args, TIMING_ONLY) == [] and _given(args, GRID_ONLY) == []
