"""fleetadmin.env: strict readers of the environment, and the settings that rely on them."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from fleetadmin.env import EnvError, envbool, envfloat, envint, envproxyheader, envsecret, envstr
from tools.processes import REPO


@pytest.mark.parametrize(("value", "expected"), [("true", True), ("false", False), ("TRUE", True), (" False ", False)])
def test_envbool_reads_true_and_false(monkeypatch, value, expected):
    monkeypatch.setenv("FA_TEST_FLAG", value)

    assert envbool("FA_TEST_FLAG") is expected


@pytest.mark.parametrize("value", [None, "", "   "])
def test_envbool_gives_the_default_when_unset_or_empty(monkeypatch, value):
    if value is None:
        monkeypatch.delenv("FA_TEST_FLAG", raising=False)
    else:
        monkeypatch.setenv("FA_TEST_FLAG", value)

    assert envbool("FA_TEST_FLAG", True) is True
    assert envbool("FA_TEST_FLAG", False) is False


@pytest.mark.parametrize("value", ["yes", "1", "0", "on", "no", "t"])
def test_envbool_refuses_anything_but_true_or_false(monkeypatch, value):
    monkeypatch.setenv("FA_TEST_FLAG", value)

    with pytest.raises(EnvError) as refused:
        envbool("FA_TEST_FLAG")

    assert str(refused.value) == f"FA_TEST_FLAG must be 'true' or 'false', not {value!r}"


def test_envint_reads_an_integer(monkeypatch):
    monkeypatch.setenv("FA_TEST_INT", " 42 ")

    assert envint("FA_TEST_INT", 7, minimum=1) == 42


def test_envint_gives_the_default_when_unset(monkeypatch):
    monkeypatch.delenv("FA_TEST_INT", raising=False)

    assert envint("FA_TEST_INT", 7, minimum=1) == 7


@pytest.mark.parametrize("value", ["abc", "4.5", "1e3", "12 pages"])
def test_envint_refuses_what_is_not_an_integer(monkeypatch, value):
    monkeypatch.setenv("FA_TEST_INT", value)

    with pytest.raises(EnvError) as refused:
        envint("FA_TEST_INT", 7)

    assert str(refused.value) == f"FA_TEST_INT must be an integer, not {value!r}"


def test_envint_refuses_a_value_below_its_minimum(monkeypatch):
    monkeypatch.setenv("FA_TEST_INT", "0")

    with pytest.raises(EnvError) as refused:
        envint("FA_TEST_INT", 7, minimum=1)

    assert str(refused.value) == "FA_TEST_INT must be at least 1, not 0"


def test_envint_accepts_its_minimum(monkeypatch):
    monkeypatch.setenv("FA_TEST_INT", "1")

    assert envint("FA_TEST_INT", 7, minimum=1) == 1


def test_envfloat_reads_a_number_and_refuses_others(monkeypatch):
    monkeypatch.setenv("FA_TEST_FLOAT", "2.5")
    assert envfloat("FA_TEST_FLOAT", 1.0, minimum=1.0) == 2.5

    monkeypatch.setenv("FA_TEST_FLOAT", "fast")
    with pytest.raises(EnvError, match="FA_TEST_FLOAT must be a number, not 'fast'"):
        envfloat("FA_TEST_FLOAT", 1.0)

    monkeypatch.setenv("FA_TEST_FLOAT", "0.5")
    with pytest.raises(EnvError, match="FA_TEST_FLOAT must be at least 1.0, not 0.5"):
        envfloat("FA_TEST_FLOAT", 1.0, minimum=1.0)


def test_envstr_strips_and_falls_back_to_the_default(monkeypatch):
    monkeypatch.setenv("FA_TEST_STR", "  value  ")
    assert envstr("FA_TEST_STR", "default") == "value"

    monkeypatch.setenv("FA_TEST_STR", "")
    assert envstr("FA_TEST_STR", "default") == "default"


def test_envsecret_reads_name_file_over_name(monkeypatch, tmp_path):
    secret = tmp_path / "secret"
    secret.write_text("from-the-file\n")
    monkeypatch.setenv("FA_TEST_SECRET", "from-the-variable")
    monkeypatch.setenv("FA_TEST_SECRET_FILE", str(secret))

    assert envsecret("FA_TEST_SECRET") == "from-the-file"


def test_envsecret_reads_name_without_a_file(monkeypatch):
    monkeypatch.setenv("FA_TEST_SECRET", "from-the-variable")
    monkeypatch.delenv("FA_TEST_SECRET_FILE", raising=False)

    assert envsecret("FA_TEST_SECRET") == "from-the-variable"
    monkeypatch.delenv("FA_TEST_SECRET")
    assert envsecret("FA_TEST_SECRET", "fallback") == "fallback"


@pytest.mark.parametrize("kind", ["missing", "directory"])
def test_envsecret_says_clearly_that_its_file_cannot_be_read(monkeypatch, tmp_path, kind):
    path = tmp_path / "nothing-here" if kind == "missing" else tmp_path
    monkeypatch.setenv("FA_TEST_SECRET", "from-the-variable")
    monkeypatch.setenv("FA_TEST_SECRET_FILE", str(path))

    with pytest.raises(EnvError) as refused:
        envsecret("FA_TEST_SECRET")

    message = str(refused.value)
    assert message.startswith(f"FA_TEST_SECRET_FILE={str(path)!r} cannot be read: ")
    assert ("No such file" in message) if kind == "missing" else ("Is a directory" in message)


# --- the settings module ------------------------------------------------------------------


def load_settings(tmp_path: Path, **env: str) -> subprocess.CompletedProcess:
    """Import the settings in a fresh interpreter with only the given variables set."""
    clean = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG")}
    clean.update(FLEETADMIN_VAR_DIR=str(tmp_path / "var"), DJANGO_SETTINGS_MODULE="fleetadmin.settings", **env)
    code = "import django; django.setup(); from django.conf import settings; print(settings.DATABASES['default']['ENGINE'])"
    return subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, env=clean, capture_output=True, text=True, timeout=120
    )


def test_the_embedded_default_needs_no_environment(tmp_path):
    result = load_settings(tmp_path)

    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "django.db.backends.sqlite3"
    assert (tmp_path / "var" / "secret_key").is_file()


def test_the_generated_secret_key_is_never_on_disk_readable_by_others(tmp_path):
    # Review L1: the key was written with the umask's mode, then chmod-ed. The key is made here
    # with the file already there: what mode does it have at that moment?
    code = (
        "import os, secrets, stat; from pathlib import Path; made = secrets.token_urlsafe; "
        f"path = Path({str(tmp_path / 'var' / 'secret_key')!r}); "
        "secrets.token_urlsafe = lambda n: print('mode', oct(stat.S_IMODE(path.stat().st_mode)) "
        "if path.exists() else 'no file') or made(n); "
        "import django; django.setup(); print('key', len(Path(path).read_text()))"
    )
    (tmp_path / "var").mkdir()
    clean = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG")}
    clean.update(FLEETADMIN_VAR_DIR=str(tmp_path / "var"), DJANGO_SETTINGS_MODULE="fleetadmin.settings")
    result = subprocess.run(["sh", "-c", f"umask 022 && exec {sys.executable} -c \"$0\"", code], cwd=REPO,
                            env=clean, capture_output=True, text=True, timeout=120)  # fmt: skip

    assert result.returncode == 0, result.stderr
    assert result.stdout.split("\n")[:2] == ["mode 0o600", "key 67"]
    assert stat.S_IMODE((tmp_path / "var" / "secret_key").stat().st_mode) == 0o600


def test_settings_refuse_a_database_url_without_a_secret_key(tmp_path):
    result = load_settings(tmp_path, DATABASE_URL="postgres://fa:fa@127.0.0.1:5432/fa")

    assert result.returncode != 0
    assert "SECRET_KEY (or SECRET_KEY_FILE) is required when DATABASE_URL is set" in result.stderr


def test_settings_refuse_a_debug_flag_that_is_not_true_or_false(tmp_path):
    result = load_settings(tmp_path, DEBUG="yes")

    assert result.returncode != 0
    assert "DEBUG must be 'true' or 'false', not 'yes'" in result.stderr


# --- envproxyheader ---------------------------------------------------------------------------


@pytest.mark.parametrize("value", ["HTTP_X_FORWARDED_PROTO", "X-Forwarded-Proto", "x_forwarded_proto"])
def test_envproxyheader_names_the_header_as_django_reads_it(monkeypatch, value):
    monkeypatch.setenv("FA_TEST_PROXY", value)
    assert envproxyheader("FA_TEST_PROXY") == ("HTTP_X_FORWARDED_PROTO", "https")


def test_envproxyheader_unset_is_none(monkeypatch):
    monkeypatch.delenv("FA_TEST_PROXY", raising=False)
    assert envproxyheader("FA_TEST_PROXY") is None


@pytest.mark.parametrize("value", ["X-Forwarded-Proto: https", "HTTP_X_FORWARDED_PROTO,https", "X.Proto"])
def test_envproxyheader_refuses_what_is_not_a_header_name(monkeypatch, value):
    monkeypatch.setenv("FA_TEST_PROXY", value)
    with pytest.raises(EnvError, match="FA_TEST_PROXY must be a header name"):
        envproxyheader("FA_TEST_PROXY")
