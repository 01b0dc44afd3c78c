"""Jobs, documents and pages, one module per concern (import from the module, not from here):

- ``submission``: ``job_submit`` in the front; uploads sniffed, staged, checked against the
  limits (size, pages, pixels); pools, languages, file names, the form of URLs (``check_url``).
- ``fetch``: URL documents, fetched by a worker, pinned to the addresses that were checked.
- ``split``: documents split into pages (rendered, or kept as their text layer); lost fetches
  and splits sent again (``documents_recover``).
- ``jobs``: how a job ends (``job_refresh``), ``job_cancel``, ``job_retry_failed``.
- ``pages``: claims, the pod of each page, results (the one writer of result files), failed
  attempts, pages given back.
- ``dispatchers``: dispatcher slots, starting one, a pool's waiting pages.
"""

# Until pods/services.py and pods/tasks.py (split on their own branch) import these from
# their modules: the only names re-exported here.
from ocrjobs.services.dispatchers import dispatch_ensure, pages_waiting
from ocrjobs.services.pages import pages_requeue_from_pod
from ocrjobs.services.split import documents_recover

__all__ = ["dispatch_ensure", "documents_recover", "pages_requeue_from_pod", "pages_waiting"]
