"""Hub loading off the network: one reachability probe puts the hub libraries offline, so a load fails at once."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import datasets
import huggingface_hub.constants
import pytest
from conftest import hub_mode

from tasks.hub import load_split, offline_unless_reachable


@pytest.fixture
def online(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[pytest.MonkeyPatch]:
    """Both libraries in online mode over an empty cache, the probe not yet run; restored afterwards."""
    hub_mode(monkeypatch, tmp_path, offline=False)
    offline_unless_reachable.cache_clear()
    yield monkeypatch
    offline_unless_reachable.cache_clear()


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_an_unreachable_hub_switches_both_libraries_offline(online: pytest.MonkeyPatch) -> None:
    online.setattr(huggingface_hub.constants, "ENDPOINT", f"http://127.0.0.1:{closed_port()}")
    assert offline_unless_reachable() is True
    assert huggingface_hub.constants.HF_HUB_OFFLINE is True and datasets.config.HF_HUB_OFFLINE is True


def test_a_reachable_hub_stays_online(online: pytest.MonkeyPatch) -> None:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        online.setattr(huggingface_hub.constants, "ENDPOINT", f"http://127.0.0.1:{server.getsockname()[1]}")
        assert offline_unless_reachable() is False
    assert huggingface_hub.constants.HF_HUB_OFFLINE is False and datasets.config.HF_HUB_OFFLINE is False


def test_a_load_off_the_network_says_only_the_cache_was_read(online: pytest.MonkeyPatch) -> None:
    online.setattr(huggingface_hub.constants, "ENDPOINT", f"http://127.0.0.1:{closed_port()}")
    with pytest.raises(FileNotFoundError) as raised:
        load_split("owner/absent", split="test", revision="0" * 40, how_to_get="pass task.data_file=<file>")
    message = str(raised.value)
    assert message.startswith(f"could not load owner/absent@{'0' * 40}, split 'test', from the hub (")
    assert "only the datasets cache was read" in message
    assert message.endswith(" — pass task.data_file=<file>") and "\n" not in message
