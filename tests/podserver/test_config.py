"""Flags over environment over defaults; the 0.0.0.0-in-a-pod / loopback rule."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from podserver import config, engines
from podserver.config import load

# The pod server touches no database: once, on the SQLite run.
pytestmark = pytest.mark.once_sqlite

RUNPOD = {"RUNPOD_POD_ID": "abc123xyz", "POD_TOKEN": "t0k3n"}


def test_defaults_outside_a_pod_are_loopback_and_open() -> None:
    config = load([], environ={})
    assert (config.host, config.port, config.lanes, config.engine, config.token) == (
        "127.0.0.1",
        8000,
        1,
        "tesseract",
        "",
    )
    assert config.page_timeout == 120.0
    assert (config.cache_bytes, config.max_document_bytes) == (2 * 1024**3, 512 * 1024**2)


def test_inside_a_runpod_pod_it_binds_every_address_and_ends_pages_before_the_proxy_does() -> None:
    config = load([], environ=RUNPOD)
    assert config.host == "0.0.0.0"
    assert config.token == "t0k3n"
    assert config.page_timeout < 100  # RunPod's proxy cuts a request at 100 s


def test_the_local_provider_keeps_loopback_even_in_a_pod() -> None:
    config = load(["--host", "127.0.0.1", "--port", "0"], environ={"RUNPOD_POD_ID": "abc123xyz"})
    assert (config.host, config.port, config.token) == ("127.0.0.1", 0, "")


@pytest.mark.parametrize(
    "environ",
    [{"RUNPOD_POD_ID": "abc123xyz"}, {"HOST": "0.0.0.0"}, {"HOST": "10.1.2.3"}, {"HOST": "pod.example"}],
)
def test_a_public_bind_without_a_token_refuses_to_start(environ: dict, capsys) -> None:
    with pytest.raises(SystemExit):
        load([], environ=environ)
    assert "without a token" in capsys.readouterr().err


def test_the_environment_is_read() -> None:
    config = load(
        [],
        environ={
            **RUNPOD,
            "PORT": "8123",
            "LANES": "6",
            "ENGINE": "rapidocr",
            "MODEL": "allenai/olmOCR-2-7B-1025-FP8",
            "PAGE_TIMEOUT": "45",
            "DOCUMENT_CACHE_DIR": "/cache",
            "DOCUMENT_CACHE_BYTES": "1000000",
            "MAX_DOCUMENT_BYTES": "2000",
        },
    )
    assert (config.port, config.lanes, config.engine, config.model) == (
        8123,
        6,
        "rapidocr",
        "allenai/olmOCR-2-7B-1025-FP8",
    )
    assert (config.page_timeout, config.cache_dir, config.cache_bytes, config.max_document_bytes) == (
        45.0,
        "/cache",
        1_000_000,
        2000,
    )


def test_flags_override_the_environment() -> None:
    config = load(["--lanes", "2", "--engine", "tesseract", "--port", "0"], environ={"LANES": "6", "ENGINE": "vlm"})
    assert (config.lanes, config.engine, config.port) == (2, "tesseract", 0)


@pytest.mark.parametrize(
    "environ",
    [{"LANES": "0"}, {"LANES": "many"}, {"ENGINE": "nope"}, {"PORT": "99999"}, {"PAGE_TIMEOUT": "-1"}],
)
def test_bad_environment_values_refuse_to_start(environ: dict) -> None:
    with pytest.raises(SystemExit):
        load([], environ=environ)


def test_the_token_can_come_from_a_file_and_stays_out_of_reprs(tmp_path) -> None:
    secret = tmp_path / "token"
    secret.write_text("from-a-file\n")
    config = load([], environ={"HOST": "0.0.0.0", "POD_TOKEN_FILE": str(secret)})
    assert config.token == "from-a-file"
    assert "from-a-file" not in repr(config)


def test_lanes_auto_leaves_the_choice_to_the_engine() -> None:
    assert load([], environ={"LANES": "auto"}).lanes == 0
    assert load(["--lanes", "auto"], environ={"LANES": "3"}).lanes == 0


def test_each_registered_engine_names_a_class_of_its_module_and_the_flag_offers_exactly_those():
    here = Path(engines.__file__).parent
    for name, (module, cls) in engines.ENGINES.items():
        tree = ast.parse((here / f"{module}.py").read_text())
        assert cls in {node.name for node in tree.body if isinstance(node, ast.ClassDef)}, name
    assert config.ENGINES is engines.ENGINES
    with pytest.raises(ValueError, match="unknown engine"):
        engines.create("nonesuch")
