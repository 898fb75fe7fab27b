"""Jupyter Server's side of clusterbook's JupyterLab extension: the REST API under
``/clusterbook/api/`` that the Clusters sidebar polls (:mod:`clusterbook_widgets.lab.routes`).

Jupyter Server loads it through ``jupyter_server_config.d/clusterbook.json``, which the
package installs (``jupyter server extension list`` shows it), or ``jupyter server extension
enable clusterbook_widgets.lab``.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

__all__ = ["_jupyter_server_extension_points", "_load_jupyter_server_extension"]

#: Threads that run the API's calls (files, control sockets): a slow stop never holds the
#: sidebar's listing, which needs one.
_THREADS = 4


def _jupyter_server_extension_points() -> list[dict[str, str]]:
    return [{"module": "clusterbook_widgets.lab"}]


def _load_jupyter_server_extension(serverapp: Any) -> None:
    """Add the API's routes to Jupyter Server's web application."""
    from clusterbook_widgets.lab.routes import handlers
    from clusterbook_widgets.lab.service import ClusterService

    service = ClusterService()
    pool = ThreadPoolExecutor(_THREADS, thread_name_prefix="clusterbook-api")
    web_app = serverapp.web_app
    web_app.add_handlers(".*$", handlers(web_app.settings["base_url"], service, pool))
    serverapp.log.info("clusterbook: the clusters API is at %sclusterbook/api/",
                       web_app.settings["base_url"])  # fmt: skip
