"""A pod confined to its own files (Landlock): what a local pod may read and write, nothing else.

A pod reads untrusted documents. On RunPod it is a machine of its own; a local pod (the embedded
default) runs on the control plane's host as the same OS user, where a parser exploit would
otherwise read ``var/secret_key``, the SQLite database, the admin's password file, or the workers'
environment through /proc. The local provider names, in ``POD_SANDBOX_READ`` and
``POD_SANDBOX_WRITE`` (paths joined by ``os.pathsep``), the trees the pod needs: Python, its
libraries, tesseract and the system's files to read, its own directory to write. Once
``confine`` runs, every other file is refused by the kernel, for the pod and every process it
starts (tesseract); nor may it signal or trace a process outside it (Landlock's ptrace rule and
signal scope), which keeps /proc/<worker>/environ shut.

Landlock needs no privilege (Linux 5.13 and later, enabled in the kernel's LSM list); where the
kernel has none, ``confine`` says so and the pod runs as before. README.md ("Local pods") says
what remains shared: the pod's network, and the same user's processes outside the sandbox.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping

READ_ENV = "POD_SANDBOX_READ"
WRITE_ENV = "POD_SANDBOX_WRITE"
# Directories any process needs to list beneath a path it reads (Python's imports list the
# directories on sys.path): listing, not reading, the repository's other files.
LIST_ENV = "POD_SANDBOX_LIST"


def paths_from(environ: Mapping[str, str], name: str) -> list[str]:
    return [path for path in environ.get(name, "").split(os.pathsep) if path]


def confine(*, read: Iterable[str], write: Iterable[str], list_only: Iterable[str] = ()) -> str:
    """Enforce the sandbox on this process (call it before any thread starts: Landlock binds the
    calling thread and the processes and threads it starts afterwards). Returns what was done,
    for the pod's log: "confined (Landlock ABI n)", or why not."""
    import landlockpy
    from landlockpy import AccessFS, AccessNet, Ruleset, Scope

    abi = landlockpy.abi_version()
    if abi == 0:
        return "not confined: this kernel has no Landlock"
    reading = AccessFS.READ_FILE | AccessFS.READ_DIR | AccessFS.EXECUTE
    with Ruleset(handled_net=AccessNet.NONE, scoped=Scope.SIGNAL | Scope.ABSTRACT_UNIX_SOCKET) as ruleset:
        everything = ruleset.handled_fs
        for path in read:
            if os.path.exists(path):
                # A file takes only a file's rights (a directory's would be refused: EINVAL).
                ruleset.allow_path(path, reading if os.path.isdir(path) else AccessFS.READ_FILE | AccessFS.EXECUTE)
        for path in list_only:
            if os.path.isdir(path):
                ruleset.allow_path(path, AccessFS.READ_DIR)
        for path in write:
            os.makedirs(path, exist_ok=True)
            ruleset.allow_path(path, everything)
        ruleset.restrict()
    return f"confined (Landlock ABI {abi})"


def confine_from_environment(environ: Mapping[str, str] = os.environ) -> str | None:
    """``confine`` with the paths the environment names; None when it names none (a pod in an
    image of its own, on a machine of its own)."""
    read, write = paths_from(environ, READ_ENV), paths_from(environ, WRITE_ENV)
    if not read and not write:
        return None
    return confine(read=read, write=write, list_only=paths_from(environ, LIST_ENV))
