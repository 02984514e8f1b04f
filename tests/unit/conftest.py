"""The unit tier's one rule, held: no test here starts a process (`greenroom serve`, a
subprocess, a tractor actor). One that needs to belongs in tests/live."""

from __future__ import annotations

import os
import subprocess

import pytest


@pytest.fixture(autouse=True)
def no_processes(monkeypatch):
    def refused(*args, **kwargs):
        raise AssertionError("a unit test started a process: it belongs in tests/live")

    monkeypatch.setattr(subprocess.Popen, "_execute_child", refused)
    monkeypatch.setattr(os, "fork", refused)
