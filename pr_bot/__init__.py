"""The pull-request bot: render a comparison as a GitHub comment and post it (plus a status).

One package for every caller: the web endpoint (``web.pr_routes``), the CLI
(``cptrace pr-comment``) and the service's automated pull-request loop. It may import
``analyzers``; it must never import ``service``, ``web`` or ``cptrace`` (they import it).
"""
