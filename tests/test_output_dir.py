"""``gnnio.graph.output_dir`` details the CLI tests do not reach: the claim when its previous
holder unlinks the lock file in between, and the one-line errors of short and refused writes."""

from __future__ import annotations

import errno
import os

from gnnio.graph import output_dir as od


def test_a_claim_locks_the_lock_file_at_the_path_not_one_unlinked(tmp_path, monkeypatch):
    """The holder before unlinks the lock file when done: a writer that opened it just before
    then locks an unlinked file, which claims nothing. It must lock the file at the path."""
    import fcntl

    out = tmp_path / "ds"
    lock = tmp_path / ".ds.lock"
    real = fcntl.flock
    calls = []

    def flock(fd, op):
        calls.append(op)
        if len(calls) == 1:  # the previous holder finishes between our open and our lock
            os.unlink(lock)
        return real(fd, op)

    monkeypatch.setattr(fcntl, "flock", flock)
    with od.claim(out):
        fd = od._HELD[os.path.abspath(lock)][0]
        assert os.path.samestat(os.fstat(fd), os.stat(lock))  # the file at the path is held
        assert lock.read_text() == f"{os.getpid()}\n"
    assert len(calls) == 2 and not lock.exists()


def test_short_and_refused_writes_are_one_line_errors(tmp_path):
    out = tmp_path / "ds"
    inside = str(tmp_path / ".ds.tmp-1-abcd" / "features.npy")
    short = od.write_error(out, OSError(None, "wrote 3 of 8 bytes", inside))
    assert short is not None and "no room to write features.npy (wrote 3 of 8 bytes;" in str(short)
    for code in (errno.EROFS, errno.EACCES, errno.EPERM, errno.EIO):
        e = od.write_error(out, OSError(code, os.strerror(code), inside))
        assert e is not None and str(e) == (
            f"{out}: cannot write it ({os.strerror(code)}); the partial output was removed"
        )
    elsewhere = str(tmp_path.parent / "else" / "f.npy")  # not under the output's parent
    assert od.write_error(out, OSError(None, "short", elsewhere)) is None
    assert od.write_error(out, OSError(errno.EROFS, "ro", elsewhere)) is None
    assert od.write_error(out, OSError(errno.ENOENT, "gone", inside)) is None
