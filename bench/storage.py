"""Storage: what any-host serving costs (README, "Storage").

- documents on S3 (``rclone serve s3`` over a temporary folder, started here): storing a large
  document (a streamed multipart upload), reading it whole (the dispatcher's read) and into a local
  file (the split's read), in MB/s;
- a page image's read from S3, as a dispatcher does for a forward: wall and client CPU per read;
- storing page results in their rows (``pages_complete``, batches of 100): wall and CPU per page,
  on a throw-away SQLite database (or ``--database-url``).

    python bench/storage.py [--document-mb 100] [--reads 200] [--pages 5000]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._setup import django_for_bench
from tools.processes import start_s3_server


def _timed(fn):
    wall, cpu = time.perf_counter(), time.process_time()
    value = fn()
    return value, time.perf_counter() - wall, time.process_time() - cpu


def storage_figures(args, root: Path) -> dict:
    from ocrjobs.storage import document_bytes, document_local, document_save_bytes, document_store

    staged = root / "staged"
    staged.write_bytes(os.urandom(args.document_mb * 1024 * 1024))
    name, put, _ = _timed(lambda: document_store("documents/bench/source.pdf", staged))
    _, get, _ = _timed(lambda: document_bytes(name))

    def to_local() -> None:
        with document_local(name) as local:
            local.stat()

    _, local, _ = _timed(to_local)
    image = document_save_bytes("documents/bench/pages/1.png", os.urandom(150 * 1024))
    document_bytes(image)
    _, wall, cpu = _timed(lambda: [document_bytes(image) for _ in range(args.reads)])
    return {
        "document_mb": args.document_mb,
        "store_mb_per_s": round(args.document_mb / put, 1),
        "read_mb_per_s": round(args.document_mb / get, 1),
        "read_to_local_file_mb_per_s": round(args.document_mb / local, 1),
        "page_read_wall_ms": round(wall / args.reads * 1000, 2),
        "page_read_cpu_ms": round(cpu / args.reads * 1000, 2),
    }


def result_figures(args) -> dict:
    from ocrjobs.models import Document, Job, Page
    from ocrjobs.services.pages import PageResult, pages_claim, pages_complete
    from pods.models import Pool

    pool = Pool.objects.create(key="bench-storage", provider="local")
    job = Job.objects.create(pool=pool)
    document = Document.objects.create(job=job, position=0, name="d", kind="pdf", source="x", size_bytes=1,
                                       page_count=args.pages)  # fmt: skip
    Page.objects.bulk_create([Page(job=job, document=document, pool=pool, number=n) for n in range(1, args.pages + 1)])
    claimed = pages_claim(pool_id=pool.pk, token="bench", limit=args.pages)
    # About what tesseract answers for a page of prose: its text and 40 lines with boxes.
    result = {"text": "lorem ipsum " * 150, "confidence": 90.0,
              "lines": [{"text": "lorem", "box": [1, 2, 3, 4], "confidence": 90.0}] * 40}  # fmt: skip

    def store() -> None:
        for i in range(0, len(claimed), 100):
            pages_complete(token="bench", items=[PageResult(c.id, c.job_id, c.position, None, result, 0.1,
                                                            attempt=c.attempts) for c in claimed[i : i + 100]])  # fmt: skip

    _, wall, cpu = _timed(store)
    return {
        "pages": args.pages,
        "result_bytes": len(json.dumps(result)),
        "result_store_wall_ms_per_page": round(wall / args.pages * 1000, 3),
        "result_store_cpu_ms_per_page": round(cpu / args.pages * 1000, 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--document-mb", type=int, default=100)
    parser.add_argument("--reads", type=int, default=200)
    parser.add_argument("--pages", type=int, default=5000)
    parser.add_argument("--database-url", default="")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="fleetadmin-bench-storage-"))
    server, env = start_s3_server(root / "s3", root)
    try:
        os.environ.update(env)
        var_dir = django_for_bench("storage", database_url=args.database_url)
        figures = {**storage_figures(args, root), **result_figures(args)}
    finally:
        server.stop()
        shutil.rmtree(root, ignore_errors=True)
    shutil.rmtree(var_dir, ignore_errors=True)
    print(f"S3 (rclone serve s3, localhost): store {figures['store_mb_per_s']} MB/s, read "
          f"{figures['read_mb_per_s']} MB/s, read to a local file {figures['read_to_local_file_mb_per_s']} MB/s "
          f"({args.document_mb} MB)")  # fmt: skip
    print(f"a 150 kB page image read from S3: {figures['page_read_wall_ms']} ms, "
          f"{figures['page_read_cpu_ms']} ms of client CPU")  # fmt: skip
    print(f"results stored in their rows: {figures['result_store_wall_ms_per_page']} ms, "
          f"{figures['result_store_cpu_ms_per_page']} ms of CPU per page ({figures['result_bytes']} B each)")  # fmt: skip
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
