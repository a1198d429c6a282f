"""The automated pull-request loop: push -> measure -> compare with the base -> one comment.

``webhook`` verifies and records GitHub deliveries; ``planner`` turns a pull request or a push
into a batch of checkout jobs (the suite file at the head SHA, or the service's per-repository
config); runners (``cptrace agent``) run them; ``publisher`` (driven by the analysis worker)
picks the baseline, judges the result by the suite's policy and posts the comment and the
commit status through :mod:`pr_bot`. May import ``pr_bot`` and ``analyzers``; never ``web``,
``cptrace`` or ``runners``.
"""
