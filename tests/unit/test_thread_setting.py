"""epd.thread_setting: a value per thread, restored when its block ends (pure)."""

from __future__ import annotations

import threading

import pytest

from epd.thread_setting import ThreadSetting


def test_nested_blocks_restore_the_outer_value_even_on_an_error():
    setting = ThreadSetting(0)
    with setting.set(1):
        with pytest.raises(RuntimeError), setting.set(2):
            assert setting.get() == 2
            raise RuntimeError("inside")
        assert setting.get() == 1
    assert setting.get() == 0


def test_another_thread_sees_the_default():
    setting = ThreadSetting("default")
    seen = []
    with setting.set("mine"):
        worker = threading.Thread(target=lambda: seen.append(setting.get()))
        worker.start()
        worker.join(5)
    assert seen == ["default"]
