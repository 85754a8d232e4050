"""The grouped passes' pause of the cycle collector leaves it as it found it."""

import gc

import pytest

from kproxy_spark.gc_pause import collector_paused


@pytest.fixture(autouse=True)
def collector_restored():
    was_on = gc.isenabled()
    yield
    (gc.enable if was_on else gc.disable)()


def test_the_collector_is_off_inside_and_on_again_after():
    gc.enable()
    with collector_paused():
        assert not gc.isenabled()
    assert gc.isenabled()


def test_the_collector_comes_back_after_an_error():
    gc.enable()
    with pytest.raises(ValueError), collector_paused():
        raise ValueError("a key's check failed")
    assert gc.isenabled()


def test_a_collector_that_was_off_stays_off():
    gc.disable()
    with collector_paused():
        pass
    assert not gc.isenabled()

