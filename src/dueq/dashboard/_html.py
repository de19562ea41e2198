"""HTML building blocks: every value goes through ``html.escape`` on its way into a page.

No template engine: pages are short, and a handful of helpers (``e``, ``link``, ``table``,
``button``) keep every interpolation escaped in one visible place. Scripts and styles come from
``/static`` (same origin), so the Content-Security-Policy can forbid inline script entirely: a
payload that slipped through unescaped still could not run.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime, timezone
from html import escape
from typing import Any
from urllib.parse import urlencode

CSS = """
body{font-family:system-ui,sans-serif;margin:0;color:#222;background:#fafafa}
header{background:#263238;color:#fff;padding:8px 16px;display:flex;gap:16px;align-items:center}
header a{color:#fff;text-decoration:none;font-weight:bold}
header .where{margin-left:auto;font-size:12px;opacity:.8}
main{padding:12px 16px}
h1{font-size:20px;margin:8px 0}
h2{font-size:16px;margin:18px 0 6px}
h3{font-size:14px;margin:12px 0 4px}
table{border-collapse:collapse;background:#fff;font-size:13px}
th,td{border:1px solid #ddd;padding:4px 8px;text-align:left;vertical-align:top}
th{background:#eceff1}
td.n{text-align:right;font-variant-numeric:tabular-nums}
pre{background:#fff;border:1px solid #ddd;padding:8px;white-space:pre-wrap;
word-break:break-all;max-width:1100px;font-size:12px}
form.inline{display:inline;margin:0}
button{font-size:12px;padding:2px 8px;cursor:pointer}
button.danger{color:#b71c1c}
.paused{color:#b71c1c;font-weight:bold}
.notice{background:#e8f5e9;border:1px solid #a5d6a7;padding:8px;margin:8px 0}
.problem{background:#ffebee;border:1px solid #ef9a9a;padding:8px;margin:8px 0}
.muted{color:#777;font-size:12px}
img.chart{display:block;border:1px solid #ddd;margin:6px 0;width:600px;height:auto}
.charts{display:flex;gap:16px;flex-wrap:wrap}
tr[data-health=warn] td{background:#fff8e1}
tr[data-health=bad] td{background:#ffebee}
td.badge{font-weight:bold;text-transform:uppercase;font-size:11px}
[data-health=ok] td.badge{color:#2e7d32}
[data-health=warn] td.badge{color:#e65100}
[data-health=bad] td.badge{color:#b71c1c}
td.why{color:#444}
p#health,p.health{padding:6px 10px;border-left:6px solid #2e7d32;background:#e8f5e9}
p#health[data-health=warn],p.health[data-health=warn]{border-color:#ef6c00;background:#fff3e0}
p#health[data-health=bad],p.health[data-health=bad]{border-color:#c62828;background:#ffebee}
"""

JS = """
(function () {
  var body = document.body, url = body.getAttribute('data-poll');
  var every = Number(body.getAttribute('data-every')) || 2000, ticks = 0, shown = {};
  if (!url) { return; }
  function tick() {
    ticks += 1;
    fetch(url, {credentials: 'same-origin', headers: {'Accept': 'application/json'}})
      .then(function (r) { return r.ok ? r.json() : null; })
      .then(function (data) {
        if (!data) { return; }
        var live = data.live || {};
        document.querySelectorAll('[data-live]').forEach(function (el) {
          var v = live[el.getAttribute('data-live')];
          if (v !== undefined && el.textContent !== String(v)) { el.textContent = String(v); }
        });
        document.querySelectorAll('[data-health-of]').forEach(function (el) {
          var v = live[el.getAttribute('data-health-of')];
          if (v !== undefined) { el.setAttribute('data-health', String(v)); }
        });
        var rows = data.rows || {};
        document.querySelectorAll('tbody[data-rows]').forEach(function (tbody) {
          var key = tbody.getAttribute('data-rows'), got = rows[key];
          if (!Array.isArray(got)) { return; }
          var text = JSON.stringify(got);
          if (shown[key] === text) { return; }
          shown[key] = text;
          var fresh = document.createDocumentFragment();
          if (got.length === 0) {
            var tr = document.createElement('tr'), td = document.createElement('td');
            td.colSpan = Number(tbody.getAttribute('data-columns')) || 1;
            td.className = 'muted';
            td.textContent = tbody.getAttribute('data-empty') || '';
            tr.appendChild(td);
            fresh.appendChild(tr);
          }
          got.forEach(function (cells) {
            var tr = document.createElement('tr');
            cells.forEach(function (c) {
              var td = document.createElement('td');
              if (c.css) { td.className = c.css; }
              if (c.href) {
                var a = document.createElement('a');
                a.setAttribute('href', c.href);
                a.textContent = c.text;
                td.appendChild(a);
              } else { td.textContent = c.text; }
              tr.appendChild(td);
            });
            fresh.appendChild(tr);
          });
          tbody.replaceChildren(fresh);
        });
        if (ticks % 5 === 0) {
          document.querySelectorAll('img[data-chart]').forEach(function (img) {
            var src = img.getAttribute('data-chart');
            img.src = src + (src.indexOf('?') < 0 ? '?' : '&') + 't=' + Date.now();
          });
        }
        var stamp = document.getElementById('updated');
        if (stamp) { stamp.textContent = 'live, updated ' + new Date().toLocaleTimeString(); }
      })
      .catch(function () { /* the next tick tries again */ })
      .then(function () { setTimeout(tick, every); });
  }
  setTimeout(tick, every);
})();
"""


def e(value: object) -> str:
    """``value`` as text, escaped for HTML (quotes too: safe inside attributes)."""
    return escape("" if value is None else str(value), quote=True)


def url(path: str, **query: object) -> str:
    """``path?query`` with the values URL-encoded (None values left out); not yet escaped."""
    given = {k: str(v) for k, v in query.items() if v is not None and v != ""}
    return f"{path}?{urlencode(given)}" if given else path


def link(text: object, path: str, **query: object) -> str:
    return f'<a href="{e(url(path, **query))}">{e(text)}</a>'


def when(value: datetime | None) -> str:
    if value is None:
        return "-"
    return value.astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def live(key: str, text: object, css: str = "") -> str:
    """A table cell the page's poller refreshes from the JSON endpoint's ``live[key]``."""
    cls = f' class="{e(css)}"' if css else ""
    return f'<td{cls} data-live="{e(key)}">{e(text)}</td>'


def health_row(queue: str, level: str) -> str:
    """The opening ``<tr>`` of a queue's row, coloured by its health (the poller keeps
    ``data-health`` current from the JSON's ``live[QUEUE.health]``)."""
    return (
        f'<tr data-health="{e(level)}" data-queue="{e(queue)}" data-health-of="{e(queue)}.health">'
    )


def chart(alt: str, src: str) -> str:
    """An SVG chart the page's poller reloads now and then."""
    return f'<img class="chart" alt="{e(alt)}" src="{e(src)}" data-chart="{e(src)}">'


#: One cell of a table row the poller refreshes (``live_table``): its ``text``, and a link
#: (``href``, a path of this site) or a CSS class (``css``) when it has one. The page renders
#: these cells as HTML and the JSON endpoint gives the same cells, so both show one thing.
Cell = dict[str, str]


def cell(text: object, *, href: str | None = None, css: str = "") -> Cell:
    got = {"text": "" if text is None else str(text)}
    if href is not None:
        got["href"] = href
    if css:
        got["css"] = css
    return got


def _cell_html(c: Cell) -> str:
    cls = f' class="{e(c["css"])}"' if c.get("css") else ""
    text = e(c["text"])
    return (
        f"<td{cls}>" + (f'<a href="{e(c["href"])}">{text}</a>' if "href" in c else text) + "</td>"
    )


def live_table(key: str, head: Sequence[str], rows: Sequence[Sequence[Cell]], *, empty: str) -> str:
    """A table whose rows the page's poller replaces with the JSON endpoint's ``rows[key]``
    (a list of rows of ``cell``s) when they change; shown even when empty (with ``empty`` in
    one row), so that rows can arrive."""
    cells = "".join(f"<th>{e(h)}</th>" for h in head)
    body = "".join("<tr>" + "".join(_cell_html(c) for c in row) + "</tr>" for row in rows)
    if not body:
        body = f'<tr><td colspan="{len(head)}" class="muted">{e(empty)}</td></tr>'
    return (
        f"<table><tr>{cells}</tr>"
        f'<tbody data-rows="{e(key)}" data-columns="{len(head)}" data-empty="{e(empty)}">'
        f"{body}</tbody></table>"
    )


def table(head: Sequence[str], rows: Iterable[str], *, empty: str = "none") -> str:
    body = "".join(rows)
    if not body:
        return f'<p class="muted">{e(empty)}</p>'
    cells = "".join(f"<th>{e(h)}</th>" for h in head)
    return f"<table>{f'<tr>{cells}</tr>' if head else ''}{body}</table>"


def button(label: str, action: str, fields: Mapping[str, object], *, danger: bool = False) -> str:
    """A button that opens the confirmation page of ``action`` (a GET: it changes nothing)."""
    hidden = "".join(
        f'<input type="hidden" name="{e(k)}" value="{e(v)}">'
        for k, v in fields.items()
        if v is not None
    )
    cls = ' class="danger"' if danger else ""
    return (
        f'<form class="inline" method="get" action="/action/{e(action)}">{hidden}'
        f'<button type="submit"{cls} data-action="{e(action)}">{e(label)}</button></form>'
    )


def pretty_json(value: Any) -> str:
    try:
        return json.dumps(value, indent=2, ensure_ascii=False, sort_keys=True)
    except (TypeError, ValueError):  # not JSON-shaped: show its repr instead
        return repr(value)


def layout(
    title: str,
    body: str,
    *,
    where: str | None,
    poll: str | None,
    read_only: bool,
    logout_csrf: str | None = None,
) -> str:
    """The whole page: header with navigation, ``body``, and the poller when ``poll`` is set;
    a Log out button (a POST carrying ``logout_csrf``) when that is given; the Redis named as
    ``where`` unless that is None (a visitor not yet logged in)."""
    poll_attr = f' data-poll="{e(poll)}"' if poll else ""
    mode = " · read-only" if read_only else ""
    logout = (
        '<form class="inline" method="post" action="/logout">'
        f'<input type="hidden" name="csrf" value="{e(logout_csrf)}">'
        '<button type="submit" id="logout">Log out</button></form>'
        if logout_csrf
        else ""
    )
    return (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        f"<title>{e(title)} · dueq</title>"
        '<link rel="stylesheet" href="/static/dashboard.css">'
        '<script src="/static/dashboard.js" defer></script></head>'
        f"<body{poll_attr}><header>"
        f"{link('dueq', '/')}{link('Overview', '/')}{link('Workers', '/workers')}"
        f"{link('Cron', '/cron')}{link('Batches', '/batches')}{link('Dead letters', '/dead')}"
        f'<span class="where">{e(f"Redis {where}" if where else "")}{e(mode)} · '
        '<span id="updated"></span></span>'
        f"{logout}</header><main>{body}</main></body></html>"
    )
