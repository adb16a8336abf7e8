"""gnnio.utils.capture.CAPTURE_LOCK: reentrant, and ``locked()`` says whether any thread holds it."""

from __future__ import annotations

import threading

from gnnio.utils.capture import CAPTURE_LOCK, _Lock


def test_the_holder_takes_it_again_and_locked_follows_the_outermost_release():
    """The step's capture runs its dropout, which takes the lock again on the same thread: a
    plain lock would deadlock there (checked here without waiting: a non-blocking acquire)."""
    lock = _Lock()
    assert not lock.locked()
    with lock:
        assert lock.acquire(blocking=False), "not reentrant"
        assert lock.locked()
        lock.release()
        assert lock.locked()  # (still held by the outer block)
    assert not lock.locked()
    assert not CAPTURE_LOCK.locked()


def test_a_refused_acquire_from_another_thread_leaves_locked_alone():
    """``acquire(blocking=False)`` that fails while another thread holds the lock counts
    nothing: once the holder lets go, ``locked()`` is false and the lock can be taken."""
    lock = _Lock()
    held, release = threading.Event(), threading.Event()

    def hold():
        with lock:
            held.set()
            release.wait(10)

    t = threading.Thread(target=hold)
    t.start()
    try:
        assert held.wait(10)
        assert not lock.acquire(blocking=False)
        assert not lock.acquire(timeout=0.01)
        assert lock.locked()  # (held by the other thread)
    finally:
        release.set()
        t.join(10)
    assert not lock.locked()
    assert lock.acquire(blocking=False)
    lock.release()
    assert not lock.locked()
