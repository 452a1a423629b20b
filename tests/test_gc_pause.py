"""The garbage collector pause around tracing and compiling."""

from __future__ import annotations

import gc
import threading

import pytest

from gpustat._gc import collector_paused


@pytest.fixture
def collector_on():
    was = gc.isenabled()
    gc.enable()
    yield
    if not was:
        gc.disable()


def test_collector_paused_inside_and_resumed_after_nested_blocks(collector_on):
    with collector_paused():
        assert not gc.isenabled()
        with collector_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()
    assert gc.isenabled()


def test_collector_stays_off_when_it_was_off(collector_on):
    gc.disable()
    with collector_paused():
        pass
    assert not gc.isenabled()


def test_collector_resumes_after_an_error(collector_on):
    with pytest.raises(KeyError), collector_paused():
        raise KeyError("x")
    assert gc.isenabled()


def test_concurrent_blocks_share_one_pause(collector_on):
    inside, release = threading.Event(), threading.Event()

    def other():
        with collector_paused():
            inside.set()
            release.wait(10)

    thread = threading.Thread(target=other)
    thread.start()
    inside.wait(10)
    with collector_paused():
        pass
    assert not gc.isenabled()  # the other thread's block is still open
    release.set()
    thread.join()
    assert gc.isenabled()
