"""Stamps: one conversion between float seconds, integer nanoseconds and (sec, nanosec)."""
from __future__ import annotations

import math

import pytest
from builtin_interfaces.msg import Time

from s2h_ros import stamps
from s2h_ros.ros import messages


def test_a_fraction_that_rounds_to_a_whole_second_carries_into_sec():
    msg = messages.stamp_msg(100.99999999999994)
    assert (msg.sec, msg.nanosec) == (101, 0)
    assert stamps.split_ns(stamps.sec_to_ns(100.99999999999994)) == (101, 0)


def test_epoch_scale_stamps_keep_their_nanoseconds():
    t = 1_700_000_000.123456
    ns = stamps.sec_to_ns(t)
    assert abs(ns - 1_700_000_000_123_456_000) < 300  # the float itself is only that precise
    assert stamps.ns_to_sec(ns) == t  # and comes back as the same float


@pytest.mark.parametrize("t", [0.0, 0.1, 1.0, 2.5, 12345.678901234, 1e-9])
def test_seconds_round_trip_through_messages(t):
    msg = messages.stamp_msg(t)
    assert 0 <= msg.nanosec < 1_000_000_000
    assert messages.stamp_to_sec(msg) == pytest.approx(t, abs=1e-9)
    assert stamps.stamp_ns(msg) == stamps.sec_to_ns(t)


def test_integers_are_nanoseconds_and_messages_pass_through():
    assert messages.stamp_msg(1_500_000_001) == Time(sec=1, nanosec=500_000_001)
    given = Time(sec=3, nanosec=4)
    assert messages.stamp_msg(given) is given
    assert messages.stamp_msg(None) == Time()


def test_non_finite_seconds_are_rejected():
    with pytest.raises(ValueError, match="finite"):
        stamps.sec_to_ns(math.nan)
