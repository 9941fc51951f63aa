"""idist's one way to change the environment: set, remove, and give back exactly."""

from __future__ import annotations

import os

import pytest

from idist import _environ


def test_changed_sets_removes_and_gives_back_each_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("IDIST_T_KEPT", "old")
    monkeypatch.setenv("IDIST_T_GONE", "here")
    monkeypatch.delenv("IDIST_T_NEW", raising=False)
    with _environ.changed({"IDIST_T_KEPT": "new", "IDIST_T_GONE": None, "IDIST_T_NEW": "1"}):
        assert os.environ["IDIST_T_KEPT"] == "new"
        assert "IDIST_T_GONE" not in os.environ
        assert os.environ["IDIST_T_NEW"] == "1"
    assert os.environ["IDIST_T_KEPT"] == "old"
    assert os.environ["IDIST_T_GONE"] == "here"
    assert "IDIST_T_NEW" not in os.environ


def test_kept_undoes_what_the_block_and_the_code_it_calls_did(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("IDIST_T_KEPT", "old")
    before = dict(os.environ)
    with pytest.raises(RuntimeError), _environ.kept():
        _environ.apply({"IDIST_T_KEPT": None})
        os.environ["IDIST_T_SET_BY_A_LIBRARY"] = "x"
        raise RuntimeError
    assert dict(os.environ) == before
