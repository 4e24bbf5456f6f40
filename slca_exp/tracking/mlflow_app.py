"""MLflow's tracking server, whose UI opens each experiment in the view its kind tag names.

MLflow records what an experiment holds in its ``mlflow.experimentKind`` tag (slca-exp tags its
experiments ``custom_model_development``: model training), but MLflow 3.17's UI picks the view
from its own GenAI / Model training switch: the page's ``?workflowType=`` parameter, else the
browser's last choice (GenAI at first). This app is MLflow's own server with one addition: the
UI page carries a small script that, when an experiment is opened without that parameter, reads
the experiment's kind tag through MLflow's REST API and, when the tag names the other view,
reopens the experiment with the parameter set::

    #/experiments/3            (kind custom_model_development, browser last chose GenAI)
      -> #/experiments/3?workflowType=machine_learning       (the runs table)

An explicit ``workflowType`` (a link, or a click on the switch) is left alone, and so is an
experiment without a kind tag. Everything else is MLflow's server, unchanged.

Registered as the MLflow app ``slca-exp`` (``pyproject.toml``, entry point group ``mlflow.app``),
so ``mlflow server --app-name slca-exp`` serves it; ``slca-exp ui`` starts it on a run store.
"""

from __future__ import annotations

import json
from pathlib import Path

from flask import Response
from mlflow.server import app as flask_app
from mlflow.server.fastapi_app import app  # noqa: F401 - the ASGI app uvicorn serves

from slca_exp.core.tags import EXPERIMENT_KIND
from slca_exp.tracking.lineage import TRAINING_KIND

VIEWS = {TRAINING_KIND: "machine_learning", "genai_development": "genai"}
"""Experiment kind tag value -> the UI's ``workflowType`` that shows it."""
STORED_VIEW_KEY = "mlflow.workflowType_v1"
"""Where the UI keeps the browser's last switch choice (localStorage, a JSON string)."""
DEFAULT_VIEW = "genai"
"""The UI's view when the browser never chose one."""

_SCRIPT = """<script>
(function () {
  "use strict";
  var KIND_TAG = %(kind_tag)s, VIEWS = %(views)s;
  var STORED = %(stored)s, DEFAULT_VIEW = %(default)s;
  var LANDING = /^#\\/experiments\\/(\\d+)\\/?(?:\\?(.*))?$/;
  var kinds = {};
  function shownView(query) {
    var asked = new URLSearchParams(query || "").get("workflowType");
    if (asked) return asked;
    try { return JSON.parse(localStorage.getItem(STORED)) || DEFAULT_VIEW; }
    catch (e) { return DEFAULT_VIEW; }
  }
  function kindOf(id) {
    if (!kinds[id]) {
      kinds[id] = fetch("ajax-api/2.0/mlflow/experiments/get?experiment_id=" + id)
        .then(function (r) { return r.ok ? r.json() : {}; })
        .then(function (body) {
          var tags = (body.experiment && body.experiment.tags) || [];
          var tag = tags.filter(function (t) { return t.key === KIND_TAG; })[0];
          return tag ? tag.value : null;
        })
        .catch(function () { delete kinds[id]; return null; });
    }
    return kinds[id];
  }
  function route(target) {
    var hash = "#" + (String(target).split("#")[1] || "");
    var m = LANDING.exec(hash);
    if (!m || new URLSearchParams(m[2] || "").get("workflowType")) return;
    var id = m[1], query = new URLSearchParams(m[2] || "");
    kindOf(id).then(function (kind) {
      var view = VIEWS[kind];
      var here = new RegExp("^#/experiments/" + id + "(?:[/?]|$)").test(location.hash);
      if (!view || !here || view === shownView(location.hash.split("?")[1])) return;
      query.set("workflowType", view);
      location.replace("#/experiments/" + id + "?" + query.toString());
    });
  }
  ["pushState", "replaceState"].forEach(function (name) {
    var original = history[name];
    history[name] = function (state, unused, url) {
      var result = original.apply(this, arguments);
      if (url !== undefined && url !== null) route(new URL(url, location.href).href);
      return result;
    };
  });
  window.addEventListener("hashchange", function (event) { route(event.newURL); });
  route(location.href);
})();
</script>"""


def routing_script() -> str:
    """The ``<script>`` element the UI page carries (see the module docstring)."""
    return _SCRIPT % {
        "kind_tag": json.dumps(EXPERIMENT_KIND),
        "views": json.dumps(VIEWS, sort_keys=True),
        "stored": json.dumps(STORED_VIEW_KEY),
        "default": json.dumps(DEFAULT_VIEW),
    }


def with_routing(html: str) -> str:
    """The UI page ``html`` with :func:`routing_script` as the first element of its head.

    >>> page = with_routing("<html><head><title>MLflow</title></head></html>")
    >>> page.startswith("<html><head><script>"), page.endswith("</script><title>MLflow</title>")
    (True, False)
    >>> page.endswith("</script><title>MLflow</title></head></html>")
    True
    >>> with_routing("<p>no head</p>")
    Traceback (most recent call last):
    ...
    ValueError: the MLflow UI page has no <head>: this MLflow version serves another page
    """
    head = html.find("<head>")
    if head < 0:
        raise ValueError(
            "the MLflow UI page has no <head>: this MLflow version serves another page"
        )
    cut = head + len("<head>")
    return html[:cut] + routing_script() + html[cut:]


_serve_mlflow_page = flask_app.view_functions["serve"]


def _serve_page() -> Response:
    """MLflow's UI page with the routing script; MLflow's own answer when it has no UI build."""
    index = Path(flask_app.static_folder or "", "index.html")
    if not index.is_file():
        return _serve_mlflow_page()
    response = Response(with_routing(index.read_text(encoding="utf-8")), mimetype="text/html")
    response.headers["Cache-Control"] = "no-cache"
    return response


flask_app.view_functions["serve"] = _serve_page
