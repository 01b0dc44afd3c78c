"""Jobs, documents and pages, one module per concern (import from the module, not from here):

- ``submission``: ``job_submit`` in the front; uploads sniffed, staged, checked against the
  limits (size, pages, pixels); pools, languages, file names.
- ``urls``: the form of a URL (``check_url``) and whether an address is public, for documents
  and webhooks.
- ``fetch``: URL documents, fetched by a worker, pinned to the addresses that were checked.
- ``split``: documents split into pages (counted and checked, or kept as their text layer; the
  pods render them); ``recover``: lost fetches and splits sent again (``documents_recover``).
- ``idempotency``: Idempotency-Key submissions; ``schedule``: budget, deadline, priority;
  ``budgets``: what a user's jobs may still cost in a day;
  ``webhooks``: job events to callback URLs, delivered by passes.
- ``remote``: an exchange with a machine we do not control (a URL host, a webhook receiver):
  pinned addresses, a total deadline, a size cap.
- ``jobs``: how a job ends (``job_refresh``, ``jobs_refresh``), ``job_cancel``, ``job_retry``
  (failed pages and failed documents).
- ``pages``: claims, the pod of each page, results (the one writer of pods' results), failed
  attempts, pages given back.
- ``escalation_budget``: the cascade held to a job's budget (no escalation past it; escalated
  pages waiting keep their first reading).
- ``dispatchers``: dispatcher slots, starting one.
- ``outputs``: result.md, per-document downloads, asking for searchable PDFs when a job ends;
  ``searchable_pdf``: building one (the original pages under an invisible text layer).
"""
