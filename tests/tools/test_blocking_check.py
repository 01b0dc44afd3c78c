"""The static loop check (tools.blocking_check) catches what it claims and lets correct code pass.

What ruff's ASYNC rules report (sleep, open, processes, HTTP clients) is left to ruff in an async
def itself (tests/test_no_blocking_calls.py proves ruff still reports it) and caught here only
through the module's own functions. The bad code lives in strings here, so the project walk
(test_no_blocking_calls.py) never sees it.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from tools.blocking_check import check_project, check_source, main


def findings(source: str) -> list[str]:
    return [f"{f.line}: {f.call}" for f in check_source(textwrap.dedent(source), "snippet.py")]


def calls(source: str) -> list[str]:
    return [f.call for f in check_source(textwrap.dedent(source), "snippet.py")]


# -- what it catches, by category -----------------------------------------------------------------

CAUGHT = {
    "waits for a process made elsewhere": (
        """
        import subprocess
        class Child:
            def __init__(self):
                self.proc = subprocess.Popen(["cat"])
            async def stop(self, process):
                self.proc.communicate(b"x")
                self.proc.wait()
                process.wait()
        """,
        ["self.proc.communicate(b'x')", "self.proc.wait()", "process.wait()"],
    ),
    "thread joins": (
        """
        import threading
        class Worker:
            def __init__(self):
                self._runner: threading.Thread | None = None
            async def stop(self, threads):
                t = threading.Thread(target=print)
                t.join()
                self._runner.join(timeout=5)
                thread.join()
                for each in threads:
                    each.join()
        """,
        ["t.join()", "self._runner.join(timeout=5)", "thread.join()", "each.join()"],
    ),
    "sockets": (
        """
        import socket
        async def f(peer: socket.socket):
            sock = socket.create_connection(("example.org", 80))
            sock.sendall(b"x")
            listener = socket.socket()
            conn, addr = listener.accept()
            conn.recv(10)
            peer.send(b"y")
        """,
        [
            "socket.create_connection(('example.org', 80))",
            "sock.sendall(b'x')",
            "listener.accept()",
            "conn.recv(10)",
            "peer.send(b'y')",
        ],
    ),
    "the runpod SDK": (
        """
        import runpod
        from runpod import create_pod
        import runpod.api.ctl_commands as ctl
        async def f():
            runpod.get_pods()
            create_pod(name="x", image_name="y", gpu_type_id="z")
            ctl.terminate_pod("abc")
        """,
        ["runpod.get_pods()", "create_pod(name='x', image_name='y', gpu_type_id='z')", "ctl.terminate_pod('abc')"],
    ),
    "shutil": (
        """
        import shutil
        from shutil import rmtree
        async def f(source, target):
            shutil.copyfile(source, target)
            rmtree(target)
        """,
        ["shutil.copyfile(source, target)", "rmtree(target)"],
    ),
    "the Django ORM": (
        """
        from pods.models import Pod
        async def f(pod):
            Pod.objects.get(pk=1)
            Pod.objects.filter(state="ready").update(state="draining")
            Pod.objects.create(name="x")
            pod.save()
            pod.delete()
            pod.refresh_from_db()
            for row in Pod.objects.filter(state="ready"):
                pass
            list(Pod.objects.all())
        """,
        [
            "Pod.objects.get(pk=1)",
            "Pod.objects.filter(state='ready').update(state='draining')",
            "Pod.objects.create(name='x')",
            "pod.save()",
            "pod.delete()",
            "pod.refresh_from_db()",
            "for ... in Pod.objects.filter(state='ready')",
            "list(Pod.objects.all())",
        ],
    ),
    "executor shutdown and futures": (
        """
        import asyncio
        from concurrent.futures import ThreadPoolExecutor
        class Loop:
            def __init__(self):
                self._db = ThreadPoolExecutor(1)
            async def end(self, coro, loop):
                self._db.shutdown(wait=True)
                self._db.shutdown()
                future = self._db.submit(print)
                future.result()
                asyncio.run_coroutine_threadsafe(coro, loop).result()
        """,
        [
            "self._db.shutdown(wait=True)",
            "self._db.shutdown()",
            "future.result()",
            "asyncio.run_coroutine_threadsafe(coro, loop).result()",
        ],
    ),
    "thread synchronisation": (
        """
        import queue
        import threading
        async def f():
            done = threading.Event()
            done.wait()
            jobs = queue.Queue()
            jobs.get()
        """,
        ["done.wait()", "jobs.get()"],
    ),
    "database, broker and cache round trips": (
        """
        from django.core.cache import cache
        from django.db import transaction
        from django_q.tasks import async_task
        async def f():
            with transaction.atomic():
                pass
            async_task("pods.tasks.tick")
            cache.get("key")
        """,
        ["transaction.atomic()", "async_task('pods.tasks.tick')", "cache.get('key')"],
    ),
    "a function of the module that blocks, directly or through another": (
        """
        from django.core.cache import cache
        def _cached(name):
            return cache.get(name)
        def _load(name):
            return _cached(name)
        def _pure(x):
            return x + 1
        class Loop:
            def forget(self):
                cache.delete("key")
            async def run(self):
                _cached("a")
                _load("b")
                _pure(1)
                self.forget()
        """,
        ["_cached('a')", "_load('b')", "self.forget()"],
    ),
    "a function of the module that does what ruff reports in an async def": (
        """
        import subprocess, time, requests
        from pathlib import Path
        from time import sleep as nap
        def _read(name):
            return Path(name).read_bytes()
        def _fetch(url):
            return requests.get(url)
        def _run():
            subprocess.run(["true"])
        def _wait():
            nap(1)
        def _log(name):
            with open(name, "a") as fh:
                fh.write("x")
        async def f(url):
            _read("a")
            _fetch(url)
            _run()
            _wait()
            _log("b")
        """,
        ["_read('a')", "_fetch(url)", "_run()", "_wait()", "_log('b')"],
    ),
    "what a nested def or lambda evaluates now": (
        """
        from django.core.cache import cache
        async def f(name):
            def later(data=cache.get(name)):
                return data
            handler = lambda text=cache.get(name).strip(): text
            return later, handler
        """,
        ["cache.get(name)", "cache.get(name)"],
    ),
    "a synchronous call wrongly awaited": (
        """
        from django.core.cache import cache
        from django_q.tasks import async_task
        async def f():
            await cache.get("key")
            await async_task("pods.tasks.tick")
        """,
        ["cache.get('key')", "async_task('pods.tasks.tick')"],
    ),
}


@pytest.mark.parametrize("case", CAUGHT, ids=list(CAUGHT))
def test_it_catches(case):
    source, expected = CAUGHT[case]
    assert calls(source) == expected


def test_a_finding_names_the_file_the_line_the_call_and_why():
    [finding] = check_source("from django.core.cache import cache\n\nasync def f():\n    cache.get(1)\n", "pods/x.py")
    assert str(finding) == "pods/x.py:4: cache.get(1): a cache round trip"


def test_a_local_function_finding_says_what_blocks_inside_it():
    source = """
        import time
        def helper():
            time.sleep(1)
        async def f():
            helper()
        """
    [finding] = check_source(textwrap.dedent(source), "m.py")
    assert finding.line == 6 and "time.sleep(1) at line 4" in finding.why


# -- what it lets pass --------------------------------------------------------------------------------

CORRECT = {
    "to_thread with a lambda, and with a reference": """
        import asyncio, time, requests
        async def f(url):
            await asyncio.to_thread(lambda: time.sleep(1))
            await asyncio.to_thread(time.sleep, 1)
            await asyncio.to_thread(lambda: requests.get(url).json())
        """,
    "what ruff's ASYNC rules report, in the async def itself": """
        import subprocess, time, requests
        from pathlib import Path
        async def f(url):
            time.sleep(1)
            open("x")
            Path("x").read_text()
            subprocess.run(["true"])
            requests.get(url)
        """,
    "pure functions": """
        import os, json, time
        async def f(parts, data):
            os.path.join("a", *parts)
            ", ".join(parts)
            os.getpid()
            json.dumps(data)
            time.monotonic()
            {}.get("x")
        """,
    "asyncio primitives": """
        import asyncio
        async def f(tasks):
            await asyncio.sleep(1)
            await asyncio.wait(tasks, timeout=1)
            ready = asyncio.Event()
            await ready.wait()
            await asyncio.wait_for(ready.wait(), 1)
            lock = asyncio.Lock()
            async with lock:
                pass
            jobs = asyncio.Queue()
            await jobs.get()
            proc = await asyncio.create_subprocess_exec("true")
            await proc.wait()
        """,
    "coroutines handed to ensure_future, create_task, gather": """
        import asyncio
        async def f(pod, client, urls, loop, group):
            asyncio.ensure_future(pod.save())
            asyncio.create_task(client.delete(urls[0]))
            loop.create_task(pod.asave())
            group.create_task(client.delete(urls[1]))
            await asyncio.gather(*[client.delete(u) for u in urls])
        """,
    "nested def and class bodies": """
        import time, requests
        async def f(url):
            def later():
                time.sleep(1)
                return requests.get(url)
            class Later:
                requests.get(url)
            return later, Later
        """,
    "run_in_executor with a function reference": """
        import asyncio, functools, requests
        from pods.models import Pod
        async def f(executor, url):
            loop = asyncio.get_running_loop()
            await loop.run_in_executor(executor, requests.get, url)
            await loop.run_in_executor(executor, functools.partial(Pod.objects.get, pk=1))
        """,
    "sync_to_async(f)() and database_sync_to_async(f)": """
        from asgiref.sync import sync_to_async
        from channels.db import database_sync_to_async
        from pods.models import Pod
        async def f(pod, fetch):
            await sync_to_async(Pod.objects.get)(pk=1)
            await sync_to_async(pod.save)()
            await database_sync_to_async(fetch)()
        """,
    "the async ORM": """
        from pods.models import Pod
        async def f(pod):
            await Pod.objects.aget(pk=1)
            await Pod.objects.filter(state="ready").aupdate(state="draining")
            await pod.asave()
            await pod.adelete()
            ready = Pod.objects.filter(state="ready").select_related("pool")
            async for row in ready:
                pass
        """,
    "an awaited async client": """
        import httpx
        async def f(url):
            async with httpx.AsyncClient() as client:
                await client.get(url)
                await client.delete(url)
        """,
    "blocking code outside any async def": """
        import time, requests
        def f(url):
            time.sleep(1)
            return requests.get(url)
        """,
    "non-blocking forms of blocking methods": """
        import queue
        from concurrent.futures import ThreadPoolExecutor
        POOL = ThreadPoolExecutor(2)
        async def f():
            POOL.shutdown(wait=False)
            jobs = queue.Queue()
            jobs.get(block=False)
            jobs.put(1, False)
        """,
    "local functions that do not block, or handed to a thread": """
        import asyncio, time
        def helper():
            time.sleep(1)
        class Store:
            def save(self):
                return {}
            async def run(self):
                self.save()
                await asyncio.to_thread(helper)
        """,
    "calls of this module's own coroutines, whatever their names": """
        import asyncio
        async def save(pod):
            return pod
        class Writer:
            async def write_bytes(self, data):
                return data
            async def delete(self):
                return None
            async def run(self, pod):
                pending = self.write_bytes(b"x")
                asyncio.get_running_loop().create_task(pending)
                closing = self.delete()
                await asyncio.gather(pending, closing, save(pod))
        """,
    "runpod classes, which call nobody when made": """
        import runpod
        async def f():
            endpoint = runpod.AsyncioEndpoint("id", None)
            return endpoint, runpod.Endpoint("id")
        """,
    "aiofiles-style open": """
        import aiofiles
        async def f(name):
            async with aiofiles.open(name) as fh:
                await fh.read()
        """,
}


@pytest.mark.parametrize("case", CORRECT, ids=list(CORRECT))
def test_it_lets_pass(case):
    assert findings(CORRECT[case]) == []


# -- the walk -------------------------------------------------------------------------------------------


def test_the_walk_skips_virtualenvs_migrations_and_hidden_directories(tmp_path: Path):
    bad = "from django.core.cache import cache\n\nasync def f():\n    cache.get(1)\n"
    for relative in (".venv/lib/x.py", "app/migrations/0001_initial.py", ".git/hook.py", "app/module.py"):
        path = tmp_path / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(bad)
    assert [str(f) for f in check_project(tmp_path)] == ["app/module.py:4: cache.get(1): a cache round trip"]


def test_a_file_that_does_not_parse_is_a_finding(tmp_path: Path):
    (tmp_path / "broken.py").write_text("async def f(:\n")
    [finding] = check_project(tmp_path)
    assert finding.path == "broken.py" and "cannot be parsed" in finding.why


def test_the_command_exits_1_on_a_finding(tmp_path: Path, capsys, monkeypatch):
    (tmp_path / "bad.py").write_text("import shutil\n\nasync def f():\n    shutil.rmtree('x')\n")
    (tmp_path / "good.py").write_text("import asyncio\n\nasync def f():\n    await asyncio.sleep(0)\n")
    monkeypatch.chdir(tmp_path)
    assert main([str(tmp_path / "bad.py")]) == 1
    assert "bad.py:4: shutil.rmtree('x')" in capsys.readouterr().out
    assert main([str(tmp_path / "good.py")]) == 0
