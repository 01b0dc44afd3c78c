"""Actions on pools and pods, one module per concern.

- ``boot``: the boot steps (create on a candidate, wait until it runs, until its model answers, join).
- ``lifecycle``: end a pod, release it, drain it, mark it busy.
- ``reconcile``: the provider and the database made to agree; orphans adopted.
- ``scaler``: a pool's demand, the tick that boots and sheds.
- ``scale_requests``: a pool's size set on request.
- ``passes``: the pass runner: rows that are due (boots, terminates, shed ticks, scale requests,
  webhook sends) moved one short step each; ``pass_request`` asks for a pass.
- ``forecast``: what a job will cost and how long it will take, before anything is spent.

Everything here but ``forecast`` blocks (provider calls, HTTP to pods): it runs in
django-q2 workers, never in the front's request path. ``forecast`` reads only the
database (the stored catalogue), and the front calls it for every submission.
"""
