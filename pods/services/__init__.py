"""Actions on pools and pods, one module per concern.

- ``boot``: the boot steps (create on a candidate, wait until it runs, until its model answers, join).
- ``lifecycle``: end a pod, release it, drain it, mark it busy.
- ``reconcile``: the provider and the database made to agree; orphans adopted.
- ``scaler``: a pool's demand, the tick that boots and sheds.
- ``scale_requests``: a pool's size set on request.

Everything here blocks (provider calls, HTTP to pods): it runs in django-q2
workers, never in the front's request path.
"""
