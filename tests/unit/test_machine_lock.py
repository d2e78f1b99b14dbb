"""The sandbox's slot locks (sandbox/machine_lock.py): two sessions take two slots, a third waits, bounded."""

from __future__ import annotations

import pytest

from sandbox import machine_lock as ml


@pytest.fixture
def lock_dir(tmp_path, monkeypatch):
    monkeypatch.setattr(ml, "LOCK_PATH", tmp_path / "sandbox.lock")
    return tmp_path


def test_two_sessions_take_two_slots_and_a_third_times_out_naming_both(lock_dir):
    # flock holds per open file: two `with`s in one process contend as two processes would
    with ml.any_slot_lock([0, 1], 1) as first, ml.any_slot_lock([0, 1], 1) as second:
        assert (first, second) == (0, 1)
        with pytest.raises(ml.MachineLockTimeout, match="sandbox.lock, .*sandbox-s1.lock"):
            with ml.any_slot_lock([0, 1], 0.3, poll_s=0.05):
                pass
    with ml.any_slot_lock([0, 1], 1) as again:  # released: the first is free again
        assert again == 0


def test_a_forced_slot_waits_for_that_slot_only(lock_dir):
    with ml.any_slot_lock([1], 1) as held:
        assert held == 1
        with pytest.raises(ml.MachineLockTimeout):
            with ml.any_slot_lock([1], 0.2, poll_s=0.05):
                pass
        with ml.any_slot_lock([0, 1], 1) as other:
            assert other == 0
    assert (lock_dir / "sandbox-s1.lock").exists()


def test_the_benchmarks_lock_is_slot_0s(lock_dir):
    with ml.machine_lock(1):
        with pytest.raises(ml.MachineLockTimeout, match="other sessions held every sandbox slot lock"):
            with ml.any_slot_lock([0], 0.2, poll_s=0.05):
                pass
        with ml.any_slot_lock([0, 1], 1) as free:
            assert free == 1
