"""Every name a package lists in ``__all__`` is really there (STYLE: public names are re-exported)."""

import importlib

import pytest


@pytest.mark.parametrize("package", ["ring", "protocol", "storage", "peer", "peerlab.localweb"])
def test_all_names_resolve(package):
    mod = importlib.import_module(package)
    assert mod.__all__, f"{package} exports nothing"
    missing = [name for name in mod.__all__ if getattr(mod, name, None) is None]
    assert missing == []
